/*
 * fs/s3/s3_xml.h - parse S3 XML responses with libxml2: ListObjectsV2 result
 * pages and <Error> bodies.
 *
 * Input is bounded (S3_XML_MAX_BYTES); documents with a DTD are rejected;
 * entities are never expanded and nothing is fetched from the network.
 */
#ifndef CKPTFS_S3_XML_H
#define CKPTFS_S3_XML_H

#include <stddef.h>
#include <stdint.h>

#include "store.h"

#define S3_XML_MAX_BYTES (16u << 20) /* a 1000-key page is ~1-2 MB at most */

struct s3_object {
    char *key;
    uint64_t size;
    int64_t mtime;             /* LastModified, seconds since the epoch (0 if absent) */
    char etag[STORE_ETAG_MAX]; /* as sent, quotes included; "" if absent or too long */
};

struct s3_list_page {
    struct s3_object *objects; /* <Contents> */
    size_t nobjects;
    char **prefixes; /* <CommonPrefixes><Prefix> */
    size_t nprefixes;
    int is_truncated; /* <IsTruncated>true */
    char *next_token; /* <NextContinuationToken>, NULL if none */
};

struct s3_error_body {
    char code[64];
    char message[256];
    char request_id[128];
    char region[64]; /* <Region> or <BucketRegion> on redirects, if present */
};

/* Parse a ListObjectsV2 response. 0, or -EINVAL (malformed, not a
 * ListBucketResult, has a DTD), -EFBIG (too large), -ENOMEM. If the result
 * says <EncodingType>url</EncodingType>, keys and prefixes are decoded.
 * On failure *page is left empty. */
int s3_xml_parse_list(const char *body, size_t len, struct s3_list_page *page);
void s3_list_page_free(struct s3_list_page *page);

/* Parse an <Error> body. 0, or -EINVAL / -EFBIG; on failure the fields are "". */
int s3_xml_parse_error(const char *body, size_t len, struct s3_error_body *err);

/* "2009-10-12T17:50:30.000Z" (fraction and zone optional; Z or +hh:mm)
 * -> seconds since the epoch; -1 if malformed. */
int64_t s3_parse_iso8601(const char *s);

#endif
