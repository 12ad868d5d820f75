/*
 * fs/store/s3/store_s3_base.c - the S3 store's pieces below both of its halves
 * (see store_s3_base.h): the key and directory prefix of a store path, the
 * ETag comparison, and HEAD. store_s3.c and store_s3_write.c call these;
 * nothing here calls back into them.
 */
#include "store_s3_base.h"

#include "s3_client.h"
#include "store.h"
#include "strutil.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- small helpers ------------------------------------------------------ */

/* The key of a store path: "PREFIX/path", "path", or PREFIX for the root. */
char *s3_store_key(const struct s3_store *s, const char *path)
{
    if (!*s->prefix)
        return strdup(path);
    if (!*path)
        return strdup(s->prefix);
    return str_printf("%s/%s", s->prefix, path);
}

/* The ListObjectsV2 prefix for the directory at path: "" or "KEY/". */
char *s3_store_dir_prefix(const struct s3_store *s, const char *path)
{
    char *key = s3_store_key(s, path);
    if (!key || !*key)
        return key;
    char *p = str_printf("%s/", key);
    free(key);
    return p;
}

/* ---- HEAD --------------------------------------------------------------- */

/* read_answer of HEAD: size, mtime and ETag into the store_stat. */
static int head_answer(const struct s3_request *rq, struct s3_response *rs)
{
    struct store_stat *st = rq->answer;
    st->size = rs->content_length > 0 ? (uint64_t)rs->content_length : 0;
    st->mtime_ns = rs->last_modified * 1000000000;
    memcpy(st->etag, rs->etag, sizeof st->etag);
    st->attrs = rs->attrs;
    st->attrs.set |= STORE_ATTR_READ;
    return 0;
}

/* read_error of HEAD: 404 is -ENOENT. */
static int head_error(const struct s3_request *rq, struct s3_response *rs, int rc)
{
    (void)rq;
    return rc == 0 && rs->status == 404 ? -ENOENT : S3_USUAL;
}

int s3_store_head(struct s3_store *s, const char *key, struct store_stat *st)
{
    struct s3_request rq = {.what = "HEAD",
                            .method = "HEAD",
                            .key = key,
                            .max_retries = s->max_retries,
                            .counter = &s->base.counters.head_requests,
                            .read_answer = head_answer,
                            .read_error = head_error,
                            .answer = st};
    return s3_client_call(s->client, &rq);
}
