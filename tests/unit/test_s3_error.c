/*
 * tests/unit/test_s3_error.c - the (HTTP status, S3 code) -> errno table,
 * retry policy, transport classes, the status of a code (for an <Error>
 * inside a 200 answer) and mount-time messages.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "s3_error.h"

Test(s3_error, access_codes_are_eacces)
{
    const char *codes[] = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                           "ExpiredToken", "InvalidToken",       "RequestTimeTooSkewed"};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        cr_expect_eq(s3_error_errno(403, codes[i]), EACCES, "%s", codes[i]);
        cr_expect_eq(s3_error_retryable(403, codes[i], 1), 0, "%s", codes[i]);
    }
    cr_expect_eq(s3_error_errno(403, NULL), EACCES, "HEAD has no body");
    cr_expect_eq(s3_error_errno(401, ""), EACCES);
    cr_expect_eq(s3_error_classify(403, "SignatureDoesNotMatch").kind, S3K_SIGNATURE);
    cr_expect_eq(s3_error_classify(403, "RequestTimeTooSkewed").kind, S3K_CLOCK);
}

Test(s3_error, missing_things_are_enoent)
{
    cr_expect_eq(s3_error_errno(404, "NoSuchKey"), ENOENT);
    cr_expect_eq(s3_error_errno(404, NULL), ENOENT);
    cr_expect_eq(s3_error_errno(404, "NoSuchBucket"), ENOENT);
    cr_expect_eq(s3_error_classify(404, "NoSuchBucket").kind, S3K_NO_BUCKET);
    cr_expect_eq(s3_error_classify(404, "NoSuchKey").kind, S3K_NOT_FOUND);
    cr_expect_eq(s3_error_retryable(404, "NoSuchKey", 1), 0);
}

Test(s3_error, conditions_ranges_conflicts_bad_requests)
{
    cr_expect_eq(s3_error_errno(412, "PreconditionFailed"), ESTALE);
    cr_expect_eq(s3_error_errno(412, NULL), ESTALE);
    cr_expect_eq(s3_error_errno(416, "InvalidRange"), EINVAL);
    cr_expect_eq(s3_error_errno(400, "InvalidArgument"), EINVAL);
    cr_expect_eq(s3_error_errno(400, NULL), EINVAL);
    cr_expect_eq(s3_error_errno(409, NULL), EBUSY);
    cr_expect_eq(s3_error_errno(409, "OperationAborted"), EBUSY);
    cr_expect_eq(s3_error_retryable(409, "OperationAborted", 0), 1);
    cr_expect_eq(s3_error_errno(400, "KeyTooLongError"), ENAMETOOLONG);
    cr_expect_eq(s3_error_errno(418, NULL), EINVAL, "unknown 4xx");
    for (long st = 400; st < 500; st++)
        if (st != 408 && st != 429)
            cr_expect_eq(s3_error_retryable(st, NULL, 1), 0, "status %ld", st);
}

Test(s3_error, throttling_and_server_errors_retry_then_eio)
{
    struct s3_error_class c = s3_error_classify(503, "SlowDown");
    cr_expect_eq(c.err, EAGAIN);
    cr_expect_eq(c.final_err, EIO);
    cr_expect_eq(c.retry, S3_RETRY);
    cr_expect_eq(c.kind, S3K_THROTTLE);
    cr_expect_eq(s3_error_retryable(500, "InternalError", 0), 1);
    cr_expect_eq(s3_error_retryable(502, NULL, 0), 1);
    cr_expect_eq(s3_error_retryable(504, "", 0), 1);
    cr_expect_eq(s3_error_errno(599, NULL), EIO);
    cr_expect_eq(s3_error_retryable(429, NULL, 0), 1);
    cr_expect_eq(s3_error_errno(429, NULL), EIO);
    cr_expect_eq(s3_error_retryable(408, NULL, 0), 1);
    cr_expect_eq(s3_error_errno(408, NULL), ETIMEDOUT);
    cr_expect_eq(s3_error_retryable(400, "RequestTimeout", 0), 1);
    cr_expect_eq(s3_error_errno(501, "NotImplemented"), ENOSYS);
    cr_expect_eq(s3_error_retryable(501, NULL, 0), 0);
    /* A known code wins over the status fallback: SlowDown sent with 200? still throttle */
    cr_expect_eq(s3_error_classify(500, "SlowDown").kind, S3K_THROTTLE);
}

Test(s3_error, write_errors)
{
    cr_expect_eq(s3_error_errno(404, "NoSuchUpload"), ENOENT);
    cr_expect_eq(s3_error_retryable(404, "NoSuchUpload", 1), 0);
    cr_expect_eq(s3_error_errno(400, "InvalidPart"), EINVAL);
    cr_expect_eq(s3_error_errno(400, "InvalidPartOrder"), EINVAL);
    cr_expect_eq(s3_error_errno(400, "EntityTooSmall"), EINVAL);
    cr_expect_eq(s3_error_errno(400, "EntityTooLarge"), EFBIG);
    cr_expect_eq(s3_error_retryable(400, "EntityTooLarge", 1), 0);
    /* the body did not match its signed hash: damaged on the way, send again */
    cr_expect_eq(s3_error_retryable(400, "XAmzContentSHA256Mismatch", 0), 1);
    cr_expect_eq(s3_error_errno(400, "XAmzContentSHA256Mismatch"), EIO);
    cr_expect_eq(s3_error_retryable(400, "BadDigest", 0), 1);
    cr_expect_eq(s3_error_errno(400, "BadDigest"), EIO);
    cr_expect_eq(s3_error_errno(412, "PreconditionFailed"), ESTALE, "copy if-match");
}

Test(s3_error, status_of_codes)
{
    cr_expect_eq(s3_error_status_of("InternalError"), 500);
    cr_expect_eq(s3_error_status_of("SlowDown"), 503);
    cr_expect_eq(s3_error_status_of("ServiceUnavailable"), 503);
    cr_expect_eq(s3_error_status_of("NoSuchUpload"), 404);
    cr_expect_eq(s3_error_status_of("NoSuchKey"), 404);
    cr_expect_eq(s3_error_status_of("AccessDenied"), 403);
    cr_expect_eq(s3_error_status_of("PreconditionFailed"), 412);
    cr_expect_eq(s3_error_status_of("InvalidPart"), 400);
    cr_expect_eq(s3_error_status_of("NoSuchThing"), 0);
    cr_expect_eq(s3_error_status_of(""), 0);
    cr_expect_eq(s3_error_status_of(NULL), 0);
    /* every status given classifies the code the same as the code alone does */
    const char *codes[] = {"InternalError", "SlowDown",       "NoSuchUpload",    "AccessDenied",
                           "InvalidPart",   "RequestTimeout", "OperationAborted"};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        long st = s3_error_status_of(codes[i]);
        cr_expect_eq(s3_error_retryable(st, codes[i], 1), s3_error_retryable(0, codes[i], 1), "%s",
                     codes[i]);
        cr_expect_eq(s3_error_errno(st, codes[i]), s3_error_errno(0, codes[i]), "%s", codes[i]);
    }
}

Test(s3_error, region_errors)
{
    cr_expect_eq(s3_error_classify(301, "PermanentRedirect").kind, S3K_REGION);
    cr_expect_eq(s3_error_classify(301, NULL).kind, S3K_REGION);
    cr_expect_eq(s3_error_classify(400, "AuthorizationHeaderMalformed").kind, S3K_REGION);
    cr_expect_eq(s3_error_errno(301, NULL), EINVAL);
}

Test(s3_error, transport_classes)
{
    struct s3_error_class c = s3_error_transport(S3T_TIMEOUT);
    cr_expect_eq(c.err, ETIMEDOUT);
    cr_expect_eq(c.retry, S3_RETRY);
    c = s3_error_transport(S3T_REFUSED);
    cr_expect_eq(c.err, ECONNREFUSED);
    cr_expect_eq(c.final_err, EIO);
    cr_expect_eq(c.retry, S3_RETRY_IF_REACHED);
    c = s3_error_transport(S3T_RESET);
    cr_expect_eq(c.retry, S3_RETRY);
    cr_expect_eq(c.final_err, EIO);
    cr_expect_eq(s3_error_transport(S3T_RESOLVE).retry, S3_RETRY_IF_REACHED);
    cr_expect_eq(s3_error_transport(S3T_TLS).retry, S3_NO_RETRY);
    cr_expect_eq(s3_error_transport(S3T_BODY_LIMIT).retry, S3_NO_RETRY);
    cr_expect_eq(s3_error_transport((enum s3_transport)999).final_err, EIO);
}

Test(s3_error, retry_if_reached)
{
    /* no status row has RETRY_IF_REACHED, but the flag is honoured */
    cr_expect_eq(s3_error_retryable(503, NULL, 0), 1);
    cr_expect_eq(s3_error_retryable(403, NULL, 1), 0);
}

static const char *msg(struct s3_mount_failure f)
{
    static char buf[512];
    return s3_error_mount_message(&f, buf, sizeof buf);
}

Test(s3_error, mount_messages)
{
    cr_expect_str_eq(
        msg((struct s3_mount_failure){.bucket = "x", .http_status = 404, .code = "NoSuchBucket"}),
        "bucket 'x' does not exist (NoSuchBucket)");
    cr_expect_str_eq(msg((struct s3_mount_failure){
                         .bucket = "x", .http_status = 403, .code = "InvalidAccessKeyId"}),
                     "access denied to s3://x/ (InvalidAccessKeyId): check credentials");
    cr_expect_str_eq(
        msg((struct s3_mount_failure){
            .bucket = "x", .prefix = "p/q", .http_status = 403, .code = "AccessDenied"}),
        "access denied to s3://x/p/q/ (AccessDenied): check credentials");
    cr_expect_str_eq(msg((struct s3_mount_failure){
                         .bucket = "x", .http_status = 403, .code = "SignatureDoesNotMatch"}),
                     "signature rejected (SignatureDoesNotMatch): check the secret key and region");
    cr_expect_str_eq(msg((struct s3_mount_failure){.http_status = 0,
                                                   .url = "http://127.0.0.1:9/",
                                                   .transport_msg = "Couldn't connect to server"}),
                     "cannot reach http://127.0.0.1:9/ : Couldn't connect to server");
    cr_expect_str_eq(msg((struct s3_mount_failure){.bucket = "x",
                                                   .http_status = 301,
                                                   .code = "PermanentRedirect",
                                                   .bucket_region = "eu-west-1",
                                                   .region = "us-east-1"}),
                     "bucket 'x' is in region 'eu-west-1', not 'us-east-1' (PermanentRedirect): "
                     "use --region eu-west-1");
    cr_expect_str_eq(
        msg((struct s3_mount_failure){
            .bucket = "x", .http_status = 500, .code = "InternalError", .message = "try again"}),
        "s3://x/: HTTP 500 InternalError: try again");
    cr_expect_str_eq(msg((struct s3_mount_failure){.bucket = "x", .http_status = 502}),
                     "s3://x/: HTTP 502");
    cr_expect_str_eq(msg((struct s3_mount_failure){.bucket = "x", .http_status = 403}),
                     "access denied to s3://x/ (HTTP 403): check credentials");
}

Test(s3_error, mount_message_truncates)
{
    char small[16];
    struct s3_mount_failure f = {
        .bucket = "averyveryverylongbucketname", .http_status = 404, .code = "NoSuchBucket"};
    s3_error_mount_message(&f, small, sizeof small);
    cr_expect_eq(strlen(small), sizeof small - 1);
}
