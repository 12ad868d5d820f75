/*
 * fs/store/s3/s3_error.c - the S3 error table: (HTTP status, S3 code) -> errno, retry
 * policy and kind; transport failures -> the same; user-facing messages for
 * a failed mount check. Pure functions, no I/O.
 */
#include "s3_error.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

struct s3_error_row {
    long status;      /* 0 = any status */
    const char *code; /* NULL = any code (a per-status fallback row) */
    struct s3_error_class cls;
};

/* Rows with a code are matched first (status 0 = any status), then the
 * code-less row for the status, then the status class (see classify). */
static const struct s3_error_row error_table[] = {
    /* credentials and signing */
    {0, "AccessDenied", {EACCES, EACCES, S3_NO_RETRY, S3K_ACCESS}},
    {0, "InvalidAccessKeyId", {EACCES, EACCES, S3_NO_RETRY, S3K_ACCESS}},
    {0, "AllAccessDisabled", {EACCES, EACCES, S3_NO_RETRY, S3K_ACCESS}},
    {0, "AccountProblem", {EACCES, EACCES, S3_NO_RETRY, S3K_ACCESS}},
    {0, "ExpiredToken", {EACCES, EACCES, S3_NO_RETRY, S3K_ACCESS}},
    {0, "InvalidToken", {EACCES, EACCES, S3_NO_RETRY, S3K_ACCESS}},
    {0, "TokenRefreshRequired", {EACCES, EACCES, S3_NO_RETRY, S3K_ACCESS}},
    {0, "InvalidObjectState", {EACCES, EACCES, S3_NO_RETRY, S3K_ACCESS}},
    {0, "SignatureDoesNotMatch", {EACCES, EACCES, S3_NO_RETRY, S3K_SIGNATURE}},
    {0, "RequestTimeTooSkewed", {EACCES, EACCES, S3_NO_RETRY, S3K_CLOCK}},
    /* wrong region */
    {0, "PermanentRedirect", {EINVAL, EINVAL, S3_NO_RETRY, S3K_REGION}},
    {0, "AuthorizationHeaderMalformed", {EINVAL, EINVAL, S3_NO_RETRY, S3K_REGION}},
    {0, "IllegalLocationConstraintException", {EINVAL, EINVAL, S3_NO_RETRY, S3K_REGION}},
    /* missing things */
    {0, "NoSuchBucket", {ENOENT, ENOENT, S3_NO_RETRY, S3K_NO_BUCKET}},
    {0, "NoSuchKey", {ENOENT, ENOENT, S3_NO_RETRY, S3K_NOT_FOUND}},
    {0, "NoSuchVersion", {ENOENT, ENOENT, S3_NO_RETRY, S3K_NOT_FOUND}},
    {0, "NoSuchUpload", {ENOENT, ENOENT, S3_NO_RETRY, S3K_NOT_FOUND}},
    /* multipart uploads (NoSuchUpload is above) */
    {0, "InvalidPart", {EINVAL, EINVAL, S3_NO_RETRY, S3K_OTHER}},
    {0, "InvalidPartOrder", {EINVAL, EINVAL, S3_NO_RETRY, S3K_OTHER}},
    {0, "EntityTooSmall", {EINVAL, EINVAL, S3_NO_RETRY, S3K_OTHER}},
    {0, "EntityTooLarge", {EFBIG, EFBIG, S3_NO_RETRY, S3K_OTHER}},
    /* conditions and ranges */
    {0, "PreconditionFailed", {ESTALE, ESTALE, S3_NO_RETRY, S3K_STALE}},
    {0, "InvalidRange", {EINVAL, EINVAL, S3_NO_RETRY, S3K_RANGE}},
    /* bad requests */
    {0, "KeyTooLongError", {ENAMETOOLONG, ENAMETOOLONG, S3_NO_RETRY, S3K_OTHER}},
    {0, "InvalidBucketName", {EINVAL, EINVAL, S3_NO_RETRY, S3K_OTHER}},
    {0, "NotImplemented", {ENOSYS, ENOSYS, S3_NO_RETRY, S3K_OTHER}},
    {0, "MethodNotAllowed", {EPERM, EPERM, S3_NO_RETRY, S3K_OTHER}},
    /* transient */
    {0, "OperationAborted", {EBUSY, EBUSY, S3_RETRY, S3K_OTHER}},
    {0, "RequestTimeout", {ETIMEDOUT, ETIMEDOUT, S3_RETRY, S3K_TIMEOUT}},
    {0, "IncompleteBody", {ECONNRESET, EIO, S3_RETRY, S3K_CONNECTION}},
    /* the body we sent does not match its signed SHA-256 / Content-MD5:
     * damaged on the way (or the staging file changed): send it again */
    {0, "XAmzContentSHA256Mismatch", {EIO, EIO, S3_RETRY, S3K_CONNECTION}},
    {0, "BadDigest", {EIO, EIO, S3_RETRY, S3K_CONNECTION}},
    {0, "SlowDown", {EAGAIN, EIO, S3_RETRY, S3K_THROTTLE}},
    {0, "TooManyRequests", {EAGAIN, EIO, S3_RETRY, S3K_THROTTLE}},
    {0, "InternalError", {EAGAIN, EIO, S3_RETRY, S3K_SERVER}},
    {0, "ServiceUnavailable", {EAGAIN, EIO, S3_RETRY, S3K_SERVER}},
    /* per-status fallbacks */
    {301, NULL, {EINVAL, EINVAL, S3_NO_RETRY, S3K_REGION}},
    {307, NULL, {EIO, EIO, S3_NO_RETRY, S3K_REGION}},
    {400, NULL, {EINVAL, EINVAL, S3_NO_RETRY, S3K_OTHER}},
    {401, NULL, {EACCES, EACCES, S3_NO_RETRY, S3K_ACCESS}},
    {403, NULL, {EACCES, EACCES, S3_NO_RETRY, S3K_ACCESS}},
    {404, NULL, {ENOENT, ENOENT, S3_NO_RETRY, S3K_NOT_FOUND}},
    {405, NULL, {EPERM, EPERM, S3_NO_RETRY, S3K_OTHER}},
    {408, NULL, {ETIMEDOUT, ETIMEDOUT, S3_RETRY, S3K_TIMEOUT}},
    {409, NULL, {EBUSY, EBUSY, S3_NO_RETRY, S3K_OTHER}},
    {411, NULL, {EINVAL, EINVAL, S3_NO_RETRY, S3K_OTHER}},
    {412, NULL, {ESTALE, ESTALE, S3_NO_RETRY, S3K_STALE}},
    {416, NULL, {EINVAL, EINVAL, S3_NO_RETRY, S3K_RANGE}},
    {429, NULL, {EAGAIN, EIO, S3_RETRY, S3K_THROTTLE}},
    {501, NULL, {ENOSYS, ENOSYS, S3_NO_RETRY, S3K_OTHER}},
    {503, NULL, {EAGAIN, EIO, S3_RETRY, S3K_THROTTLE}},
};

static const struct s3_error_class class_5xx = {EAGAIN, EIO, S3_RETRY, S3K_SERVER};
static const struct s3_error_class class_4xx = {EINVAL, EINVAL, S3_NO_RETRY, S3K_OTHER};
static const struct s3_error_class class_other = {EIO, EIO, S3_NO_RETRY, S3K_OTHER};

#define NROWS (sizeof error_table / sizeof error_table[0])

struct s3_error_class s3_error_classify(long http_status, const char *code)
{
    if (code && *code) {
        for (size_t i = 0; i < NROWS; i++) {
            const struct s3_error_row *r = &error_table[i];
            if (r->code && strcmp(r->code, code) == 0 &&
                (r->status == 0 || r->status == http_status))
                return r->cls;
        }
    }
    for (size_t i = 0; i < NROWS; i++)
        if (!error_table[i].code && error_table[i].status == http_status)
            return error_table[i].cls;
    if (http_status >= 500 && http_status <= 599)
        return class_5xx;
    if (http_status >= 400 && http_status <= 499)
        return class_4xx;
    return class_other;
}

struct s3_error_class s3_error_transport(enum s3_transport t)
{
    static const struct s3_error_class table[] = {
        [S3T_OK] = {0, 0, S3_NO_RETRY, S3K_OTHER},
        [S3T_TIMEOUT] = {ETIMEDOUT, ETIMEDOUT, S3_RETRY, S3K_TIMEOUT},
        [S3T_RESOLVE] = {EHOSTUNREACH, EIO, S3_RETRY_IF_REACHED, S3K_UNREACHABLE},
        [S3T_REFUSED] = {ECONNREFUSED, EIO, S3_RETRY_IF_REACHED, S3K_UNREACHABLE},
        [S3T_RESET] = {ECONNRESET, EIO, S3_RETRY, S3K_CONNECTION},
        [S3T_TLS_HANDSHAKE] = {EPROTO, EIO, S3_RETRY_IF_REACHED, S3K_UNREACHABLE},
        [S3T_TLS] = {EPROTO, EIO, S3_NO_RETRY, S3K_UNREACHABLE},
        [S3T_BODY_LIMIT] = {EFBIG, EIO, S3_NO_RETRY, S3K_OTHER},
        [S3T_OTHER] = {EIO, EIO, S3_NO_RETRY, S3K_OTHER},
    };
    if ((unsigned)t >= sizeof table / sizeof table[0])
        return table[S3T_OTHER];
    return table[t];
}

/* The status S3 sends each code with, for an <Error> inside a 200 answer. */
static const struct {
    const char *code;
    long status;
} code_status[] = {
    {"AccessDenied", 403},
    {"InvalidAccessKeyId", 403},
    {"SignatureDoesNotMatch", 403},
    {"RequestTimeTooSkewed", 403},
    {"ExpiredToken", 400},
    {"InvalidToken", 400},
    {"NoSuchBucket", 404},
    {"NoSuchKey", 404},
    {"NoSuchUpload", 404},
    {"NoSuchVersion", 404},
    {"MethodNotAllowed", 405},
    {"OperationAborted", 409},
    {"PreconditionFailed", 412},
    {"InvalidRange", 416},
    {"InvalidArgument", 400},
    {"InvalidRequest", 400},
    {"InvalidPart", 400},
    {"InvalidPartOrder", 400},
    {"EntityTooSmall", 400},
    {"EntityTooLarge", 400},
    {"MalformedXML", 400},
    {"KeyTooLongError", 400},
    {"RequestTimeout", 400},
    {"IncompleteBody", 400},
    {"XAmzContentSHA256Mismatch", 400},
    {"BadDigest", 400},
    {"TooManyRequests", 429},
    {"InternalError", 500},
    {"NotImplemented", 501},
    {"SlowDown", 503},
    {"ServiceUnavailable", 503},
};

long s3_error_status_of(const char *code)
{
    for (size_t i = 0; code && i < sizeof code_status / sizeof code_status[0]; i++)
        if (strcmp(code_status[i].code, code) == 0)
            return code_status[i].status;
    return 0;
}

int s3_error_errno(long http_status, const char *code)
{
    return s3_error_classify(http_status, code).final_err;
}

int s3_error_retryable(long http_status, const char *code, int reached)
{
    enum s3_retry r = s3_error_classify(http_status, code).retry;
    return r == S3_RETRY || (r == S3_RETRY_IF_REACHED && reached);
}

/* ---- user-facing mount messages ----------------------------------------- */

static const char *nz(const char *s, const char *dflt)
{
    return s && *s ? s : dflt;
}

static void region_message(const struct s3_mount_failure *f, const char *code, char *buf,
                           size_t len)
{
    if (f->bucket_region && *f->bucket_region)
        snprintf(buf, len, "bucket '%s' is in region '%s', not '%s' (%s): use --region %s",
                 f->bucket, f->bucket_region, nz(f->region, "?"), code, f->bucket_region);
    else
        snprintf(buf, len, "wrong region '%s' for bucket '%s' (%s): check --region or AWS_REGION",
                 nz(f->region, "?"), f->bucket, code);
}

char *s3_error_mount_message(const struct s3_mount_failure *f, char *buf, size_t len)
{
    if (!buf || !len)
        return buf;
    const char *bucket = nz(f->bucket, "?");
    if (f->http_status == 0) {
        snprintf(buf, len, "cannot reach %s : %s", nz(f->url, "endpoint"),
                 nz(f->transport_msg, "unknown error"));
        return buf;
    }
    char status_code[32];
    snprintf(status_code, sizeof status_code, "HTTP %ld", f->http_status);
    const char *code = nz(f->code, status_code);
    const char *sep = f->prefix && *f->prefix ? "/" : "";
    const char *prefix = f->prefix ? f->prefix : "";
    switch (s3_error_classify(f->http_status, f->code).kind) {
    case S3K_NO_BUCKET:
    case S3K_NOT_FOUND:
        snprintf(buf, len, "bucket '%s' does not exist (%s)", bucket, code);
        break;
    case S3K_ACCESS:
        snprintf(buf, len, "access denied to s3://%s/%s%s (%s): check credentials", bucket, prefix,
                 sep, code);
        break;
    case S3K_SIGNATURE:
        snprintf(buf, len, "signature rejected (%s): check the secret key and region", code);
        break;
    case S3K_CLOCK:
        snprintf(buf, len, "request time rejected (%s): check the system clock", code);
        break;
    case S3K_REGION:
        region_message(f, code, buf, len);
        break;
    default:
        snprintf(buf, len, "s3://%s/: %s%s%s%s%s", bucket, status_code,
                 f->code && *f->code ? " " : "", nz(f->code, ""),
                 f->message && *f->message ? ": " : "", nz(f->message, ""));
        break;
    }
    return buf;
}
