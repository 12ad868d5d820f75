/*
 * fs/util/strutil.c - small string helpers shared by fs/ modules (see strutil.h).
 */
#include "strutil.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

char *str_printf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    if (vasprintf(&s, fmt, ap) < 0)
        s = NULL;
    va_end(ap);
    return s;
}

uint64_t str_hash(const char *s, size_t len)
{
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    return h;
}

int path_dir(const char *path, char *buf, size_t len)
{
    const char *slash = strrchr(path, '/');
    size_t n = slash ? (size_t)(slash - path) : 0;
    if (n >= len) {
        if (len)
            buf[0] = '\0';
        return -ENAMETOOLONG;
    }
    memcpy(buf, path, n);
    buf[n] = '\0';
    return 0;
}

const char *path_base(const char *path)
{
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

int path_at_or_below(const char *path, const char *dir)
{
    size_t n = strlen(dir);
    return n == 0 || (strncmp(path, dir, n) == 0 && (path[n] == '/' || path[n] == '\0'));
}
