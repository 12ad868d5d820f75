/*
 * fs/store.h - the store interface.
 *
 * A store is where checkpoint bytes live: a local directory or an S3 bucket
 * prefix. Every backend fills in one table of functions (struct store_ops);
 * the filesystem core, the cache/readahead, and later the uploader and the
 * index builder talk to stores only through it, so each runs unchanged on
 * any backend (and on a fault-injecting one in tests).
 *
 * Paths are relative to the store root, '/'-separated, with no leading or
 * trailing slash; "" is the root directory. All functions are thread-safe,
 * may block, and return 0 or a negative errno.
 */
#ifndef CKPTFS_STORE_H
#define CKPTFS_STORE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define STORE_ETAG_MAX 80

struct store_stat {
    uint64_t size;             /* object size in bytes (0 for directories) */
    int64_t mtime;             /* seconds since the epoch, 0 if unknown */
    int is_dir;                /* 1 for a directory (a common prefix on S3) */
    char etag[STORE_ETAG_MAX]; /* opaque version tag, "" if the backend has none */
};

/* Called once per entry of a listing. name is one path component, valid only
 * during the call. Return 0 to continue, non-zero to stop the listing early
 * (list() then returns 0). */
typedef int (*store_list_fn)(void *arg, const char *name, const struct store_stat *st);

/* Counters every backend keeps, read for the mount's statistics. */
struct store_counters {
    atomic_uint_fast64_t get_requests;  /* ranged GETs / preads issued */
    atomic_uint_fast64_t get_bytes;     /* body bytes received by reads */
    atomic_uint_fast64_t head_requests; /* stat calls that reached the backend */
    atomic_uint_fast64_t list_requests; /* list pages fetched */
    atomic_uint_fast64_t retries;       /* requests retried after a transient error */
    atomic_uint_fast64_t errors;        /* requests that failed for good */
};

struct store;

struct store_ops {
    const char *scheme; /* "dir", "s3" */

    /* Attributes of the object or directory at path. An S3 key that is only
     * a prefix of other keys is a directory. -ENOENT if neither exists. */
    int (*stat)(struct store *s, const char *path, struct store_stat *st);

    /* The entries directly below directory dir ("" = root), each once, in
     * no particular order. -ENOENT if dir does not exist, -ENOTDIR if it is
     * an object. */
    int (*list)(struct store *s, const char *dir, store_list_fn fn, void *arg);

    /* Read up to len bytes of path at offset off into buf; *nread is set to
     * the count read (short only at end of object). If etag is non-NULL and
     * non-empty and the object no longer has that etag, fails with -ESTALE
     * (the object changed under an open file). */
    int (*read)(struct store *s, const char *path, const char *etag, uint64_t off, size_t len,
                void *buf, size_t *nread);

    /* Optional (NULL if the backend has no file descriptors): an fd open
     * for reading the object at path, if it still has etag (else -ESTALE),
     * so the kernel can copy its bytes straight to the reader (splice)
     * without passing through the cache. The caller closes it. */
    int (*open_fd)(struct store *s, const char *path, const char *etag);

    /* Release everything the store holds. */
    void (*destroy)(struct store *s);
};

/* The common head of every backend's state; backends embed it first. */
struct store {
    const struct store_ops *ops;
    struct store_counters counters;
    char *description; /* for logs, e.g. "s3://bucket/prefix"; never holds secrets */
};

/* Options for opening a store; unset fields take defaults from the
 * environment (AWS_* variables, ~/.aws files) or built-in values. */
struct store_options {
    const char *endpoint_url; /* --endpoint-url */
    const char *region;       /* --region */
    const char *profile;      /* --profile */
    int force_path_style;     /* --force-path-style */
    int max_connections;      /* parallel requests in flight, 0 = default (16) */
    int connect_timeout_ms;   /* 0 = default (5000) */
    int request_timeout_ms;   /* no progress for this long fails a request, 0 = default (30000) */
    int max_retries;          /* 0 = default (5); -1 = no retries */
};

/* Open the store named by url: "s3://bucket[/prefix]" or a local directory
 * path (optionally "file://..."). On failure returns a negative errno and
 * writes a one-line, user-facing reason to err. */
int store_open(const char *url, const struct store_options *opt, struct store **out, char *err,
               size_t errlen);

/* Backends (called by store_open). */
int store_dir_open(const char *root, struct store **out, char *err, size_t errlen);
int store_s3_open(const char *bucket, const char *prefix, const struct store_options *opt,
                  struct store **out, char *err, size_t errlen);

static inline void store_destroy(struct store *s)
{
    if (s)
        s->ops->destroy(s);
}

#endif
