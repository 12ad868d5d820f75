/*
 * fs/store/s3/store_s3.c - the S3 store: open, stat/list/read of s3://BUCKET[/PREFIX]
 * on top of the S3 HTTP client engine (s3_client.c; this file does not see
 * curl.h). The write calls are in store_s3_write.c; the store's state, keys,
 * ETag comparison and HEAD that both use are below them in store_s3_base.c.
 *
 * Owns: what directories mean on S3 (common prefixes), the store_ops table
 * (stat, list, read, destroy here; put, mpu_*, copy, remove, mkdir, rmdir
 * from store_s3_write.c), validation of the
 * bucket name, the configuration (credentials, region, endpoint via
 * aws_config.c, defaults for connections, timeouts and retries, payload
 * signing), and the mount-time bucket check.
 *
 * Requests: HEAD for stat, ListObjectsV2 for list and the directory probe,
 * ranged GET (written straight into the caller's buffer) for read.
 * Credentials (secret key, session token, Authorization) are never logged.
 */
#include "ckey.h"
#include "store.h"
#include "strutil.h"

#include "aws_config.h"
#include "log.h"
#include "s3_client.h"
#include "s3_error.h"
#include "s3_xml.h"
#include "sigv4.h"
#include "store_s3_base.h"
#include "store_s3_write.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define S3_DEFAULT_MAX_CONNECTIONS 16
#define S3_DEFAULT_CONNECT_TIMEOUT_MS 5000
#define S3_DEFAULT_REQUEST_TIMEOUT_MS 10000 /* no progress for this long */
#define S3_DEFAULT_MAX_RETRIES 5
#define S3_MOUNT_CHECK_MAX_RETRIES 2

/* ---- stat --------------------------------------------------------------- */

/* Is there any key below "key/"? Then key is a directory, whose time is the
 * newest of the first STORE_DIR_TIME_KEYS keys below it (store.h): one page. */
static int probe_dir(struct s3_store *s, const char *key, struct store_stat *st)
{
    char *prefix = str_printf("%s/", key);
    if (!prefix)
        return -ENOMEM;
    struct s3_list_query lq = {
        .prefix = prefix, .max_keys = STORE_DIR_TIME_KEYS, .max_retries = s->max_retries};
    struct s3_list_page page;
    int rc = s3_client_list_page(s->client, &lq, &page);
    if (rc == 0) {
        for (size_t i = 0; i < page.nobjects && i < STORE_DIR_TIME_KEYS; i++)
            if (page.objects[i].mtime_ns > st->mtime_ns)
                st->mtime_ns = page.objects[i].mtime_ns;
        if (page.nobjects || page.nprefixes)
            st->is_dir = 1;
        else
            rc = -ENOENT;
        s3_list_page_free(&page);
    }
    free(prefix);
    return rc;
}

static int s3_stat(struct store *base, const char *path, struct store_stat *st)
{
    struct s3_store *s = (struct s3_store *)base;
    memset(st, 0, sizeof *st);
    if (!*path) {
        st->is_dir = 1;
        return 0;
    }
    char *key = s3_store_key(s, path);
    if (!key)
        return -ENOMEM;
    int rc = s3_store_head(s, key, st);
    if (rc == -ENOENT)
        rc = probe_dir(s, key, st);
    free(key);
    return rc;
}

/* ---- list --------------------------------------------------------------- */

struct list_ctx {
    store_list_fn fn;
    void *arg;
    const char *prefix; /* "" or "dir/" */
    size_t plen;
    char **files; /* names emitted so far, sorted: each name is emitted once */
    size_t nfiles, cap;
    int stopped;
    int seen_any; /* any key or prefix at all, markers included */
};

/* Index where name is or would go in ctx->files; *found set if present. */
static size_t files_find(const struct list_ctx *c, const char *name, int *found)
{
    size_t lo = 0, hi = c->nfiles;
    *found = 0;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int cmp = strcmp(c->files[mid], name);
        if (cmp == 0) {
            *found = 1;
            return mid;
        }
        if (cmp < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static int files_add(struct list_ctx *c, const char *name)
{
    int found;
    size_t at = files_find(c, name, &found);
    if (found)
        return 0;
    if (c->nfiles == c->cap) {
        size_t ncap = c->cap ? c->cap * 2 : 256;
        char **n = realloc(c->files, ncap * sizeof *n);
        if (!n)
            return -ENOMEM;
        c->files = n;
        c->cap = ncap;
    }
    char *copy = strdup(name);
    if (!copy)
        return -ENOMEM;
    memmove(c->files + at + 1, c->files + at, (c->nfiles - at) * sizeof *c->files);
    c->files[at] = copy;
    c->nfiles++;
    return 0;
}

/* A directory entry name is one usable path component. */
static int usable_name(const char *name)
{
    return *name && !strchr(name, '/') && strcmp(name, ".") != 0 && strcmp(name, "..") != 0;
}

static int emit_object(struct list_ctx *c, const struct s3_object *o)
{
    if (strncmp(o->key, c->prefix, c->plen) != 0)
        return 0;
    c->seen_any = 1;
    const char *name = o->key + c->plen;
    if (!usable_name(name)) /* "" is the directory's own marker object */
        return 0;
    if (files_add(c, name) < 0)
        return -ENOMEM;
    struct store_stat st = {.size = o->size, .mtime_ns = o->mtime_ns};
    memcpy(st.etag, o->etag, sizeof st.etag);
    c->stopped = c->fn(c->arg, name, &st) != 0;
    return 0;
}

static int emit_prefix(struct list_ctx *c, const char *p)
{
    if (strncmp(p, c->prefix, c->plen) != 0)
        return 0;
    c->seen_any = 1;
    char *name = strdup(p + c->plen);
    if (!name)
        return -ENOMEM;
    size_t n = strlen(name);
    if (n && name[n - 1] == '/')
        name[n - 1] = '\0';
    int found = 0, rc = 0;
    if (usable_name(name))
        files_find(c, name, &found);
    /* Emit each name once: a name may be both an object and a prefix, and
     * some servers (s3rver) repeat a common prefix on the next page. */
    if (usable_name(name) && !found && (rc = files_add(c, name)) == 0) {
        struct store_stat st = {.is_dir = 1};
        c->stopped = c->fn(c->arg, name, &st) != 0;
    }
    free(name);
    return rc;
}

static int emit_page(struct list_ctx *c, const struct s3_list_page *page)
{
    for (size_t i = 0; i < page->nobjects && !c->stopped; i++)
        if (emit_object(c, &page->objects[i]) < 0)
            return -ENOMEM;
    for (size_t i = 0; i < page->nprefixes && !c->stopped; i++)
        if (emit_prefix(c, page->prefixes[i]) < 0)
            return -ENOMEM;
    return 0;
}

/* Every page of ListObjectsV2 for prefix (with or without a delimiter), each
 * handed to on_page as it comes, until one is not truncated or on_page
 * returns nonzero (> 0: stop, < 0: that error). */
static int for_each_page(struct s3_store *s, const char *prefix, const char *start_after,
                         int delimiter, int (*on_page)(void *arg, const struct s3_list_page *page),
                         void *arg)
{
    char *token = NULL;
    int rc = 0;
    do {
        struct s3_list_query lq = {.prefix = prefix,
                                   .token = token,
                                   .start_after = start_after,
                                   .delimiter = delimiter,
                                   .max_retries = s->max_retries};
        struct s3_list_page page;
        char *next = NULL;
        rc = s3_client_list_page(s->client, &lq, &page);
        if (rc == 0) {
            rc = on_page(arg, &page);
            if (rc == 0 && page.is_truncated) {
                /* A truncated page must move on: no token, or the same one
                 * again, would list forever (a broken server). */
                if (!page.next_token || (token && strcmp(token, page.next_token) == 0)) {
                    log_error("s3: LIST s3://%s/%s: a truncated page without a new "
                              "continuation token",
                              s->bucket, prefix);
                    rc = -EIO;
                } else {
                    next = page.next_token;
                    page.next_token = NULL;
                }
            }
            s3_list_page_free(&page);
        }
        free(token);
        token = next;
    } while (rc == 0 && token);
    free(token);
    return rc < 0 ? rc : 0;
}

static int emit_list_page(void *arg, const struct s3_list_page *page)
{
    struct list_ctx *c = arg;
    int rc = emit_page(c, page);
    return rc < 0 ? rc : c->stopped;
}

/* An empty listing: -ENOTDIR if path is an object, else -ENOENT. */
static int empty_dir_result(struct s3_store *s, const char *path)
{
    struct store_stat st;
    char *key = s3_store_key(s, path);
    if (!key)
        return -ENOMEM;
    int rc = s3_store_head(s, key, &st);
    free(key);
    return rc == 0 ? -ENOTDIR : rc == -ENOENT ? -ENOENT : rc;
}

/* list() of dir, from the first name after `after` if not NULL (ListObjectsV2's
 * start-after); a listing from the start tells an empty directory from none. */
static int list_from(struct s3_store *s, const char *dir, const char *after, store_list_fn fn,
                     void *arg)
{
    char *prefix = s3_store_dir_prefix(s, dir);
    char *start = prefix && after ? str_printf("%s%s", prefix, after) : NULL;
    if (!prefix || (after && !start)) {
        free(prefix);
        return -ENOMEM;
    }
    struct list_ctx c = {.fn = fn, .arg = arg, .prefix = prefix, .plen = strlen(prefix)};
    int rc = for_each_page(s, prefix, start, 1, emit_list_page, &c);
    if (rc == 0 && !c.seen_any && *dir && !after)
        rc = empty_dir_result(s, dir);
    for (size_t i = 0; i < c.nfiles; i++)
        free(c.files[i]);
    free(c.files);
    free(start);
    free(prefix);
    return rc;
}

static int s3_list(struct store *base, const char *dir, store_list_fn fn, void *arg)
{
    return list_from((struct s3_store *)base, dir, NULL, fn, arg);
}

static int s3_list_after(struct store *base, const char *dir, const char *after, store_list_fn fn,
                         void *arg)
{
    return list_from((struct s3_store *)base, dir, after, fn, arg);
}

struct below_ctx {
    store_list_fn fn;
    void *arg;
    const char *prefix;
    size_t plen;
};

static int emit_below_page(void *arg, const struct s3_list_page *page)
{
    struct below_ctx *c = arg;
    for (size_t i = 0; i < page->nobjects; i++) {
        const struct s3_object *o = &page->objects[i];
        if (strncmp(o->key, c->prefix, c->plen) != 0)
            continue; /* not below (dir's own marker is "") */
        struct store_stat st = {.size = o->size, .mtime_ns = o->mtime_ns};
        memcpy(st.etag, o->etag, sizeof st.etag);
        if (c->fn(c->arg, o->key + c->plen, &st) != 0)
            return 1;
    }
    return 0;
}

/* Every key below dir, any depth, relative to dir: ListObjectsV2 without a
 * delimiter, page by page until fn says stop. */
static int s3_list_below(struct store *base, const char *dir, store_list_fn fn, void *arg)
{
    struct s3_store *s = (struct s3_store *)base;
    char *prefix = s3_store_dir_prefix(s, dir);
    if (!prefix)
        return -ENOMEM;
    struct below_ctx c = {.fn = fn, .arg = arg, .prefix = prefix, .plen = strlen(prefix)};
    int rc = for_each_page(s, prefix, NULL, 0, emit_below_page, &c);
    free(prefix);
    return rc;
}

/* ---- read --------------------------------------------------------------- */

struct read_want {
    uint64_t off;
    size_t len;
    const char *etag;
    store_progress_fn progress; /* or NULL */
    void *progress_arg;
    size_t *nread;                   /* the answer: bytes read */
    atomic_uint_fast64_t *get_bytes; /* counts them */
};

/* Whether a 2xx answer's headers show the asked version and range start:
 * 0, -ESTALE (another version) or -EIO (another range, or a range longer
 * than asked). An answer without an ETag is taken as the asked version: a
 * server that sends none (a static file server in front of the store)
 * cannot prove a version for any GET, so holding its bytes back until the
 * end would protect nothing and only make readers wait. */
static int check_headers(const struct read_want *w, const struct s3_response *rs)
{
    if (w->etag && *w->etag && rs->etag[0] && !store_etag_equal(w->etag, rs->etag))
        return -ESTALE;
    if (rs->status == 206)
        return rs->has_range && rs->range_start == w->off && rs->range_end >= rs->range_start &&
                       rs->range_end - rs->range_start < w->len
                   ? 0
                   : -EIO;
    /* 200: the server ignored Range and sent the object from byte 0 */
    return rs->status == 200 && w->off == 0 ? 0 : -EIO;
}

/* on_body of a progressive read: hand out the bytes that arrived, once the
 * headers prove they are the asked ones. */
static void read_on_body(const struct s3_request *rq, struct s3_response *rs)
{
    const struct read_want *w = rq->check_arg;
    if (rs->body_len <= rs->sink_final || rs->body_len > w->len || check_headers(w, rs) != 0)
        return;
    rs->sink_final = rs->body_len;
    w->progress(w->progress_arg, rs->body_len);
}

/* Validate a 2xx answer to a ranged GET: 0, -EAGAIN (short: retry), -ESTALE, -EIO. */
static int check_read(const struct s3_request *rq, struct s3_response *rs)
{
    const struct read_want *w = rq->check_arg;
    int rc = check_headers(w, rs);
    if (rc != 0)
        return rc;
    if (rs->content_length >= 0 && rs->body_len < (uint64_t)rs->content_length)
        return -EAGAIN;
    if (rs->status == 206) {
        uint64_t expect = rs->range_end - rs->range_start + 1;
        if (rs->body_len != expect)
            return rs->body_len < expect ? -EAGAIN : -EIO;
        if (rs->body_len < w->len && rs->range_end + 1 < rs->range_total)
            return -EAGAIN; /* short, though not at the end of the object */
    }
    return 0;
}

/* read_answer of a ranged GET: the bytes that came (none past the end). */
static int read_answer(const struct s3_request *rq, struct s3_response *rs)
{
    struct read_want *w = rq->answer;
    *w->nread = rs->past_eof ? 0 : rs->body_len;
    if (!rs->past_eof)
        atomic_fetch_add(w->get_bytes, rs->body_len);
    return 0;
}

/* read_error of a ranged GET: 416 (at or past the end) is 0 bytes. */
static int read_error(const struct s3_request *rq, struct s3_response *rs, int rc)
{
    (void)rq;
    return rc == 0 && rs->status == 416 ? 0 : S3_USUAL;
}

static int s3_read_progressive(struct store *base, const char *path, const char *etag, uint64_t off,
                               size_t len, void *buf, size_t *nread, store_progress_fn progress,
                               void *arg)
{
    struct s3_store *s = (struct s3_store *)base;
    *nread = 0;
    if (len == 0)
        return 0;
    if (off > UINT64_MAX - (len - 1))
        return -EINVAL;
    char range[64];
    snprintf(range, sizeof range, "bytes=%" PRIu64 "-%" PRIu64, off, off + (len - 1));
    char *key = s3_store_key(s, path);
    if (!key)
        return -ENOMEM;
    struct read_want want = {off, len, etag, progress, arg, nread, &s->base.counters.get_bytes};
    struct s3_request rq = {.what = "GET",
                            .method = "GET",
                            .key = key,
                            .range = range,
                            /* No If-Match: the ETag of the answer is checked
                             * instead (check_read), which protects the same way
                             * and also works through static read endpoints that
                             * answer If-Match with 412 (nginx with etag off). */
                            .if_match = NULL,
                            .sink = buf,
                            .sink_cap = len,
                            .max_retries = s->max_retries,
                            .counter = &s->base.counters.get_requests,
                            .on_body = progress ? read_on_body : NULL,
                            .check = check_read,
                            .check_arg = &want,
                            .read_answer = read_answer,
                            .read_error = read_error,
                            .answer = &want};
    int rc = s3_client_call(s->client, &rq);
    free(key);
    return rc;
}

static int s3_read(struct store *base, const char *path, const char *etag, uint64_t off, size_t len,
                   void *buf, size_t *nread)
{
    return s3_read_progressive(base, path, etag, off, len, buf, nread, NULL, NULL);
}

/* ---- destroy ------------------------------------------------------------ */

static void s3_destroy(struct store *base)
{
    struct s3_store *s = (struct s3_store *)base;
    if (!s)
        return;
    s3_client_destroy(s->client);
    creds_provider_destroy(s->creds);
    free(s->bucket);
    free(s->prefix);
    free(s->region);
    free(s->base.description);
    free(s);
}

/* S3 keys are at most 1024 bytes of UTF-8 (prefix included). */
#define S3_KEY_MAX 1024
#define S3_MAX_OBJECT (5ull << 40) /* 5 TiB: S3's largest object */

static int s3_check_name(struct store *base, const char *path)
{
    char *key = s3_store_key((struct s3_store *)base, path);
    if (!key)
        return -ENOMEM;
    size_t n = strlen(key);
    free(key);
    return n > S3_KEY_MAX ? -ENAMETOOLONG : 0;
}

static const struct store_ops s3_ops = {
    .scheme = "s3",
    .stat = s3_stat,
    .list = s3_list,
    .list_below = s3_list_below,
    .read = s3_read,
    .read_progressive = s3_read_progressive,
    .put = s3_store_put,
    .mpu_begin = s3_store_mpu_begin,
    .put_attrs = s3_store_put_attrs,
    .mpu_begin_attrs = s3_store_mpu_begin_attrs,
    .set_attrs = s3_store_set_attrs,
    .get_attrs = s3_store_get_attrs,
    .mpu_part = s3_store_mpu_part,
    .mpu_complete = s3_store_mpu_complete,
    .mpu_abort = s3_store_mpu_abort,
    .mpu_list = s3_store_mpu_list,
    .copy = s3_store_copy,
    .remove = s3_store_remove,
    .mkdir = s3_store_mkdir, /* a "dir/" marker object */
    .list_after = s3_list_after,
    .rmdir = s3_store_rmdir, /* rename: NULL (directories are key prefixes) */
    .check_name = s3_check_name,
    .name_max = S3_KEY_MAX,
    .destroy = s3_destroy,
};

/* ---- open: configuration ------------------------------------------------ */

static int valid_bucket_name(const char *b)
{
    size_t n = strlen(b);
    if (n == 0 || n > 255)
        return 0;
    for (const char *p = b; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '.' || *p == '-' || *p == '_'))
            return 0;
    return 1;
}

static void apply_settings(struct s3_store *s, const struct store_options *opt)
{
    s->max_connections =
        opt->max_connections > 0 ? opt->max_connections : S3_DEFAULT_MAX_CONNECTIONS;
    s->connect_timeout_ms =
        opt->connect_timeout_ms > 0 ? opt->connect_timeout_ms : S3_DEFAULT_CONNECT_TIMEOUT_MS;
    s->request_timeout_ms =
        opt->request_timeout_ms > 0 ? opt->request_timeout_ms : S3_DEFAULT_REQUEST_TIMEOUT_MS;
    s->max_retries = opt->max_retries < 0    ? 0
                     : opt->max_retries == 0 ? S3_DEFAULT_MAX_RETRIES
                                             : opt->max_retries;
    s->unsigned_payload = opt->unsigned_payload != 0;
}

/* The prefix as fs/store/ckey.h cleans it (no "." segments or outer slashes), so the
 * objects read and the description (the mount's index key) agree with
 * ckptfs-admin's key for the same URL. */
static char *clean_prefix(const char *prefix)
{
    return ckpt_clean_prefix(prefix ? prefix : "");
}

/* Resolve credentials, region and endpoint, and create the client for them. */
static int configure(struct s3_store *s, const struct store_options *opt, char *err, size_t errlen)
{
    struct aws_config_overrides ov = {opt->endpoint_url, opt->region, opt->profile};
    struct aws_config cfg;
    int rc = aws_config_resolve(&ov, &cfg, err, errlen);
    if (rc < 0)
        return rc;
    /* fetches the first credentials now: a broken source fails the mount */
    rc = creds_provider_create(&cfg, &s->creds, err, errlen);
    if (rc < 0) {
        aws_config_free(&cfg);
        return rc;
    }
    if (!s->creds && cfg.cred_source == AWS_CRED_NONE)
        log_warn("s3: no AWS credentials found (environment, profile '%s'): sending unsigned "
                 "requests",
                 cfg.profile ? cfg.profile : "default");
    char *endpoint = cfg.endpoint_url ? strdup(cfg.endpoint_url)
                                      : str_printf("https://s3.%s.amazonaws.com", cfg.region);
    s->region = cfg.region;
    cfg.region = NULL;
    struct s3_client_config cc = {.bucket = s->bucket,
                                  .endpoint_url = endpoint,
                                  .force_path_style = opt->force_path_style,
                                  .addressing = cfg.addressing,
                                  .region = s->region,
                                  .creds = s->creds,
                                  .max_connections = s->max_connections,
                                  .connect_timeout_ms = s->connect_timeout_ms,
                                  .request_timeout_ms = s->request_timeout_ms,
                                  .unsigned_payload = s->unsigned_payload,
                                  .counters = &s->base.counters};
    rc = endpoint ? s3_client_create(&cc, &s->client, err, errlen) : -ENOMEM;
    aws_config_free(&cfg); /* wipes the secrets: the provider has its own copies */
    free(endpoint);
    return rc;
}

/* ---- open: the mount check ---------------------------------------------- */

/* Where the mount check's hooks report. */
struct mount_answer {
    struct s3_store *s;
    char *err;
    size_t errlen;
};

/* read_answer of the mount check: the answer must be a ListObjectsV2 result. */
static int mount_check_answer(const struct s3_request *rq, struct s3_response *rs)
{
    struct mount_answer *a = rq->answer;
    struct s3_list_page page;
    int rc = s3_xml_parse_list(rs->body, rs->body_len, &page);
    if (rc < 0) {
        snprintf(a->err, a->errlen, "%s answered, but not with an S3 ListObjectsV2 result",
                 s3_client_endpoint(a->s->client));
        rc = -EIO;
    }
    s3_list_page_free(&page);
    return rc;
}

/* read_error of the mount check: a user-facing line in err, for any failure. */
static int mount_check_error(const struct s3_request *rq, struct s3_response *rs, int rc)
{
    struct mount_answer *a = rq->answer;
    struct s3_store *s = a->s;
    struct s3_mount_failure f = {.bucket = s->bucket,
                                 .prefix = s->prefix,
                                 .http_status = rc < 0 ? 0 : rs->status,
                                 .code = rs->err.code,
                                 .message = rs->err.message,
                                 .bucket_region =
                                     rs->bucket_region[0] ? rs->bucket_region : rs->err.region,
                                 .region = s->region,
                                 .url = s3_client_endpoint(s->client),
                                 .transport_msg = s3_response_transport_message(rs)};
    if (rc < 0)
        log_debug("s3: mount check: %s", rs->transport_err);
    else
        rc = -s3_error_classify(rs->status, rs->err.code).final_err;
    s3_error_mount_message(&f, a->err, a->errlen);
    return rc;
}

/* One ListObjectsV2 (max-keys=1) on the prefix: the bucket exists, we may
 * list it, and the answer is S3. On failure a user-facing line goes to err. */
static int mount_check(struct s3_store *s, char *err, size_t errlen)
{
    char *prefix = s3_store_dir_prefix(s, "");
    if (!prefix)
        return -ENOMEM;
    struct sigv4_pair q[] = {
        {"list-type", "2"}, {"encoding-type", "url"}, {"max-keys", "1"}, {"prefix", prefix}};
    int retries =
        s->max_retries < S3_MOUNT_CHECK_MAX_RETRIES ? s->max_retries : S3_MOUNT_CHECK_MAX_RETRIES;
    struct mount_answer answer = {s, err, errlen};
    struct s3_request rq = {.what = "LIST",
                            .method = "GET",
                            .query = q,
                            .nquery = 4,
                            .max_retries = retries,
                            .quiet = 1,
                            .counter = &s->base.counters.list_requests,
                            .read_answer = mount_check_answer,
                            .read_error = mount_check_error,
                            .answer = &answer};
    int rc = s3_client_call(s->client, &rq);
    free(prefix);
    return rc;
}

int store_s3_open(const char *bucket, const char *prefix, const struct store_options *opt,
                  struct store **out, char *err, size_t errlen)
{
    static const struct store_options defaults;
    *out = NULL;
    if (err && errlen)
        err[0] = '\0';
    if (!opt)
        opt = &defaults;
    if (!bucket || !valid_bucket_name(bucket)) {
        snprintf(err, errlen, "invalid S3 bucket name '%s'", bucket ? bucket : "");
        return -EINVAL;
    }
    int rc = s3_client_global_init(err, errlen);
    if (rc < 0)
        return rc;
    struct s3_store *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    s->base.ops = &s3_ops;
    s->base.max_object = S3_MAX_OBJECT;
    apply_settings(s, opt);
    s->bucket = strdup(bucket);
    s->prefix = clean_prefix(prefix);
    rc = s->bucket && s->prefix ? 0 : -ENOMEM;
    if (rc == 0)
        s->base.description = *s->prefix ? str_printf("s3://%s/%s", bucket, s->prefix)
                                         : str_printf("s3://%s", bucket);
    if (rc == 0)
        rc = configure(s, opt, err, errlen);
    if (rc == 0)
        rc = mount_check(s, err, errlen);
    if (rc < 0) {
        if (rc == -ENOMEM && err && errlen && !err[0])
            snprintf(err, errlen, "out of memory");
        s3_destroy(&s->base);
        return rc;
    }
    log_info("s3: %s via %s (%s, region %s, up to %d connections)", s->base.description,
             s3_client_endpoint(s->client),
             s3_client_path_style(s->client) ? "path-style" : "virtual-hosted", s->region,
             s->max_connections);
    *out = &s->base;
    return 0;
}
