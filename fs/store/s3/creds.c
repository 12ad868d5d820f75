/*
 * fs/store/s3/creds.c - the credentials provider: fetches credentials from the
 * source aws_config.c resolved (environment / shared-file keys as they are;
 * STS AssumeRoleWithWebIdentity and AssumeRole, credential_process, the
 * container endpoint and IMDSv2 over the network or a child process), keeps
 * the current immutable credentials object, and refreshes it ahead of its
 * expiry from one short-lived thread at a time, with backoff after failures.
 *
 * Owns: struct creds (refcounts), struct creds_provider (its lock, condition
 * variable and refresh thread), the bounded parsers of every credentials
 * answer, and the small HTTP requests to IMDS / container / STS (sent with
 * http_fetch of http.c, the plumbing under the S3 client engine too; S3
 * traffic itself is s3_client.c's).
 * Secrets are wiped before they are freed and never logged.
 */
#include "creds.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libxml/parser.h>
#include <libxml/tree.h>
#include <openssl/crypto.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "http.h"
#include "log.h"
#include "sigv4.h"
#include "strutil.h"

extern char **environ;

#define CREDS_TOKEN_FILE_MAX (64 * 1024)

/* ---- the credentials object --------------------------------------------- */

static void free_secret(char *s)
{
    if (s) {
        OPENSSL_cleanse(s, strlen(s));
        free(s);
    }
}

struct creds *creds_new(const char *id, const char *secret, const char *token, time_t expiration)
{
    struct creds *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    atomic_init(&c->refs, 1);
    c->access_key_id = strdup(id);
    c->secret_access_key = strdup(secret);
    c->session_token = token && *token ? strdup(token) : NULL;
    c->expiration = expiration;
    if (!c->access_key_id || !c->secret_access_key || (token && *token && !c->session_token)) {
        creds_unref(c);
        return NULL;
    }
    return c;
}

struct creds *creds_ref(struct creds *c)
{
    int old = atomic_fetch_add(&c->refs, 1);
    assert(old > 0);
    (void)old;
    return c;
}

void creds_unref(struct creds *c)
{
    if (!c)
        return;
    int old = atomic_fetch_sub(&c->refs, 1);
    assert(old > 0);
    if (old != 1)
        return;
    free_secret(c->access_key_id);
    free_secret(c->secret_access_key);
    free_secret(c->session_token);
    free(c);
}

/* ---- parsers ------------------------------------------------------------ */

int creds_parse_time(const char *s, time_t *t)
{
    int Y, M, D, h, m, sec, n = 0;
    if (!s || sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d%n", &Y, &M, &D, &h, &m, &sec, &n) != 6 || n != 19)
        return -EINVAL;
    if (M < 1 || M > 12 || D < 1 || D > 31 || h > 23 || m > 59 || sec > 60 || Y < 1970 || h < 0 ||
        m < 0 || sec < 0)
        return -EINVAL;
    const char *p = s + n;
    if (*p == '.') {
        p++;
        if (*p < '0' || *p > '9')
            return -EINVAL;
        while (*p >= '0' && *p <= '9')
            p++;
    }
    long off = 0;
    if (*p == 'Z' || *p == 'z') {
        p++;
    } else if (*p == '+' || *p == '-') {
        int oh, om, k = 0;
        if (sscanf(p + 1, "%2d:%2d%n", &oh, &om, &k) != 2 || k != 5) {
            k = 0;
            if (sscanf(p + 1, "%2d%2d%n", &oh, &om, &k) != 2 || k != 4)
                return -EINVAL;
        }
        off = (oh * 3600L + om * 60L) * (*p == '+' ? 1 : -1);
        p += 1 + k;
    } else {
        return -EINVAL;
    }
    if (*p)
        return -EINVAL;
    struct tm tm = {.tm_year = Y - 1900,
                    .tm_mon = M - 1,
                    .tm_mday = D,
                    .tm_hour = h,
                    .tm_min = m,
                    .tm_sec = sec};
    time_t v = timegm(&tm);
    if (v == (time_t)-1)
        return -EINVAL;
    *t = v - off;
    return 0;
}

static const char *json_kind_name(enum creds_json_kind k)
{
    return k == CREDS_JSON_PROCESS ? "credential_process output"
           : k == CREDS_JSON_IMDS  ? "IMDS answer"
                                   : "container endpoint answer";
}

/* A string member, or NULL (and a message) if missing or not a non-empty string. */
static const char *json_str(json_t *o, const char *key, const char *what, char *err, size_t errlen)
{
    json_t *v = json_object_get(o, key);
    if (!json_is_string(v) || !*json_string_value(v)) {
        snprintf(err, errlen, "%s: %s %s", what, key,
                 v ? "is not a non-empty string" : "is missing");
        return NULL;
    }
    return json_string_value(v);
}

int creds_parse_json(const char *body, size_t len, enum creds_json_kind kind, struct creds **out,
                     char *err, size_t errlen)
{
    const char *what = json_kind_name(kind);
    *out = NULL;
    if (len > CREDS_MAX_RESPONSE) {
        snprintf(err, errlen, "%s: %zu bytes, more than the %d allowed", what, len,
                 CREDS_MAX_RESPONSE);
        return -EFBIG;
    }
    json_error_t je;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!o || !json_is_object(o)) {
        /* je.text may quote the input: give the position only */
        if (o)
            snprintf(err, errlen, "%s: not a JSON object", what);
        else
            snprintf(err, errlen, "%s: not a JSON object (invalid JSON at line %d, column %d)",
                     what, je.line, je.column);
        json_decref(o);
        return -EINVAL;
    }
    int rc = -EINVAL;
    if (kind == CREDS_JSON_PROCESS) {
        json_t *v = json_object_get(o, "Version");
        if (!json_is_integer(v) || json_integer_value(v) != 1) {
            snprintf(err, errlen, "%s: Version must be 1", what);
            goto out;
        }
    }
    if (kind == CREDS_JSON_IMDS) {
        json_t *code = json_object_get(o, "Code");
        if (code && (!json_is_string(code) || strcmp(json_string_value(code), "Success") != 0)) {
            snprintf(err, errlen, "%s: Code is %.64s, not Success", what,
                     json_is_string(code) ? json_string_value(code) : "(not a string)");
            goto out;
        }
    }
    const char *id = json_str(o, "AccessKeyId", what, err, errlen);
    const char *secret = id ? json_str(o, "SecretAccessKey", what, err, errlen) : NULL;
    if (!id || !secret)
        goto out;
    json_t *tok = json_object_get(o, kind == CREDS_JSON_PROCESS ? "SessionToken" : "Token");
    if (tok && !json_is_string(tok)) {
        snprintf(err, errlen, "%s: session token is not a string", what);
        goto out;
    }
    time_t exp = 0;
    json_t *e = json_object_get(o, "Expiration");
    if (e && !json_is_null(e) &&
        (!json_is_string(e) || creds_parse_time(json_string_value(e), &exp) < 0)) {
        snprintf(err, errlen, "%s: Expiration is not an ISO 8601 time", what);
        goto out;
    }
    *out = creds_new(id, secret, tok ? json_string_value(tok) : NULL, exp);
    rc = *out ? 0 : -ENOMEM;
    if (rc < 0)
        snprintf(err, errlen, "out of memory");
out:
    json_decref(o); /* jansson does not wipe: the body the caller holds is wiped there */
    return rc;
}

/* The first element named name below n (depth first), or NULL. */
static xmlNodePtr xml_find(xmlNodePtr n, const char *name)
{
    for (; n; n = n->next) {
        if (n->type != XML_ELEMENT_NODE)
            continue;
        if (strcmp((const char *)n->name, name) == 0)
            return n;
        xmlNodePtr f = xml_find(n->children, name);
        if (f)
            return f;
    }
    return NULL;
}

/* The text of child name of n (malloc'ed), or NULL. */
static char *xml_text(xmlNodePtr n, const char *name)
{
    xmlNodePtr c = n ? xml_find(n->children, name) : NULL;
    if (!c)
        return NULL;
    xmlChar *t = xmlNodeGetContent(c);
    char *s = t ? strdup((const char *)t) : NULL;
    if (t) {
        OPENSSL_cleanse(t, strlen((const char *)t));
        xmlFree(t);
    }
    return s;
}

int creds_parse_sts_xml(const char *body, size_t len, struct creds **out, char *err, size_t errlen)
{
    *out = NULL;
    if (len > CREDS_MAX_RESPONSE) {
        snprintf(err, errlen, "STS answer: %zu bytes, more than the %d allowed", len,
                 CREDS_MAX_RESPONSE);
        return -EFBIG;
    }
    int flags = XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING;
    xmlDocPtr doc = len ? xmlReadMemory(body, (int)len, "sts-response.xml", NULL, flags) : NULL;
    xmlNodePtr root = doc ? xmlDocGetRootElement(doc) : NULL;
    if (!root || doc->intSubset || doc->extSubset) {
        snprintf(err, errlen, "STS answer is not an XML document%s",
                 root ? " (a DTD is not allowed)" : "");
        xmlFreeDoc(doc);
        return -EINVAL;
    }
    int rc = -EINVAL;
    char *id = NULL, *secret = NULL, *token = NULL, *exp = NULL;
    xmlNodePtr cr = xml_find(root, "Credentials");
    if (strcmp((const char *)root->name, "ErrorResponse") == 0 || xml_find(root, "Error")) {
        xmlNodePtr e = xml_find(root, "Error");
        char *code = xml_text(e, "Code"), *msg = xml_text(e, "Message");
        snprintf(err, errlen, "STS: %.64s: %.200s", code ? code : "(no code)",
                 msg ? msg : "(no message)");
        free(code);
        free(msg);
        rc = -EACCES;
        goto out;
    }
    if (!cr) {
        snprintf(err, errlen, "STS answer has no Credentials element");
        goto out;
    }
    id = xml_text(cr, "AccessKeyId");
    secret = xml_text(cr, "SecretAccessKey");
    token = xml_text(cr, "SessionToken");
    exp = xml_text(cr, "Expiration");
    time_t t = 0;
    if (!id || !*id || !secret || !*secret || !token || !*token) {
        snprintf(err, errlen, "STS answer lacks %s",
                 !id || !*id           ? "AccessKeyId"
                 : !secret || !*secret ? "SecretAccessKey"
                                       : "SessionToken");
        goto out;
    }
    if (!exp || creds_parse_time(exp, &t) < 0) {
        snprintf(err, errlen, "STS answer: Expiration is missing or not an ISO 8601 time");
        goto out;
    }
    *out = creds_new(id, secret, token, t);
    rc = *out ? 0 : -ENOMEM;
    if (rc < 0)
        snprintf(err, errlen, "out of memory");
out:
    free(id);
    free_secret(secret);
    free_secret(token);
    free(exp);
    xmlFreeDoc(doc);
    return rc;
}

/* ---- refresh scheduling (pure) ------------------------------------------ */

time_t creds_refresh_at(time_t fetched, time_t expires)
{
    time_t life = expires - fetched;
    time_t ahead = life / 2 < CREDS_REFRESH_AHEAD_S ? life / 2 : CREDS_REFRESH_AHEAD_S;
    time_t at = expires - ahead;
    return at < fetched + 1 ? fetched + 1 : at;
}

long creds_retry_delay(int failures, time_t now, time_t expires)
{
    long d = CREDS_RETRY_MIN_S;
    for (int i = 1; i < failures && d < CREDS_RETRY_MAX_S; i++)
        d *= 2;
    if (d > CREDS_RETRY_MAX_S)
        d = CREDS_RETRY_MAX_S;
    if (expires > now && d > (expires - now) / 2)
        d = (expires - now) / 2;
    return d < CREDS_RETRY_MIN_S ? CREDS_RETRY_MIN_S : d;
}

/* ---- small HTTP requests (http.c) ------------------------------------- */

/* One request to a credentials source (http_fetch): 0 with *status and the
 * answer in *b, or a negative errno with the reason in err. */
static int http_do(const char *method, const char *url, const struct sigv4_pair *headers,
                   size_t nheaders, const char *body, long timeout_ms, long *status,
                   struct http_buf *b, char *err, size_t errlen)
{
    struct http_fetch f = {.method = method,
                           .url = url,
                           .headers = headers,
                           .nheaders = nheaders,
                           .body = body,
                           .connect_timeout_ms = CREDS_HTTP_CONNECT_MS,
                           .timeout_ms = timeout_ms,
                           .max_answer = CREDS_MAX_RESPONSE};
    return http_fetch(&f, status, b, err, errlen);
}

/* A small file (a token), whitespace at the end trimmed; malloc'ed or NULL. */
static char *read_small_file(const char *path, char *err, size_t errlen, const char *what)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(err, errlen, "cannot read %s %s: %s", what, path, strerror(errno));
        return NULL;
    }
    const size_t cap = CREDS_TOKEN_FILE_MAX + 1; /* one byte more tells "too big" */
    char *buf = malloc(cap + 1);
    size_t len = 0;
    const char *why = buf ? NULL : "out of memory";
    while (!why && len < cap) {
        ssize_t r = read(fd, buf + len, cap - len);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            why = strerror(errno);
        if (r <= 0)
            break;
        len += (size_t)r;
    }
    close(fd);
    if (!why && len > CREDS_TOKEN_FILE_MAX)
        why = "larger than 64 KiB";
    while (!why && len && (buf[len - 1] == '\n' || buf[len - 1] == '\r' || buf[len - 1] == ' '))
        len--;
    if (!why && !len)
        why = "empty";
    if (why) {
        snprintf(err, errlen, "%s %s: %s", what, path, why);
        if (buf)
            OPENSSL_cleanse(buf, len);
        free(buf);
        return NULL;
    }
    buf[len] = '\0';
    return buf;
}

/* ---- the sources -------------------------------------------------------- */

struct creds_provider {
    enum aws_cred_source src;
    struct aws_config cfg; /* a copy of the settings this source needs */
    char *sts_url;         /* STS endpoint (web identity, assume role) */
    char *session_name;

    pthread_mutex_t mu; /* guards everything below */
    pthread_cond_t cv;  /* broadcast when a refresh ends */
    struct creds *cur;  /* never NULL once created */
    time_t next_at;     /* when the next refresh is due (cur expiring) */
    int failures;       /* failed refreshes in a row */
    int refreshing;     /* a refresh thread is fetching */
    pid_t refresh_pid;  /* the process that started it (a fork loses threads) */
    int have_thread;    /* thread is joinable: the last refresh thread */
    pthread_t thread;
    unsigned long refreshes;
};

/* x-www-form-urlencoded "k=v&..." of n pairs (values encoded). */
static char *form(const struct sigv4_pair *q, size_t n)
{
    return sigv4_canonical_query(q, n); /* same encoding STS accepts */
}

/* host[:port] and path of an http(s) URL, into the buffers. */
static int split_url(const char *url, char *host, size_t hl, char *path, size_t pl)
{
    const char *p = strstr(url, "://");
    if (!p)
        return -EINVAL;
    p += 3;
    const char *slash = strchr(p, '/');
    size_t n = slash ? (size_t)(slash - p) : strlen(p);
    if (!n || n >= hl)
        return -EINVAL;
    memcpy(host, p, n);
    host[n] = '\0';
    snprintf(path, pl, "%s", slash ? slash : "/");
    return 0;
}

#define STS_CONTENT_TYPE "application/x-www-form-urlencoded; charset=utf-8"

/* The SigV4 signature of an STS POST: the headers it signs, and the buffers
 * they point into. */
struct sts_signature {
    char host[512], path[1024], date[17], hash[65];
    char *auth; /* the Authorization value (wiped by sts_signature_free) */
};

static void sts_signature_free(struct sts_signature *sig)
{
    free_secret(sig->auth);
    sig->auth = NULL;
}

/* Sign the STS POST of body with src: Authorization and the x-amz-* headers
 * (content hash, date, token if any) appended to h at *nh. 0, -EINVAL (bad
 * STS URL, reason in err) or -ENOMEM. */
static int sts_sign(const struct creds_provider *p, const struct creds *src, const char *body,
                    struct sts_signature *sig, struct sigv4_pair *h, size_t *nh, char *err,
                    size_t errlen)
{
    if (split_url(p->sts_url, sig->host, sizeof sig->host, sig->path, sizeof sig->path) < 0) {
        snprintf(err, errlen, "bad STS endpoint URL '%s'", p->sts_url);
        return -EINVAL;
    }
    sigv4_amz_date(time(NULL), sig->date);
    sigv4_sha256_hex(body, strlen(body), sig->hash);
    struct sigv4_pair sh[5] = {{"host", sig->host},
                               {"content-type", STS_CONTENT_TYPE},
                               {"x-amz-content-sha256", sig->hash},
                               {"x-amz-date", sig->date},
                               {"x-amz-security-token", src->session_token}};
    size_t nsh = src->session_token ? 5 : 4;
    struct sigv4_request req = {"POST", sig->path, NULL, 0, sh, nsh, sig->hash};
    struct sigv4_credentials sc = {src->access_key_id, src->secret_access_key, src->session_token};
    sig->auth = sigv4_authorization(&req, &sc, sig->date, p->cfg.region, "sts");
    if (!sig->auth)
        return -ENOMEM;
    h[(*nh)++] = (struct sigv4_pair){"Authorization", sig->auth};
    for (size_t i = 2; i < nsh; i++)
        h[(*nh)++] = sh[i];
    return 0;
}

/* POST an STS query; signed with src when non-NULL (AssumeRole). */
static int sts_call(struct creds_provider *p, const struct sigv4_pair *q, size_t nq,
                    const struct creds *src, struct creds **out, char *err, size_t errlen)
{
    char *body = form(q, nq);
    if (!body)
        return -ENOMEM;
    struct sigv4_pair h[5] = {{"Content-Type", STS_CONTENT_TYPE}};
    size_t nh = 1;
    struct sts_signature sig = {.auth = NULL};
    int rc = src ? sts_sign(p, src, body, &sig, h, &nh, err, errlen) : 0;
    long status = 0;
    struct http_buf b;
    if (rc == 0)
        rc = http_do("POST", p->sts_url, h, nh, body, CREDS_HTTP_TIMEOUT_MS, &status, &b, err,
                     errlen);
    sts_signature_free(&sig);
    OPENSSL_cleanse(body, strlen(body));
    free(body);
    if (rc < 0)
        return rc;
    rc = creds_parse_sts_xml(b.data ? b.data : "", b.len, out, err, errlen);
    if (rc == 0 && (status < 200 || status > 299)) {
        creds_unref(*out);
        *out = NULL;
        rc = -EIO;
    }
    if (rc < 0 && status && (status < 200 || status > 299) && rc != -EACCES)
        snprintf(err, errlen, "STS %s answered HTTP %ld", p->sts_url, status);
    http_buf_free(&b);
    return rc;
}

static int fetch_web_identity(struct creds_provider *p, struct creds **out, char *err,
                              size_t errlen)
{
    char *tok = read_small_file(p->cfg.web_identity_token_file, err, errlen, "web identity token");
    if (!tok)
        return -EINVAL;
    struct sigv4_pair q[] = {{"Action", "AssumeRoleWithWebIdentity"},
                             {"RoleArn", p->cfg.role_arn},
                             {"RoleSessionName", p->session_name},
                             {"Version", "2011-06-15"},
                             {"WebIdentityToken", tok}};
    int rc = sts_call(p, q, 5, NULL, out, err, errlen);
    free_secret(tok);
    return rc;
}

static int fetch_assume_role(struct creds_provider *p, struct creds **out, char *err, size_t errlen)
{
    struct creds *src =
        creds_new(p->cfg.access_key_id, p->cfg.secret_access_key, p->cfg.session_token, 0);
    if (!src)
        return -ENOMEM;
    struct sigv4_pair q[] = {{"Action", "AssumeRole"},
                             {"RoleArn", p->cfg.role_arn},
                             {"RoleSessionName", p->session_name},
                             {"Version", "2011-06-15"}};
    int rc = sts_call(p, q, 4, src, out, err, errlen);
    creds_unref(src);
    return rc;
}

static int fetch_container(struct creds_provider *p, struct creds **out, char *err, size_t errlen)
{
    char *tok = NULL;
    if (p->cfg.container_token_file) {
        tok = read_small_file(p->cfg.container_token_file, err, errlen,
                              "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE");
        if (!tok)
            return -EINVAL;
    }
    const char *auth = tok ? tok : p->cfg.container_token;
    struct sigv4_pair h[] = {{"Authorization", auth}};
    long status = 0;
    struct http_buf b;
    int rc = http_do("GET", p->cfg.container_url, h, auth ? 1 : 0, NULL, CREDS_HTTP_TIMEOUT_MS,
                     &status, &b, err, errlen);
    free_secret(tok);
    if (rc < 0)
        return rc;
    if (status != 200) {
        snprintf(err, errlen, "container endpoint %s answered HTTP %ld", p->cfg.container_url,
                 status);
        rc = -EIO;
    } else {
        rc = creds_parse_json(b.data ? b.data : "", b.len, CREDS_JSON_CONTAINER, out, err, errlen);
    }
    http_buf_free(&b);
    return rc;
}

/* IMDSv2: a session token, the role name, then its credentials. -ENODEV
 * when nothing answers the token request (no IMDS here). */
static int fetch_imds(struct creds_provider *p, struct creds **out, char *err, size_t errlen)
{
    char url[2048], *token = NULL, role[256] = "";
    const char *base = p->cfg.imds_endpoint;
    size_t bl = strlen(base);
    while (bl && base[bl - 1] == '/')
        bl--;
    long status = 0;
    struct http_buf b;
    snprintf(url, sizeof url, "%.*s/latest/api/token", (int)bl, base);
    struct sigv4_pair ttl[] = {{"X-aws-ec2-metadata-token-ttl-seconds", "21600"}};
    int rc = http_do("PUT", url, ttl, 1, NULL, CREDS_IMDS_TIMEOUT_MS, &status, &b, err, errlen);
    if (rc == -ECONNREFUSED || rc == -ETIMEDOUT)
        return -ENODEV;
    if (rc < 0)
        return rc;
    if (status != 200 || !b.len) {
        snprintf(err, errlen, "IMDS %s answered HTTP %ld to the token request", url, status);
        http_buf_free(&b);
        return -EIO;
    }
    token = strndup(b.data, b.len);
    http_buf_free(&b);
    if (!token)
        return -ENOMEM;
    struct sigv4_pair h[] = {{"X-aws-ec2-metadata-token", token}};
    snprintf(url, sizeof url, "%.*s/latest/meta-data/iam/security-credentials/", (int)bl, base);
    rc = http_do("GET", url, h, 1, NULL, CREDS_IMDS_TIMEOUT_MS, &status, &b, err, errlen);
    if (rc == 0 && status != 200) {
        snprintf(err, errlen, "IMDS %s answered HTTP %ld (no instance profile attached?)", url,
                 status);
        http_buf_free(&b);
        rc = -EIO;
    }
    if (rc == 0) {
        size_t n = strcspn(b.data ? b.data : "", "\r\n");
        if (!n || n >= sizeof role || strchr(b.data, '/')) {
            snprintf(err, errlen, "IMDS %s: no usable role name in the answer", url);
            rc = -EINVAL;
        } else {
            memcpy(role, b.data, n);
            role[n] = '\0';
        }
        http_buf_free(&b);
    }
    if (rc == 0) {
        snprintf(url, sizeof url, "%.*s/latest/meta-data/iam/security-credentials/%s", (int)bl,
                 base, role);
        rc = http_do("GET", url, h, 1, NULL, CREDS_IMDS_TIMEOUT_MS, &status, &b, err, errlen);
        if (rc == 0 && status != 200) {
            snprintf(err, errlen, "IMDS %s answered HTTP %ld", url, status);
            rc = -EIO;
        } else if (rc == 0) {
            rc = creds_parse_json(b.data ? b.data : "", b.len, CREDS_JSON_IMDS, out, err, errlen);
        }
        http_buf_free(&b);
    }
    free_secret(token);
    return rc;
}

/* Run the credential_process command line with /bin/sh and parse its stdout.
 * The child's stderr goes to ours (the daemon log). */
static int fetch_process(struct creds_provider *p, struct creds **out, char *err, size_t errlen)
{
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) < 0) {
        snprintf(err, errlen, "credential_process: pipe: %s", strerror(errno));
        return -EIO;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, pfd[1], 1);
    char *argv[] = {"sh", "-c", p->cfg.credential_process, NULL};
    pid_t pid;
    int src = posix_spawn(&pid, "/bin/sh", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(pfd[1]);
    if (src != 0) {
        close(pfd[0]);
        snprintf(err, errlen, "credential_process: cannot start /bin/sh: %s", strerror(src));
        return -EIO;
    }
    struct http_buf b = {.max = CREDS_MAX_RESPONSE};
    char chunk[4096];
    int rc = 0;
    time_t deadline = time(NULL) + CREDS_PROCESS_TIMEOUT_S;
    for (;;) {
        struct pollfd pf = {pfd[0], POLLIN, 0};
        long left = (long)(deadline - time(NULL));
        int pr = left > 0 ? poll(&pf, 1, (int)(left * 1000)) : 0;
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0) {
            snprintf(err, errlen, "credential_process did not finish within %d s: killed",
                     CREDS_PROCESS_TIMEOUT_S);
            rc = -ETIMEDOUT;
            break;
        }
        ssize_t r = read(pfd[0], chunk, sizeof chunk);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        if (http_buf_add(&b, chunk, (size_t)r) < 0) {
            snprintf(err, errlen, "credential_process printed more than %d bytes: killed",
                     CREDS_MAX_RESPONSE);
            rc = -EFBIG;
            break;
        }
    }
    OPENSSL_cleanse(chunk, sizeof chunk);
    close(pfd[0]);
    if (rc < 0)
        kill(pid, SIGKILL);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (rc == 0 && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
        snprintf(err, errlen, "credential_process failed (%s %d; its stderr is in the log)",
                 WIFEXITED(st) ? "exit status" : "signal",
                 WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
        rc = -EIO;
    }
    if (rc == 0)
        rc = creds_parse_json(b.data ? b.data : "", b.len, CREDS_JSON_PROCESS, out, err, errlen);
    http_buf_free(&b);
    return rc;
}

/* Fetch once from p's source. */
static int fetch(struct creds_provider *p, struct creds **out, char *err, size_t errlen)
{
    switch (p->src) {
    case AWS_CRED_WEB_IDENTITY:
        return fetch_web_identity(p, out, err, errlen);
    case AWS_CRED_ASSUME_ROLE:
        return fetch_assume_role(p, out, err, errlen);
    case AWS_CRED_PROCESS:
        return fetch_process(p, out, err, errlen);
    case AWS_CRED_CONTAINER:
        return fetch_container(p, out, err, errlen);
    case AWS_CRED_IMDS:
        return fetch_imds(p, out, err, errlen);
    default:
        *out = creds_new(p->cfg.access_key_id, p->cfg.secret_access_key, p->cfg.session_token, 0);
        return *out ? 0 : -ENOMEM;
    }
}

/* ---- the provider and its refresh thread --------------------------------- */

static void log_creds(const struct creds_provider *p, const struct creds *c, const char *what)
{
    char key[32], when[32] = "never";
    if (c->expiration) {
        struct tm tm;
        gmtime_r(&c->expiration, &tm);
        strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    }
    char prof[300] = "";
    if (p->src == AWS_CRED_CREDENTIALS_FILE || p->src == AWS_CRED_CONFIG_FILE ||
        p->src == AWS_CRED_PROCESS || p->src == AWS_CRED_ASSUME_ROLE)
        snprintf(prof, sizeof prof, "profile '%.256s', ",
                 p->cfg.profile ? p->cfg.profile : "default");
    log_info("s3: credentials %s from %s (%skey %s%s; expire %s)", what,
             aws_cred_source_name(p->src), prof, aws_redact(c->access_key_id, 1, key, sizeof key),
             c->session_token ? ", with session token" : "", when);
}

/* Wait on p->cv until wall-clock time `at` at most (30 s at a time, so a
 * clock jump is noticed). Called with p->mu held. */
static void wait_until(struct creds_provider *p, time_t at)
{
    assert(pthread_mutex_trylock(&p->mu) == EBUSY);
    long delay = (long)(at - time(NULL));
    if (delay > 30)
        delay = 30;
    if (delay <= 0)
        return;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += delay;
    pthread_cond_timedwait(&p->cv, &p->mu, &ts);
}

/* The refresh thread: one fetch, then swap (or schedule a retry). */
static void *refresh_main(void *arg)
{
    struct creds_provider *p = arg;
    struct creds *n = NULL;
    char err[512] = "";
    int rc = fetch(p, &n, err, sizeof err);
    time_t now = time(NULL);
    pthread_mutex_lock(&p->mu);
    assert(p->refreshing);
    struct creds *old = NULL;
    if (rc == 0) {
        old = p->cur;
        p->cur = n; /* requests in flight hold their own references to old */
        p->failures = 0;
        p->refreshes++;
        p->next_at = n->expiration ? creds_refresh_at(now, n->expiration) : 0;
        log_creds(p, n, "refreshed");
    } else {
        p->failures++;
        long d = creds_retry_delay(p->failures, now, p->cur->expiration);
        p->next_at = now + d;
        log_warn("s3: refreshing credentials from %s failed (%s); retry in %ld s, current "
                 "ones %s",
                 aws_cred_source_name(p->src), err, d,
                 p->cur->expiration > now ? "still valid" : "have expired");
    }
    p->refreshing = 0;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    creds_unref(old);
    return NULL;
}

/* Start a refresh thread if one is due and none runs. Called with p->mu held. */
static void maybe_refresh(struct creds_provider *p, time_t now)
{
    assert(pthread_mutex_trylock(&p->mu) == EBUSY); /* held (by us: callers lock it) */
    if (p->refreshing && p->refresh_pid == getpid())
        return;
    if (!p->next_at || now < p->next_at)
        return;
    if (p->have_thread && p->refresh_pid == getpid())
        pthread_join(p->thread, NULL); /* it has finished: refreshing is 0 */
    p->have_thread = 0;
    p->refreshing = 1;
    p->refresh_pid = getpid();
    if (pthread_create(&p->thread, NULL, refresh_main, p) != 0) {
        p->refreshing = 0;
        p->next_at = now + CREDS_RETRY_MIN_S;
        log_warn("s3: cannot start a credentials refresh thread; retry in %d s", CREDS_RETRY_MIN_S);
        return;
    }
    p->have_thread = 1;
}

static int copy_cfg(struct aws_config *d, const struct aws_config *s)
{
    memset(d, 0, sizeof *d);
    const char *src[] = {s->access_key_id,
                         s->secret_access_key,
                         s->session_token,
                         s->region,
                         s->profile,
                         s->role_arn,
                         s->role_session_name,
                         s->web_identity_token_file,
                         s->credential_process,
                         s->sts_endpoint,
                         s->container_url,
                         s->container_token,
                         s->container_token_file,
                         s->imds_endpoint};
    char **dst[] = {&d->access_key_id,
                    &d->secret_access_key,
                    &d->session_token,
                    &d->region,
                    &d->profile,
                    &d->role_arn,
                    &d->role_session_name,
                    &d->web_identity_token_file,
                    &d->credential_process,
                    &d->sts_endpoint,
                    &d->container_url,
                    &d->container_token,
                    &d->container_token_file,
                    &d->imds_endpoint};
    for (size_t i = 0; i < sizeof src / sizeof src[0]; i++)
        if (src[i] && !(*dst[i] = strdup(src[i])))
            return -ENOMEM;
    d->cred_source = s->cred_source;
    return 0;
}

int creds_provider_create(const struct aws_config *cfg, struct creds_provider **out, char *err,
                          size_t errlen)
{
    *out = NULL;
    if (cfg->cred_source == AWS_CRED_NONE)
        return 0;
    struct creds_provider *p = calloc(1, sizeof *p);
    if (!p)
        return -ENOMEM;
    p->src = cfg->cred_source;
    pthread_mutex_init(&p->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&p->cv, &ca);
    pthread_condattr_destroy(&ca);
    int rc = copy_cfg(&p->cfg, cfg);
    if (rc == 0 && (p->src == AWS_CRED_WEB_IDENTITY || p->src == AWS_CRED_ASSUME_ROLE)) {
        p->sts_url = cfg->sts_endpoint ? strdup(cfg->sts_endpoint)
                                       : str_printf("https://sts.%s.amazonaws.com",
                                                    cfg->region ? cfg->region : "us-east-1");
        char name[64];
        snprintf(name, sizeof name, "ckptfs-%ld", (long)time(NULL));
        p->session_name = strdup(cfg->role_session_name ? cfg->role_session_name : name);
        if (!p->sts_url || !p->session_name)
            rc = -ENOMEM;
    }
    if (rc == 0)
        rc = fetch(p, &p->cur, err, errlen);
    if (rc == -ENODEV) { /* IMDS: nothing answered */
        log_warn("s3: no AWS credentials found (environment, profile '%s', no container "
                 "endpoint, IMDS at %s does not answer): sending unsigned requests",
                 cfg->profile ? cfg->profile : "default", cfg->imds_endpoint);
        creds_provider_destroy(p);
        return 0;
    }
    if (rc < 0) {
        if (rc == -ENOMEM && !err[0])
            snprintf(err, errlen, "out of memory");
        /* say which source failed: the reason alone may not name it */
        char why[512];
        snprintf(why, sizeof why, "%s", err);
        snprintf(err, errlen, "credentials from %s: %s", aws_cred_source_name(p->src), why);
        creds_provider_destroy(p);
        return rc;
    }
    log_creds(p, p->cur, "loaded");
    if (p->cur->expiration)
        p->next_at = creds_refresh_at(time(NULL), p->cur->expiration);
    *out = p;
    return 0;
}

void creds_provider_destroy(struct creds_provider *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    while (p->refreshing && p->refresh_pid == getpid())
        pthread_cond_wait(&p->cv, &p->mu);
    if (p->have_thread && p->refresh_pid == getpid())
        pthread_join(p->thread, NULL);
    pthread_mutex_unlock(&p->mu);
    creds_unref(p->cur);
    free(p->sts_url);
    free(p->session_name);
    aws_config_free(&p->cfg);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

struct creds *creds_provider_get(struct creds_provider *p)
{
    if (!p)
        return NULL;
    pthread_mutex_lock(&p->mu);
    assert(p->cur);
    time_t now = time(NULL);
    maybe_refresh(p, now);
    if (p->cur->expiration && p->cur->expiration <= now) {
        /* expired (idle mount, or refreshes failing): wait a little for new ones */
        struct creds *seen = p->cur;
        time_t until = now + CREDS_EXPIRED_WAIT_S;
        while (p->cur == seen && p->refreshing && time(NULL) < until)
            wait_until(p, until);
    }
    struct creds *c = creds_ref(p->cur);
    pthread_mutex_unlock(&p->mu);
    return c;
}

unsigned long creds_provider_refreshes(const struct creds_provider *p)
{
    if (!p)
        return 0;
    pthread_mutex_lock((pthread_mutex_t *)&p->mu);
    unsigned long n = p->refreshes;
    pthread_mutex_unlock((pthread_mutex_t *)&p->mu);
    return n;
}
