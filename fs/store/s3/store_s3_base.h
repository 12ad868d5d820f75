/*
 * fs/store/s3/store_s3_base.h - private to the S3 store: its state (struct
 * s3_store) and what both halves of the store use, below both: the key and
 * ListObjectsV2 prefix of a store path, the ETag comparison, and HEAD.
 * store_s3.c (open, stat, list, read) and store_s3_write.c (put, multipart
 * uploads, copy, remove, mkdir, rmdir) call down into store_s3_base.c, never
 * into each other except through the store_ops table. Not for other modules.
 */
#ifndef CKPTFS_STORE_S3_BASE_H
#define CKPTFS_STORE_S3_BASE_H

#include "s3_client.h"
#include "store.h"

struct s3_store {
    struct store base;
    struct s3_client *client;     /* NULL until configured */
    struct creds_provider *creds; /* NULL: anonymous; outlives client */
    char *bucket;
    char *prefix; /* "" or "a/b" */
    char *region;
    int max_connections, connect_timeout_ms, request_timeout_ms, max_retries;
    int unsigned_payload; /* store_options.unsigned_payload */
};

/* The key of a store path: "PREFIX/path", "path", or PREFIX for the root
 * (malloc'ed; NULL when out of memory). */
char *s3_store_key(const struct s3_store *s, const char *path);

/* The ListObjectsV2 prefix for the directory at path: "" or "KEY/" (malloc'ed). */
char *s3_store_dir_prefix(const struct s3_store *s, const char *path);

/* HEAD key: size, mtime and etag into *st. 0, -ENOENT on 404, else a
 * negative errno (logged). */
int s3_store_head(struct s3_store *s, const char *key, struct store_stat *st);

#endif
