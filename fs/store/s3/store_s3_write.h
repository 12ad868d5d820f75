/*
 * fs/store/s3/store_s3_write.h - private to the S3 store: the write calls of
 * store_s3_write.c that s3_ops in store_s3.c points at, and the pure helpers
 * of copy and multipart completion (exposed for tests). Not for other modules.
 */
#ifndef CKPTFS_STORE_S3_WRITE_H
#define CKPTFS_STORE_S3_WRITE_H

#include <stdint.h>

#include "store.h"
#include "store_s3_base.h"

#define S3_COPY_PART_SIZE (1ull << 30) /* UploadPartCopy part size above STORE_MAX_PART */

/* The store_ops write calls of the S3 store (see store.h for each contract). */
int s3_store_put(struct store *s, const char *path, int fd, uint64_t len,
                 char etag[STORE_ETAG_MAX]);
int s3_store_mpu_begin(struct store *s, const char *path, char upload_id[STORE_UPLOAD_ID_MAX]);
/* Attributes (store.h's put_attrs, mpu_begin_attrs, set_attrs, get_attrs). */
int s3_store_put_attrs(struct store *s, const char *path, int fd, uint64_t len,
                       const struct store_attrs *a, char etag[STORE_ETAG_MAX]);
int s3_store_mpu_begin_attrs(struct store *s, const char *path, const struct store_attrs *a,
                             char upload_id[STORE_UPLOAD_ID_MAX]);
int s3_store_set_attrs(struct store *s, const char *path, int is_dir, const char *etag,
                       uint64_t size, const struct store_attrs *a, char etag_out[STORE_ETAG_MAX]);
int s3_store_get_attrs(struct store *s, const char *path, int is_dir, struct store_attrs *a,
                       char etag[STORE_ETAG_MAX]);
int s3_store_mpu_part(struct store *s, const char *path, const char *upload_id,
                      struct store_part *part, int fd);
int s3_store_mpu_complete(struct store *s, const char *path, const char *upload_id,
                          const struct store_part *parts, size_t n, uint64_t size,
                          char etag[STORE_ETAG_MAX]);
int s3_store_mpu_abort(struct store *s, const char *path, const char *upload_id);
int s3_store_mpu_list(struct store *s, const char *path, store_upload_fn fn, void *arg);
int s3_store_copy(struct store *s, const char *from, const char *etag, uint64_t size,
                  const char *to, char etag_out[STORE_ETAG_MAX]);
int s3_store_remove(struct store *s, const char *path);
int s3_store_rmdir(struct store *s, const char *path);
/* An empty "dir/" marker object: the directory exists for every mount. */
int s3_store_mkdir(struct store *s, const char *path);

/* Server-side copy of key from_key (size bytes, version etag if non-empty,
 * else the version a HEAD finds) to to_key as a multipart upload of
 * UploadPartCopy parts of part_size bytes (the last one shorter), completed
 * in order, aborted on failure. copy() uses it above STORE_MAX_PART with
 * s3_copy_part_size(size). 0 or a negative errno (-ESTALE: the source changed). */
int s3_store_copy_multipart(struct s3_store *s, const char *from_key, const char *etag,
                            uint64_t size, const char *to_key, uint64_t part_size,
                            char etag_out[STORE_ETAG_MAX]);

/* Pure: the ETag S3 gives the object that parts make, "\"hex-N\"" (the MD5
 * of the parts' binary MD5s, then the part count), into etag. 0, or -EINVAL
 * when n is 0 or above STORE_MAX_PARTS or a part's ETag is not a plain MD5
 * (32 hex digits, quotes optional), -ENOMEM. */
int s3_multipart_etag(const struct store_part *parts, size_t n, char etag[STORE_ETAG_MAX]);

/* Pure: the UploadPartCopy part size for a size-byte object: S3_COPY_PART_SIZE,
 * or larger (whole MiB) so the copy needs at most STORE_MAX_PARTS parts; 0 if
 * even STORE_MAX_PART parts cannot do it. */
uint64_t s3_copy_part_size(uint64_t size);

#endif
