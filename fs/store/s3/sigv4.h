/*
 * fs/store/s3/sigv4.h - AWS Signature Version 4 (header-based), done with OpenSSL.
 *
 * Pure functions: no I/O, no globals, no logging. The caller builds the list
 * of headers it will send (host, x-amz-date, x-amz-content-sha256, and
 * optionally x-amz-security-token, range, if-match, ...); every header in
 * that list is signed. Paths and query parameters are given raw (not
 * percent-encoded): this module encodes them exactly once, the S3 way, and
 * the caller must put the same encoded strings on the wire (see
 * sigv4_uri_encode and sigv4_canonical_query).
 *
 * Strings returned as char * are malloc'ed (free them); NULL means out of
 * memory or invalid input.
 */
#ifndef CKPTFS_SIGV4_H
#define CKPTFS_SIGV4_H

#include <stddef.h>
#include <time.h>

/* Payload hash of an empty body (GET, HEAD, LIST). */
#define SIGV4_EMPTY_SHA256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
/* Payload hash for streamed uploads whose body is not hashed. */
#define SIGV4_UNSIGNED_PAYLOAD "UNSIGNED-PAYLOAD"
#define SIGV4_ALGORITHM "AWS4-HMAC-SHA256"

/* A header or query parameter: name and value, both raw. */
struct sigv4_pair {
    const char *name;
    const char *value;
};

struct sigv4_request {
    const char *method;             /* "GET", "HEAD", ... */
    const char *path;               /* raw absolute path, e.g. "/bucket/a b.txt" */
    const struct sigv4_pair *query; /* raw names and values, any order */
    size_t nquery;
    const struct sigv4_pair *headers; /* every header to sign, any case and order */
    size_t nheaders;
    const char *payload_hash; /* hex SHA-256 of the body, or SIGV4_UNSIGNED_PAYLOAD */
};

struct sigv4_credentials {
    const char *access_key_id;
    const char *secret_access_key;
    const char *session_token; /* NULL or "" if none (caller adds the header) */
};

/* Hex SHA-256 of data (65 bytes with the NUL). */
void sigv4_sha256_hex(const void *data, size_t len, char out[65]);

/* "YYYYMMDDTHHMMSSZ" for t in UTC (17 bytes with the NUL). */
void sigv4_amz_date(time_t t, char out[17]);

/* Percent-encode per AWS rules: unreserved A-Z a-z 0-9 - . _ ~ stay, every
 * other byte becomes %XX (upper-case hex); '/' stays when keep_slash. */
char *sigv4_uri_encode(const char *s, int keep_slash);

/* Canonical query string: names and values encoded (slashes too), sorted by
 * encoded name then value, joined "a=1&b=2". "" when n == 0. */
char *sigv4_canonical_query(const struct sigv4_pair *q, size_t n);

/* Header value for signing: leading/trailing whitespace removed, inner runs
 * of spaces and tabs squeezed to one space. */
char *sigv4_trim_value(const char *v);

/* The canonical request; *signed_headers receives "host;x-amz-date;..." (malloc'ed)
 * when signed_headers is non-NULL. Headers of the same name are joined with ','
 * in the order given. The path is encoded once with slashes kept (S3 rule:
 * no normalization, no double encoding). */
char *sigv4_canonical_request(const struct sigv4_request *req, char **signed_headers);

/* "<date>/<region>/<service>/aws4_request" for amz_date "YYYYMMDDT...". */
char *sigv4_scope(const char *amz_date, const char *region, const char *service);

/* AWS4-HMAC-SHA256 \n amz_date \n scope \n hex(sha256(canonical_request)). */
char *sigv4_string_to_sign(const char *amz_date, const char *scope, const char *canonical_request);

/* kSigning = HMAC chain over "AWS4"+secret, date (YYYYMMDD), region, service,
 * "aws4_request". Returns 0, or -1 on bad input. */
int sigv4_signing_key(const char *secret, const char *date8, const char *region,
                      const char *service, unsigned char key[32]);

/* Hex signature of string_to_sign with key (65 bytes with the NUL). */
void sigv4_signature(const unsigned char key[32], const char *string_to_sign, char out[65]);

/* The whole chain: the value of the Authorization header for req, signed at
 * amz_date (which must also be the request's x-amz-date header). */
char *sigv4_authorization(const struct sigv4_request *req, const struct sigv4_credentials *cred,
                          const char *amz_date, const char *region, const char *service);

#endif
