/*
 * fs/store_s3.c - the S3 store: stat/list/read of s3://BUCKET[/PREFIX] over
 * HTTP(S) with libcurl (the only file that includes curl.h).
 *
 * Owns: endpoint and addressing (path-style / virtual-hosted), a pool of
 * CURL easy handles (keep-alive connections, bounded parallelism), request
 * signing via sigv4.c, retries with jittered exponential backoff, mapping of
 * failures to errno via s3_error.c, and the mount-time bucket check.
 *
 * Requests: HEAD for stat, ListObjectsV2 for list and the directory probe,
 * ranged GET (written straight into the caller's buffer) for read.
 * Credentials (secret key, session token, Authorization) are never logged.
 */
#include "store.h"

#include "aws_config.h"
#include "log.h"
#include "s3_error.h"
#include "s3_xml.h"
#include "sigv4.h"

#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <openssl/crypto.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#define S3_DEFAULT_MAX_CONNECTIONS 16
#define S3_DEFAULT_CONNECT_TIMEOUT_MS 5000
#define S3_DEFAULT_REQUEST_TIMEOUT_MS 30000
#define S3_DEFAULT_MAX_RETRIES 5
#define S3_MOUNT_CHECK_MAX_RETRIES 2
#define S3_BACKOFF_BASE_MS 100
#define S3_BACKOFF_CAP_MS 5000
#define S3_ERROR_BODY_MAX (64 * 1024)
#define S3_RECV_BUFFER (256 * 1024)
#define S3_MIN_RATE (64 * 1024) /* bytes/s assumed by the hard timeout */
#define S3_USER_AGENT "ckptfs/0.1"

/* ---- state -------------------------------------------------------------- */

struct s3_store {
    struct store base;
    char *bucket;
    char *prefix;      /* "" or "a/b" */
    char *url_base;    /* "scheme://host[:port]" requests go to */
    char *host_header; /* the Host header, as signed */
    char *path_base;   /* raw path before the key: "" (virtual-hosted) or "/bucket" */
    char *endpoint;    /* endpoint URL for messages, ending in '/' */
    char *region;
    char *access_key_id; /* NULL when anonymous */
    char *secret_access_key;
    char *session_token;
    int path_style;
    int max_connections, connect_timeout_ms, request_timeout_ms, max_retries;
    atomic_int reached; /* the endpoint has given an HTTP answer at least once */

    int pool_ready; /* the mutexes below are initialized */
    pthread_mutex_t pool_mu;
    pthread_cond_t pool_cv;
    CURL **idle; /* LIFO of idle handles: the most recently used first */
    int nidle, created;
    CURLSH *share; /* DNS cache and TLS sessions shared by the handles */
    pthread_mutex_t share_mu[CURL_LOCK_DATA_LAST];
};

struct s3_response;

/* One HTTP request, described before it is sent. */
struct s3_request {
    const char *what;   /* "HEAD", "GET", "LIST" for logs */
    const char *method; /* "HEAD" or "GET" */
    const char *key;    /* object key, or NULL for a bucket-level request */
    const struct sigv4_pair *query;
    size_t nquery;
    const char *range;    /* Range header value or NULL */
    const char *if_match; /* If-Match header value or NULL */
    char *sink;           /* fixed body buffer (reads), or NULL for a growable one */
    size_t sink_cap;
    int max_retries;
    int quiet;                     /* don't log the final failure (mount check reports it itself) */
    atomic_uint_fast64_t *counter; /* bumped once per attempt */
    /* Checks a 2xx answer: 0 ok, -EAGAIN retry, other negative: fail. */
    int (*check)(const struct s3_request *rq, struct s3_response *rs);
    const void *check_arg;
};

/* What came back. */
struct s3_response {
    long status; /* 0 = no HTTP answer */
    CURLcode curl_rc;
    char curl_err[CURL_ERROR_SIZE];
    int64_t content_length; /* -1 if absent */
    int has_range;          /* Content-Range: bytes start-end/total */
    uint64_t range_start, range_end, range_total;
    char etag[STORE_ETAG_MAX];
    int64_t last_modified;
    char request_id[128];
    char bucket_region[64];
    char *body; /* 2xx body: the caller's sink, or malloc'ed */
    size_t body_len, body_cap;
    int body_fixed;
    int overflow; /* more body than the sink holds */
    int past_eof; /* 206 whose Content-Range starts at or past the object's end */
    char *err_body;
    size_t err_len;
    struct s3_error_body err; /* parsed <Error>, if any */
};

/* ---- small helpers ------------------------------------------------------ */

static char *str_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *str_printf(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    if (vasprintf(&s, fmt, ap) < 0)
        s = NULL;
    va_end(ap);
    return s;
}

/* Secret strings are wiped before they are freed. */
static void free_secret(char *s)
{
    if (s) {
        OPENSSL_cleanse(s, strlen(s));
        free(s);
    }
}

/* The key of a store path: "PREFIX/path", "path", or PREFIX for the root. */
static char *key_of(const struct s3_store *s, const char *path)
{
    if (!*s->prefix)
        return strdup(path);
    if (!*path)
        return strdup(s->prefix);
    return str_printf("%s/%s", s->prefix, path);
}

/* The ListObjectsV2 prefix for the directory at path: "" or "KEY/". */
static char *dir_prefix_of(const struct s3_store *s, const char *path)
{
    char *key = key_of(s, path);
    if (!key || !*key)
        return key;
    char *p = str_printf("%s/", key);
    free(key);
    return p;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Full-jitter exponential backoff: uniform in [0, min(cap, base * 2^attempt)]. */
static long backoff_ms(int attempt)
{
    static _Thread_local unsigned seed;
    if (!seed)
        seed = (unsigned)now_ms() ^ (unsigned)(uintptr_t)&seed ^ (unsigned)pthread_self();
    long ceiling = S3_BACKOFF_BASE_MS;
    for (int i = 0; i < attempt && ceiling < S3_BACKOFF_CAP_MS; i++)
        ceiling *= 2;
    if (ceiling > S3_BACKOFF_CAP_MS)
        ceiling = S3_BACKOFF_CAP_MS;
    return (long)(rand_r(&seed) % (unsigned)(ceiling + 1));
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* ETags compared without quotes and a weak "W/" marker. */
static int etag_equal(const char *a, const char *b)
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

/* ---- the handle pool ---------------------------------------------------- */

static void share_lock(CURL *h, curl_lock_data data, curl_lock_access access, void *arg)
{
    (void)h;
    (void)access;
    struct s3_store *s = arg;
    if ((unsigned)data < CURL_LOCK_DATA_LAST)
        pthread_mutex_lock(&s->share_mu[data]);
}

static void share_unlock(CURL *h, curl_lock_data data, void *arg)
{
    (void)h;
    struct s3_store *s = arg;
    if ((unsigned)data < CURL_LOCK_DATA_LAST)
        pthread_mutex_unlock(&s->share_mu[data]);
}

/* Options that never change for a handle. */
static CURL *handle_new(struct s3_store *s)
{
    CURL *h = curl_easy_init();
    if (!h)
        return NULL;
    curl_easy_setopt(h, CURLOPT_SHARE, s->share);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_USERAGENT, S3_USER_AGENT);
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
#else
    curl_easy_setopt(h, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(h, CURLOPT_PATH_AS_IS, 1L); /* keys may contain "./" */
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(h, CURLOPT_BUFFERSIZE, (long)S3_RECV_BUFFER);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)s->connect_timeout_ms);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, (long)((s->request_timeout_ms + 999) / 1000));
    return h;
}

/* A handle for one request; blocks while max_connections are in flight. */
static CURL *pool_acquire(struct s3_store *s)
{
    CURL *h = NULL;
    pthread_mutex_lock(&s->pool_mu);
    while (s->nidle == 0 && s->created >= s->max_connections)
        pthread_cond_wait(&s->pool_cv, &s->pool_mu);
    if (s->nidle > 0)
        h = s->idle[--s->nidle];
    else
        s->created++;
    pthread_mutex_unlock(&s->pool_mu);
    if (h)
        return h;
    h = handle_new(s);
    if (!h) {
        pthread_mutex_lock(&s->pool_mu);
        s->created--;
        pthread_cond_signal(&s->pool_cv);
        pthread_mutex_unlock(&s->pool_mu);
    }
    return h;
}

static void pool_release(struct s3_store *s, CURL *h)
{
    pthread_mutex_lock(&s->pool_mu);
    s->idle[s->nidle++] = h;
    pthread_cond_signal(&s->pool_cv);
    pthread_mutex_unlock(&s->pool_mu);
}

/* ---- response callbacks ------------------------------------------------- */

static void copy_header_value(char *dst, size_t cap, const char *v, size_t len)
{
    if (len >= cap)
        len = cap - 1;
    memcpy(dst, v, len);
    dst[len] = '\0';
}

static void response_reset_headers(struct s3_response *rs)
{
    rs->content_length = -1;
    rs->has_range = 0;
    rs->etag[0] = rs->request_id[0] = rs->bucket_region[0] = '\0';
    rs->last_modified = 0;
}

/* One header: name (len nlen) and trimmed value (len vlen). */
static void on_header_field(struct s3_response *rs, const char *name, size_t nlen, const char *v,
                            size_t vlen)
{
    char tmp[256];
    copy_header_value(tmp, sizeof tmp, v, vlen);
#define IS(h) (nlen == sizeof(h) - 1 && strncasecmp(name, h, nlen) == 0)
    if (IS("content-length")) {
        char *end;
        long long cl = strtoll(tmp, &end, 10);
        rs->content_length = (*tmp && !*end && cl >= 0) ? cl : -1;
    } else if (IS("content-range")) {
        rs->has_range = sscanf(tmp, "bytes %" SCNu64 "-%" SCNu64 "/%" SCNu64, &rs->range_start,
                               &rs->range_end, &rs->range_total) == 3;
    } else if (IS("etag")) {
        if (vlen < sizeof rs->etag)
            copy_header_value(rs->etag, sizeof rs->etag, v, vlen);
    } else if (IS("last-modified")) {
        time_t t = curl_getdate(tmp, NULL);
        rs->last_modified = t < 0 ? 0 : (int64_t)t;
    } else if (IS("x-amz-request-id")) {
        copy_header_value(rs->request_id, sizeof rs->request_id, v, vlen);
    } else if (IS("x-amz-bucket-region")) {
        copy_header_value(rs->bucket_region, sizeof rs->bucket_region, v, vlen);
    }
#undef IS
}

static size_t on_header(char *data, size_t size, size_t n, void *arg)
{
    struct s3_response *rs = arg;
    size_t len = size * n;
    if (len <= 2 && rs->status == 206 && rs->has_range && rs->range_start >= rs->range_total) {
        /* Some servers (s3rver) answer a range on an empty object with
         * "206, bytes 0-0/0" and a body that never comes: that is EOF. */
        rs->past_eof = 1;
        return 0; /* aborts the transfer */
    }
    if (len >= 5 && strncmp(data, "HTTP/", 5) == 0) {
        /* a new status line (also after 100 Continue): forget earlier headers */
        response_reset_headers(rs);
        const char *sp = memchr(data, ' ', len);
        rs->status = sp ? strtol(sp + 1, NULL, 10) : 0;
        return len;
    }
    const char *colon = memchr(data, ':', len);
    if (!colon)
        return len;
    const char *v = colon + 1, *end = data + len;
    while (v < end && (*v == ' ' || *v == '\t'))
        v++;
    while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' ' || end[-1] == '\t'))
        end--;
    on_header_field(rs, data, (size_t)(colon - data), v, (size_t)(end - v));
    return len;
}

/* Error bodies are kept (bounded) for their <Code>; excess is dropped. */
static size_t sink_error_body(struct s3_response *rs, const char *data, size_t len)
{
    size_t room = S3_ERROR_BODY_MAX - rs->err_len;
    size_t take = len < room ? len : room;
    if (take) {
        if (!rs->err_body)
            rs->err_body = malloc(S3_ERROR_BODY_MAX);
        if (!rs->err_body)
            return len;
        memcpy(rs->err_body + rs->err_len, data, take);
        rs->err_len += take;
    }
    return len;
}

static size_t on_body(char *data, size_t size, size_t n, void *arg)
{
    struct s3_response *rs = arg;
    size_t len = size * n;
    if (rs->status < 200 || rs->status > 299)
        return sink_error_body(rs, data, len);
    if (len > rs->body_cap - rs->body_len) {
        if (rs->body_fixed || rs->body_len + len > S3_XML_MAX_BYTES) {
            rs->overflow = 1;
            return 0; /* aborts the transfer with CURLE_WRITE_ERROR */
        }
        size_t cap = rs->body_cap ? rs->body_cap : 64 * 1024;
        while (cap - rs->body_len < len)
            cap *= 2;
        char *p = realloc(rs->body, cap);
        if (!p)
            return 0;
        rs->body = p;
        rs->body_cap = cap;
    }
    memcpy(rs->body + rs->body_len, data, len);
    rs->body_len += len;
    return len;
}

static void response_init(struct s3_response *rs, const struct s3_request *rq)
{
    memset(rs, 0, sizeof *rs);
    response_reset_headers(rs);
    if (rq->sink) {
        rs->body = rq->sink;
        rs->body_cap = rq->sink_cap;
        rs->body_fixed = 1;
    }
}

/* Forget the previous attempt's answer, keeping the body buffer. */
static void response_rewind(struct s3_response *rs)
{
    char *body = rs->body, *err_body = rs->err_body;
    size_t body_cap = rs->body_cap;
    int fixed = rs->body_fixed;
    memset(rs, 0, sizeof *rs);
    response_reset_headers(rs);
    rs->body = body;
    rs->body_cap = body_cap;
    rs->body_fixed = fixed;
    rs->err_body = err_body;
}

static void response_free(struct s3_response *rs)
{
    if (!rs->body_fixed)
        free(rs->body);
    free(rs->err_body);
    rs->body = rs->err_body = NULL;
}

/* ---- building and sending one request ----------------------------------- */

/* Raw (unencoded) path: path_base + "/" + key, or the bucket itself. */
static char *request_path(const struct s3_store *s, const char *key)
{
    if (!key)
        return strdup(*s->path_base ? s->path_base : "/");
    return str_printf("%s/%s", s->path_base, key);
}

static int add_header(struct curl_slist **list, const char *name, const char *value)
{
    char *line = str_printf("%s: %s", name, value);
    struct curl_slist *n = line ? curl_slist_append(*list, line) : NULL;
    if (line) {
        OPENSSL_cleanse(line, strlen(line));
        free(line);
    }
    if (!n)
        return -ENOMEM;
    *list = n;
    return 0;
}

/* Signed headers for rq (and Authorization unless anonymous) into *list. */
static int sign_headers(const struct s3_store *s, const struct s3_request *rq, const char *path,
                        struct curl_slist **list)
{
    char date[17];
    sigv4_amz_date(time(NULL), date);
    struct sigv4_pair h[6];
    size_t nh = 0;
    h[nh++] = (struct sigv4_pair){"Host", s->host_header};
    h[nh++] = (struct sigv4_pair){"x-amz-content-sha256", SIGV4_EMPTY_SHA256};
    h[nh++] = (struct sigv4_pair){"x-amz-date", date};
    if (s->session_token)
        h[nh++] = (struct sigv4_pair){"x-amz-security-token", s->session_token};
    if (rq->range)
        h[nh++] = (struct sigv4_pair){"Range", rq->range};
    if (rq->if_match)
        h[nh++] = (struct sigv4_pair){"If-Match", rq->if_match};
    for (size_t i = 0; i < nh; i++)
        if (add_header(list, h[i].name, h[i].value) < 0)
            return -ENOMEM;
    if (!s->access_key_id)
        return 0;
    struct sigv4_request req = {rq->method, path, rq->query, rq->nquery, h, nh, SIGV4_EMPTY_SHA256};
    struct sigv4_credentials cred = {s->access_key_id, s->secret_access_key, s->session_token};
    char *auth = sigv4_authorization(&req, &cred, date, s->region, "s3");
    int rc = auth ? add_header(list, "Authorization", auth) : -ENOMEM;
    if (auth) {
        OPENSSL_cleanse(auth, strlen(auth));
        free(auth);
    }
    return rc;
}

/* The URL of rq: url_base + encoded path + canonical query. */
static char *request_url(const struct s3_store *s, const struct s3_request *rq, const char *path)
{
    char *epath = sigv4_uri_encode(path, 1);
    char *query = sigv4_canonical_query(rq->query, rq->nquery);
    char *url = NULL;
    if (epath && query)
        url = str_printf("%s%s%s%s", s->url_base, epath, *query ? "?" : "", query);
    free(epath);
    free(query);
    return url;
}

/* Send rq once on handle h; the outcome is in rs (curl_rc, status, body). */
static void send_once(const struct s3_store *s, CURL *h, const struct s3_request *rq,
                      struct s3_response *rs, long timeout_ms)
{
    struct curl_slist *headers = NULL;
    char *path = request_path(s, rq->key);
    char *url = path ? request_url(s, rq, path) : NULL;
    if (!url || sign_headers(s, rq, path, &headers) < 0) {
        rs->curl_rc = CURLE_OUT_OF_MEMORY;
        snprintf(rs->curl_err, sizeof rs->curl_err, "out of memory");
    } else {
        curl_easy_setopt(h, CURLOPT_URL, url);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
        curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
        curl_easy_setopt(h, CURLOPT_NOBODY, strcmp(rq->method, "HEAD") == 0 ? 1L : 0L);
        curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
        curl_easy_setopt(h, CURLOPT_HEADERDATA, rs);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, rs);
        curl_easy_setopt(h, CURLOPT_ERRORBUFFER, rs->curl_err);
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout_ms);
        rs->curl_rc = curl_easy_perform(h);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, NULL);
        curl_easy_setopt(h, CURLOPT_ERRORBUFFER, NULL);
    }
    curl_slist_free_all(headers);
    free(url);
    free(path);
}

/* ---- outcomes, retries, failures ---------------------------------------- */

static enum s3_transport transport_of(CURLcode rc)
{
    switch (rc) {
    case CURLE_OK:
        return S3T_OK;
    case CURLE_OPERATION_TIMEDOUT:
        return S3T_TIMEOUT;
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
        return S3T_RESOLVE;
    case CURLE_COULDNT_CONNECT:
        return S3T_REFUSED;
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
        return S3T_RESET;
    case CURLE_SSL_CONNECT_ERROR:
        return S3T_TLS_HANDSHAKE;
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_CACERT_BADFILE:
        return S3T_TLS;
    default:
        return S3T_OTHER;
    }
}

static int retry_allowed(const struct s3_store *s, enum s3_retry r)
{
    return r == S3_RETRY || (r == S3_RETRY_IF_REACHED && atomic_load(&s->reached));
}

/* Judge one attempt. Returns 0 when there is an HTTP answer for the caller
 * (any status) or a negative errno; *retry says whether to try again and
 * reason describes the problem for logs. */
static int judge(struct s3_store *s, const struct s3_request *rq, struct s3_response *rs,
                 int *retry, char *reason, size_t rlen)
{
    *retry = 0;
    if (rs->status > 0)
        atomic_store(&s->reached, 1);
    if (rs->past_eof)
        return 0;
    if (rs->curl_rc != CURLE_OK) {
        if (rs->overflow) {
            snprintf(reason, rlen, "response body larger than requested");
            return -EIO;
        }
        struct s3_error_class c = s3_error_transport(transport_of(rs->curl_rc));
        *retry = retry_allowed(s, c.retry);
        snprintf(reason, rlen, "%s",
                 rs->curl_err[0] ? rs->curl_err : curl_easy_strerror(rs->curl_rc));
        return -c.final_err;
    }
    if (rs->status >= 200 && rs->status <= 299) {
        int rc = rq->check ? rq->check(rq, rs) : 0;
        if (rc == -EAGAIN) {
            *retry = 1;
            snprintf(reason, rlen, "short body (%zu bytes)", rs->body_len);
            return -EIO;
        }
        if (rc < 0)
            snprintf(reason, rlen, "%s",
                     rc == -ESTALE ? "object changed (ETag differs)"
                                   : "unexpected response body or range");
        return rc;
    }
    if (rs->err_len > 0)
        s3_xml_parse_error(rs->err_body, rs->err_len, &rs->err);
    struct s3_error_class c = s3_error_classify(rs->status, rs->err.code);
    *retry = retry_allowed(s, c.retry);
    snprintf(reason, rlen, "HTTP %ld %s", rs->status, rs->err.code[0] ? rs->err.code : "");
    return 0;
}

static const char *request_id(const struct s3_response *rs)
{
    return rs->err.request_id[0] ? rs->err.request_id : rs->request_id[0] ? rs->request_id : "-";
}

/* A request that failed for good without a usable HTTP answer. */
static void note_failure(struct s3_store *s, const struct s3_request *rq,
                         const struct s3_response *rs, int rc, const char *reason, int attempts)
{
    atomic_fetch_add(&s->base.counters.errors, 1);
    if (!rq->quiet)
        log_msg(rc == -ESTALE ? LOG_LVL_WARN : LOG_LVL_ERROR,
                "s3: %s s3://%s/%s failed after %d attempt%s: %s (request id %s)", rq->what,
                s->bucket, rq->key ? rq->key : "", attempts, attempts == 1 ? "" : "s", reason,
                request_id(rs));
}

/* An HTTP error answer that the caller does not expect: log, count, errno. */
static int http_failure(struct s3_store *s, const struct s3_request *rq,
                        const struct s3_response *rs)
{
    struct s3_error_class c = s3_error_classify(rs->status, rs->err.code);
    atomic_fetch_add(&s->base.counters.errors, 1);
    if (!rq->quiet)
        log_warn("s3: %s s3://%s/%s: HTTP %ld %s: %s (request id %s)", rq->what, s->bucket,
                 rq->key ? rq->key : "", rs->status, rs->err.code[0] ? rs->err.code : "-",
                 rs->err.message[0] ? rs->err.message : "no message", request_id(rs));
    return -c.final_err;
}

/* Hard cap on one attempt: generous, the no-progress timeout does the work. */
static long hard_timeout_ms(const struct s3_store *s, size_t bytes)
{
    return 4L * s->request_timeout_ms + (long)(bytes / S3_MIN_RATE) * 1000L;
}

/* Send rq with retries. 0: rs holds an HTTP answer (check rs->status; free
 * with response_free). Negative errno: failed for good (logged, counted). */
static int s3_perform(struct s3_store *s, const struct s3_request *rq, struct s3_response *rs)
{
    response_init(rs, rq);
    long timeout = hard_timeout_ms(s, rq->sink ? rq->sink_cap : 0);
    for (int attempt = 0;; attempt++) {
        if (attempt)
            response_rewind(rs);
        CURL *h = pool_acquire(s);
        if (!h)
            return -ENOMEM;
        if (rq->counter)
            atomic_fetch_add(rq->counter, 1);
        int64_t started = now_ms();
        send_once(s, h, rq, rs, timeout);
        pool_release(s, h);
        int retry;
        char reason[CURL_ERROR_SIZE + 64];
        int rc = judge(s, rq, rs, &retry, reason, sizeof reason);
        log_debug("s3: %s s3://%s/%s%s%s -> %ld, %llu bytes in %lld ms", rq->what, s->bucket,
                  rq->key ? rq->key : "", rq->range ? " " : "", rq->range ? rq->range : "",
                  rs->status, (unsigned long long)rs->body_len, (long long)(now_ms() - started));
        if (!retry || attempt >= rq->max_retries) {
            if (rc < 0)
                note_failure(s, rq, rs, rc, reason, attempt + 1);
            return rc;
        }
        long delay = backoff_ms(attempt);
        atomic_fetch_add(&s->base.counters.retries, 1);
        log_info("s3: %s s3://%s/%s: %s; retry %d/%d in %ld ms", rq->what, s->bucket,
                 rq->key ? rq->key : "", reason, attempt + 1, rq->max_retries, delay);
        sleep_ms(delay);
    }
}

/* ---- ListObjectsV2 ------------------------------------------------------ */

struct list_query {
    const char *prefix;
    const char *token; /* continuation token or NULL */
    int delimiter;     /* group by '/' */
    int max_keys;      /* 0 = server default (1000) */
};

/* One ListObjectsV2 page into *page. */
static int list_page(struct s3_store *s, const struct list_query *lq, struct s3_list_page *page)
{
    struct sigv4_pair q[5];
    size_t nq = 0;
    char max_keys[16];
    q[nq++] = (struct sigv4_pair){"list-type", "2"};
    q[nq++] = (struct sigv4_pair){"prefix", lq->prefix};
    if (lq->delimiter)
        q[nq++] = (struct sigv4_pair){"delimiter", "/"};
    if (lq->max_keys > 0) {
        snprintf(max_keys, sizeof max_keys, "%d", lq->max_keys);
        q[nq++] = (struct sigv4_pair){"max-keys", max_keys};
    }
    if (lq->token)
        q[nq++] = (struct sigv4_pair){"continuation-token", lq->token};
    struct s3_request rq = {.what = "LIST",
                            .method = "GET",
                            .key = NULL,
                            .query = q,
                            .nquery = nq,
                            .max_retries = s->max_retries,
                            .counter = &s->base.counters.list_requests};
    struct s3_response rs;
    memset(page, 0, sizeof *page);
    int rc = s3_perform(s, &rq, &rs);
    if (rc == 0 && (rs.status < 200 || rs.status > 299)) {
        rc = http_failure(s, &rq, &rs);
    } else if (rc == 0) {
        rc = s3_xml_parse_list(rs.body, rs.body_len, page);
        if (rc < 0) {
            atomic_fetch_add(&s->base.counters.errors, 1);
            log_error("s3: LIST s3://%s/%s: malformed ListObjectsV2 response (%s)", s->bucket,
                      lq->prefix, strerror(-rc));
            rc = -EIO;
        }
    }
    response_free(&rs);
    return rc;
}

/* ---- stat --------------------------------------------------------------- */

static int head_object(struct s3_store *s, const char *key, struct store_stat *st)
{
    struct s3_request rq = {.what = "HEAD",
                            .method = "HEAD",
                            .key = key,
                            .max_retries = s->max_retries,
                            .counter = &s->base.counters.head_requests};
    struct s3_response rs;
    int rc = s3_perform(s, &rq, &rs);
    if (rc == 0) {
        if (rs.status >= 200 && rs.status <= 299) {
            st->size = rs.content_length > 0 ? (uint64_t)rs.content_length : 0;
            st->mtime = rs.last_modified;
            memcpy(st->etag, rs.etag, sizeof st->etag);
        } else if (rs.status == 404) {
            rc = -ENOENT;
        } else {
            rc = http_failure(s, &rq, &rs);
        }
    }
    response_free(&rs);
    return rc;
}

/* Is there any key below "key/"? Then key is a directory. */
static int probe_dir(struct s3_store *s, const char *key, struct store_stat *st)
{
    char *prefix = str_printf("%s/", key);
    if (!prefix)
        return -ENOMEM;
    struct list_query lq = {.prefix = prefix, .max_keys = 1};
    struct s3_list_page page;
    int rc = list_page(s, &lq, &page);
    if (rc == 0) {
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
    char *key = key_of(s, path);
    if (!key)
        return -ENOMEM;
    int rc = head_object(s, key, st);
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
    struct store_stat st = {.size = o->size, .mtime = o->mtime};
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

/* All pages below c->prefix, emitted as they come. */
static int list_all(struct s3_store *s, struct list_ctx *c)
{
    char *token = NULL;
    int rc = 0;
    do {
        struct list_query lq = {.prefix = c->prefix, .token = token, .delimiter = 1};
        struct s3_list_page page;
        rc = list_page(s, &lq, &page);
        free(token);
        token = NULL;
        if (rc < 0)
            break;
        rc = emit_page(c, &page);
        if (rc == 0 && page.is_truncated && !c->stopped) {
            token = page.next_token;
            page.next_token = NULL;
        }
        s3_list_page_free(&page);
    } while (rc == 0 && token);
    free(token);
    return rc;
}

/* An empty listing: -ENOTDIR if path is an object, else -ENOENT. */
static int empty_dir_result(struct s3_store *s, const char *path)
{
    struct store_stat st;
    char *key = key_of(s, path);
    if (!key)
        return -ENOMEM;
    int rc = head_object(s, key, &st);
    free(key);
    return rc == 0 ? -ENOTDIR : rc == -ENOENT ? -ENOENT : rc;
}

static int s3_list(struct store *base, const char *dir, store_list_fn fn, void *arg)
{
    struct s3_store *s = (struct s3_store *)base;
    char *prefix = dir_prefix_of(s, dir);
    if (!prefix)
        return -ENOMEM;
    struct list_ctx c = {.fn = fn, .arg = arg, .prefix = prefix, .plen = strlen(prefix)};
    int rc = list_all(s, &c);
    if (rc == 0 && !c.seen_any && *dir)
        rc = empty_dir_result(s, dir);
    for (size_t i = 0; i < c.nfiles; i++)
        free(c.files[i]);
    free(c.files);
    free(prefix);
    return rc;
}

/* ---- read --------------------------------------------------------------- */

struct read_want {
    uint64_t off;
    size_t len;
    const char *etag;
};

/* Validate a 2xx answer to a ranged GET: 0, -EAGAIN (short: retry), -ESTALE, -EIO. */
static int check_read(const struct s3_request *rq, struct s3_response *rs)
{
    const struct read_want *w = rq->check_arg;
    if (w->etag && *w->etag && rs->etag[0] && !etag_equal(w->etag, rs->etag))
        return -ESTALE;
    if (rs->content_length >= 0 && rs->body_len < (uint64_t)rs->content_length)
        return -EAGAIN;
    if (rs->status == 206) {
        if (!rs->has_range || rs->range_start != w->off || rs->range_end < rs->range_start)
            return -EIO;
        uint64_t expect = rs->range_end - rs->range_start + 1;
        if (rs->body_len != expect || expect > w->len)
            return rs->body_len < expect ? -EAGAIN : -EIO;
        if (rs->body_len < w->len && rs->range_end + 1 < rs->range_total)
            return -EAGAIN; /* short, though not at the end of the object */
        return 0;
    }
    /* 200: the server ignored Range and sent the object from byte 0 */
    return w->off == 0 ? 0 : -EIO;
}

static int s3_read(struct store *base, const char *path, const char *etag, uint64_t off, size_t len,
                   void *buf, size_t *nread)
{
    struct s3_store *s = (struct s3_store *)base;
    *nread = 0;
    if (len == 0)
        return 0;
    if (off > UINT64_MAX - (len - 1))
        return -EINVAL;
    char range[64];
    snprintf(range, sizeof range, "bytes=%" PRIu64 "-%" PRIu64, off, off + (len - 1));
    char *key = key_of(s, path);
    if (!key)
        return -ENOMEM;
    struct read_want want = {off, len, etag};
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
                            .check = check_read,
                            .check_arg = &want};
    struct s3_response rs;
    int rc = s3_perform(s, &rq, &rs);
    if (rc == 0 && rs.past_eof) {
        *nread = 0;
    } else if (rc == 0 && rs.status >= 200 && rs.status <= 299) {
        *nread = rs.body_len;
        atomic_fetch_add(&s->base.counters.get_bytes, rs.body_len);
    } else if (rc == 0 && rs.status != 416) { /* 416: at or past the end: 0 bytes */
        rc = http_failure(s, &rq, &rs);
    }
    response_free(&rs);
    free(key);
    return rc;
}

/* ---- destroy ------------------------------------------------------------ */

static void s3_destroy(struct store *base)
{
    struct s3_store *s = (struct s3_store *)base;
    if (!s)
        return;
    for (int i = 0; i < s->nidle; i++)
        curl_easy_cleanup(s->idle[i]);
    free(s->idle);
    if (s->share)
        curl_share_cleanup(s->share);
    if (s->pool_ready) {
        for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
            pthread_mutex_destroy(&s->share_mu[i]);
        pthread_mutex_destroy(&s->pool_mu);
        pthread_cond_destroy(&s->pool_cv);
    }
    free(s->bucket);
    free(s->prefix);
    free(s->url_base);
    free(s->host_header);
    free(s->path_base);
    free(s->endpoint);
    free(s->region);
    free_secret(s->access_key_id);
    free_secret(s->secret_access_key);
    free_secret(s->session_token);
    free(s->base.description);
    free(s);
}

static const struct store_ops s3_ops = {
    .scheme = "s3",
    .stat = s3_stat,
    .list = s3_list,
    .read = s3_read,
    .destroy = s3_destroy,
};

/* ---- open: configuration ------------------------------------------------ */

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static void curl_init_once(void)
{
    curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

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

/* Usable as a DNS label set in a virtual-hosted URL. */
static int dns_compatible(const char *b)
{
    size_t n = strlen(b);
    if (n < 3 || n > 63 || b[0] == '-' || b[0] == '.' || b[n - 1] == '-' || b[n - 1] == '.')
        return 0;
    for (const char *p = b; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '.' || *p == '-'))
            return 0;
    return strstr(b, "..") == NULL;
}

static int host_is_ip_or_localhost(const char *host)
{
    if (host[0] == '[' || strcasecmp(host, "localhost") == 0)
        return 1;
    int dots = 0;
    for (const char *p = host; *p; p++) {
        if (*p == '.')
            dots++;
        else if (*p < '0' || *p > '9')
            return 0;
    }
    return dots == 3;
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
}

/* Strip leading and trailing slashes of a prefix. */
static char *clean_prefix(const char *prefix)
{
    if (!prefix)
        prefix = "";
    while (*prefix == '/')
        prefix++;
    char *p = strdup(prefix);
    size_t n = p ? strlen(p) : 0;
    while (n && p[n - 1] == '/')
        p[--n] = '\0';
    return p;
}

struct endpoint_parts {
    char *scheme, *host, *port, *path;
};

static void endpoint_parts_free(struct endpoint_parts *e)
{
    curl_free(e->scheme);
    curl_free(e->host);
    curl_free(e->port);
    curl_free(e->path);
}

static int parse_endpoint(const char *url, struct endpoint_parts *e, char *err, size_t errlen)
{
    memset(e, 0, sizeof *e);
    CURLU *u = curl_url();
    if (!u)
        return -ENOMEM;
    int ok = curl_url_set(u, CURLUPART_URL, url, CURLU_DEFAULT_SCHEME) == CURLUE_OK &&
             curl_url_get(u, CURLUPART_SCHEME, &e->scheme, 0) == CURLUE_OK &&
             curl_url_get(u, CURLUPART_HOST, &e->host, 0) == CURLUE_OK &&
             curl_url_get(u, CURLUPART_PATH, &e->path, 0) == CURLUE_OK;
    if (ok && curl_url_get(u, CURLUPART_PORT, &e->port, CURLU_NO_DEFAULT_PORT) != CURLUE_OK)
        e->port = NULL;
    curl_url_cleanup(u);
    if (!ok || (strcasecmp(e->scheme, "http") != 0 && strcasecmp(e->scheme, "https") != 0)) {
        snprintf(err, errlen, "invalid S3 endpoint URL '%s': expected http(s)://host[:port]", url);
        endpoint_parts_free(e);
        return -EINVAL;
    }
    return 0;
}

static int choose_path_style(const struct s3_store *s, const struct endpoint_parts *e,
                             const struct store_options *opt, enum aws_addressing addressing)
{
    if (opt->force_path_style || addressing == AWS_ADDR_PATH)
        return 1;
    if (host_is_ip_or_localhost(e->host) || !dns_compatible(s->bucket))
        return 1;
    if (addressing == AWS_ADDR_VIRTUAL)
        return 0;
    return strchr(s->bucket, '.') && strcasecmp(e->scheme, "https") == 0;
}

/* url_base, host_header, path_base, endpoint from the endpoint URL. */
static int setup_addressing(struct s3_store *s, const char *endpoint_url,
                            const struct store_options *opt, enum aws_addressing addressing,
                            char *err, size_t errlen)
{
    struct endpoint_parts e;
    int rc = parse_endpoint(endpoint_url, &e, err, errlen);
    if (rc < 0)
        return rc;
    s->path_style = choose_path_style(s, &e, opt, addressing);
    const char *colon = e.port ? ":" : "", *port = e.port ? e.port : "";
    size_t plen = strlen(e.path);
    while (plen && e.path[plen - 1] == '/')
        plen--;
    if (s->path_style)
        s->host_header = str_printf("%s%s%s", e.host, colon, port);
    else
        s->host_header = str_printf("%s.%s%s%s", s->bucket, e.host, colon, port);
    s->url_base = s->host_header ? str_printf("%s://%s", e.scheme, s->host_header) : NULL;
    s->path_base = str_printf("%.*s%s%s", (int)plen, e.path, s->path_style ? "/" : "",
                              s->path_style ? s->bucket : "");
    s->endpoint = str_printf("%s://%s%s%s%.*s/", e.scheme, e.host, colon, port, (int)plen, e.path);
    endpoint_parts_free(&e);
    return s->url_base && s->path_base && s->endpoint ? 0 : -ENOMEM;
}

/* Move credentials and region from cfg into s; say where they came from. */
static void take_credentials(struct s3_store *s, struct aws_config *cfg)
{
    s->access_key_id = cfg->access_key_id;
    s->secret_access_key = cfg->secret_access_key;
    s->session_token = cfg->session_token;
    s->region = cfg->region;
    cfg->access_key_id = cfg->secret_access_key = cfg->session_token = cfg->region = NULL;
    char key[32];
    if (!s->access_key_id)
        log_warn("s3: no AWS credentials found (environment, profile '%s'): sending unsigned "
                 "requests",
                 cfg->profile ? cfg->profile : "default");
    else
        log_info("s3: credentials from %s (profile '%s', key %s%s)",
                 aws_cred_source_name(cfg->cred_source), cfg->profile ? cfg->profile : "default",
                 aws_redact(s->access_key_id, 1, key, sizeof key),
                 s->session_token ? ", with session token" : "");
}

/* Resolve credentials, region and endpoint into s. */
static int configure(struct s3_store *s, const struct store_options *opt, char *err, size_t errlen)
{
    struct aws_config_overrides ov = {opt->endpoint_url, opt->region, opt->profile};
    struct aws_config cfg;
    int rc = aws_config_resolve(&ov, &cfg, err, errlen);
    if (rc < 0)
        return rc;
    char *endpoint = cfg.endpoint_url ? strdup(cfg.endpoint_url)
                                      : str_printf("https://s3.%s.amazonaws.com", cfg.region);
    enum aws_addressing addressing = cfg.addressing;
    take_credentials(s, &cfg);
    aws_config_free(&cfg);
    rc = endpoint ? setup_addressing(s, endpoint, opt, addressing, err, errlen) : -ENOMEM;
    free(endpoint);
    return rc;
}

static int pool_init(struct s3_store *s)
{
    pthread_mutex_init(&s->pool_mu, NULL);
    pthread_cond_init(&s->pool_cv, NULL);
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
        pthread_mutex_init(&s->share_mu[i], NULL);
    s->pool_ready = 1;
    s->idle = calloc((size_t)s->max_connections, sizeof *s->idle);
    s->share = curl_share_init();
    if (!s->idle || !s->share)
        return -ENOMEM;
    curl_share_setopt(s->share, CURLSHOPT_LOCKFUNC, share_lock);
    curl_share_setopt(s->share, CURLSHOPT_UNLOCKFUNC, share_unlock);
    curl_share_setopt(s->share, CURLSHOPT_USERDATA, s);
    curl_share_setopt(s->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
    curl_share_setopt(s->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
    return 0;
}

/* ---- open: the mount check ---------------------------------------------- */

/* One ListObjectsV2 (max-keys=1) on the prefix: the bucket exists, we may
 * list it, and the answer is S3. On failure a user-facing line goes to err. */
static int mount_check(struct s3_store *s, char *err, size_t errlen)
{
    char *prefix = dir_prefix_of(s, "");
    if (!prefix)
        return -ENOMEM;
    struct sigv4_pair q[] = {{"list-type", "2"}, {"max-keys", "1"}, {"prefix", prefix}};
    int retries =
        s->max_retries < S3_MOUNT_CHECK_MAX_RETRIES ? s->max_retries : S3_MOUNT_CHECK_MAX_RETRIES;
    struct s3_request rq = {.what = "LIST",
                            .method = "GET",
                            .query = q,
                            .nquery = 3,
                            .max_retries = retries,
                            .quiet = 1,
                            .counter = &s->base.counters.list_requests};
    struct s3_response rs;
    int rc = s3_perform(s, &rq, &rs);
    struct s3_mount_failure f = {.bucket = s->bucket,
                                 .prefix = s->prefix,
                                 .http_status = rc < 0 ? 0 : rs.status,
                                 .code = rs.err.code,
                                 .message = rs.err.message,
                                 .bucket_region =
                                     rs.bucket_region[0] ? rs.bucket_region : rs.err.region,
                                 .region = s->region,
                                 .url = s->endpoint,
                                 .transport_msg = curl_easy_strerror(rs.curl_rc)};
    if (rc < 0) {
        log_debug("s3: mount check: %s", rs.curl_err);
        s3_error_mount_message(&f, err, errlen);
    } else if (rs.status < 200 || rs.status > 299) {
        rc = -s3_error_classify(rs.status, rs.err.code).final_err;
        s3_error_mount_message(&f, err, errlen);
    } else {
        struct s3_list_page page;
        rc = s3_xml_parse_list(rs.body, rs.body_len, &page);
        if (rc < 0) {
            snprintf(err, errlen, "%s answered, but not with an S3 ListObjectsV2 result",
                     s->endpoint);
            rc = -EIO;
        }
        s3_list_page_free(&page);
    }
    response_free(&rs);
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
    pthread_once(&curl_once, curl_init_once);
    if (curl_init_rc != CURLE_OK) {
        snprintf(err, errlen, "cannot initialize libcurl: %s", curl_easy_strerror(curl_init_rc));
        return -EIO;
    }
    struct s3_store *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    s->base.ops = &s3_ops;
    apply_settings(s, opt);
    s->bucket = strdup(bucket);
    s->prefix = clean_prefix(prefix);
    int rc = s->bucket && s->prefix ? 0 : -ENOMEM;
    if (rc == 0)
        s->base.description = *s->prefix ? str_printf("s3://%s/%s", bucket, s->prefix)
                                         : str_printf("s3://%s", bucket);
    if (rc == 0)
        rc = configure(s, opt, err, errlen);
    if (rc == 0)
        rc = pool_init(s);
    if (rc == 0)
        rc = mount_check(s, err, errlen);
    if (rc < 0) {
        if (rc == -ENOMEM && err && errlen && !err[0])
            snprintf(err, errlen, "out of memory");
        s3_destroy(&s->base);
        return rc;
    }
    log_info("s3: %s via %s (%s, region %s, up to %d connections)", s->base.description,
             s->endpoint, s->path_style ? "path-style" : "virtual-hosted", s->region,
             s->max_connections);
    *out = &s->base;
    return 0;
}
