/*
 * fs/store/s3/s3_error.h - what an S3 failure means: errno, retryability, user message.
 *
 * One table maps (HTTP status, S3 error code) and transport failures to an
 * errno and a retry policy. s3_client.c classifies libcurl results into
 * enum s3_transport (this module does not see curl.h).
 */
#ifndef CKPTFS_S3_ERROR_H
#define CKPTFS_S3_ERROR_H

#include <stddef.h>

enum s3_retry {
    S3_NO_RETRY = 0,
    S3_RETRY = 1,            /* transient: retry with backoff */
    S3_RETRY_IF_REACHED = 2, /* retry only if the endpoint has answered before
                                (e.g. connection refused while a server restarts) */
};

/* What kind of failure, for the user-facing message at mount. */
enum s3_error_kind {
    S3K_OTHER = 0,
    S3K_NOT_FOUND,   /* object or key missing */
    S3K_NO_BUCKET,   /* bucket missing */
    S3K_ACCESS,      /* denied, bad key id, expired token */
    S3K_SIGNATURE,   /* signature rejected */
    S3K_CLOCK,       /* request time too skewed */
    S3K_REGION,      /* wrong region / redirect */
    S3K_STALE,       /* precondition (If-Match) failed */
    S3K_RANGE,       /* range not satisfiable */
    S3K_THROTTLE,    /* slow down, too many requests */
    S3K_SERVER,      /* 5xx */
    S3K_TIMEOUT,     /* no progress / request timeout */
    S3K_UNREACHABLE, /* DNS, refused, TLS: never got an HTTP answer */
    S3K_CONNECTION,  /* connection broke mid-request */
};

/* Transport-level outcome of a request (no HTTP status available). */
enum s3_transport {
    S3T_OK = 0,
    S3T_TIMEOUT,       /* connect or no-progress timeout */
    S3T_RESOLVE,       /* DNS failure */
    S3T_REFUSED,       /* couldn't connect */
    S3T_RESET,         /* send/recv error, empty reply, partial body */
    S3T_TLS_HANDSHAKE, /* TLS handshake failed (reset, or not TLS at all) */
    S3T_TLS,           /* certificate problems */
    S3T_BODY_LIMIT,    /* response bigger than we accept (our own abort) */
    S3T_OTHER,
};

struct s3_error_class {
    int err;             /* errno while classifying, e.g. EAGAIN for throttling */
    int final_err;       /* errno returned to callers once retries are over */
    enum s3_retry retry; /* whether to retry */
    enum s3_error_kind kind;
};

/* Classify an HTTP error response. code may be NULL or "" (HEAD has no body).
 * Unknown codes fall back to a per-status row, then to the status class. */
struct s3_error_class s3_error_classify(long http_status, const char *code);

/* Classify a transport failure. */
struct s3_error_class s3_error_transport(enum s3_transport t);

/* The HTTP status S3 sends with error code (e.g. 500 for "InternalError",
 * 404 for "NoSuchUpload"), 0 if unknown: how to treat an <Error> document
 * that arrives in a 200 answer. */
long s3_error_status_of(const char *code);

/* Shortcuts over s3_error_classify. */
int s3_error_errno(long http_status, const char *code); /* final errno, positive */
int s3_error_retryable(long http_status, const char *code, int reached);

/* One-line user-facing reason for a failed mount check, written to buf.
 * bucket/prefix name the mount; code/message/region come from the response
 * (any may be NULL); transport_msg is the transport error text, url the
 * endpoint, used when http_status is 0. Returns buf. */
struct s3_mount_failure {
    const char *bucket;
    const char *prefix;
    long http_status;          /* 0 = no HTTP answer */
    const char *code;          /* S3 error code */
    const char *message;       /* S3 error message */
    const char *bucket_region; /* x-amz-bucket-region, if the server sent it */
    const char *region;        /* the region we signed for */
    const char *url;           /* endpoint URL */
    const char *transport_msg; /* e.g. "Couldn't connect to server" */
};
char *s3_error_mount_message(const struct s3_mount_failure *f, char *buf, size_t len);

#endif
