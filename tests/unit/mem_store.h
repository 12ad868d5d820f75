/*
 * tests/unit/mem_store.h - an in-memory store for unit tests.
 *
 * Behaves like S3 through struct store_ops: objects are keys, directories
 * only key prefixes (a "dir/" marker object makes an empty one and is hidden
 * from listings); stat, list, read (etag checked: -ESTALE), put, multipart
 * uploads with real semantics (parts kept per upload id, replaced when sent
 * again, assembled by complete, dropped by abort, found by mpu_list), copy,
 * remove (-EISDIR for a prefix), mkdir (an empty "dir/" marker, as the S3
 * store writes) and rmdir (deletes the "dir/" marker of a directory with
 * nothing else under it, else -ENOTEMPTY; -ENOENT without a marker); rename
 * and open_fd are NULL, as on S3. Etags are
 * content hashes (the same bytes written again give the same etag, as S3's
 * MD5s do). Requests are counted in the store's counters like the S3 backend
 * counts them. Thread-safe (one mutex).
 *
 * For tests: put and inspect objects without counting, make calls of an op
 * fail (before taking effect, or after it as if the answer was lost), delay
 * them, and watch every call with a hook run at its start.
 */
#ifndef CKPTFS_TEST_MEM_STORE_H
#define CKPTFS_TEST_MEM_STORE_H

#include "store.h"

#include <stddef.h>
#include <stdint.h>

enum mem_op {
    MEM_OP_STAT,
    MEM_OP_LIST,
    MEM_OP_READ,
    MEM_OP_PUT,
    MEM_OP_MPU_BEGIN,
    MEM_OP_MPU_PART,
    MEM_OP_MPU_COMPLETE,
    MEM_OP_MPU_ABORT,
    MEM_OP_MPU_LIST,
    MEM_OP_COPY,
    MEM_OP_REMOVE,
    MEM_OP_RMDIR,
    MEM_OP_MKDIR,
    MEM_OP_COUNT,
    MEM_OP_ALL = MEM_OP_COUNT /* for mem_store_fail / mem_store_delay: every op */
};

/* One call, as the hook sees it (pointers valid during the hook only). */
struct mem_call {
    enum mem_op op;
    const char *path;      /* the op's path; copy: the source */
    const char *to;        /* copy: the destination; else NULL */
    const char *upload_id; /* mpu_part, mpu_complete, mpu_abort; else NULL */
    uint64_t off, len;     /* read: the range; put: 0, len; mpu_part: the part's
                              offset, length; mpu_complete, copy: 0, size */
    uint32_t part;         /* mpu_part: the part number; mpu_complete: the part count */
};

/* Called at the start of every call through store_ops (before the delay and
 * any injected failure), without the store's lock held: it may call the
 * helpers below (e.g. mem_store_get to check what is already there). */
typedef void (*mem_store_hook_fn)(void *arg, const struct mem_call *call);

struct mem_store;

/* An empty store (multipart parts must be >= STORE_MIN_PART but the last,
 * as on S3; see mem_store_set_min_part). Never NULL (aborts on ENOMEM). */
struct mem_store *mem_store_new(void);
/* The store to hand to the code under test (store_destroy() on it is
 * mem_store_free()). */
struct store *mem_store_base(struct mem_store *m);
/* Frees the store, its objects and uploads. NULL is a no-op. */
void mem_store_free(struct mem_store *m);

/* Puts len bytes of data at key path directly (no counters, hook, delay or
 * faults); a path ending in '/' makes a directory marker. etag (may be NULL)
 * gets the new object's etag. Returns 0 or -ENOMEM. */
int mem_store_set(struct mem_store *m, const char *path, const void *data, size_t len, char *etag);
/* Lists and times directories as the S3 store does: list_below (every key
 * below, in key order, dir's own marker as ""; one counted LIST page per
 * 1000 keys), and stat of a prefix gives the newest mtime of its first
 * STORE_DIR_TIME_KEYS keys (store.h). Call before handing the store out. */
void mem_store_s3_listings(struct mem_store *m);
/* Sets the mtime of the object at path: 0 or -ENOENT. */
int mem_store_set_mtime(struct mem_store *m, const char *path, int64_t mtime_ns);
/* A malloc'd copy of the object at path (caller frees; one spare byte, so an
 * empty object is not NULL) and *len its size; NULL if there is none. */
void *mem_store_get(struct mem_store *m, const char *path, size_t *len);
/* Number of objects (markers included), directly. */
size_t mem_store_objects(struct mem_store *m);
/* Multipart uploads begun and neither completed nor aborted. */
size_t mem_store_uploads_in_progress(struct mem_store *m);
/* Calls of op made through store_ops so far (failed ones included). */
uint64_t mem_store_calls(struct mem_store *m, enum mem_op op);

/* The next `times` calls of op (times < 0: every call; 0: none, clears)
 * fail with err (a negative errno) before taking any effect. */
void mem_store_fail(struct mem_store *m, enum mem_op op, int err, int times);
/* Like mem_store_fail, but each failing call first takes effect (the object
 * is written, the upload completed...) and then returns err: an answer lost
 * on the way back. */
void mem_store_lose_answer(struct mem_store *m, enum mem_op op, int err, int times);
/* Every call of op sleeps usec microseconds first (without the lock). */
void mem_store_delay(struct mem_store *m, enum mem_op op, unsigned usec);
/* Progressive reads (read_progressive) hand out their bytes chunk bytes
 * at a time, usec apart (chunk 0: all at once); with err (negative errno)
 * the read fails once fail_at bytes were handed out. */
void mem_store_stream(struct mem_store *m, size_t chunk, unsigned usec, size_t fail_at, int err);
/* Sets (or with NULL clears) the hook run at the start of every call. */
void mem_store_set_hook(struct mem_store *m, mem_store_hook_fn fn, void *arg);
/* Smallest part but the last that mpu_complete accepts (default
 * STORE_MIN_PART, as S3; 0 to accept any), else -EINVAL (EntityTooSmall). */
void mem_store_set_min_part(struct mem_store *m, uint64_t bytes);

#endif
