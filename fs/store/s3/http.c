/*
 * fs/store/s3/http.c - the libcurl plumbing under the S3 client engine and the
 * credentials sources (see http.h): handle defaults, header lines, the
 * bounded answer buffer, and the one-shot plain request.
 */
#include "http.h"

#include <curl/curl.h>
#include <errno.h>
#include <openssl/crypto.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strutil.h"

void *http_handle_new(void)
{
    CURL *h = curl_easy_init();
    if (!h)
        return NULL;
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_USERAGENT, HTTP_USER_AGENT);
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
#else
    curl_easy_setopt(h, CURLOPT_PROTOCOLS, (long)(CURLPROTO_HTTP | CURLPROTO_HTTPS));
#endif
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
    return h;
}

int http_add_header(struct curl_slist **list, const char *name, const char *value)
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

int http_add_raw_header(struct curl_slist **list, const char *line)
{
    struct curl_slist *n = curl_slist_append(*list, line);
    if (!n)
        return -ENOMEM;
    *list = n;
    return 0;
}

int http_buf_add(struct http_buf *b, const char *p, size_t n)
{
    if (b->len + n > b->max) {
        b->overflow = 1;
        return -1;
    }
    char *d = realloc(b->data, b->len + n + 1);
    if (!d)
        return -1;
    memcpy(d + b->len, p, n);
    b->data = d;
    b->len += n;
    d[b->len] = '\0';
    return 0;
}

void http_buf_free(struct http_buf *b)
{
    if (b->data)
        OPENSSL_cleanse(b->data, b->len);
    free(b->data);
    *b = (struct http_buf){.max = b->max};
}

static size_t on_answer(char *p, size_t size, size_t n, void *arg)
{
    return http_buf_add(arg, p, size * n) == 0 ? size * n : 0;
}

/* f's headers (and no Expect for a POST body) into *list: 0 or -ENOMEM. */
static int fetch_headers(const struct http_fetch *f, struct curl_slist **list)
{
    int rc = 0;
    for (size_t i = 0; i < f->nheaders && rc == 0; i++)
        rc = http_add_header(list, f->headers[i].name, f->headers[i].value);
    if (rc == 0 && strcmp(f->method, "POST") == 0)
        rc = http_add_raw_header(list, "Expect:");
    return rc;
}

int http_fetch(const struct http_fetch *f, long *status, struct http_buf *b, char *err,
               size_t errlen)
{
    *status = 0;
    *b = (struct http_buf){.max = f->max_answer};
    struct curl_slist *hdrs = NULL;
    CURL *h = http_handle_new();
    if (!h || fetch_headers(f, &hdrs) < 0) {
        if (h)
            curl_easy_cleanup(h);
        curl_slist_free_all(hdrs);
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    char cerr[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(h, CURLOPT_URL, f->url);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, f->connect_timeout_ms);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, f->timeout_ms);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_answer);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, b);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, cerr);
    if (strcmp(f->method, "POST") == 0)
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, f->body ? f->body : "");
    else if (strcmp(f->method, "PUT") == 0)
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "PUT");
    CURLcode rc = curl_easy_perform(h);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, status);
    curl_easy_cleanup(h);
    curl_slist_free_all(hdrs);
    if (rc == CURLE_OK)
        return 0;
    if (b->overflow)
        snprintf(err, errlen, "%s %s: answer larger than %zu bytes", f->method, f->url,
                 f->max_answer);
    else
        snprintf(err, errlen, "%s %s: %s", f->method, f->url,
                 cerr[0] ? cerr : curl_easy_strerror(rc));
    http_buf_free(b);
    return rc == CURLE_COULDNT_CONNECT        ? -ECONNREFUSED
           : rc == CURLE_OPERATION_TIMEDOUT   ? -ETIMEDOUT
           : rc == CURLE_COULDNT_RESOLVE_HOST ? -ECONNREFUSED
                                              : -EIO;
}
