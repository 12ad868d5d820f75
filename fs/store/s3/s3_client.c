/*
 * fs/store/s3/s3_client.c - the S3 HTTP client engine (with http.c, the only files
 * that include curl.h). See s3_client.h for the API.
 *
 * Owns: endpoint parsing and addressing (path-style / virtual-hosted), a
 * pool of CURL easy handles (keep-alive connections, bounded parallelism)
 * sharing DNS and TLS sessions, request signing via sigv4.c (with the
 * body's SHA-256, computed once per request, or UNSIGNED-PAYLOAD), sending
 * any method with a body from memory or streamed from a file descriptor
 * range (pread; rewound for each retry), capturing the response (headers, a
 * bounded error body, the body into the caller's buffer or a growable one),
 * judging each attempt (including an <Error> document inside a 200 answer),
 * retries with jittered exponential backoff, mapping failures to errno via
 * s3_error.c with their log lines, and fetching one ListObjectsV2 page via
 * s3_xml.c.
 * Credentials (secret key, session token, Authorization) are never logged.
 */
#include "s3_client.h"
#include "strutil.h"

#include "fdio.h"
#include "http.h"
#include "log.h"
#include "s3_error.h"
#include "s3_xml.h"
#include "sigv4.h"

#include <assert.h>
#include <curl/curl.h>
#include <errno.h>
#include <inttypes.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#define S3_BACKOFF_BASE_MS 100
#define S3_BACKOFF_CAP_MS 5000
/* Timed-out attempts (no progress, or no connection) in a row on this
 * endpoint, with no complete answer in between, after which a timed-out attempt
 * is no longer retried, whatever max_retries says: one stalled connection
 * is retried, but once the endpoint has stopped answering every request
 * fails after its first timeout. Other transient errors keep the full
 * retry budget. */
#define S3_TIMEOUT_MAX_RETRIES 1
#define S3_ERROR_BODY_MAX (64 * 1024)
#define S3_RECV_BUFFER (256 * 1024)
#define S3_MIN_RATE (64 * 1024) /* bytes/s assumed by the hard timeout */
/* Silence allowed while the server assembles (Copy, UploadPartCopy,
 * Complete): S3 keeps such an answer alive with whitespace, but s3rver,
 * and other servers, say nothing until they are done. */
#define S3_ASSEMBLY_SILENCE_S 120L
#define S3_HASH_CHUNK (1u << 20) /* bytes read at a time to hash a file body */
#define S3_MAX_HEADERS 16        /* signed headers of one request */

_Static_assert(S3_TRANSPORT_ERR_MAX == CURL_ERROR_SIZE, "transport_err must hold a curl error");

/* ---- state -------------------------------------------------------------- */

struct s3_client {
    char *bucket;
    char *url_base;    /* "scheme://host[:port]" requests go to */
    char *host_header; /* the Host header, as signed */
    char *path_base;   /* raw path before the key: "" (virtual-hosted) or "/bucket" */
    char *endpoint;    /* endpoint URL for messages, ending in '/' */
    char *region;
    struct creds_provider *creds; /* NULL when anonymous; not owned */
    int path_style;
    int max_connections, connect_timeout_ms, request_timeout_ms;
    int unsigned_payload;            /* bodies are signed as UNSIGNED-PAYLOAD */
    struct store_counters *counters; /* the store's: errors, retries, list_requests */
    atomic_int reached;              /* the endpoint has given an HTTP answer at least once */
    atomic_int timeouts_in_a_row;    /* timed-out attempts since the last complete answer */

    int pool_ready; /* the mutexes below are initialized */
    pthread_mutex_t pool_mu;
    pthread_cond_t pool_cv;
    CURL **idle; /* LIFO of idle handles: the most recently used first */
    int nidle, created;
    CURLSH *share; /* DNS cache and TLS sessions shared by the handles */
    pthread_mutex_t share_mu[CURL_LOCK_DATA_LAST];
};

/* ---- small helpers ------------------------------------------------------ */

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

/* ---- the handle pool ---------------------------------------------------- */

static void share_lock(CURL *h, curl_lock_data data, curl_lock_access access, void *arg)
{
    (void)h;
    (void)access;
    struct s3_client *s = arg;
    if ((unsigned)data < CURL_LOCK_DATA_LAST)
        pthread_mutex_lock(&s->share_mu[data]);
}

static void share_unlock(CURL *h, curl_lock_data data, void *arg)
{
    (void)h;
    struct s3_client *s = arg;
    if ((unsigned)data < CURL_LOCK_DATA_LAST)
        pthread_mutex_unlock(&s->share_mu[data]);
}

/* Options that never change for a handle (beyond http_handle_new's). */
static CURL *handle_new(struct s3_client *s)
{
    CURL *h = http_handle_new();
    if (!h)
        return NULL;
    curl_easy_setopt(h, CURLOPT_SHARE, s->share);
    curl_easy_setopt(h, CURLOPT_PATH_AS_IS, 1L); /* keys may contain "./" */
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(h, CURLOPT_BUFFERSIZE, (long)S3_RECV_BUFFER);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)s->connect_timeout_ms);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, (long)((s->request_timeout_ms + 999) / 1000));
    return h;
}

/* A handle for one request; blocks while max_connections are in flight. */
static CURL *pool_acquire(struct s3_client *s)
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

static void pool_release(struct s3_client *s, CURL *h)
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
    memset(&rs->attrs, 0, sizeof rs->attrs);
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
    } else if (nlen > 11 && strncasecmp(name, "x-amz-meta-", 11) == 0) {
        store_attrs_parse_header(&rs->attrs, name, nlen, v, vlen);
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
    size_t skip = rs->sink_final > rs->body_len ? rs->sink_final - rs->body_len : 0;
    if (skip < len) /* bytes below sink_final are final already: never rewritten */
        memcpy(rs->body + rs->body_len + skip, data + skip, len - skip);
    rs->body_len += len;
    if (rs->on_body_rq)
        rs->on_body_rq->on_body(rs->on_body_rq, rs);
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
    if (rq->on_body)
        rs->on_body_rq = rq;
}

/* Forget the previous attempt's answer, keeping the body buffer. */
static void response_rewind(struct s3_response *rs)
{
    char *body = rs->body, *err_body = rs->err_body;
    size_t body_cap = rs->body_cap;
    int fixed = rs->body_fixed;
    size_t sink_final = rs->sink_final;
    const struct s3_request *on_body_rq = rs->on_body_rq;
    memset(rs, 0, sizeof *rs);
    response_reset_headers(rs);
    rs->body = body;
    rs->body_cap = body_cap;
    rs->body_fixed = fixed;
    rs->sink_final = sink_final;
    rs->on_body_rq = on_body_rq;
    rs->err_body = err_body;
}

/* Release what s3_client_perform left in rs. */
static void s3_response_free(struct s3_response *rs)
{
    if (!rs->body_fixed)
        free(rs->body);
    free(rs->err_body);
    rs->body = rs->err_body = NULL;
}

/* ---- request bodies ----------------------------------------------------- */

/* The body of one attempt: where curl is in it. */
struct body_reader {
    const struct s3_body *b;
    uint64_t pos;
    int err; /* positive errno when reading the file failed */
};

static size_t on_read(char *buf, size_t size, size_t n, void *arg)
{
    struct body_reader *r = arg;
    uint64_t left = r->b->len - r->pos;
    size_t want = size * n < left ? size * n : (size_t)left;
    if (want == 0)
        return 0;
    if (r->b->kind == S3_BODY_MEM) {
        memcpy(buf, (const char *)r->b->data + r->pos, want);
    } else {
        int rc = pread_exact(r->b->fd, buf, want, r->b->offset + r->pos);
        if (rc < 0) {
            r->err = -rc;
            return CURL_READFUNC_ABORT;
        }
    }
    r->pos += want;
    return want;
}

/* curl rewinds the body this way when it must send it again (e.g. on a
 * redirect or auth retry on the same attempt). */
static int on_seek(void *arg, curl_off_t off, int origin)
{
    struct body_reader *r = arg;
    if (origin != SEEK_SET || off < 0 || (uint64_t)off > r->b->len)
        return CURL_SEEKFUNC_FAIL;
    r->pos = (uint64_t)off;
    return CURL_SEEKFUNC_OK;
}

/* Hex SHA-256 of a file body, read once: 0 or a positive errno. */
static int sha256_fd_hex(const struct s3_body *b, char out[65])
{
    unsigned char *buf = malloc(S3_HASH_CHUNK);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    int e = buf && ctx && EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) == 1 ? 0 : ENOMEM;
    for (uint64_t done = 0; e == 0 && done < b->len;) {
        size_t n = b->len - done < S3_HASH_CHUNK ? (size_t)(b->len - done) : S3_HASH_CHUNK;
        e = -pread_exact(b->fd, buf, n, b->offset + done);
        if (e == 0 && EVP_DigestUpdate(ctx, buf, n) != 1)
            e = EIO;
        done += n;
    }
    unsigned char md[32];
    unsigned int mdlen = 0;
    if (e == 0 && (EVP_DigestFinal_ex(ctx, md, &mdlen) != 1 || mdlen != sizeof md))
        e = EIO;
    for (unsigned i = 0; e == 0 && i < sizeof md; i++)
        snprintf(out + 2 * i, 3, "%02x", md[i]);
    EVP_MD_CTX_free(ctx);
    free(buf);
    return e;
}

/* The x-amz-content-sha256 value for rq: the empty-body hash without a body,
 * UNSIGNED-PAYLOAD when the client says so (unless rq->sign_payload), else
 * the body's SHA-256. 0, or a positive errno (the file could not be read). */
static int payload_hash(const struct s3_client *s, const struct s3_request *rq, char out[65])
{
    const struct s3_body *b = &rq->body;
    if (b->kind == S3_BODY_NONE || b->len == 0) {
        snprintf(out, 65, "%s", SIGV4_EMPTY_SHA256);
        return 0;
    }
    if (s->unsigned_payload && !rq->sign_payload) {
        snprintf(out, 65, "%s", SIGV4_UNSIGNED_PAYLOAD);
        return 0;
    }
    if (b->kind == S3_BODY_MEM) {
        sigv4_sha256_hex(b->data, (size_t)b->len, out);
        return 0;
    }
    return sha256_fd_hex(b, out);
}

/* ---- building and sending one request ----------------------------------- */

/* Raw (unencoded) path: path_base + "/" + key, or the bucket itself. */
static char *request_path(const struct s3_client *s, const char *key)
{
    if (!key)
        return strdup(*s->path_base ? s->path_base : "/");
    return str_printf("%s/%s", s->path_base, key);
}

/* Signed headers for rq (and Authorization unless anonymous) into *list;
 * payload is the x-amz-content-sha256 value. */
static int sign_headers(const struct s3_client *s, const struct s3_request *rq, const char *path,
                        const char *payload, struct curl_slist **list)
{
    char date[17];
    sigv4_amz_date(time(NULL), date);
    struct sigv4_pair h[S3_MAX_HEADERS];
    size_t nh = 0;
    if (rq->nheaders > S3_MAX_HEADERS - 6)
        return -EINVAL;
    h[nh++] = (struct sigv4_pair){"Host", s->host_header};
    h[nh++] = (struct sigv4_pair){"x-amz-content-sha256", payload};
    h[nh++] = (struct sigv4_pair){"x-amz-date", date};
    /* this attempt keeps these credentials even if a refresh swaps them */
    struct creds *cr = creds_provider_get(s->creds);
    if (cr && cr->session_token)
        h[nh++] = (struct sigv4_pair){"x-amz-security-token", cr->session_token};
    if (rq->range)
        h[nh++] = (struct sigv4_pair){"Range", rq->range};
    if (rq->if_match)
        h[nh++] = (struct sigv4_pair){"If-Match", rq->if_match};
    for (size_t i = 0; i < rq->nheaders; i++)
        h[nh++] = rq->headers[i];
    int rc = 0;
    for (size_t i = 0; i < nh && rc == 0; i++)
        rc = http_add_header(list, h[i].name, h[i].value);
    if (!cr || rc < 0) {
        creds_unref(cr);
        return rc;
    }
    struct sigv4_request req = {rq->method, path, rq->query, rq->nquery, h, nh, payload};
    struct sigv4_credentials cred = {cr->access_key_id, cr->secret_access_key, cr->session_token};
    char *auth = sigv4_authorization(&req, &cred, date, s->region, "s3");
    rc = auth ? http_add_header(list, "Authorization", auth) : -ENOMEM;
    if (auth) {
        OPENSSL_cleanse(auth, strlen(auth));
        free(auth);
    }
    creds_unref(cr);
    return rc;
}

/* The URL of rq: url_base + encoded path + canonical query. */
static char *request_url(const struct s3_client *s, const struct s3_request *rq, const char *path)
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

/* PUT and POST send a body (possibly empty); the others none. */
static int has_body(const struct s3_request *rq)
{
    return strcmp(rq->method, "PUT") == 0 || strcmp(rq->method, "POST") == 0;
}

/* The method and body of rq on handle h (whose options persist between
 * requests: every one of these is set each time). */
static void set_method(CURL *h, const struct s3_request *rq, struct body_reader *br)
{
    curl_easy_setopt(h, CURLOPT_HTTPGET, 1L); /* resets upload and nobody */
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, NULL);
    curl_easy_setopt(h, CURLOPT_NOBODY, strcmp(rq->method, "HEAD") == 0 ? 1L : 0L);
    if (has_body(rq)) {
        /* an upload is a PUT to curl; POST is the same with another name */
        curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)br->b->len);
        curl_easy_setopt(h, CURLOPT_READFUNCTION, on_read);
        curl_easy_setopt(h, CURLOPT_READDATA, br);
        curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, on_seek);
        curl_easy_setopt(h, CURLOPT_SEEKDATA, br);
    }
    if (strcmp(rq->method, "GET") != 0 && strcmp(rq->method, "HEAD") != 0 &&
        strcmp(rq->method, "PUT") != 0)
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, rq->method);
}

/* How long rq may go without a byte moving (--timeout; longer for a request
 * the server works on before it answers). */
static long silence_seconds(const struct s3_client *s, const struct s3_request *rq)
{
    long t = (long)((s->request_timeout_ms + 999) / 1000);
    return rq->error_in_200 && t < S3_ASSEMBLY_SILENCE_S ? S3_ASSEMBLY_SILENCE_S : t;
}

/* Send rq once on handle h; the outcome is in rs (transport_rc, status, body).
 * payload is the body's x-amz-content-sha256 value. */
static void send_once(const struct s3_client *s, CURL *h, const struct s3_request *rq,
                      const char *payload, struct s3_response *rs, long timeout_ms)
{
    static const struct s3_body no_body = {.kind = S3_BODY_NONE};
    struct body_reader br = {.b = rq->body.kind == S3_BODY_NONE ? &no_body : &rq->body};
    struct curl_slist *headers = NULL;
    char *path = request_path(s, rq->key);
    char *url = path ? request_url(s, rq, path) : NULL;
    /* No "Expect: 100-continue" (curl's default for large uploads): it costs
     * a round trip per part, or a 1 s stall with servers that ignore it. */
    if (!url || sign_headers(s, rq, path, payload, &headers) < 0 ||
        (has_body(rq) && http_add_raw_header(&headers, "Expect:") < 0)) {
        rs->transport_rc = CURLE_OUT_OF_MEMORY;
        snprintf(rs->transport_err, sizeof rs->transport_err, "out of memory");
    } else {
        curl_easy_setopt(h, CURLOPT_URL, url);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
        set_method(h, rq, &br);
        curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
        curl_easy_setopt(h, CURLOPT_HEADERDATA, rs);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, rs);
        curl_easy_setopt(h, CURLOPT_ERRORBUFFER, rs->transport_err);
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout_ms);
        curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, silence_seconds(s, rq));
        rs->transport_rc = (int)curl_easy_perform(h);
        rs->body_errno = br.err;
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, NULL);
        curl_easy_setopt(h, CURLOPT_ERRORBUFFER, NULL);
        curl_easy_setopt(h, CURLOPT_READDATA, NULL);
        curl_easy_setopt(h, CURLOPT_SEEKDATA, NULL);
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

static int retry_allowed(const struct s3_client *s, enum s3_retry r)
{
    return r == S3_RETRY || (r == S3_RETRY_IF_REACHED && atomic_load(&s->reached));
}

/* Judge one attempt. Returns 0 when there is an HTTP answer for the caller
 * (any status) or a negative errno; *retry says whether to try again and
 * reason describes the problem for logs. */
static int judge(struct s3_client *s, const struct s3_request *rq, struct s3_response *rs,
                 int *retry, char *reason, size_t rlen)
{
    *retry = 0;
    if (rs->status > 0)
        atomic_store(&s->reached, 1);
    if (rs->transport_rc == CURLE_OK)
        atomic_store(&s->timeouts_in_a_row, 0); /* a whole answer: the endpoint works */
    if (rs->past_eof)
        return 0;
    if (rs->body_errno) {
        snprintf(reason, rlen, "cannot read the body to send: %s", strerror(rs->body_errno));
        return -EIO;
    }
    if (rs->transport_rc == CURLE_OK && rs->status >= 200 && rs->status <= 299 &&
        rq->error_in_200) {
        long st = s3_client_embedded_error(rs->body, rs->body_len, &rs->err);
        if (st) {
            rs->status = st;
            rs->embedded_error = 1;
        }
    }
    if (rs->transport_rc != CURLE_OK) {
        if (rs->overflow) {
            snprintf(reason, rlen, "response body larger than requested");
            return -EIO;
        }
        struct s3_error_class c = s3_error_transport(transport_of((CURLcode)rs->transport_rc));
        *retry = retry_allowed(s, c.retry);
        snprintf(reason, rlen, "%s",
                 rs->transport_err[0] ? rs->transport_err
                                      : curl_easy_strerror((CURLcode)rs->transport_rc));
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
    snprintf(reason, rlen, "HTTP %s%ld %s", rs->embedded_error ? "200 with <Error> as " : "",
             rs->status, rs->err.code[0] ? rs->err.code : "");
    return 0;
}

long s3_client_embedded_error(const char *body, size_t len, struct s3_error_body *err)
{
    memset(err, 0, sizeof *err);
    if (!body || !len || !memmem(body, len, "<Error", 6))
        return 0;
    if (s3_xml_parse_error(body, len, err) < 0) {
        memset(err, 0, sizeof *err);
        return 0;
    }
    long st = s3_error_status_of(err->code);
    return st ? st : 500;
}

static const char *request_id(const struct s3_response *rs)
{
    return rs->err.request_id[0] ? rs->err.request_id : rs->request_id[0] ? rs->request_id : "-";
}

/* A request that failed for good without a usable HTTP answer. */
static void note_failure(struct s3_client *s, const struct s3_request *rq,
                         const struct s3_response *rs, int rc, const char *reason, int attempts)
{
    atomic_fetch_add(&s->counters->errors, 1);
    if (!rq->quiet)
        log_msg(rc == -ESTALE ? LOG_LVL_WARN : LOG_LVL_ERROR,
                "s3: %s s3://%s/%s failed after %d attempt%s: %s (request id %s)", rq->what,
                s->bucket, rq->key ? rq->key : "", attempts, attempts == 1 ? "" : "s", reason,
                request_id(rs));
}

/* An HTTP error answer that the caller does not expect: log (unless
 * rq->quiet), count, and return its negative errno. */
static int s3_client_http_failure(struct s3_client *s, const struct s3_request *rq,
                                  const struct s3_response *rs)
{
    struct s3_error_class c = s3_error_classify(rs->status, rs->err.code);
    atomic_fetch_add(&s->counters->errors, 1);
    if (!rq->quiet)
        log_warn("s3: %s s3://%s/%s: HTTP %s%ld %s: %s (request id %s)", rq->what, s->bucket,
                 rq->key ? rq->key : "", rs->embedded_error ? "200 with <Error> as " : "",
                 rs->status, rs->err.code[0] ? rs->err.code : "-",
                 rs->err.message[0] ? rs->err.message : "no message", request_id(rs));
    return -c.final_err;
}

/* Hard cap on one attempt of rq: generous, the no-progress timeout does the
 * work. None for a request whose server works before it answers and keeps
 * the connection alive meanwhile (CopyObject, UploadPartCopy, Complete:
 * minutes for large objects, with whitespace sent in the 200 answer). */
static long hard_timeout_ms(const struct s3_client *s, const struct s3_request *rq, size_t bytes)
{
    if (rq->error_in_200)
        return 0; /* curl: no limit */
    return 4L * s->request_timeout_ms + (long)(bytes / S3_MIN_RATE) * 1000L;
}

/* Send rq with retries. 0: rs holds an HTTP answer (check rs->status; free
 * with s3_response_free). Negative errno: failed for good (logged, counted). */
static int s3_client_perform(struct s3_client *s, const struct s3_request *rq,
                             struct s3_response *rs)
{
    response_init(rs, rq);
    uint64_t body_len = rq->body.kind == S3_BODY_NONE ? 0 : rq->body.len;
    if (rq->body.kind != S3_BODY_NONE && !has_body(rq))
        return -EINVAL;
    size_t sink = rq->sink ? rq->sink_cap : 0;
    long timeout = hard_timeout_ms(s, rq, body_len > sink ? (size_t)body_len : sink);
    char payload[65];
    int e = payload_hash(s, rq, payload); /* once, not per attempt */
    if (e) {
        atomic_fetch_add(&s->counters->errors, 1);
        log_error("s3: %s s3://%s/%s: cannot read the body to hash it: %s", rq->what, s->bucket,
                  rq->key ? rq->key : "", strerror(e));
        return e == ENOMEM ? -ENOMEM : -EIO;
    }
    for (int attempt = 0;; attempt++) {
        if (attempt)
            response_rewind(rs);
        rs->attempts = attempt + 1;
        CURL *h = pool_acquire(s);
        if (!h)
            return -ENOMEM;
        if (rq->counter)
            atomic_fetch_add(rq->counter, 1);
        int64_t started = now_ms();
        send_once(s, h, rq, payload, rs, timeout);
        pool_release(s, h);
        int retry;
        char reason[CURL_ERROR_SIZE + 64];
        int rc = judge(s, rq, rs, &retry, reason, sizeof reason);
        if (rs->transport_rc == CURLE_OPERATION_TIMEDOUT &&
            atomic_fetch_add(&s->timeouts_in_a_row, 1) + 1 > S3_TIMEOUT_MAX_RETRIES)
            retry = 0; /* the endpoint does not answer: fail now */
        if (log_get_level() >= LOG_LVL_DEBUG) {
            char query[512] = "";
            for (size_t i = 0, n = 0; i < rq->nquery && n < sizeof query; i++)
                n += (size_t)snprintf(query + n, sizeof query - n, "%s%s=%s", i ? "&" : "?",
                                      rq->query[i].name, rq->query[i].value);
            log_debug("s3: %s s3://%s/%s%s%s%s -> %ld, %llu bytes in %lld ms", rq->what, s->bucket,
                      rq->key ? rq->key : "", query, rq->range ? " " : "",
                      rq->range ? rq->range : "", rs->status, (unsigned long long)rs->body_len,
                      (long long)(now_ms() - started));
        }
        if (!retry || attempt >= rq->max_retries) {
            if (rc < 0)
                note_failure(s, rq, rs, rc, reason, attempt + 1);
            return rc;
        }
        long delay = backoff_ms(attempt);
        atomic_fetch_add(&s->counters->retries, 1);
        log_info("s3: %s s3://%s/%s: %s; retry %d/%d in %ld ms", rq->what, s->bucket,
                 rq->key ? rq->key : "", reason, attempt + 1, rq->max_retries, delay);
        sleep_ms(delay);
    }
}

int s3_client_call(struct s3_client *s, const struct s3_request *rq)
{
    struct s3_response rs;
    int rc = s3_client_perform(s, rq, &rs);
    assert(rc <= 0);
    if (rc == 0 && rs.status >= 200 && rs.status <= 299) {
        rc = rq->read_answer ? rq->read_answer(rq, &rs) : 0;
    } else {
        int result = rq->read_error ? rq->read_error(rq, &rs, rc) : S3_USUAL;
        assert(result <= 0 || result == S3_USUAL);
        assert(rc == 0 || result != 0); /* no answer is never a success */
        if (result != S3_USUAL)
            rc = result;
        else if (rc == 0)
            rc = s3_client_http_failure(s, rq, &rs);
    }
    s3_response_free(&rs);
    return rc;
}

int s3_client_bad_answer(struct s3_client *s, const struct s3_request *rq, const char *problem)
{
    atomic_fetch_add(&s->counters->errors, 1);
    log_error("s3: %s s3://%s/%s: %s", rq->what, s->bucket, rq->key ? rq->key : "", problem);
    return -EIO;
}

/* ---- ListObjectsV2 ------------------------------------------------------ */

/* Where list_page_answer puts the page. */
struct list_answer {
    struct s3_client *client;
    const char *prefix; /* for the log line */
    struct s3_list_page *page;
};

/* read_answer of a ListObjectsV2 page: parse it. */
static int list_page_answer(const struct s3_request *rq, struct s3_response *rs)
{
    struct list_answer *a = rq->answer;
    int rc = s3_xml_parse_list(rs->body, rs->body_len, a->page);
    if (rc == 0)
        atomic_fetch_add(&a->client->counters->listed_keys, a->page->nobjects + a->page->nprefixes);
    if (rc < 0) {
        atomic_fetch_add(&a->client->counters->errors, 1);
        log_error("s3: LIST s3://%s/%s: malformed ListObjectsV2 response (%s)", a->client->bucket,
                  a->prefix, strerror(-rc));
        rc = -EIO;
    }
    return rc;
}

/* One ListObjectsV2 page into *page. */
int s3_client_list_page(struct s3_client *s, const struct s3_list_query *lq,
                        struct s3_list_page *page)
{
    struct sigv4_pair q[7];
    size_t nq = 0;
    char max_keys[16];
    q[nq++] = (struct sigv4_pair){"list-type", "2"};
    /* Keys come URL-encoded (the answer says so; s3_xml decodes them): a key
     * with a control character is not valid XML 1.0 otherwise. */
    q[nq++] = (struct sigv4_pair){"encoding-type", "url"};
    q[nq++] = (struct sigv4_pair){"prefix", lq->prefix};
    if (lq->delimiter)
        q[nq++] = (struct sigv4_pair){"delimiter", "/"};
    if (lq->max_keys > 0) {
        snprintf(max_keys, sizeof max_keys, "%d", lq->max_keys);
        q[nq++] = (struct sigv4_pair){"max-keys", max_keys};
    }
    if (lq->token)
        q[nq++] = (struct sigv4_pair){"continuation-token", lq->token};
    else if (lq->start_after)
        q[nq++] = (struct sigv4_pair){"start-after", lq->start_after};
    struct list_answer answer = {s, lq->prefix, page};
    struct s3_request rq = {.what = "LIST",
                            .method = "GET",
                            .key = NULL,
                            .query = q,
                            .nquery = nq,
                            .max_retries = lq->max_retries,
                            .counter = &s->counters->list_requests,
                            .read_answer = list_page_answer,
                            .answer = &answer};
    memset(page, 0, sizeof *page);
    return s3_client_call(s, &rq);
}

/* ---- addressing --------------------------------------------------------- */

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

static int choose_path_style(const struct s3_client *s, const struct endpoint_parts *e,
                             int force_path_style, enum aws_addressing addressing)
{
    if (force_path_style || addressing == AWS_ADDR_PATH)
        return 1;
    if (host_is_ip_or_localhost(e->host) || !dns_compatible(s->bucket))
        return 1;
    if (addressing == AWS_ADDR_VIRTUAL)
        return 0;
    return strchr(s->bucket, '.') && strcasecmp(e->scheme, "https") == 0;
}

/* url_base, host_header, path_base, endpoint from the endpoint URL. */
static int setup_addressing(struct s3_client *s, const char *endpoint_url, int force_path_style,
                            enum aws_addressing addressing, char *err, size_t errlen)
{
    struct endpoint_parts e;
    int rc = parse_endpoint(endpoint_url, &e, err, errlen);
    if (rc < 0)
        return rc;
    s->path_style = choose_path_style(s, &e, force_path_style, addressing);
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

/* ---- creating and destroying ------------------------------------------- */

static int pool_init(struct s3_client *s)
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

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;

static void curl_init_once(void)
{
    curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

int s3_client_global_init(char *err, size_t errlen)
{
    pthread_once(&curl_once, curl_init_once);
    if (curl_init_rc != CURLE_OK) {
        snprintf(err, errlen, "cannot initialize libcurl: %s", curl_easy_strerror(curl_init_rc));
        return -EIO;
    }
    return 0;
}

/* A copy of an optional string: 0, or -ENOMEM. */
static int copy_opt(char **dst, const char *src)
{
    *dst = src ? strdup(src) : NULL;
    return src && !*dst ? -ENOMEM : 0;
}

int s3_client_create(const struct s3_client_config *cfg, struct s3_client **out, char *err,
                     size_t errlen)
{
    *out = NULL;
    struct s3_client *s = calloc(1, sizeof *s);
    if (!s)
        return -ENOMEM;
    s->max_connections = cfg->max_connections;
    s->connect_timeout_ms = cfg->connect_timeout_ms;
    s->request_timeout_ms = cfg->request_timeout_ms;
    s->unsigned_payload = cfg->unsigned_payload;
    s->counters = cfg->counters;
    int rc = 0;
    s->creds = cfg->creds;
    if (copy_opt(&s->bucket, cfg->bucket) < 0 || copy_opt(&s->region, cfg->region) < 0)
        rc = -ENOMEM;
    if (rc == 0)
        rc = setup_addressing(s, cfg->endpoint_url, cfg->force_path_style, cfg->addressing, err,
                              errlen);
    if (rc == 0)
        rc = pool_init(s);
    if (rc < 0) {
        s3_client_destroy(s);
        return rc;
    }
    *out = s;
    return 0;
}

void s3_client_destroy(struct s3_client *s)
{
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
    free(s->url_base);
    free(s->host_header);
    free(s->path_base);
    free(s->endpoint);
    free(s->region);
    free(s);
}

const char *s3_client_endpoint(const struct s3_client *s)
{
    return s->endpoint;
}

int s3_client_path_style(const struct s3_client *s)
{
    return s->path_style;
}

const char *s3_response_transport_message(const struct s3_response *rs)
{
    return curl_easy_strerror((CURLcode)rs->transport_rc);
}
