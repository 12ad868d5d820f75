/*
 * tests/unit/test_s3_write.c - the pure helpers of the S3 write path: an
 * <Error> document inside a 200 answer (s3_client_embedded_error), the
 * UploadPartCopy part size (s3_copy_part_size) and the multipart ETag that
 * recognises a completion whose answer was lost (s3_multipart_etag).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "s3_client.h"
#include "s3_error.h"
#include "store_s3_write.h"

static long embedded(const char *body, struct s3_error_body *e)
{
    return s3_client_embedded_error(body, strlen(body), e);
}

Test(s3_write, error_inside_200)
{
    struct s3_error_body e;
    /* as CompleteMultipartUpload sends it: spaces, then the document */
    cr_expect_eq(embedded("   \n<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>"
                          "InternalError</Code><Message>We encountered an internal error."
                          "</Message><RequestId>R1</RequestId></Error>",
                          &e),
                 500);
    cr_expect_str_eq(e.code, "InternalError");
    cr_expect_str_eq(e.request_id, "R1");
    cr_expect_eq(s3_error_retryable(500, e.code, 1), 1, "retried like a 500");
    cr_expect_eq(embedded("<Error><Code>SlowDown</Code></Error>", &e), 503);
    cr_expect_eq(embedded("<Error><Code>NoSuchUpload</Code></Error>", &e), 404);
    cr_expect_eq(embedded("<Error><Code>AccessDenied</Code></Error>", &e), 403);
    cr_expect_eq(embedded("<Error><Code>InvalidPart</Code></Error>", &e), 400);
    cr_expect_eq(s3_error_retryable(400, e.code, 1), 0, "not retried");
    cr_expect_eq(embedded("<Error><Code>SomethingNew</Code></Error>", &e), 500,
                 "unknown code: a failure after the server accepted the request");
    cr_expect_eq(embedded("<Error></Error>", &e), 500);
}

Test(s3_write, success_bodies_are_not_errors)
{
    struct s3_error_body e;
    cr_expect_eq(embedded("<CompleteMultipartUploadResult><ETag>\"e\"</ETag>"
                          "</CompleteMultipartUploadResult>",
                          &e),
                 0);
    cr_expect_str_eq(e.code, "");
    /* an object key that contains "<Error" is no error */
    cr_expect_eq(embedded("<CompleteMultipartUploadResult><Key>&lt;Error&gt;</Key><Location>"
                          "<Error>x</Error></Location></CompleteMultipartUploadResult>",
                          &e),
                 0);
    cr_expect_eq(embedded("<CopyObjectResult><ETag>\"e\"</ETag></CopyObjectResult>", &e), 0);
    cr_expect_eq(embedded("", &e), 0);
    cr_expect_eq(s3_client_embedded_error(NULL, 0, &e), 0);
    cr_expect_eq(embedded("<Error><Code>InternalError</Code>", &e), 0, "malformed: not an Error");
    cr_expect_str_eq(e.code, "");
    cr_expect_eq(embedded("<!DOCTYPE x [<!ENTITY a \"b\">]><Error><Code>&a;</Code></Error>", &e),
                 0);
}

Test(s3_write, copy_part_size)
{
    const uint64_t GiB = 1ull << 30, MiB = 1ull << 20;
    cr_expect_eq(s3_copy_part_size(5 * GiB + 1), S3_COPY_PART_SIZE);
    cr_expect_eq(s3_copy_part_size(10000 * GiB), GiB, "exactly 10,000 parts of 1 GiB");
    cr_expect_eq(s3_copy_part_size(10000 * GiB + 1), GiB + MiB);
    uint64_t five_tib = 5ull << 40; /* S3's largest object */
    uint64_t p = s3_copy_part_size(five_tib);
    cr_expect_leq(p, STORE_MAX_PART);
    cr_expect_leq((five_tib + p - 1) / p, STORE_MAX_PARTS);
    cr_expect_eq(s3_copy_part_size(STORE_MAX_PARTS * STORE_MAX_PART), STORE_MAX_PART);
    cr_expect_eq(s3_copy_part_size(STORE_MAX_PARTS * STORE_MAX_PART + 1), 0, "cannot be done");
    for (uint64_t size = 5 * GiB; size < 60000 * GiB; size = size * 3 / 2 + 12345) {
        p = s3_copy_part_size(size);
        if (!p)
            break;
        cr_expect_leq(p, STORE_MAX_PART, "size %llu", (unsigned long long)size);
        cr_expect_geq(p, STORE_MIN_PART);
        cr_expect_leq((size + p - 1) / p, STORE_MAX_PARTS, "size %llu", (unsigned long long)size);
    }
}

Test(s3_write, multipart_etag)
{
    /* python: md5(bytes.fromhex(a) + bytes.fromhex(b)).hexdigest() + "-2" */
    struct store_part parts[2] = {{.number = 1, .etag = "\"5d41402abc4b2a76b9719d911017c592\""},
                                  {.number = 2, .etag = "7d793037a0760186574b0282f2f435e7"}};
    char etag[STORE_ETAG_MAX];
    cr_assert_eq(s3_multipart_etag(parts, 2, etag), 0);
    cr_expect_str_eq(etag, "\"065947336a2f2a95ba8899f3675c3be6-2\"");
    cr_assert_eq(s3_multipart_etag(parts, 1, etag), 0);
    cr_expect_str_eq(etag, "\"62109206880d38a4010a98e11243924a-1\"");
}

Test(s3_write, multipart_etag_needs_md5_parts)
{
    struct store_part p = {.number = 1, .etag = "\"3858f62230ac3c915f300c664312c11f-9\""};
    char etag[STORE_ETAG_MAX];
    cr_expect_eq(s3_multipart_etag(&p, 1, etag), -EINVAL, "a multipart ETag is no part MD5");
    cr_expect_str_eq(etag, "");
    snprintf(p.etag, sizeof p.etag, "\"abc\"");
    cr_expect_eq(s3_multipart_etag(&p, 1, etag), -EINVAL);
    snprintf(p.etag, sizeof p.etag, "\"5d41402abc4b2a76b9719d911017c59z\"");
    cr_expect_eq(s3_multipart_etag(&p, 1, etag), -EINVAL);
    cr_expect_eq(s3_multipart_etag(&p, 0, etag), -EINVAL);
}
