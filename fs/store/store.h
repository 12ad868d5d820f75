/*
 * fs/store/store.h - the store interface.
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
 *
 * Writing: an object appears on a store only complete. Small objects are
 * written with put(); large ones with a multipart upload (mpu_*): parts are
 * sent in any order and in parallel, and the object appears at
 * mpu_complete(). The local-directory store implements the same calls with
 * a temporary file in the target directory that is renamed into place, so
 * both backends give the same semantics. Data to write always comes from a
 * file descriptor (the staging file) and an offset in it.
 */
#ifndef CKPTFS_STORE_H
#define CKPTFS_STORE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define STORE_ETAG_MAX 80
#define STORE_UPLOAD_ID_MAX 1024    /* S3 upload ids are opaque; AWS's are ~130 bytes */
#define STORE_MAX_PARTS 10000       /* S3: part numbers 1..10000 */
#define STORE_MIN_PART (5ull << 20) /* S3: every part but the last is at least 5 MiB */
#define STORE_MAX_PART (5ull << 30) /* S3: largest part, PUT or CopyObject: 5 GiB */

/* ---- attributes: modes, owners, times (issue #18; docs/semantics.md,
 * "Modes, owners and times"). ----
 *
 * An object's or directory's attributes as the store keeps them: on S3 the
 * s3fs convention of user metadata (x-amz-meta-mode: decimal st_mode with
 * the file type bits, so a later symlink can be an object with S_IFLNK;
 * x-amz-meta-uid, -gid: decimal; x-amz-meta-mtime: seconds since the epoch,
 * with ".NNNNNNNNN" nanoseconds when they are not 0); on the local store the
 * files' own. `set` says which fields hold a value: an attribute not set
 * shows the mount's default (0644/0755 files/directories, the mounting
 * user, the store's time). STORE_ATTR_READ: the answer came from a request
 * that carries attributes (a HEAD, a local stat), so unset ones are truly
 * absent, not merely unknown (a listing carries none). */
#define STORE_ATTR_MODE 1u
#define STORE_ATTR_UID 2u
#define STORE_ATTR_GID 4u
#define STORE_ATTR_MTIME 8u
#define STORE_ATTR_READ 16u
struct store_attrs {
    uint32_t set;  /* STORE_ATTR_* bits */
    uint32_t mode; /* st_mode, type bits included */
    uint32_t uid, gid;
    int64_t mtime_ns; /* nanoseconds since the epoch */
};

/* The S3 metadata header names (without "x-amz-meta-"), and their values. */
#define STORE_ATTR_HDR_MAX 4 /* headers store_attrs_headers writes at most */
#define STORE_ATTR_VALUE_MAX 32

/* The x-amz-meta-* headers for a's set fields: names[i] (static strings,
 * full header names) and values[i] (written into vals). Returns the count. */
int store_attrs_headers(const struct store_attrs *a, const char *names[STORE_ATTR_HDR_MAX],
                        char vals[STORE_ATTR_HDR_MAX][STORE_ATTR_VALUE_MAX]);

/* One response header (name of nlen bytes, any case; value of vlen bytes,
 * trimmed): if it is one of the attribute headers with a well-formed value,
 * fill that field of a and set its bit; 1 then, else 0. */
int store_attrs_parse_header(struct store_attrs *a, const char *name, size_t nlen,
                             const char *value, size_t vlen);

/* ---- symbolic links (issue #18; docs/semantics.md, "Symbolic links";
 * symlink.c) ----
 *
 * A link is an object whose body is its target and whose attributes' mode
 * has S_IFLNK (s3fs's convention; on the local store, a real link). */
#define STORE_LINK_MAX 4095 /* the longest target (PATH_MAX - 1) */

/* 1 if a's mode says a symbolic link. */
int store_attrs_is_link(const struct store_attrs *a);

/* 1 if an object named name (a path or a last component) of size bytes may
 * be a link, whose lookup must then learn its attributes (a HEAD on S3: a
 * listing has none): 1..STORE_LINK_MAX bytes and not a file of which a
 * load looks up many (*.distcp, *.metadata, *.safetensors,
 * *.safetensors.index.json). */
int store_may_be_link(const char *name, uint64_t size);

/* Where target, the target of a link at store path link, lies on the store:
 * out gets the store path ("" = anything: an absolute target, or one that
 * climbs above the root), "." and ".." resolved lexically. 0, or -1 if it
 * does not fit in len bytes. */
int store_link_wait_path(const char *link, const char *target, char *out, size_t len);

struct store_stat {
    uint64_t size;             /* object size in bytes (0 for directories) */
    int64_t mtime_ns;          /* nanoseconds since the epoch, 0 if unknown (see below) */
    int is_dir;                /* 1 for a directory (a common prefix on S3) */
    char etag[STORE_ETAG_MAX]; /* opaque version tag, "" if the backend has none */
    struct store_attrs attrs;  /* what the answer said of modes, owners, times */
};

/* A directory's time on a store of keys (S3), where a prefix has none of its
 * own: the newest mtime_ns among the first STORE_DIR_TIME_KEYS keys below it in
 * key order, its own "dir/" marker included (all of them, for a directory of
 * no more keys; docs/design.md, "Directory times"). stat() of such a
 * directory gives it; list() cannot (a common prefix carries no time) and
 * reports 0, which the core fills in by the same rule from list_below(). */
#define STORE_DIR_TIME_KEYS 1000

/* Called once per entry of a listing. name is one path component, valid only
 * during the call. Return 0 to continue, non-zero to stop the listing early
 * (list() then returns 0). */
typedef int (*store_list_fn)(void *arg, const char *name, const struct store_stat *st);

/* A file by name (relative to some directory) and its size on the store. */
struct store_file_size {
    const char *name;
    uint64_t size;
};

/* Bytes buf[0, ready) of a read in flight are final (read_progressive). */
typedef void (*store_progress_fn)(void *arg, size_t ready);

/* Counters every backend keeps, read for the mount's statistics. */
struct store_counters {
    atomic_uint_fast64_t get_requests;  /* ranged GETs / preads issued */
    atomic_uint_fast64_t get_bytes;     /* body bytes received by reads */
    atomic_uint_fast64_t head_requests; /* stat calls that reached the backend */
    atomic_uint_fast64_t list_requests; /* list pages fetched */
    atomic_uint_fast64_t listed_keys;   /* keys (and common prefixes) those pages held */
    atomic_uint_fast64_t retries;       /* requests retried after a transient error */
    atomic_uint_fast64_t errors;        /* requests that failed for good */
    /* Writes (one count per request sent, retries included, like the above). */
    atomic_uint_fast64_t put_requests;         /* single-request object writes */
    atomic_uint_fast64_t put_bytes;            /* body bytes of puts and parts that succeeded */
    atomic_uint_fast64_t mpu_begin_requests;   /* CreateMultipartUpload */
    atomic_uint_fast64_t part_requests;        /* UploadPart */
    atomic_uint_fast64_t complete_requests;    /* CompleteMultipartUpload */
    atomic_uint_fast64_t abort_requests;       /* AbortMultipartUpload */
    atomic_uint_fast64_t upload_list_requests; /* ListMultipartUploads pages */
    atomic_uint_fast64_t copy_requests;        /* CopyObject / UploadPartCopy */
    atomic_uint_fast64_t delete_requests;      /* DeleteObject */
};

/* One part of a multipart upload, as the upload engine tracks it and as
 * mpu_complete() lists it. Parts are numbered 1..STORE_MAX_PARTS and lie at
 * offset..offset+length of the object (and of the staging file). */
struct store_part {
    uint32_t number;
    uint64_t offset, length;
    char etag[STORE_ETAG_MAX]; /* set by mpu_part() */
};

/* Called once per multipart upload in progress found by mpu_list(). */
typedef int (*store_upload_fn)(void *arg, const char *upload_id);

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

    /* Optional: every object at any depth below directory dir, named by its
     * path relative to dir ("sub/file"; a directory marker "sub/", dir's own
     * marker ""), in key order; fn returning non-zero stops it (then 0 is
     * returned). An empty
     * or missing dir gives no entries. Lookups list directories with it where
     * list() cannot be trusted to report a directory that holds only
     * directories (s3rver 3.7.1 omits such common prefixes). */
    int (*list_below)(struct store *s, const char *dir, store_list_fn fn, void *arg);

    /* Optional (NULL: use list()): like list(), but only the entries whose
     * names sort after `after` (byte order); -ENOENT is not reported (an
     * empty answer). The commit check lists only what it has not seen. */
    int (*list_after)(struct store *s, const char *dir, const char *after, store_list_fn fn,
                      void *arg);

    /* Read up to len bytes of path at offset off into buf; *nread is set to
     * the count read (short only at end of object). If etag is non-NULL and
     * non-empty and the object no longer has that etag, fails with -ESTALE
     * (the object changed under an open file). */
    int (*read)(struct store *s, const char *path, const char *etag, uint64_t off, size_t len,
                void *buf, size_t *nread);

    /* Optional (NULL: reads complete at once): read, calling
     * progress(arg, ready) from the calling thread whenever more of buf is
     * final: buf[0, ready) holds bytes of the asked range of etag's version,
     * never written again. ready only grows; a failed read may have made
     * some bytes final. */
    int (*read_progressive)(struct store *s, const char *path, const char *etag, uint64_t off,
                            size_t len, void *buf, size_t *nread, store_progress_fn progress,
                            void *arg);

    /* Optional (NULL if the backend has no file descriptors): an fd open
     * for reading the object at path, if it still has etag (else -ESTALE),
     * so the kernel can copy its bytes straight to the reader (splice)
     * without passing through the cache. The caller closes it. */
    int (*open_fd)(struct store *s, const char *path, const char *etag);

    /* ---- writing ---- */

    /* Write the object at path from the first len bytes of fd (read with
     * pread; fd's file offset is not used) in one request, replacing any
     * object there. The object appears whole or not at all. etag gets the
     * new object's version tag (what stat() will report). */
    int (*put)(struct store *s, const char *path, int fd, uint64_t len, char etag[STORE_ETAG_MAX]);

    /* Start a multipart upload of path; upload_id gets its id (at most
     * STORE_UPLOAD_ID_MAX bytes with the NUL). Nothing is visible at path
     * until mpu_complete(). 0; 1 (upload_id set too) when the request was
     * sent again, so a lost answer may have begun another upload nobody
     * holds; or -errno. */
    int (*mpu_begin)(struct store *s, const char *path, char upload_id[STORE_UPLOAD_ID_MAX]);

    /* Upload part->length bytes of fd at part->offset as part number
     * part->number (sending it again replaces it); sets part->etag. */
    int (*mpu_part)(struct store *s, const char *path, const char *upload_id,
                    struct store_part *part, int fd);

    /* Make the object: parts[0..n) in ascending number order, contiguous from
     * offset 0, together size bytes. Replaces any object at path. etag gets
     * the new object's version tag. A completion whose answer was lost and
     * that is retried is recognised (the object is there with this size):
     * success, not an error. */
    int (*mpu_complete)(struct store *s, const char *path, const char *upload_id,
                        const struct store_part *parts, size_t n, uint64_t size,
                        char etag[STORE_ETAG_MAX]);

    /* Abandon an upload and free its parts. An upload that no longer exists
     * is not an error. */
    int (*mpu_abort)(struct store *s, const char *path, const char *upload_id);

    /* Every multipart upload in progress for exactly path (for cleaning up
     * after a crash): fn once per upload id; non-zero from fn stops. */
    int (*mpu_list)(struct store *s, const char *path, store_upload_fn fn, void *arg);

    /* Server-side copy of the object at from (size bytes; if etag is non-NULL
     * and non-empty, only that version: else -ESTALE) to to, replacing any
     * object there; the copy appears whole or not at all. etag_out gets the
     * new object's version tag. */
    int (*copy)(struct store *s, const char *from, const char *etag, uint64_t size, const char *to,
                char etag_out[STORE_ETAG_MAX]);

    /* Remove the object at path. -ENOENT if there is none. */
    int (*remove)(struct store *s, const char *path);

    /* Optional (NULL where directories exist only as key prefixes, as on
     * S3): create / remove an (empty) directory. */
    int (*mkdir)(struct store *s, const char *path);
    int (*rmdir)(struct store *s, const char *path);

    /* Optional (NULL if the store cannot): rename the object or directory at
     * from to to atomically, replacing an object at to. Without it the
     * core renames an object as copy() then remove(). */
    int (*rename)(struct store *s, const char *from, const char *to);

    /* Optional (NULL: any name): 0 if an object may be created at path, or
     * -ENAMETOOLONG / -EINVAL for a name the store cannot hold, so creates
     * and renames fail at once instead of every upload later. */
    int (*check_name)(struct store *s, const char *path);

    /* ---- attributes (issue #18; see struct store_attrs) ---- */

    /* Optional (NULL: put() and mpu_begin() without attributes, then
     * set_attrs() once the object is there): put() / mpu_begin() storing a's
     * set attributes with the new object (a may be NULL: none). */
    int (*put_attrs)(struct store *s, const char *path, int fd, uint64_t len,
                     const struct store_attrs *a, char etag[STORE_ETAG_MAX]);
    int (*mpu_begin_attrs)(struct store *s, const char *path, const struct store_attrs *a,
                           char upload_id[STORE_UPLOAD_ID_MAX]);

    /* Optional (NULL: attributes are not kept): give the object (size bytes,
     * version etag if non-empty, else -ESTALE) or directory at path the
     * attributes a (its set fields replace all earlier ones) without
     * sending its bytes again: S3 copies the object onto itself with
     * x-amz-metadata-directive: REPLACE (a multipart copy past 5 GiB), and
     * a directory's "dir/" marker is written; the local store calls chmod,
     * chown, utimensat. etag_out gets the new version's tag (may be ""). */
    int (*set_attrs)(struct store *s, const char *path, int is_dir, const char *etag, uint64_t size,
                     const struct store_attrs *a, char etag_out[STORE_ETAG_MAX]);

    /* Optional (NULL: stat() already reports them): the attributes of the
     * object or directory (is_dir) at path in *a, with STORE_ATTR_READ:
     * one HEAD on S3 (of the "dir/" marker for a directory; none there: no
     * attributes). etag gets the object's version tag. */
    int (*get_attrs)(struct store *s, const char *path, int is_dir, struct store_attrs *a,
                     char etag[STORE_ETAG_MAX]);

    /* Optional (NULL: a link's target is its object's bytes, read()): the
     * target of the link at path into buf (len bytes at most, no NUL);
     * the count, -EINVAL if path is no link. The local store's links are
     * real ones. */
    int (*readlink)(struct store *s, const char *path, char *buf, size_t len);

    /* The longest name of one path component (statfs's f_namemax); 0: 1024. */
    unsigned name_max;

    /* Release everything the store holds. */
    void (*destroy)(struct store *s);
};

/* The common head of every backend's state; backends embed it first. */
struct store {
    const struct store_ops *ops;
    struct store_counters counters;
    char *description;   /* for logs, e.g. "s3://bucket/prefix"; never holds secrets */
    uint64_t max_object; /* the largest object the store holds; 0: no limit of its own */
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
    int request_timeout_ms;   /* no progress for this long fails a request, 0 = default (10000) */
    int max_retries;          /* 0 = default (5); -1 = no retries */
    int unsigned_payload;     /* S3: send UNSIGNED-PAYLOAD instead of the body's SHA-256 */
};

/* Open the store named by url: "s3://bucket[/prefix]" or a local directory
 * path (optionally "file://..."). On failure returns a negative errno and
 * writes a one-line, user-facing reason to err. */
int store_open(const char *url, const struct store_options *opt, struct store **out, char *err,
               size_t errlen);

/* The version fingerprint of an object, "etag=ETAG size=SIZE": what the
 * persistent index keeps to tell whether a .metadata changed. The mount
 * (ckindex) and ckptfs-admin both compute it here, so either reuses an
 * index the other built. */
void store_fingerprint(const struct store_stat *st, char *buf, size_t len);

/* 1 if the ETags a and b name one version: compared without their quotes
 * and a weak "W/" marker (a listing's, a HEAD's and a copy's answers may
 * write one tag differently). */
int store_etag_equal(const char *a, const char *b);

struct stat;
/* The local-directory store's attributes (and etag) of a file or directory
 * with stat(2) result sb: what its stat() reports. */
void store_dir_stat_of(const struct stat *sb, struct store_stat *st);

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
