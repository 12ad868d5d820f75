/*
 * fs/store/s3/store_s3_write.c - the S3 store's write calls: put (PutObject),
 * multipart uploads (CreateMultipartUpload, UploadPart, CompleteMultipartUpload,
 * AbortMultipartUpload, ListMultipartUploads), copy (CopyObject, or UploadPartCopy
 * parts above STORE_MAX_PART), remove (DeleteObject) and rmdir (the "dir/"
 * marker), on top of the S3 HTTP client engine (s3_client.c; no curl.h here).
 *
 * Owns: which request each write call sends and how its answer is judged
 * (ETags, upload ids, the CompleteMultipartUpload retry rule, 404s that are
 * success), argument checks (sizes, part numbers, contiguous parts), and the
 * write counters. Bodies always come from the caller's file descriptor and
 * are streamed by the client. Credentials are never logged.
 */
#include "store_s3_write.h"
#include "store_s3_base.h"

#include "log.h"
#include "s3_client.h"
#include "s3_xml.h"
#include "sigv4.h"
#include "store.h"
#include "strutil.h"

#include <errno.h>
#include <inttypes.h>
#include <openssl/evp.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- small helpers ------------------------------------------------------ */

static void copy_etag(char dst[STORE_ETAG_MAX], const char *src)
{
    snprintf(dst, STORE_ETAG_MAX, "%s", src);
}

/* etag of key after a write: the answer's, else what a HEAD reports. */
static int etag_after_write(struct s3_store *s, const char *key, const char *answer,
                            char etag[STORE_ETAG_MAX])
{
    if (answer && *answer) {
        copy_etag(etag, answer);
        return 0;
    }
    struct store_stat st;
    int rc = s3_store_head(s, key, &st);
    if (rc == 0)
        copy_etag(etag, st.etag);
    return rc;
}

/* "/bucket/encoded-key" for x-amz-copy-source (malloc'ed). */
static char *copy_source(const struct s3_store *s, const char *key)
{
    char *enc = sigv4_uri_encode(key, 1);
    char *src = enc ? str_printf("/%s/%s", s->bucket, enc) : NULL;
    free(enc);
    return src;
}

/* The x-amz-meta-* headers of attributes (store.h), as request headers. */
struct attr_headers {
    const char *names[STORE_ATTR_HDR_MAX];
    char vals[STORE_ATTR_HDR_MAX][STORE_ATTR_VALUE_MAX];
};

/* Append a's headers to h[n..] (room for STORE_ATTR_HDR_MAX); the new count. */
static size_t add_attr_headers(const struct store_attrs *a, struct attr_headers *ah,
                               struct sigv4_pair *h, size_t n)
{
    int k = store_attrs_headers(a, ah->names, ah->vals);
    for (int i = 0; i < k; i++)
        h[n++] = (struct sigv4_pair){ah->names[i], ah->vals[i]};
    return n;
}

/* ---- put ---------------------------------------------------------------- */

/* What a PutObject answer is read into. */
struct written {
    struct s3_store *s;
    const char *key;
    uint64_t len;
    char *etag; /* [STORE_ETAG_MAX] */
};

/* read_answer of PutObject: count the bytes, and the new object's ETag. */
static int written_answer(const struct s3_request *rq, struct s3_response *rs)
{
    struct written *w = rq->answer;
    atomic_fetch_add(&w->s->base.counters.put_bytes, w->len);
    return etag_after_write(w->s, w->key, rs->etag, w->etag);
}

int s3_store_put(struct store *base, const char *path, int fd, uint64_t len,
                 char etag[STORE_ETAG_MAX])
{
    return s3_store_put_attrs(base, path, fd, len, NULL, etag);
}

int s3_store_put_attrs(struct store *base, const char *path, int fd, uint64_t len,
                       const struct store_attrs *a, char etag[STORE_ETAG_MAX])
{
    struct s3_store *s = (struct s3_store *)base;
    etag[0] = '\0';
    if (!*path)
        return -EISDIR;
    if (len > STORE_MAX_PART)
        return -EFBIG; /* the caller uses a multipart upload */
    char *key = s3_store_key(s, path);
    if (!key)
        return -ENOMEM;
    struct written w = {s, key, len, etag};
    struct attr_headers ah;
    struct sigv4_pair h[STORE_ATTR_HDR_MAX];
    size_t nh = add_attr_headers(a, &ah, h, 0);
    struct s3_request rq = {.what = "PUT",
                            .method = "PUT",
                            .key = key,
                            .headers = h,
                            .nheaders = nh,
                            .body = {.kind = S3_BODY_FD, .fd = fd, .offset = 0, .len = len},
                            .max_retries = s->max_retries,
                            .counter = &s->base.counters.put_requests,
                            .read_answer = written_answer,
                            .answer = &w};
    int rc = s3_client_call(s->client, &rq);
    free(key);
    return rc;
}

/* ---- multipart uploads -------------------------------------------------- */

/* What a CreateMultipartUpload answer is read into. */
struct begun {
    struct s3_client *client;
    char *upload_id; /* [STORE_UPLOAD_ID_MAX] */
};

/* read_answer of CreateMultipartUpload: the upload id; 1 when retried. */
static int begun_answer(const struct s3_request *rq, struct s3_response *rs)
{
    struct begun *b = rq->answer;
    if (s3_xml_parse_initiate(rs->body, rs->body_len, b->upload_id, STORE_UPLOAD_ID_MAX) < 0)
        return s3_client_bad_answer(b->client, rq,
                                    "no usable UploadId in the InitiateMultipartUploadResult");
    return rs->attempts > 1;
}

/* CreateMultipartUpload of key: its id into upload_id. 0, 1 when the
 * request was retried (an earlier attempt may have begun another upload), or
 * -errno. */
static int begin_upload(struct s3_store *s, const char *key, const struct store_attrs *a,
                        char upload_id[STORE_UPLOAD_ID_MAX])
{
    struct sigv4_pair q[] = {{"uploads", ""}};
    struct begun b = {s->client, upload_id};
    struct attr_headers ah;
    struct sigv4_pair h[STORE_ATTR_HDR_MAX];
    size_t nh = add_attr_headers(a, &ah, h, 0);
    struct s3_request rq = {.what = "CREATE-MPU",
                            .method = "POST",
                            .key = key,
                            .query = q,
                            .nquery = 1,
                            .headers = h,
                            .nheaders = nh,
                            .max_retries = s->max_retries,
                            .counter = &s->base.counters.mpu_begin_requests,
                            .read_answer = begun_answer,
                            .answer = &b};
    return s3_client_call(s->client, &rq);
}

int s3_store_mpu_begin(struct store *base, const char *path, char upload_id[STORE_UPLOAD_ID_MAX])
{
    return s3_store_mpu_begin_attrs(base, path, NULL, upload_id);
}

int s3_store_mpu_begin_attrs(struct store *base, const char *path, const struct store_attrs *a,
                             char upload_id[STORE_UPLOAD_ID_MAX])
{
    struct s3_store *s = (struct s3_store *)base;
    upload_id[0] = '\0';
    if (!*path)
        return -EISDIR;
    char *key = s3_store_key(s, path);
    if (!key)
        return -ENOMEM;
    int rc = begin_upload(s, key, a, upload_id);
    free(key);
    return rc;
}

/* What an UploadPart answer is read into. */
struct part_sent {
    struct s3_store *s;
    struct store_part *part;
};

/* read_answer of UploadPart: count the bytes; the part's ETag. */
static int part_answer(const struct s3_request *rq, struct s3_response *rs)
{
    struct part_sent *p = rq->answer;
    atomic_fetch_add(&p->s->base.counters.put_bytes, p->part->length);
    if (!rs->etag[0])
        return s3_client_bad_answer(p->s->client, rq, "UploadPart answer without an ETag");
    copy_etag(p->part->etag, rs->etag);
    return 0;
}

int s3_store_mpu_part(struct store *base, const char *path, const char *upload_id,
                      struct store_part *part, int fd)
{
    struct s3_store *s = (struct s3_store *)base;
    part->etag[0] = '\0';
    if (!*path || !upload_id || !*upload_id || part->number < 1 || part->number > STORE_MAX_PARTS)
        return -EINVAL;
    if (part->length > STORE_MAX_PART)
        return -EFBIG;
    char *key = s3_store_key(s, path);
    if (!key)
        return -ENOMEM;
    char number[16];
    snprintf(number, sizeof number, "%u", (unsigned)part->number);
    struct sigv4_pair q[] = {{"partNumber", number}, {"uploadId", upload_id}};
    struct part_sent sent = {s, part};
    struct s3_request rq = {
        .what = "PART",
        .method = "PUT",
        .key = key,
        .query = q,
        .nquery = 2,
        .body = {.kind = S3_BODY_FD, .fd = fd, .offset = part->offset, .len = part->length},
        .max_retries = s->max_retries,
        .counter = &s->base.counters.part_requests,
        .read_answer = part_answer,
        .answer = &sent};
    int rc = s3_client_call(s->client, &rq);
    free(key);
    return rc;
}

/* Parts in ascending number order, contiguous from offset 0, size bytes in all. */
static int check_parts(struct s3_store *s, const char *key, const struct store_part *parts,
                       size_t n, uint64_t size)
{
    uint64_t at = 0;
    const char *problem = n == 0 || n > STORE_MAX_PARTS ? "part count" : NULL;
    for (size_t i = 0; i < n && !problem; i++) {
        if (parts[i].number < 1 || parts[i].number > STORE_MAX_PARTS ||
            (i > 0 && parts[i].number <= parts[i - 1].number))
            problem = "part numbers not ascending in 1..10000";
        else if (parts[i].offset != at || parts[i].length > UINT64_MAX - at)
            problem = "parts not contiguous";
        else if (!parts[i].etag[0])
            problem = "a part without an ETag";
        at += parts[i].length;
    }
    if (!problem && at != size)
        problem = "parts do not add up to the size";
    if (!problem)
        return 0;
    log_error("s3: COMPLETE s3://%s/%s: refused: %s (%zu parts, size %" PRIu64 ")", s->bucket, key,
              problem, n, size);
    return -EINVAL;
}

/* The hex digits of a quoted or bare ETag of the form 32 hex digits,
 * optionally followed by "-" and a part count: 0 and *hex, *count
 * (0 without the suffix), or -1. */
static int split_etag(const char *etag, const char **hex, unsigned *count)
{
    size_t n = strlen(etag);
    if (n >= 2 && etag[0] == '"' && etag[n - 1] == '"')
        etag++, n -= 2;
    if (n < 32 || strspn(etag, "0123456789abcdefABCDEF") < 32)
        return -1;
    *hex = etag;
    *count = 0;
    if (n == 32)
        return 0;
    if (etag[32] != '-' || n == 33 || n > 38)
        return -1;
    for (size_t i = 33; i < n; i++) {
        if (etag[i] < '0' || etag[i] > '9')
            return -1;
        *count = *count * 10 + (unsigned)(etag[i] - '0');
    }
    return 0;
}

int s3_multipart_etag(const struct store_part *parts, size_t n, char etag[STORE_ETAG_MAX])
{
    etag[0] = '\0';
    if (n == 0 || n > STORE_MAX_PARTS)
        return -EINVAL;
    unsigned char *md5s = malloc(n * 16);
    if (!md5s)
        return -ENOMEM;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        const char *hex;
        unsigned count;
        if (split_etag(parts[i].etag, &hex, &count) < 0 || count)
            rc = -EINVAL;
        for (int j = 0; rc == 0 && j < 16; j++) {
            unsigned byte;
            if (sscanf(hex + 2 * j, "%2x", &byte) != 1)
                rc = -EINVAL;
            md5s[i * 16 + (size_t)j] = (unsigned char)byte;
        }
    }
    unsigned char md[16];
    unsigned int mdlen = 0;
    if (rc == 0 && (EVP_Digest(md5s, n * 16, md, &mdlen, EVP_md5(), NULL) != 1 || mdlen != 16))
        rc = -EIO;
    if (rc == 0) {
        char hex[33];
        for (int j = 0; j < 16; j++)
            snprintf(hex + 2 * j, 3, "%02x", md[j]);
        snprintf(etag, STORE_ETAG_MAX, "\"%s-%zu\"", hex, n);
    }
    free(md5s);
    return rc;
}

/* After a lost completion: is the object with this ETag (of size bytes, as
 * the caller checked) the one these parts make? When both ETags are
 * S3-style MD5s it must be exactly the multipart ETag of the parts (an older
 * object of the same size is not); otherwise the size is all we have. */
static int is_our_object(const struct store_part *parts, size_t n, const char *head_etag)
{
    const char *hex;
    unsigned count;
    char want[STORE_ETAG_MAX];
    if (split_etag(head_etag, &hex, &count) < 0 || count == 0 ||
        s3_multipart_etag(parts, n, want) < 0)
        return 1;
    return store_etag_equal(want, head_etag) && count == n;
}

/* What a CompleteMultipartUpload answer is read into. */
struct completed {
    struct s3_store *s;
    const char *key;
    const struct store_part *parts;
    size_t n;
    uint64_t size;
    char *etag; /* [STORE_ETAG_MAX] */
};

/* read_answer of CompleteMultipartUpload: the new object's ETag. */
static int completed_answer(const struct s3_request *rq, struct s3_response *rs)
{
    struct completed *c = rq->answer;
    char answer[STORE_ETAG_MAX];
    if (s3_xml_parse_etag(rs->body, rs->body_len, "CompleteMultipartUploadResult", answer) < 0)
        return s3_client_bad_answer(c->s->client, rq, "malformed CompleteMultipartUploadResult");
    return etag_after_write(c->s, c->key, answer, c->etag);
}

/* read_error of CompleteMultipartUpload: a retried request that ends in
 * NoSuchUpload found its first attempt's work done if the object is there
 * with size bytes (and, where ETags are S3-style MD5s, the multipart ETag of
 * these parts). */
static int completed_error(const struct s3_request *rq, struct s3_response *rs, int rc)
{
    struct completed *c = rq->answer;
    if (rc < 0 || rs->status != 404 || strcmp(rs->err.code, "NoSuchUpload") != 0 ||
        rs->attempts <= 1)
        return S3_USUAL;
    /* an earlier attempt may have completed it and its answer was lost */
    struct store_stat st;
    int hrc = s3_store_head(c->s, c->key, &st);
    if (hrc == 0 && st.size == c->size && is_our_object(c->parts, c->n, st.etag)) {
        log_info("s3: COMPLETE s3://%s/%s: answer lost, but the object is there with its "
                 "%" PRIu64 " bytes: done",
                 c->s->bucket, c->key, c->size);
        copy_etag(c->etag, st.etag);
        return 0;
    }
    return s3_client_bad_answer(c->s->client, rq,
                                hrc == 0 ? "upload gone after a retry, and the object there is "
                                           "another one (size or ETag)"
                                         : "upload gone after a retry, and no object is there");
}

/* CompleteMultipartUpload of key (parts already checked); see completed_error
 * for a retried one whose answer was lost. */
static int complete_upload(struct s3_store *s, const char *key, const char *upload_id,
                           const struct store_part *parts, size_t n, uint64_t size,
                           char etag[STORE_ETAG_MAX])
{
    char *xml;
    size_t xml_len;
    int rc = s3_xml_build_complete(parts, n, &xml, &xml_len);
    if (rc < 0)
        return rc;
    struct sigv4_pair q[] = {{"uploadId", upload_id}};
    struct sigv4_pair h[] = {{"Content-Type", "application/xml"}};
    struct completed c = {s, key, parts, n, size, etag};
    struct s3_request rq = {.what = "COMPLETE",
                            .method = "POST",
                            .key = key,
                            .query = q,
                            .nquery = 1,
                            .headers = h,
                            .nheaders = 1,
                            .body = {.kind = S3_BODY_MEM, .data = xml, .len = xml_len},
                            .sign_payload = 1, /* small: always its real SHA-256 */
                            .error_in_200 = 1,
                            .max_retries = s->max_retries,
                            .counter = &s->base.counters.complete_requests,
                            .read_answer = completed_answer,
                            .read_error = completed_error,
                            .answer = &c};
    rc = s3_client_call(s->client, &rq);
    free(xml);
    return rc;
}

int s3_store_mpu_complete(struct store *base, const char *path, const char *upload_id,
                          const struct store_part *parts, size_t n, uint64_t size,
                          char etag[STORE_ETAG_MAX])
{
    struct s3_store *s = (struct s3_store *)base;
    etag[0] = '\0';
    if (!*path || !upload_id || !*upload_id)
        return -EINVAL;
    char *key = s3_store_key(s, path);
    if (!key)
        return -ENOMEM;
    int rc = check_parts(s, key, parts, n, size);
    if (rc == 0)
        rc = complete_upload(s, key, upload_id, parts, n, size, etag);
    free(key);
    return rc;
}

/* read_error of AbortMultipartUpload: a 404 but NoSuchBucket is success
 * (NoSuchUpload: already gone, or our retry's first attempt did it). */
static int aborted_error(const struct s3_request *rq, struct s3_response *rs, int rc)
{
    (void)rq;
    return rc == 0 && rs->status == 404 && strcmp(rs->err.code, "NoSuchBucket") != 0 ? 0 : S3_USUAL;
}

/* AbortMultipartUpload; an upload that no longer exists is not an error. */
static int abort_upload(struct s3_store *s, const char *key, const char *upload_id)
{
    struct sigv4_pair q[] = {{"uploadId", upload_id}};
    struct s3_request rq = {.what = "ABORT",
                            .method = "DELETE",
                            .key = key,
                            .query = q,
                            .nquery = 1,
                            .max_retries = s->max_retries,
                            .counter = &s->base.counters.abort_requests,
                            .read_error = aborted_error};
    return s3_client_call(s->client, &rq);
}

int s3_store_mpu_abort(struct store *base, const char *path, const char *upload_id)
{
    struct s3_store *s = (struct s3_store *)base;
    if (!*path || !upload_id || !*upload_id)
        return -EINVAL;
    char *key = s3_store_key(s, path);
    if (!key)
        return -ENOMEM;
    int rc = abort_upload(s, key, upload_id);
    free(key);
    return rc;
}

/* What a ListMultipartUploads answer is read into. */
struct uploads {
    struct s3_client *client;
    struct s3_upload_page *page;
};

/* read_answer of ListMultipartUploads: the page. */
static int uploads_answer(const struct s3_request *rq, struct s3_response *rs)
{
    struct uploads *u = rq->answer;
    if (s3_xml_parse_uploads(rs->body, rs->body_len, u->page) < 0)
        return s3_client_bad_answer(u->client, rq, "malformed ListMultipartUploadsResult");
    return 0;
}

/* One ListMultipartUploads page for prefix key after the markers. */
static int list_uploads_page(struct s3_store *s, const char *key, const char *key_marker,
                             const char *id_marker, struct s3_upload_page *page)
{
    struct sigv4_pair q[5] = {{"uploads", ""}, {"encoding-type", "url"}, {"prefix", key}};
    size_t nq = 3;
    if (key_marker)
        q[nq++] = (struct sigv4_pair){"key-marker", key_marker};
    if (id_marker)
        q[nq++] = (struct sigv4_pair){"upload-id-marker", id_marker};
    struct uploads answer = {s->client, page};
    struct s3_request rq = {.what = "LIST-UPLOADS",
                            .method = "GET",
                            .key = NULL,
                            .query = q,
                            .nquery = nq,
                            .max_retries = s->max_retries,
                            .counter = &s->base.counters.upload_list_requests,
                            .read_answer = uploads_answer,
                            .answer = &answer};
    memset(page, 0, sizeof *page);
    return s3_client_call(s->client, &rq);
}

static int same_marker(const char *a, const char *b)
{
    return strcmp(a ? a : "", b ? b : "") == 0;
}

int s3_store_mpu_list(struct store *base, const char *path, store_upload_fn fn, void *arg)
{
    struct s3_store *s = (struct s3_store *)base;
    if (!*path)
        return 0; /* the root is no object: nothing is uploaded to it */
    char *key = s3_store_key(s, path);
    if (!key)
        return -ENOMEM;
    char *key_marker = NULL, *id_marker = NULL;
    int rc = 0, stopped = 0;
    while (rc == 0 && !stopped) {
        struct s3_upload_page page;
        rc = list_uploads_page(s, key, key_marker, id_marker, &page);
        if (rc < 0)
            break;
        for (size_t i = 0; i < page.nuploads && !stopped; i++) {
            const struct s3_upload *u = &page.uploads[i];
            if (strcmp(u->key, key) != 0)
                continue; /* a longer key with this prefix */
            if (strlen(u->upload_id) >= STORE_UPLOAD_ID_MAX)
                log_warn("s3: LIST-UPLOADS s3://%s/%s: skipping an upload id of %zu bytes",
                         s->bucket, key, strlen(u->upload_id));
            else
                stopped = fn(arg, u->upload_id) != 0;
        }
        if (!stopped && page.is_truncated) {
            if (same_marker(key_marker, page.next_key_marker) &&
                same_marker(id_marker, page.next_upload_id_marker)) {
                atomic_fetch_add(&s->base.counters.errors, 1);
                log_error("s3: LIST-UPLOADS s3://%s/%s: truncated page without progress", s->bucket,
                          key);
                rc = -EIO;
            }
            free(key_marker);
            free(id_marker);
            key_marker = page.next_key_marker;
            id_marker = page.next_upload_id_marker;
            page.next_key_marker = page.next_upload_id_marker = NULL;
        } else {
            stopped = 1;
        }
        s3_upload_page_free(&page);
    }
    free(key_marker);
    free(id_marker);
    free(key);
    return rc;
}

/* ---- copy --------------------------------------------------------------- */

uint64_t s3_copy_part_size(uint64_t size)
{
    uint64_t part = S3_COPY_PART_SIZE;
    uint64_t need = size / STORE_MAX_PARTS + (size % STORE_MAX_PARTS != 0);
    if (need > part)
        part = (need + (1u << 20) - 1) & ~(uint64_t)((1u << 20) - 1);
    return part <= STORE_MAX_PART ? part : 0;
}

/* read_answer of CopyObject: the new object's ETag (a written's len is 0),
 * quoted as the ETag header of a HEAD or GET has it (radosgw's
 * CopyObjectResult leaves the quotes out; S3's has them). */
static int copied_answer(const struct s3_request *rq, struct s3_response *rs)
{
    struct written *w = rq->answer;
    char answer[STORE_ETAG_MAX], quoted[STORE_ETAG_MAX];
    if (s3_xml_parse_etag(rs->body, rs->body_len, "CopyObjectResult", answer) < 0)
        return s3_client_bad_answer(w->s->client, rq, "malformed CopyObjectResult");
    if (answer[0] && answer[0] != '"') {
        int n = snprintf(quoted, sizeof quoted, "\"%s\"", answer);
        if (n > 0 && (size_t)n < sizeof quoted)
            memcpy(answer, quoted, (size_t)n + 1);
    }
    return etag_after_write(w->s, w->key, answer, w->etag);
}

/* CopyObject from_key (etag if non-empty) to to_key. */
/* With a non-NULL a, the copy's metadata is a's (x-amz-metadata-directive:
 * REPLACE); else the source's (the default directive, COPY). */
static int copy_object(struct s3_store *s, const char *from_key, const char *etag,
                       const char *to_key, const struct store_attrs *a,
                       char etag_out[STORE_ETAG_MAX])
{
    char *src = copy_source(s, from_key);
    if (!src)
        return -ENOMEM;
    struct sigv4_pair h[3 + STORE_ATTR_HDR_MAX] = {{"x-amz-copy-source", src}};
    size_t nh = 1;
    if (etag && *etag)
        h[nh++] = (struct sigv4_pair){"x-amz-copy-source-if-match", etag};
    struct attr_headers ah;
    if (a) {
        h[nh++] = (struct sigv4_pair){"x-amz-metadata-directive", "REPLACE"};
        nh = add_attr_headers(a, &ah, h, nh);
    }
    struct written copied = {s, to_key, 0, etag_out};
    struct s3_request rq = {.what = "COPY",
                            .method = "PUT",
                            .key = to_key,
                            .headers = h,
                            .nheaders = nh,
                            .error_in_200 = 1,
                            .max_retries = s->max_retries,
                            .counter = &s->base.counters.copy_requests,
                            .read_answer = copied_answer,
                            .answer = &copied};
    int rc = s3_client_call(s->client, &rq);
    free(src);
    return rc;
}

/* read_answer of UploadPartCopy: the part's ETag. */
static int part_copied_answer(const struct s3_request *rq, struct s3_response *rs)
{
    struct part_sent *p = rq->answer;
    if (s3_xml_parse_etag(rs->body, rs->body_len, "CopyPartResult", p->part->etag) < 0 ||
        !p->part->etag[0])
        return s3_client_bad_answer(p->s->client, rq, "CopyPartResult without a usable ETag");
    return 0;
}

/* UploadPartCopy of src (x-amz-copy-source) bytes part->offset.. into part
 * part->number of upload_id; sets part->etag. */
static int upload_part_copy(struct s3_store *s, const char *src, const char *etag,
                            const char *to_key, const char *upload_id, struct store_part *part)
{
    char number[16], range[64];
    snprintf(number, sizeof number, "%u", (unsigned)part->number);
    snprintf(range, sizeof range, "bytes=%" PRIu64 "-%" PRIu64, part->offset,
             part->offset + part->length - 1);
    struct sigv4_pair q[] = {{"partNumber", number}, {"uploadId", upload_id}};
    struct sigv4_pair h[] = {{"x-amz-copy-source", src},
                             {"x-amz-copy-source-range", range},
                             {"x-amz-copy-source-if-match", etag}};
    struct part_sent sent = {s, part};
    struct s3_request rq = {.what = "PART-COPY",
                            .method = "PUT",
                            .key = to_key,
                            .query = q,
                            .nquery = 2,
                            .headers = h,
                            .nheaders = etag && *etag ? 3 : 2,
                            .error_in_200 = 1,
                            .max_retries = s->max_retries,
                            .counter = &s->base.counters.copy_requests,
                            .read_answer = part_copied_answer,
                            .answer = &sent};
    return s3_client_call(s->client, &rq);
}

/* The parts of a size-byte object cut in part_size pieces (calloc'ed). */
static struct store_part *cut_parts(uint64_t size, uint64_t part_size, size_t *n)
{
    *n = (size_t)(size / part_size + (size % part_size != 0));
    struct store_part *parts = calloc(*n, sizeof *parts);
    for (size_t i = 0; parts && i < *n; i++) {
        parts[i].number = (uint32_t)(i + 1);
        parts[i].offset = (uint64_t)i * part_size;
        parts[i].length = size - parts[i].offset < part_size ? size - parts[i].offset : part_size;
    }
    return parts;
}

static int copy_multipart_attrs(struct s3_store *s, const char *from_key, const char *etag,
                                uint64_t size, const char *to_key, uint64_t part_size,
                                const struct store_attrs *a, char etag_out[STORE_ETAG_MAX]);

int s3_store_copy_multipart(struct s3_store *s, const char *from_key, const char *etag,
                            uint64_t size, const char *to_key, uint64_t part_size,
                            char etag_out[STORE_ETAG_MAX])
{
    return copy_multipart_attrs(s, from_key, etag, size, to_key, part_size, NULL, etag_out);
}

/* s3_store_copy_multipart; the new object gets attributes a (NULL: none). */
static int copy_multipart_attrs(struct s3_store *s, const char *from_key, const char *etag,
                                uint64_t size, const char *to_key, uint64_t part_size,
                                const struct store_attrs *a, char etag_out[STORE_ETAG_MAX])
{
    etag_out[0] = '\0';
    if (size == 0 || part_size == 0 || part_size > STORE_MAX_PART ||
        (size - 1) / part_size >= STORE_MAX_PARTS)
        return -EINVAL;
    /* Pin the source's version, so every part comes from the same one. */
    char pinned[STORE_ETAG_MAX];
    if (etag && *etag) {
        copy_etag(pinned, etag);
    } else {
        struct store_stat st;
        int rc = s3_store_head(s, from_key, &st);
        if (rc < 0)
            return rc;
        if (st.size != size) {
            log_warn("s3: COPY s3://%s/%s: %" PRIu64 " bytes, not %" PRIu64 ": changed", s->bucket,
                     from_key, st.size, size);
            return -ESTALE;
        }
        copy_etag(pinned, st.etag);
    }
    char *src = copy_source(s, from_key);
    size_t n;
    struct store_part *parts = src ? cut_parts(size, part_size, &n) : NULL;
    char upload_id[STORE_UPLOAD_ID_MAX];
    int rc = parts ? begin_upload(s, to_key, a, upload_id) : -ENOMEM;
    if (rc > 0)
        rc = 0; /* a retried begin's stray upload: see design.md's known gaps */
    if (rc == 0) {
        for (size_t i = 0; i < n && rc == 0; i++)
            rc = upload_part_copy(s, src, pinned, to_key, upload_id, &parts[i]);
        if (rc == 0)
            rc = complete_upload(s, to_key, upload_id, parts, n, size, etag_out);
        if (rc < 0 && abort_upload(s, to_key, upload_id) < 0)
            log_warn("s3: COPY s3://%s/%s: upload %.16s... not aborted: its parts stay until "
                     "a cleanup",
                     s->bucket, to_key, upload_id);
    }
    free(parts);
    free(src);
    return rc;
}

int s3_store_copy(struct store *base, const char *from, const char *etag, uint64_t size,
                  const char *to, char etag_out[STORE_ETAG_MAX])
{
    struct s3_store *s = (struct s3_store *)base;
    etag_out[0] = '\0';
    if (!*from || !*to)
        return -EISDIR;
    char *from_key = s3_store_key(s, from), *to_key = s3_store_key(s, to);
    int rc = from_key && to_key ? 0 : -ENOMEM;
    if (rc == 0 && strcmp(from_key, to_key) == 0) {
        /* onto itself: S3 refuses such a copy; the object is already there */
        struct store_stat st;
        rc = s3_store_head(s, from_key, &st);
        if (rc == 0 && etag && *etag && st.etag[0] && !store_etag_equal(etag, st.etag))
            rc = -ESTALE;
        if (rc == 0)
            copy_etag(etag_out, st.etag);
    } else if (rc == 0 && size <= STORE_MAX_PART) {
        rc = copy_object(s, from_key, etag, to_key, NULL, etag_out);
    } else if (rc == 0) {
        uint64_t part = s3_copy_part_size(size);
        rc = part ? s3_store_copy_multipart(s, from_key, etag, size, to_key, part, etag_out)
                  : -EFBIG;
    }
    free(from_key);
    free(to_key);
    return rc;
}

/* ---- attributes (issue #18) --------------------------------------------- */

/* PUT an empty "dir/" marker, with attributes a (NULL: none). */
static int put_marker(struct s3_store *s, const char *prefix, const struct store_attrs *a)
{
    struct attr_headers ah;
    struct sigv4_pair h[STORE_ATTR_HDR_MAX];
    size_t nh = add_attr_headers(a, &ah, h, 0);
    struct s3_request rq = {.what = "PUT",
                            .method = "PUT",
                            .key = prefix,
                            .headers = h,
                            .nheaders = nh,
                            .max_retries = s->max_retries,
                            .counter = &s->base.counters.put_requests};
    return s3_client_call(s->client, &rq);
}

int s3_store_set_attrs(struct store *base, const char *path, int is_dir, const char *etag,
                       uint64_t size, const struct store_attrs *a, char etag_out[STORE_ETAG_MAX])
{
    struct s3_store *s = (struct s3_store *)base;
    etag_out[0] = '\0';
    if (!*path)
        return 0; /* the bucket's root has no object to hold them */
    char *key = is_dir ? s3_store_dir_prefix(s, path) : s3_store_key(s, path);
    if (!key)
        return -ENOMEM;
    int rc;
    if (is_dir) {
        rc = put_marker(s, key, a);
    } else if (size <= STORE_MAX_PART) {
        rc = copy_object(s, key, etag, key, a, etag_out);
    } else {
        uint64_t part = s3_copy_part_size(size);
        rc = part ? copy_multipart_attrs(s, key, etag, size, key, part, a, etag_out) : -EFBIG;
    }
    free(key);
    return rc;
}

int s3_store_get_attrs(struct store *base, const char *path, int is_dir, struct store_attrs *a,
                       char etag[STORE_ETAG_MAX])
{
    struct s3_store *s = (struct s3_store *)base;
    memset(a, 0, sizeof *a);
    etag[0] = '\0';
    char *key = is_dir ? s3_store_dir_prefix(s, path) : s3_store_key(s, path);
    if (!key)
        return -ENOMEM;
    struct store_stat st;
    int rc = *key ? s3_store_head(s, key, &st) : -ENOENT;
    free(key);
    if (rc == 0) {
        *a = st.attrs;
        memcpy(etag, st.etag, STORE_ETAG_MAX);
    } else if (rc == -ENOENT && (is_dir || !*path)) {
        rc = 0; /* a directory without a marker: no attributes */
    }
    a->set |= STORE_ATTR_READ;
    return rc;
}

/* ---- remove, rmdir ------------------------------------------------------ */

/* read_error of DeleteObject: a 404 but NoSuchBucket is -ENOENT. */
static int deleted_error(const struct s3_request *rq, struct s3_response *rs, int rc)
{
    (void)rq;
    return rc == 0 && rs->status == 404 && strcmp(rs->err.code, "NoSuchBucket") != 0 ? -ENOENT
                                                                                     : S3_USUAL;
}

/* DeleteObject key: 0, -ENOENT if the server says 404 (S3 itself answers 204
 * for a missing key, so there the caller cannot tell). */
static int delete_object(struct s3_store *s, const char *key)
{
    struct s3_request rq = {.what = "DELETE",
                            .method = "DELETE",
                            .key = key,
                            .max_retries = s->max_retries,
                            .counter = &s->base.counters.delete_requests,
                            .read_error = deleted_error};
    return s3_client_call(s->client, &rq);
}

int s3_store_remove(struct store *base, const char *path)
{
    struct s3_store *s = (struct s3_store *)base;
    if (!*path)
        return -EISDIR;
    char *key = s3_store_key(s, path);
    if (!key)
        return -ENOMEM;
    int rc = delete_object(s, key);
    free(key);
    return rc;
}

int s3_store_mkdir(struct store *base, const char *path)
{
    struct s3_store *s = (struct s3_store *)base;
    if (!*path)
        return -EEXIST; /* the store's root */
    char *prefix = s3_store_dir_prefix(s, path);
    if (!prefix)
        return -ENOMEM;
    /* A "dir/" marker object (empty, hidden from listings), so that the
     * directory exists for every mount of the bucket before a file is in it:
     * DCP's coordinator makes the checkpoint directory, and the other nodes'
     * ranks create their shard files in it. */
    int rc = put_marker(s, prefix, NULL);
    free(prefix);
    return rc;
}

int s3_store_rmdir(struct store *base, const char *path)
{
    struct s3_store *s = (struct s3_store *)base;
    if (!*path)
        return -EBUSY; /* the store's root */
    char *prefix = s3_store_dir_prefix(s, path);
    if (!prefix)
        return -ENOMEM;
    /* Two keys at most: "dir/" (the marker, first in key order) and one more. */
    struct s3_list_query lq = {.prefix = prefix, .max_keys = 2, .max_retries = s->max_retries};
    struct s3_list_page page;
    int rc = s3_client_list_page(s->client, &lq, &page);
    int marker = 0;
    for (size_t i = 0; rc == 0 && i < page.nobjects; i++) {
        if (strcmp(page.objects[i].key, prefix) == 0)
            marker = 1;
        else
            rc = -ENOTEMPTY;
    }
    if (rc == 0 && page.nprefixes)
        rc = -ENOTEMPTY;
    if (rc == 0 && marker) {
        rc = delete_object(s, prefix);
        if (rc == -ENOENT)
            rc = 0; /* removed meanwhile: gone all the same */
    }
    s3_list_page_free(&page); /* empty if the listing failed */
    free(prefix);
    return rc;
}
