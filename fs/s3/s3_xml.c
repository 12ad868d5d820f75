/*
 * fs/s3/s3_xml.c - S3 XML responses (ListObjectsV2 pages, <Error> bodies)
 * parsed with libxml2.
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
    if (*p == '.') {
        p++;
        if (*p < '0' || *p > '9')
            return -1;
        while (*p >= '0' && *p <= '9')
            p++;
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
    return (int64_t)t - offset;
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
            int64_t m = s3_parse_iso8601(t);
            obj->mtime = m < 0 ? 0 : m;
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
    xmlDocPtr doc = read_doc(body, len, &rc);
    if (!doc)
        return rc;
    xmlNodePtr root = xmlDocGetRootElement(doc);
    if (!is_elem(root, "ListBucketResult"))
        rc = -EINVAL;
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
    xmlDocPtr doc = read_doc(body, len, &rc);
    if (!doc)
        return rc;
    xmlNodePtr root = xmlDocGetRootElement(doc);
    if (!is_elem(root, "Error")) {
        xmlFreeDoc(doc);
        return -EINVAL;
    }
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
