/*
 * index/utf8.c - well-formed UTF-8 checks and the lossy U+FFFD copy (see
 * utf8.h). Owns nothing but these two pure functions.
 */
#include "utf8.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

size_t ckpt_utf8_seq(const unsigned char *s, size_t n)
{
    unsigned char c = s[0];
    size_t k = c < 0x80                 ? 1
               : c >= 0xc2 && c <= 0xdf ? 2
               : c >= 0xe0 && c <= 0xef ? 3
               : c >= 0xf0 && c <= 0xf4 ? 4
                                        : 0;
    if (k == 0 || k > n)
        return 0;
    uint32_t cp = k == 1 ? c : c & (0x7f >> k);
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if ((k == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
        (k == 4 && (cp < 0x10000 || cp > 0x10ffff)))
        return 0;
    return k;
}

char *ckpt_utf8_lossy(const char *s, size_t n, size_t *outlen)
{
    if (n > (SIZE_MAX - 1) / 3)
        return NULL;
    char *buf = malloc(3 * n + 1); /* each bad byte grows to U+FFFD's 3 bytes */
    if (!buf)
        return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t k = ckpt_utf8_seq((const unsigned char *)s + i, n - i);
        if (k && s[i]) {
            memcpy(buf + o, s + i, k);
            o += k;
            i += k;
        } else {
            memcpy(buf + o, "\xef\xbf\xbd", 3);
            o += 3;
            i++;
        }
    }
    buf[o] = '\0';
    if (outlen)
        *outlen = o;
    return buf;
}
