/*
 * fs/store/s3/s3_xml.c - S3 XML with libxml2: ListObjectsV2 pages, <Error> bodies,
 * multipart upload results (InitiateMultipartUpload, CompleteMultipartUpload,
 * ListMultipartUploads), CopyObject/CopyPart results, and the
 * CompleteMultipartUpload request body we send.
 *
 * Safety: input size is bounded, documents carrying a DOCTYPE are refused
 * before and after parsing, XML_PARSE_NOENT is never set (no entity
 * substitution), XML_PARSE_NONET forbids network access, and text is taken
 * only from text/CDATA nodes (entity reference nodes are ignored).
 */
#include "s3_xml.h"

#include <errno.h>
#include <libxml/parser.h>
#include <libxml/tree.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define S3_XML_MAX_ENTRIES 1000000 /* per page; S3 sends at most 1000 */

static pthread_once_t xml_once = PTHREAD_ONCE_INIT;

static void xml_init(void)
{
    xmlInitParser();
}

/* ---- document helpers --------------------------------------------------- */

static int has_doctype(const char *body, size_t len)
{
    return memmem(body, len, "<!DOCTYPE", 9) != NULL || memmem(body, len, "<!ENTITY", 8) != NULL;
}

/* Parse body into a document; *rc gets 0 or a negative errno. */
static xmlDocPtr read_doc(const char *body, size_t len, int *rc)
{
    *rc = -EINVAL;
    if (!body || len == 0)
        return NULL;
    if (len > S3_XML_MAX_BYTES || len > INT_MAX) {
        *rc = -EFBIG;
        return NULL;
    }
    if (has_doctype(body, len))
        return NULL;
    /* S3 may send whitespace ahead of the document to keep a long
     * CompleteMultipartUpload or copy alive; an XML declaration must come
     * first for libxml2, so skip it. */
    while (len && (*body == ' ' || *body == '\t' || *body == '\r' || *body == '\n'))
        body++, len--;
    if (len == 0)
        return NULL;
    pthread_once(&xml_once, xml_init);
    int flags = XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING;
    xmlDocPtr doc = xmlReadMemory(body, (int)len, "s3-response.xml", NULL, flags);
    if (!doc)
        return NULL;
    if (doc->intSubset || doc->extSubset || !xmlDocGetRootElement(doc)) {
        xmlFreeDoc(doc);
        return NULL;
    }
    *rc = 0;
    return doc;
}

static int is_elem(xmlNodePtr n, const char *name)
{
    return n && n->type == XML_ELEMENT_NODE && xmlStrcmp(n->name, BAD_CAST name) == 0;
}

/* Parse body into a document whose root element is name: the document (the
 * caller frees it) with *root set, or NULL with *rc a negative errno (-EINVAL
 * for another root). */
static xmlDocPtr read_root(const char *body, size_t len, const char *name, xmlNodePtr *root,
                           int *rc)
{
    xmlDocPtr doc = read_doc(body, len, rc);
    if (!doc)
        return NULL;
    *root = xmlDocGetRootElement(doc);
    if (!is_elem(*root, name)) {
        xmlFreeDoc(doc);
        *rc = -EINVAL;
        return NULL;
    }
    return doc;
}

/* The concatenated text/CDATA children of n (malloc'ed, "" if none). */
static char *node_text(xmlNodePtr n)
{
    size_t total = 0;
    for (xmlNodePtr c = n->children; c; c = c->next)
        if ((c->type == XML_TEXT_NODE || c->type == XML_CDATA_SECTION_NODE) && c->content)
            total += strlen((const char *)c->content);
    char *s = malloc(total + 1);
    if (!s)
        return NULL;
    size_t off = 0;
    for (xmlNodePtr c = n->children; c; c = c->next) {
        if ((c->type == XML_TEXT_NODE || c->type == XML_CDATA_SECTION_NODE) && c->content) {
            size_t l = strlen((const char *)c->content);
            memcpy(s + off, c->content, l);
            off += l;
        }
    }
    s[off] = '\0';
    return s;
}

/* Copy n's text into a fixed buffer, truncating; control characters become
 * spaces so the result is safe on one log line. */
static void node_text_to(xmlNodePtr n, char *dst, size_t cap)
{
    char *t = node_text(n);
    snprintf(dst, cap, "%s", t ? t : "");
    free(t);
    for (char *p = dst; *p; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = ' ';
}

/* ---- ISO 8601 ----------------------------------------------------------- */

static int parse_digits(const char **p, int n, int *out)
{
    int v = 0;
    for (int i = 0; i < n; i++) {
        char c = (*p)[i];
        if (c < '0' || c > '9')
            return -1;
        v = v * 10 + (c - '0');
    }
    *p += n;
    *out = v;
    return 0;
}

static int expect_char(const char **p, char c)
{
    if (**p != c)
        return -1;
    (*p)++;
    return 0;
}

/* Zone suffix: "", "Z", "+hh:mm", "-hh:mm", "+hhmm" -> offset seconds. */
static int parse_zone(const char *p, long *offset)
{
    *offset = 0;
    if (*p == '\0' || (p[0] == 'Z' && p[1] == '\0'))
        return 0;
    if (*p != '+' && *p != '-')
        return -1;
    int sign = *p == '-' ? -1 : 1, hh, mm;
    p++;
    if (parse_digits(&p, 2, &hh) < 0)
        return -1;
    if (*p == ':')
        p++;
    if (parse_digits(&p, 2, &mm) < 0 || *p != '\0' || hh > 23 || mm > 59)
        return -1;
    *offset = sign * (hh * 3600L + mm * 60L);
    return 0;
}

int64_t s3_parse_iso8601(const char *s)
{
    int64_t ns = s3_parse_iso8601_ns(s);
    return ns < 0 ? -1 : ns / 1000000000;
}

int64_t s3_parse_iso8601_ns(const char *s)
{
    if (!s)
        return -1;
    const char *p = s;
    int y, mo, d, h, mi, sec;
    if (parse_digits(&p, 4, &y) || expect_char(&p, '-') || parse_digits(&p, 2, &mo) ||
        expect_char(&p, '-') || parse_digits(&p, 2, &d) || expect_char(&p, 'T') ||
        parse_digits(&p, 2, &h) || expect_char(&p, ':') || parse_digits(&p, 2, &mi) ||
        expect_char(&p, ':') || parse_digits(&p, 2, &sec))
        return -1;
    if (mo < 1 || mo > 12 || d < 1 || d > 31 || h > 23 || mi > 59 || sec > 60)
        return -1;
    int64_t frac = 0; /* nanoseconds; digits past the ninth are dropped */
    if (*p == '.') {
        p++;
        if (*p < '0' || *p > '9')
            return -1;
        int64_t scale = 100000000;
        for (; *p >= '0' && *p <= '9'; p++, scale /= 10)
            frac += (*p - '0') * scale;
    }
    long offset;
    if (parse_zone(p, &offset) < 0)
        return -1;
    struct tm tm = {0};
    tm.tm_year = y - 1900;
    tm.tm_mon = mo - 1;
    tm.tm_mday = d;
    tm.tm_hour = h;
    tm.tm_min = mi;
    tm.tm_sec = sec;
    time_t t = timegm(&tm);
    if (t == (time_t)-1)
        return -1;
    int64_t secs = (int64_t)t - offset;
    if (secs < 0 || secs > INT64_MAX / 1000000000 - 1)
        return -1;
    return secs * 1000000000 + frac;
}

/* ---- URL decoding (EncodingType=url) ------------------------------------ */

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Decode %XX and '+' in place; -1 on a bad escape or an encoded NUL. */
static int url_decode_inplace(char *s)
{
    char *w = s;
    for (const char *r = s; *r; r++) {
        if (*r == '+') {
            *w++ = ' ';
        } else if (*r == '%') {
            int hi = hexval(r[1]), lo = hi < 0 ? -1 : hexval(r[2]);
            if (hi < 0 || lo < 0 || (hi == 0 && lo == 0))
                return -1;
            *w++ = (char)(hi * 16 + lo);
            r += 2;
        } else {
            *w++ = *r;
        }
    }
    *w = '\0';
    return 0;
}

/* ---- ListObjectsV2 ------------------------------------------------------ */

void s3_list_page_free(struct s3_list_page *page)
{
    if (!page)
        return;
    for (size_t i = 0; i < page->nobjects; i++)
        free(page->objects[i].key);
    free(page->objects);
    for (size_t i = 0; i < page->nprefixes; i++)
        free(page->prefixes[i]);
    free(page->prefixes);
    free(page->next_token);
    memset(page, 0, sizeof *page);
}

static int parse_u64(const char *s, uint64_t *out)
{
    if (!s || *s < '0' || *s > '9')
        return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end != '\0')
        return -1;
    *out = v;
    return 0;
}

/* Grow an array of elem-sized items to hold n+1; -ENOMEM on failure. */
static int grow(void **arr, size_t n, size_t *cap, size_t elem)
{
    if (n < *cap)
        return 0;
    if (n >= S3_XML_MAX_ENTRIES)
        return -EFBIG;
    size_t ncap = *cap ? *cap * 2 : 64;
    void *p = realloc(*arr, ncap * elem);
    if (!p)
        return -ENOMEM;
    *arr = p;
    *cap = ncap;
    return 0;
}

/* One <Contents> element into obj. */
static int parse_contents(xmlNodePtr n, struct s3_object *obj)
{
    memset(obj, 0, sizeof *obj);
    int have_key = 0;
    for (xmlNodePtr c = n->children; c; c = c->next) {
        if (c->type != XML_ELEMENT_NODE)
            continue;
        char *t = node_text(c);
        if (!t)
            return -ENOMEM;
        int rc = 0;
        if (is_elem(c, "Key") && !have_key) {
            obj->key = t;
            t = NULL;
            have_key = 1;
        } else if (is_elem(c, "Size")) {
            rc = parse_u64(t, &obj->size) < 0 ? -EINVAL : 0;
        } else if (is_elem(c, "LastModified")) {
            int64_t m = s3_parse_iso8601_ns(t);
            obj->mtime_ns = m < 0 ? 0 : m;
        } else if (is_elem(c, "ETag")) {
            if (strlen(t) < sizeof obj->etag)
                memcpy(obj->etag, t, strlen(t) + 1);
        }
        free(t);
        if (rc < 0)
            return rc;
    }
    return have_key ? 0 : -EINVAL;
}

/* One <CommonPrefixes> element: its <Prefix> text into *out. */
static int parse_prefix(xmlNodePtr n, char **out)
{
    *out = NULL;
    for (xmlNodePtr c = n->children; c; c = c->next) {
        if (is_elem(c, "Prefix")) {
            *out = node_text(c);
            return *out ? 0 : -ENOMEM;
        }
    }
    return -EINVAL;
}

struct list_state {
    struct s3_list_page *page;
    size_t obj_cap, pfx_cap;
    int url_encoded;
};

static int list_child(struct list_state *st, xmlNodePtr c)
{
    struct s3_list_page *page = st->page;
    int rc = 0;
    if (is_elem(c, "Contents")) {
        rc = grow((void **)&page->objects, page->nobjects, &st->obj_cap, sizeof *page->objects);
        if (rc == 0) {
            rc = parse_contents(c, &page->objects[page->nobjects]);
            if (rc == 0)
                page->nobjects++;
            else
                free(page->objects[page->nobjects].key);
        }
    } else if (is_elem(c, "CommonPrefixes")) {
        rc = grow((void **)&page->prefixes, page->nprefixes, &st->pfx_cap, sizeof(char *));
        if (rc == 0) {
            rc = parse_prefix(c, &page->prefixes[page->nprefixes]);
            if (rc == 0)
                page->nprefixes++;
        }
    } else if (is_elem(c, "IsTruncated")) {
        char *t = node_text(c);
        page->is_truncated = t && strcmp(t, "true") == 0;
        free(t);
    } else if (is_elem(c, "NextContinuationToken")) {
        free(page->next_token);
        page->next_token = node_text(c);
        rc = page->next_token ? 0 : -ENOMEM;
    } else if (is_elem(c, "EncodingType")) {
        char *t = node_text(c);
        st->url_encoded = t && strcmp(t, "url") == 0;
        free(t);
    }
    return rc;
}

static int decode_page(struct s3_list_page *page)
{
    for (size_t i = 0; i < page->nobjects; i++)
        if (url_decode_inplace(page->objects[i].key) < 0)
            return -EINVAL;
    for (size_t i = 0; i < page->nprefixes; i++)
        if (url_decode_inplace(page->prefixes[i]) < 0)
            return -EINVAL;
    return 0;
}

int s3_xml_parse_list(const char *body, size_t len, struct s3_list_page *page)
{
    memset(page, 0, sizeof *page);
    int rc;
    xmlNodePtr root;
    xmlDocPtr doc = read_root(body, len, "ListBucketResult", &root, &rc);
    if (!doc)
        return rc;
    struct list_state st = {.page = page};
    for (xmlNodePtr c = root->children; c && rc == 0; c = c->next)
        if (c->type == XML_ELEMENT_NODE)
            rc = list_child(&st, c);
    if (rc == 0 && st.url_encoded)
        rc = decode_page(page);
    if (rc == 0 && page->is_truncated && (!page->next_token || !*page->next_token))
        rc = -EINVAL; /* a truncated page must say where to continue */
    xmlFreeDoc(doc);
    if (rc < 0)
        s3_list_page_free(page);
    return rc;
}

/* ---- <Error> ------------------------------------------------------------ */

int s3_xml_parse_error(const char *body, size_t len, struct s3_error_body *err)
{
    memset(err, 0, sizeof *err);
    int rc;
    xmlNodePtr root;
    xmlDocPtr doc = read_root(body, len, "Error", &root, &rc);
    if (!doc)
        return rc;
    for (xmlNodePtr c = root->children; c; c = c->next) {
        if (is_elem(c, "Code"))
            node_text_to(c, err->code, sizeof err->code);
        else if (is_elem(c, "Message"))
            node_text_to(c, err->message, sizeof err->message);
        else if (is_elem(c, "RequestId"))
            node_text_to(c, err->request_id, sizeof err->request_id);
        else if (is_elem(c, "Region") || is_elem(c, "BucketRegion"))
            node_text_to(c, err->region, sizeof err->region);
    }
    xmlFreeDoc(doc);
    return 0;
}

/* ---- multipart uploads and copies --------------------------------------- */

/* Text of n into dst (cap bytes with the NUL): 0, -EOVERFLOW, -ENOMEM. */
static int node_text_fixed(xmlNodePtr n, char *dst, size_t cap)
{
    char *t = node_text(n);
    if (!t)
        return -ENOMEM;
    size_t l = strlen(t);
    int rc = l < cap ? 0 : -EOVERFLOW;
    if (rc == 0)
        memcpy(dst, t, l + 1);
    free(t);
    return rc;
}

int s3_xml_parse_initiate(const char *body, size_t len, char *upload_id, size_t cap)
{
    if (cap)
        upload_id[0] = '\0';
    int rc;
    xmlNodePtr root;
    xmlDocPtr doc = read_root(body, len, "InitiateMultipartUploadResult", &root, &rc);
    if (!doc)
        return rc;
    rc = -EINVAL;
    for (xmlNodePtr c = root->children; c; c = c->next)
        if (is_elem(c, "UploadId")) {
            rc = node_text_fixed(c, upload_id, cap);
            break;
        }
    if (rc == 0 && !upload_id[0])
        rc = -EINVAL;
    if (rc < 0 && cap)
        upload_id[0] = '\0';
    xmlFreeDoc(doc);
    return rc;
}

/* root is root_name, or its "...Response" variant for a "...Result"
 * (moto names the CompleteMultipartUpload answer so). */
static int is_result_root(xmlNodePtr root, const char *root_name)
{
    if (!root_name)
        return 0;
    if (is_elem(root, root_name))
        return 1;
    size_t n = strlen(root_name);
    if (n < 6 || strcmp(root_name + n - 6, "Result") != 0 || !root ||
        root->type != XML_ELEMENT_NODE)
        return 0;
    const char *name = (const char *)root->name;
    return strncmp(name, root_name, n - 6) == 0 && strcmp(name + n - 6, "Response") == 0;
}

int s3_xml_parse_etag(const char *body, size_t len, const char *root_name,
                      char etag[STORE_ETAG_MAX])
{
    etag[0] = '\0';
    int rc;
    xmlDocPtr doc = read_doc(body, len, &rc);
    if (!doc)
        return rc;
    xmlNodePtr root = xmlDocGetRootElement(doc);
    if (!is_result_root(root, root_name))
        rc = -EINVAL;
    for (xmlNodePtr c = rc == 0 ? root->children : NULL; c; c = c->next)
        if (is_elem(c, "ETag")) {
            rc = node_text_fixed(c, etag, STORE_ETAG_MAX);
            break;
        }
    if (rc < 0)
        etag[0] = '\0';
    xmlFreeDoc(doc);
    return rc;
}

void s3_upload_page_free(struct s3_upload_page *page)
{
    if (!page)
        return;
    for (size_t i = 0; i < page->nuploads; i++) {
        free(page->uploads[i].key);
        free(page->uploads[i].upload_id);
    }
    free(page->uploads);
    free(page->next_key_marker);
    free(page->next_upload_id_marker);
    memset(page, 0, sizeof *page);
}

/* One <Upload> element into u (both fields set, or -EINVAL). */
static int parse_upload(xmlNodePtr n, struct s3_upload *u)
{
    memset(u, 0, sizeof *u);
    for (xmlNodePtr c = n->children; c; c = c->next) {
        char **dst = is_elem(c, "Key") ? &u->key : is_elem(c, "UploadId") ? &u->upload_id : NULL;
        if (!dst || *dst)
            continue;
        *dst = node_text(c);
        if (!*dst)
            return -ENOMEM;
    }
    return u->key && u->upload_id && *u->upload_id ? 0 : -EINVAL;
}

/* Replace *dst with the text of n. */
static int take_text(xmlNodePtr n, char **dst)
{
    free(*dst);
    *dst = node_text(n);
    return *dst ? 0 : -ENOMEM;
}

static int uploads_child(struct s3_upload_page *page, size_t *cap, int *url_encoded, xmlNodePtr c)
{
    if (is_elem(c, "Upload")) {
        int rc = grow((void **)&page->uploads, page->nuploads, cap, sizeof *page->uploads);
        if (rc == 0) {
            struct s3_upload *u = &page->uploads[page->nuploads];
            rc = parse_upload(c, u);
            if (rc == 0) {
                page->nuploads++;
            } else {
                free(u->key);
                free(u->upload_id);
            }
        }
        return rc;
    }
    if (is_elem(c, "IsTruncated")) {
        char *t = node_text(c);
        page->is_truncated = t && strcmp(t, "true") == 0;
        free(t);
        return t ? 0 : -ENOMEM;
    }
    if (is_elem(c, "NextKeyMarker"))
        return take_text(c, &page->next_key_marker);
    if (is_elem(c, "NextUploadIdMarker"))
        return take_text(c, &page->next_upload_id_marker);
    if (is_elem(c, "EncodingType")) {
        char *t = node_text(c);
        *url_encoded = t && strcmp(t, "url") == 0;
        free(t);
        return t ? 0 : -ENOMEM;
    }
    return 0;
}

static int decode_uploads(struct s3_upload_page *page)
{
    for (size_t i = 0; i < page->nuploads; i++)
        if (url_decode_inplace(page->uploads[i].key) < 0)
            return -EINVAL;
    if (page->next_key_marker && url_decode_inplace(page->next_key_marker) < 0)
        return -EINVAL;
    return 0;
}

int s3_xml_parse_uploads(const char *body, size_t len, struct s3_upload_page *page)
{
    memset(page, 0, sizeof *page);
    int rc;
    xmlNodePtr root;
    xmlDocPtr doc = read_root(body, len, "ListMultipartUploadsResult", &root, &rc);
    if (!doc)
        return rc;
    size_t cap = 0;
    int url_encoded = 0;
    for (xmlNodePtr c = root->children; c && rc == 0; c = c->next)
        if (c->type == XML_ELEMENT_NODE)
            rc = uploads_child(page, &cap, &url_encoded, c);
    if (rc == 0 && url_encoded)
        rc = decode_uploads(page);
    if (rc == 0 && page->is_truncated && (!page->next_key_marker || !*page->next_key_marker))
        rc = -EINVAL; /* a truncated page must say where to continue */
    xmlFreeDoc(doc);
    if (rc < 0)
        s3_upload_page_free(page);
    return rc;
}

/* ---- CompleteMultipartUpload request body ------------------------------- */

static int cmp_part_ptr(const void *a, const void *b)
{
    const struct store_part *x = *(const struct store_part *const *)a;
    const struct store_part *y = *(const struct store_part *const *)b;
    return x->number < y->number ? -1 : x->number > y->number;
}

/* Append s to buf at *off, escaping the five XML specials. buf is big enough. */
static void put_escaped(char *buf, size_t *off, const char *s)
{
    for (; *s; s++) {
        const char *e = NULL;
        switch (*s) {
        case '&':
            e = "&amp;";
            break;
        case '<':
            e = "&lt;";
            break;
        case '>':
            e = "&gt;";
            break;
        case '"':
            e = "&quot;";
            break;
        case '\'':
            e = "&apos;";
            break;
        }
        if (e) {
            size_t l = strlen(e);
            memcpy(buf + *off, e, l);
            *off += l;
        } else {
            buf[(*off)++] = *s;
        }
    }
}

int s3_xml_build_complete(const struct store_part *parts, size_t n, char **out, size_t *len)
{
    static const char head[] = "<CompleteMultipartUpload "
                               "xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">";
    static const char tail[] = "</CompleteMultipartUpload>";
    *out = NULL;
    *len = 0;
    if (!parts || n == 0 || n > STORE_MAX_PARTS)
        return -EINVAL;
    const struct store_part **sorted = malloc(n * sizeof *sorted);
    if (!sorted)
        return -ENOMEM;
    /* worst case per part: the fixed tags, 5 digits, every ETag byte as "&quot;" */
    size_t cap = sizeof head + sizeof tail;
    for (size_t i = 0; i < n; i++) {
        sorted[i] = &parts[i];
        cap += 64 + 6 * strnlen(parts[i].etag, STORE_ETAG_MAX);
    }
    qsort(sorted, n, sizeof *sorted, cmp_part_ptr);
    for (size_t i = 0; i < n; i++) {
        const struct store_part *p = sorted[i];
        if (p->number < 1 || p->number > STORE_MAX_PARTS || !p->etag[0] ||
            strnlen(p->etag, STORE_ETAG_MAX) == STORE_ETAG_MAX ||
            (i > 0 && sorted[i - 1]->number == p->number)) {
            free(sorted);
            return -EINVAL;
        }
    }
    char *buf = malloc(cap);
    if (!buf) {
        free(sorted);
        return -ENOMEM;
    }
    size_t off = 0;
    memcpy(buf, head, sizeof head - 1);
    off += sizeof head - 1;
    for (size_t i = 0; i < n; i++) {
        off += (size_t)snprintf(buf + off, cap - off, "<Part><PartNumber>%u</PartNumber><ETag>",
                                (unsigned)sorted[i]->number);
        put_escaped(buf, &off, sorted[i]->etag);
        static const char end[] = "</ETag></Part>";
        memcpy(buf + off, end, sizeof end - 1);
        off += sizeof end - 1;
    }
    memcpy(buf + off, tail, sizeof tail);
    off += sizeof tail - 1;
    free(sorted);
    *out = buf;
    *len = off;
    return 0;
}
