/*
 * fs/store/store_attrs.c - the attribute metadata of objects (store.h's
 * struct store_attrs) as S3 user metadata in the s3fs convention: which
 * x-amz-meta-* headers an upload or a metadata copy sends, and reading them
 * back from a HEAD's answer. Pure functions (unit-tested in
 * tests/unit/test_store_attrs.c).
 */
#include "store.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#define HDR_MODE "x-amz-meta-mode"
#define HDR_UID "x-amz-meta-uid"
#define HDR_GID "x-amz-meta-gid"
#define HDR_MTIME "x-amz-meta-mtime"

int store_attrs_headers(const struct store_attrs *a, const char *names[STORE_ATTR_HDR_MAX],
                        char vals[STORE_ATTR_HDR_MAX][STORE_ATTR_VALUE_MAX])
{
    int n = 0;
    if (!a)
        return 0;
    if (a->set & STORE_ATTR_MODE) {
        names[n] = HDR_MODE;
        snprintf(vals[n++], STORE_ATTR_VALUE_MAX, "%" PRIu32, a->mode);
    }
    if (a->set & STORE_ATTR_UID) {
        names[n] = HDR_UID;
        snprintf(vals[n++], STORE_ATTR_VALUE_MAX, "%" PRIu32, a->uid);
    }
    if (a->set & STORE_ATTR_GID) {
        names[n] = HDR_GID;
        snprintf(vals[n++], STORE_ATTR_VALUE_MAX, "%" PRIu32, a->gid);
    }
    if (a->set & STORE_ATTR_MTIME) {
        int64_t sec = a->mtime_ns / 1000000000, ns = a->mtime_ns % 1000000000;
        if (ns < 0) { /* before the epoch: the fraction stays positive */
            sec--;
            ns += 1000000000;
        }
        names[n] = HDR_MTIME;
        if (ns)
            snprintf(vals[n++], STORE_ATTR_VALUE_MAX, "%" PRId64 ".%09" PRId64, sec, ns);
        else
            snprintf(vals[n++], STORE_ATTR_VALUE_MAX, "%" PRId64, sec);
    }
    return n;
}

/* Decimal digits v[0, len) as an unsigned value below limit. */
static int parse_uint(const char *v, size_t len, uint64_t limit, uint64_t *out)
{
    uint64_t x = 0;
    if (len == 0 || len > 20)
        return -1;
    for (size_t i = 0; i < len; i++) {
        if (v[i] < '0' || v[i] > '9')
            return -1;
        x = x * 10 + (uint64_t)(v[i] - '0');
        if (x >= limit)
            return -1;
    }
    *out = x;
    return 0;
}

/* "SEC" or "SEC.FRACTION" (up to 9 digits used), SEC possibly negative. */
static int parse_time(const char *v, size_t len, int64_t *ns)
{
    int neg = len > 0 && v[0] == '-';
    const char *dot = memchr(v, '.', len);
    size_t slen = dot ? (size_t)(dot - v) : len;
    uint64_t sec, frac = 0;
    if (parse_uint(v + neg, slen - (size_t)neg, (uint64_t)1 << 33, &sec) < 0)
        return -1;
    if (dot) {
        size_t flen = len - slen - 1;
        uint64_t scale = 1000000000;
        for (size_t i = 0; i < flen; i++) {
            char c = dot[1 + i];
            if (c < '0' || c > '9')
                return -1;
            if (scale > 1) {
                scale /= 10;
                frac += (uint64_t)(c - '0') * scale;
            }
        }
    }
    *ns = neg ? -((int64_t)sec * 1000000000) + (int64_t)frac
              : (int64_t)sec * 1000000000 + (int64_t)frac;
    return 0;
}

int store_attrs_parse_header(struct store_attrs *a, const char *name, size_t nlen,
                             const char *value, size_t vlen)
{
    uint64_t x;
#define IS(h) (nlen == sizeof h - 1 && strncasecmp(name, h, nlen) == 0)
    if (IS(HDR_MODE) && parse_uint(value, vlen, (uint64_t)1 << 32, &x) == 0) {
        a->mode = (uint32_t)x;
        a->set |= STORE_ATTR_MODE;
    } else if (IS(HDR_UID) && parse_uint(value, vlen, (uint64_t)1 << 32, &x) == 0) {
        a->uid = (uint32_t)x;
        a->set |= STORE_ATTR_UID;
    } else if (IS(HDR_GID) && parse_uint(value, vlen, (uint64_t)1 << 32, &x) == 0) {
        a->gid = (uint32_t)x;
        a->set |= STORE_ATTR_GID;
    } else if (IS(HDR_MTIME) && parse_time(value, vlen, &a->mtime_ns) == 0) {
        a->set |= STORE_ATTR_MTIME;
    } else {
        return 0;
    }
#undef IS
    return 1;
}
