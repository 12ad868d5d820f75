/*
 * fs/store/s3/http.h - the libcurl plumbing under both HTTP clients of the S3
 * store: the S3 client engine (s3_client.c) and the credentials sources
 * (creds.c: IMDS, the container endpoint, STS).
 *
 * Owns: the options every easy handle starts with (no signals, the user
 * agent, http and https only, no redirects), header lists made of
 * "Name: value" lines (wiped once copied: they may carry secrets), the
 * bounded answer buffer (NUL-terminated, wiped when freed), and http_fetch,
 * the one-shot plain request of the credentials sources: unsigned, not
 * retried, on a handle of its own, its answer kept whatever its status.
 * http.c and s3_client.c are the only files that include curl.h.
 */
#ifndef CKPTFS_HTTP_H
#define CKPTFS_HTTP_H

#include <stddef.h>

#include "sigv4.h"

#define HTTP_USER_AGENT "ckptfs/0.1"

struct curl_slist; /* libcurl's, for s3_client.c: this header does not include curl.h */

/* A new libcurl easy handle (a CURL *) with the options every request starts
 * with; NULL when out of memory. */
void *http_handle_new(void);

/* Append the line "name: value" to *list; the temporary line is wiped.
 * 0 or -ENOMEM (*list unchanged). */
int http_add_header(struct curl_slist **list, const char *name, const char *value);

/* Append a header line as is ("Name:" with no value removes curl's own).
 * 0 or -ENOMEM (*list unchanged). */
int http_add_raw_header(struct curl_slist **list, const char *line);

/* A bounded answer body: data[0, len) then a NUL; overflow set once more than
 * max bytes were offered. Zero-initialize with a max. */
struct http_buf {
    char *data;
    size_t len;
    size_t max;
    int overflow;
};

/* Append n bytes: 0, or -1 (overflow set when it would pass b->max; out of
 * memory otherwise). */
int http_buf_add(struct http_buf *b, const char *p, size_t n);

/* Wipe and free the data; b is empty again (its max kept). */
void http_buf_free(struct http_buf *b);

/* One plain request. */
struct http_fetch {
    const char *method; /* "GET", "PUT" (sent without a body) or "POST" */
    const char *url;
    const struct sigv4_pair *headers; /* sent as "Name: value" */
    size_t nheaders;
    const char *body; /* POST body (a string; NULL: empty), sent without
                       * "Expect: 100-continue" (no round trip for a long token) */
    long connect_timeout_ms;
    long timeout_ms;   /* the whole request */
    size_t max_answer; /* a longer answer fails the request */
};

/* Send f once. 0 with the HTTP status in *status and the answer (any status)
 * in *b (free with http_buf_free); or a negative errno with "METHOD URL:
 * reason" in err and *b empty: -ECONNREFUSED (nothing to connect to: refused,
 * or the host unknown), -ETIMEDOUT, -ENOMEM, -EIO (other failures, an answer
 * longer than f->max_answer). */
int http_fetch(const struct http_fetch *f, long *status, struct http_buf *b, char *err,
               size_t errlen);

#endif
