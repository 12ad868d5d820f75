/*
 * fs/store/s3/sigv4.c - AWS Signature Version 4 signing with OpenSSL (SHA-256, HMAC).
 *
 * Owns: URI encoding, canonical query/headers/request, string to sign,
 * signing key derivation, and the Authorization header value. Pure: no I/O,
 * no globals, nothing logged (the inputs include secrets).
 */
#include "sigv4.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a tiny growable string -------------------------------------------- */

struct sbuf {
    char *s;
    size_t len, cap;
    int oom;
};

static void sb_reserve(struct sbuf *b, size_t extra)
{
    if (b->oom || b->len + extra + 1 <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 128;
    while (cap < b->len + extra + 1)
        cap *= 2;
    char *n = realloc(b->s, cap);
    if (!n) {
        b->oom = 1;
        return;
    }
    b->s = n;
    b->cap = cap;
}

static void sb_putn(struct sbuf *b, const char *s, size_t n)
{
    sb_reserve(b, n);
    if (b->oom)
        return;
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
}

static void sb_puts(struct sbuf *b, const char *s)
{
    sb_putn(b, s, strlen(s));
}

static void sb_putc(struct sbuf *b, char c)
{
    sb_putn(b, &c, 1);
}

/* Hand over the string (NULL on OOM); "" for an empty buffer. */
static char *sb_finish(struct sbuf *b)
{
    if (!b->oom && !b->s)
        sb_reserve(b, 0);
    if (b->oom) {
        free(b->s);
        return NULL;
    }
    b->s[b->len] = '\0';
    return b->s;
}

static void hex_encode(const unsigned char *in, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[in[i] >> 4];
        out[2 * i + 1] = digits[in[i] & 15];
    }
    out[2 * n] = '\0';
}

/* ---- hashing ------------------------------------------------------------ */

void sigv4_sha256_hex(const void *data, size_t len, char out[65])
{
    unsigned char md[SHA256_DIGEST_LENGTH];
    SHA256(data, len, md);
    hex_encode(md, sizeof md, out);
}

static void hmac_sha256(const void *key, size_t keylen, const char *msg, unsigned char out[32])
{
    unsigned int outlen = 32;
    HMAC(EVP_sha256(), key, (int)keylen, (const unsigned char *)msg, strlen(msg), out, &outlen);
}

void sigv4_amz_date(time_t t, char out[17])
{
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(out, 17, "%Y%m%dT%H%M%SZ", &tm);
}

/* ---- encoding ----------------------------------------------------------- */

static int is_unreserved(unsigned char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '.' || c == '_' || c == '~';
}

static void sb_encode(struct sbuf *b, const char *s, int keep_slash)
{
    static const char digits[] = "0123456789ABCDEF";
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (is_unreserved(*p) || (keep_slash && *p == '/')) {
            sb_putc(b, (char)*p);
        } else {
            char esc[3] = {'%', digits[*p >> 4], digits[*p & 15]};
            sb_putn(b, esc, 3);
        }
    }
}

char *sigv4_uri_encode(const char *s, int keep_slash)
{
    if (!s)
        return NULL;
    struct sbuf b = {0};
    sb_encode(&b, s, keep_slash);
    return sb_finish(&b);
}

/* ---- canonical query ---------------------------------------------------- */

struct enc_pair {
    char *name;
    char *value;
};

static int cmp_enc_pair(const void *a, const void *b)
{
    const struct enc_pair *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : strcmp(x->value, y->value);
}

static void free_enc_pairs(struct enc_pair *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(p[i].name);
        free(p[i].value);
    }
    free(p);
}

char *sigv4_canonical_query(const struct sigv4_pair *q, size_t n)
{
    struct enc_pair *p = calloc(n ? n : 1, sizeof *p);
    if (!p)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        p[i].name = sigv4_uri_encode(q[i].name, 0);
        p[i].value = sigv4_uri_encode(q[i].value ? q[i].value : "", 0);
        if (!p[i].name || !p[i].value) {
            free_enc_pairs(p, n);
            return NULL;
        }
    }
    qsort(p, n, sizeof *p, cmp_enc_pair);
    struct sbuf b = {0};
    for (size_t i = 0; i < n; i++) {
        if (i)
            sb_putc(&b, '&');
        sb_puts(&b, p[i].name);
        sb_putc(&b, '=');
        sb_puts(&b, p[i].value);
    }
    free_enc_pairs(p, n);
    return sb_finish(&b);
}

/* ---- canonical headers -------------------------------------------------- */

char *sigv4_trim_value(const char *v)
{
    if (!v)
        return NULL;
    struct sbuf b = {0};
    int pending_space = 0;
    while (*v == ' ' || *v == '\t')
        v++;
    for (; *v; v++) {
        if (*v == ' ' || *v == '\t' || *v == '\r' || *v == '\n') {
            pending_space = 1;
            continue;
        }
        if (pending_space)
            sb_putc(&b, ' ');
        pending_space = 0;
        sb_putc(&b, *v);
    }
    return sb_finish(&b);
}

struct canon_header {
    char *name;  /* lower-cased */
    char *value; /* trimmed */
    size_t order;
};

static int cmp_canon_header(const void *a, const void *b)
{
    const struct canon_header *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    if (c)
        return c;
    return x->order < y->order ? -1 : x->order > y->order;
}

static void free_canon_headers(struct canon_header *h, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(h[i].name);
        free(h[i].value);
    }
    free(h);
}

static char *lowercase_dup(const char *s)
{
    char *d = strdup(s);
    for (char *p = d; p && *p; p++)
        if (*p >= 'A' && *p <= 'Z')
            *p = (char)(*p - 'A' + 'a');
    return d;
}

/* Sorted, lower-cased, trimmed copies of the request's headers. */
static struct canon_header *canon_headers(const struct sigv4_request *req)
{
    struct canon_header *h = calloc(req->nheaders ? req->nheaders : 1, sizeof *h);
    if (!h)
        return NULL;
    for (size_t i = 0; i < req->nheaders; i++) {
        h[i].name = lowercase_dup(req->headers[i].name);
        h[i].value = sigv4_trim_value(req->headers[i].value ? req->headers[i].value : "");
        h[i].order = i;
        if (!h[i].name || !h[i].value) {
            free_canon_headers(h, req->nheaders);
            return NULL;
        }
    }
    qsort(h, req->nheaders, sizeof *h, cmp_canon_header);
    return h;
}

/* Append "name:v1,v2\n" lines to canon and "a;b" to signed. */
static void put_headers(struct sbuf *canon, struct sbuf *signed_h, const struct canon_header *h,
                        size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int same = i > 0 && strcmp(h[i].name, h[i - 1].name) == 0;
        if (same) {
            sb_putc(canon, ',');
        } else {
            if (i > 0) {
                sb_putc(canon, '\n');
                sb_putc(signed_h, ';');
            }
            sb_puts(canon, h[i].name);
            sb_putc(canon, ':');
            sb_puts(signed_h, h[i].name);
        }
        sb_puts(canon, h[i].value);
    }
    if (n)
        sb_putc(canon, '\n');
}

/* ---- canonical request, string to sign, key, signature ------------------ */

char *sigv4_canonical_request(const struct sigv4_request *req, char **signed_headers)
{
    if (!req || !req->method || !req->path || !req->payload_hash)
        return NULL;
    char *query = sigv4_canonical_query(req->query, req->nquery);
    struct canon_header *h = canon_headers(req);
    struct sbuf b = {0}, sh = {0};
    if (query && h) {
        sb_puts(&b, req->method);
        sb_putc(&b, '\n');
        sb_encode(&b, req->path[0] ? req->path : "/", 1);
        sb_putc(&b, '\n');
        sb_puts(&b, query);
        sb_putc(&b, '\n');
        put_headers(&b, &sh, h, req->nheaders);
        sb_putc(&b, '\n');
        sb_puts(&b, sh.s ? sh.s : "");
        sb_putc(&b, '\n');
        sb_puts(&b, req->payload_hash);
    } else {
        b.oom = 1;
    }
    free(query);
    if (h)
        free_canon_headers(h, req->nheaders);
    char *out = sb_finish(&b);
    char *shs = sb_finish(&sh);
    if (!out || !shs) {
        free(out);
        free(shs);
        return NULL;
    }
    if (signed_headers)
        *signed_headers = shs;
    else
        free(shs);
    return out;
}

char *sigv4_scope(const char *amz_date, const char *region, const char *service)
{
    if (!amz_date || strlen(amz_date) < 8 || !region || !service)
        return NULL;
    struct sbuf b = {0};
    sb_putn(&b, amz_date, 8);
    sb_putc(&b, '/');
    sb_puts(&b, region);
    sb_putc(&b, '/');
    sb_puts(&b, service);
    sb_puts(&b, "/aws4_request");
    return sb_finish(&b);
}

char *sigv4_string_to_sign(const char *amz_date, const char *scope, const char *canonical_request)
{
    if (!amz_date || !scope || !canonical_request)
        return NULL;
    char hash[65];
    sigv4_sha256_hex(canonical_request, strlen(canonical_request), hash);
    struct sbuf b = {0};
    sb_puts(&b, SIGV4_ALGORITHM "\n");
    sb_puts(&b, amz_date);
    sb_putc(&b, '\n');
    sb_puts(&b, scope);
    sb_putc(&b, '\n');
    sb_puts(&b, hash);
    return sb_finish(&b);
}

int sigv4_signing_key(const char *secret, const char *date8, const char *region,
                      const char *service, unsigned char key[32])
{
    if (!secret || !date8 || !region || !service)
        return -1;
    size_t slen = strlen(secret);
    unsigned char *k0 = malloc(slen + 4);
    if (!k0)
        return -1;
    memcpy(k0, "AWS4", 4);
    memcpy(k0 + 4, secret, slen);
    char date[9];
    snprintf(date, sizeof date, "%.8s", date8);
    unsigned char k1[32], k2[32], k3[32];
    hmac_sha256(k0, slen + 4, date, k1);
    hmac_sha256(k1, 32, region, k2);
    hmac_sha256(k2, 32, service, k3);
    hmac_sha256(k3, 32, "aws4_request", key);
    OPENSSL_cleanse(k0, slen + 4);
    OPENSSL_cleanse(k1, sizeof k1);
    OPENSSL_cleanse(k2, sizeof k2);
    OPENSSL_cleanse(k3, sizeof k3);
    free(k0);
    return 0;
}

void sigv4_signature(const unsigned char key[32], const char *string_to_sign, char out[65])
{
    unsigned char sig[32];
    hmac_sha256(key, 32, string_to_sign, sig);
    hex_encode(sig, sizeof sig, out);
}

char *sigv4_authorization(const struct sigv4_request *req, const struct sigv4_credentials *cred,
                          const char *amz_date, const char *region, const char *service)
{
    if (!cred || !cred->access_key_id || !cred->secret_access_key)
        return NULL;
    char *signed_headers = NULL;
    char *creq = sigv4_canonical_request(req, &signed_headers);
    char *scope = sigv4_scope(amz_date, region, service);
    char *sts = sigv4_string_to_sign(amz_date, scope, creq);
    unsigned char key[32];
    char sig[65];
    struct sbuf b = {0};
    if (sts && sigv4_signing_key(cred->secret_access_key, amz_date, region, service, key) == 0) {
        sigv4_signature(key, sts, sig);
        OPENSSL_cleanse(key, sizeof key);
        sb_puts(&b, SIGV4_ALGORITHM " Credential=");
        sb_puts(&b, cred->access_key_id);
        sb_putc(&b, '/');
        sb_puts(&b, scope);
        sb_puts(&b, ", SignedHeaders=");
        sb_puts(&b, signed_headers);
        sb_puts(&b, ", Signature=");
        sb_puts(&b, sig);
    } else {
        b.oom = 1;
    }
    free(signed_headers);
    free(creq);
    free(scope);
    free(sts);
    return sb_finish(&b);
}
