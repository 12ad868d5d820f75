/*
 * fs/store/store.c - opening a store by URL: picks the backend from the scheme.
 *
 * "s3://bucket[/prefix]" -> S3 backend; "file:///path" or a plain path ->
 * local-directory backend; any other "scheme://" is refused by name.
 */
#include "store.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void store_fingerprint(const struct store_stat *st, char *buf, size_t len)
{
    assert(st && buf && len > 0);
    snprintf(buf, len, "etag=%s size=%llu", st->etag, (unsigned long long)st->size);
}

/* Split "bucket/some/prefix/" into bucket and a prefix without slashes at
 * either end. Returns -EINVAL for an empty or malformed bucket name, with
 * *why set to the rule it breaks. */
static int split_s3_url(const char *rest, char **bucket, char **prefix, const char **why)
{
    const char *slash = strchr(rest, '/');
    size_t blen = slash ? (size_t)(slash - rest) : strlen(rest);
    *why = "expected s3://BUCKET[/PREFIX]";
    if (blen == 0)
        return -EINVAL;
    *why = "a bucket name has 3 to 63 characters";
    if (blen < 3 || blen > 63)
        return -EINVAL;
    *why = "a bucket name holds only lowercase letters, digits, '-', '.' and '_'";
    for (size_t i = 0; i < blen; i++) {
        char c = rest[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_'))
            return -EINVAL;
    }
    const char *p = slash ? slash + 1 : "";
    while (*p == '/')
        p++;
    size_t plen = strlen(p);
    while (plen > 0 && p[plen - 1] == '/')
        plen--;
    *bucket = strndup(rest, blen);
    *prefix = strndup(p, plen);
    if (!*bucket || !*prefix) {
        free(*bucket);
        free(*prefix);
        return -ENOMEM;
    }
    return 0;
}

int store_open(const char *url, const struct store_options *opt, struct store **out, char *err,
               size_t errlen)
{
    static const struct store_options defaults;
    if (!opt)
        opt = &defaults;
    *out = NULL;
    if (strncmp(url, "s3://", 5) == 0) {
        char *bucket, *prefix;
        const char *why;
        int rc = split_s3_url(url + 5, &bucket, &prefix, &why);
        if (rc == -ENOMEM) {
            snprintf(err, errlen, "out of memory");
            return rc;
        }
        if (rc < 0) {
            snprintf(err, errlen, "invalid S3 URL '%s': %s", url, why);
            return rc;
        }
        rc = store_s3_open(bucket, prefix, opt, out, err, errlen);
        free(bucket);
        free(prefix);
        return rc;
    }
    if (strncmp(url, "file://", 7) == 0)
        return store_dir_open(url + 7, out, err, errlen);
    const char *sep = strstr(url, "://");
    if (sep) {
        snprintf(
            err, errlen,
            "unknown store scheme '%.*s' in '%s' (use s3://BUCKET[/PREFIX] or a local directory)",
            (int)(sep - url), url, url);
        return -EPROTONOSUPPORT;
    }
    return store_dir_open(url, out, err, errlen);
}
