/*
 * fs/store/s3/s3_xml.h - S3 XML with libxml2: parse ListObjectsV2 pages, <Error>
 * bodies, the multipart upload results (Initiate, Complete, ListMultipartUploads),
 * CopyObject/CopyPart results; build the CompleteMultipartUpload request body.
 *
 * Input is bounded (S3_XML_MAX_BYTES); documents with a DTD are rejected;
 * entities are never expanded and nothing is fetched from the network.
 * Leading whitespace is skipped (S3 may send spaces to keep a slow
 * CompleteMultipartUpload or copy alive before the document).
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
    int64_t mtime_ns;          /* LastModified, nanoseconds since the epoch (0 if absent) */
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

/* One <Upload> of a ListMultipartUploads result. */
struct s3_upload {
    char *key;
    char *upload_id;
};

struct s3_upload_page {
    struct s3_upload *uploads;
    size_t nuploads;
    int is_truncated;            /* <IsTruncated>true */
    char *next_key_marker;       /* <NextKeyMarker>, NULL if none */
    char *next_upload_id_marker; /* <NextUploadIdMarker>, NULL if none */
};

/* Parse an InitiateMultipartUploadResult: its UploadId into upload_id (cap
 * bytes with the NUL). 0, or -EINVAL (malformed, other root, no or empty
 * UploadId), -EOVERFLOW (UploadId does not fit), -EFBIG, -ENOMEM. */
int s3_xml_parse_initiate(const char *body, size_t len, char *upload_id, size_t cap);

/* Parse a document whose root element is root ("CompleteMultipartUploadResult",
 * "CopyObjectResult", "CopyPartResult"; "...Response" for "...Result" too, as
 * moto sends) for its <ETag> (as sent, quotes included; "" if absent). 0, or -EINVAL (malformed,
 * other root), -EOVERFLOW (ETag longer than STORE_ETAG_MAX - 1), -EFBIG, -ENOMEM. */
int s3_xml_parse_etag(const char *body, size_t len, const char *root, char etag[STORE_ETAG_MAX]);

/* Parse a ListMultipartUploadsResult into *page (free with s3_upload_page_free).
 * 0, or -EINVAL (malformed, other root, an Upload without Key or UploadId, a
 * truncated page without NextKeyMarker), -EFBIG, -ENOMEM; on failure *page
 * is empty. EncodingType url is decoded. */
int s3_xml_parse_uploads(const char *body, size_t len, struct s3_upload_page *page);
void s3_upload_page_free(struct s3_upload_page *page);

/* The CompleteMultipartUpload request body for parts[0..n): one <Part> per
 * part with PartNumber and the XML-escaped ETag, in ascending part number
 * order (whatever order parts has). *out is malloc'ed, *len its length.
 * 0, or -EINVAL (n == 0 or > STORE_MAX_PARTS, a number outside 1..10000, a
 * number twice, an empty ETag), -ENOMEM. */
int s3_xml_build_complete(const struct store_part *parts, size_t n, char **out, size_t *len);

/* "2009-10-12T17:50:30.000Z" (fraction and zone optional; Z or +hh:mm)
 * -> seconds since the epoch; -1 if malformed. */
int64_t s3_parse_iso8601(const char *s);

/* The same in nanoseconds since the epoch, with the fraction of a second
 * kept (S3 writes milliseconds); -1 if malformed or before 1970. */
int64_t s3_parse_iso8601_ns(const char *s);

#endif
