/*
 * fs/store/ckey.c - canonical checkpoint locations (see ckey.h). Pure string
 * functions; owns no state.
 */
#include "ckey.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *ckpt_clean_prefix(const char *prefix)
{
    size_t n = strlen(prefix);
    char *out = malloc(n + 1);
    if (!out)
        return NULL;
    size_t o = 0;
    for (const char *s = prefix;;) {
        size_t len = strcspn(s, "/");
        if (!(len == 1 && s[0] == '.')) { /* "." segments go; empty ones are key text */
            memcpy(out + o, s, len);
            o += len;
            if (s[len] == '/')
                out[o++] = '/';
        }
        if (!s[len])
            break;
        s += len + 1;
    }
    out[o] = '\0';
    /* leading and trailing slashes go (the prefix is a directory) */
    size_t lead = strspn(out, "/");
    memmove(out, out + lead, o - lead + 1);
    o -= lead;
    while (o && out[o - 1] == '/')
        out[--o] = '\0';
    return out;
}

char *ckpt_store_key(const char *url)
{
    if (strncmp(url, "s3://", 5) != 0)
        return strdup(url);
    const char *slash = strchr(url + 5, '/');
    size_t blen = slash ? (size_t)(slash - url) : strlen(url);
    char *prefix = ckpt_clean_prefix(slash ? slash : "");
    char *key = prefix ? malloc(blen + strlen(prefix) + 2) : NULL;
    if (key)
        snprintf(key, blen + strlen(prefix) + 2, "%.*s%s%s", (int)blen, url, *prefix ? "/" : "",
                 prefix);
    free(prefix);
    return key;
}
