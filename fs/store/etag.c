/*
 * fs/store/etag.c - comparing ETags: the one rule every layer uses (a
 * backend checking a version, the core's metadata cache), below store.c so
 * that backends can call it.
 */
#include "store.h"

#include <string.h>

int store_etag_equal(const char *a, const char *b)
{
    if (strncmp(a, "W/", 2) == 0)
        a += 2;
    if (strncmp(b, "W/", 2) == 0)
        b += 2;
    size_t la = strlen(a), lb = strlen(b);
    if (la >= 2 && a[0] == '"' && a[la - 1] == '"')
        a++, la -= 2;
    if (lb >= 2 && b[0] == '"' && b[lb - 1] == '"')
        b++, lb -= 2;
    return la == lb && memcmp(a, b, la) == 0;
}
