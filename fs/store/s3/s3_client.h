/*
 * fs/store/s3/s3_client.h - the S3 HTTP client engine under the S3 store.
 *
 * Owns everything about talking HTTP(S) to one bucket: endpoint parsing and
 * addressing (path-style / virtual-hosted), a pool of keep-alive connections
 * (bounded parallelism), SigV4 signing (sigv4.c) including the payload hash
 * of request bodies, sending any method with a body from memory or streamed
 * from a file descriptor range, capturing headers and body, judging each
 * attempt (also an <Error> document inside a 200 answer) and retrying with
 * jittered exponential backoff, mapping failures to errno (s3_error.c) with
 * their log lines, and fetching one ListObjectsV2 page (s3_xml.c).
 * Every request goes through s3_client_call. Handle defaults and header lines
 * come from http.c, the libcurl plumbing shared with the credentials sources
 * (creds.c); s3_client.c and http.c are the only files that include curl.h,
 * and nothing here exposes libcurl types.
 *
 * What a path means (keys, directories, listings, reads, writes) is the
 * store's business: see store_s3.c and store_s3_write.c. Credentials are
 * never logged.
 */
#ifndef CKPTFS_S3_CLIENT_H
#define CKPTFS_S3_CLIENT_H

#include <limits.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "aws_config.h"
#include "creds.h"
#include "s3_xml.h"
#include "sigv4.h"
#include "store.h"

#define S3_TRANSPORT_ERR_MAX 256 /* == CURL_ERROR_SIZE (checked in s3_client.c) */

struct s3_client;

/* How to reach the bucket. Strings are copied; the caller keeps its own. */
struct s3_client_config {
    const char *bucket;       /* bucket name, for addressing and logs */
    const char *endpoint_url; /* "http(s)://host[:port][/path]" */
    int force_path_style;     /* --force-path-style */
    enum aws_addressing addressing;
    const char *region; /* region requests are signed for */
    /* Signs each attempt with its current credentials; NULL: anonymous
     * (unsigned) requests. Not owned: must outlive the client. */
    struct creds_provider *creds;
    int max_connections; /* requests in flight at most (> 0) */
    int connect_timeout_ms;
    int request_timeout_ms; /* no progress for this long fails an attempt */
    int unsigned_payload;   /* sign bodies as UNSIGNED-PAYLOAD, not their SHA-256 */
    /* The store's counters: errors and retries are counted here, and
     * list_requests by s3_client_list_page. Must outlive the client. */
    struct store_counters *counters;
};

struct s3_response;

/* Where a request body comes from. */
enum s3_body_kind {
    S3_BODY_NONE = 0, /* no body (Content-Length: 0 for PUT/POST) */
    S3_BODY_MEM,      /* data[0..len) */
    S3_BODY_FD, /* fd at offset..offset+len, read with pread (streamed, never all in memory) */
};

struct s3_body {
    enum s3_body_kind kind;
    const void *data;
    int fd;
    uint64_t offset;
    uint64_t len;
};

/* One HTTP request, described before it is sent. */
struct s3_request {
    const char *what;   /* "HEAD", "GET", "LIST", "PUT", ... for logs */
    const char *method; /* "HEAD", "GET", "PUT", "POST" or "DELETE" */
    const char *key;    /* object key, or NULL for a bucket-level request */
    const struct sigv4_pair *query;
    size_t nquery;
    const char *range;    /* Range header value or NULL */
    const char *if_match; /* If-Match header value or NULL */
    /* Further headers, all signed (x-amz-copy-source, Content-Type, ...). */
    const struct sigv4_pair *headers;
    size_t nheaders;
    struct s3_body body; /* only for PUT and POST */
    /* Sign the body with its SHA-256 even when the client sends
     * UNSIGNED-PAYLOAD (small bodies such as the Complete XML). */
    int sign_payload;
    /* A 2xx answer may carry an <Error> document (CompleteMultipartUpload,
     * CopyObject, UploadPartCopy): treated like the status its code names. */
    int error_in_200;
    char *sink; /* fixed body buffer (reads), or NULL for a growable one */
    size_t sink_cap;
    int max_retries;
    int quiet;                     /* don't log the final failure (mount check reports it itself) */
    atomic_uint_fast64_t *counter; /* bumped once per attempt */
    /* Called after each piece of a 2xx body lands in sink (reads): may set
     * rs->sink_final to make sink[0, sink_final) final (see s3_response). */
    void (*on_body)(const struct s3_request *rq, struct s3_response *rs);
    /* Checks a 2xx answer: 0 ok, -EAGAIN retry, other negative: fail. */
    int (*check)(const struct s3_request *rq, struct s3_response *rs);
    const void *check_arg;
    /* How s3_client_call reads the final outcome; NULL hooks: the usual.
     * A 2xx answer: the request's result, 0 or a negative errno
     * (s3_client_bad_answer for one it cannot use). Usual: 0. */
    int (*read_answer)(const struct s3_request *rq, struct s3_response *rs);
    /* Any other outcome: rc < 0, failed without a usable HTTP answer
     * (already counted, and logged unless quiet); rc == 0, a non-2xx
     * answer. The request's result, or S3_USUAL: rc, or for an HTTP
     * answer its errno (logged unless quiet, and counted). */
    int (*read_error)(const struct s3_request *rq, struct s3_response *rs, int rc);
    void *answer; /* what the hooks read the answer into */
};

/* What read_error returns for an outcome it leaves to s3_client_call. */
#define S3_USUAL INT_MAX

/* What came back. */
struct s3_response {
    long status;                              /* 0 = no HTTP answer */
    int transport_rc;                         /* the transport's result code, 0 = ok */
    char transport_err[S3_TRANSPORT_ERR_MAX]; /* its detailed message, or "" */
    int64_t content_length;                   /* -1 if absent */
    int has_range;                            /* Content-Range: bytes start-end/total */
    uint64_t range_start, range_end, range_total;
    char etag[STORE_ETAG_MAX];
    int64_t last_modified;
    char request_id[128];
    char bucket_region[64];
    struct store_attrs attrs; /* x-amz-meta-mode/uid/gid/mtime (store.h), without READ */
    char *body;               /* 2xx body: the caller's sink, or malloc'ed */
    size_t body_len, body_cap;
    int body_fixed;
    /* sink[0, sink_final) was handed out as final by on_body: kept across
     * retries, a retried answer's bytes below it are not written again. */
    size_t sink_final;
    const struct s3_request *on_body_rq; /* the request whose on_body to call */
    int overflow;                        /* more body than the sink holds */
    int past_eof;       /* 206 whose Content-Range starts at or past the object's end */
    int embedded_error; /* a 200 carried an <Error>: status is the one its code names */
    int attempts;       /* attempts made (> 1: the request was retried) */
    int body_errno;     /* reading the request body failed (positive errno), 0 = ok */
    char *err_body;
    size_t err_len;
    struct s3_error_body err; /* parsed <Error>, if any */
};

/* One ListObjectsV2 request. */
struct s3_list_query {
    const char *prefix;
    const char *token;       /* continuation token or NULL */
    const char *start_after; /* first page: keys after this one only, or NULL */
    int delimiter;           /* group by '/' */
    int max_keys;            /* 0 = server default (1000) */
    int max_retries;
};

/* Initialize the HTTP library once per process (thread-safe, idempotent).
 * 0, or -EIO with a one-line reason in err. */
int s3_client_global_init(char *err, size_t errlen);

/* A client for cfg->bucket at cfg->endpoint_url. 0, or a negative errno:
 * -EINVAL with a one-line reason in err (bad endpoint URL), -ENOMEM. */
int s3_client_create(const struct s3_client_config *cfg, struct s3_client **out, char *err,
                     size_t errlen);
void s3_client_destroy(struct s3_client *c);

/* The endpoint URL for messages, ending in '/'. */
const char *s3_client_endpoint(const struct s3_client *c);
/* 1 if requests use path-style addressing, 0 if virtual-hosted. */
int s3_client_path_style(const struct s3_client *c);

/* The one way a request is made: send rq with retries, read its outcome
 * with rq->read_answer / rq->read_error (rs lives only during them).
 * The request's result: 0 (or what read_answer returns), or a negative
 * errno (an HTTP error logged unless rq->quiet, and counted). */
int s3_client_call(struct s3_client *c, const struct s3_request *rq);

/* A 2xx answer that rq cannot use (problem says why): log, count, -EIO. */
int s3_client_bad_answer(struct s3_client *c, const struct s3_request *rq, const char *problem);

/* One ListObjectsV2 page into *page (free with s3_list_page_free). 0 or a
 * negative errno (logged and counted); on failure *page is empty. */
int s3_client_list_page(struct s3_client *c, const struct s3_list_query *lq,
                        struct s3_list_page *page);

/* Pure: if body (a 2xx answer's) is an <Error> document, fill *err and
 * return the HTTP status to treat the answer as: the one S3 sends with its
 * code, or 500 for a code it does not know (a failure after the server had
 * accepted the request). 0 if body is not an <Error> document. */
long s3_client_embedded_error(const char *body, size_t len, struct s3_error_body *err);

/* The generic text for rs->transport_rc, e.g. "Couldn't connect to server". */
const char *s3_response_transport_message(const struct s3_response *rs);

#endif
