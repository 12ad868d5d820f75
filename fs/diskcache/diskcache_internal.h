/*
 * fs/diskcache/diskcache_internal.h - what diskcache.c (the catalogue, the data
 * files, the bounds, the list of files held for reads in place) shares with
 * dcfile.c (opening and checking a file held for reads in place). Included
 * only inside fs/diskcache. Calls go one way: dcfile.c uses these, defined in
 * diskcache.c; diskcache.c calls nothing of dcfile.c.
 */
#ifndef CKPTFS_DISKCACHE_INTERNAL_H
#define CKPTFS_DISKCACHE_INTERNAL_H

#include "diskcache.h"

#include <lmdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

struct diskcache {
    char *dir;
    int lock_fd;
    MDB_env *env;
    MDB_dbi objs, chunks, lru;
    struct diskcache_config cfg;
    pthread_mutex_t lock; /* write transactions, stats, held_bytes, objects */
    pthread_t owner;      /* who holds lock (valid while held): for assertions */
    struct diskcache_stats st;
    atomic_uint_fast64_t checked_chunks; /* st.checked_chunks, counted without the lock */
    int put_failure_logged;
    atomic_int no_direct; /* O_DIRECT writes refused here: buffered ones (write_data) */
    /* Versions looked up for reads in place (diskcache_file_open), in use or
     * idle (kept, with what was checked, for the next open of the version):
     * most recently released first. Protected by files_lock, taken after lock. */
    pthread_mutex_t files_lock;
    struct diskcache_file *files;
    unsigned idle_files;
};

/* An object's record: this head, then its path and etag (no terminators). */
struct obj_head {
    uint64_t size, held, last_use;
    uint32_t path_len, etag_len;
};

struct chunk_rec {
    uint32_t crc, len;
};

/* One version looked up for reads in place (diskcache_file_open). */
struct diskcache_file {
    struct diskcache *dc;
    uint64_t id;
    char *path, *etag; /* the plain version */
    uint64_t size;
    int fd;
    uint32_t nchunks;
    struct chunk_rec *recs; /* len 0: not held */
    _Atomic unsigned char *state;
    pthread_mutex_t lock; /* with checked: waits for a chunk CHECKING */
    pthread_cond_t checked;
    _Atomic uint64_t last_use; /* of its catalogue record, as far as known (touch) */
    struct timespec mtime;     /* the data file\'s when its chunks were checked (lock) */
    void *map; /* the data file mapped, for mincore only (no cachestat); MAP_FAILED */
    uint64_t map_len;
    unsigned refs;               /* opens not closed (dc->files_lock) */
    int listed;                  /* on dc->files (dc->files_lock) */
    struct diskcache_file *next; /* on dc->files */
};

/* A hit moves its object in the lru order at most this often (a write). */
#define TOUCH_EVERY_NS 100000000ull

/* Take dc->lock, noting the caller as its owner (for assertions). */
void dc_cache_lock(struct diskcache *dc);
/* Release dc->lock, which the caller holds. */
void dc_cache_unlock(struct diskcache *dc);
/* v with its ETag in one spelling (no W/, no quotes) kept in buf[n]. */
struct diskcache_version dc_plain_version(const struct diskcache_version *v, char *buf, size_t n);
/* The catalogue id of version v (a hash of path, etag and size). */
uint64_t dc_version_id(const struct diskcache_version *v);
/* Now, in wall-clock nanoseconds (the lru's last-use times). */
uint64_t dc_now_ns(void);
/* The path of id's data file, in out[n]. */
void dc_data_path(const struct diskcache *dc, uint64_t id, char *out, size_t n);
/* An LMDB return code as 0 or -errno. */
int dc_mdb_errno(int rc);
/* The record of id in txn: 0 and *h if it is version v, -ENOENT, -EEXIST (another version). */
int dc_obj_get(struct diskcache *dc, MDB_txn *txn, uint64_t id, const struct diskcache_version *v,
               struct obj_head *h);
/* The catalogue key of chunk index of id. */
void dc_chunk_key(unsigned char key[12], uint64_t id, uint32_t index);
/* Note a hit's use in the lru order, at most every TOUCH_EVERY_NS per object. */
void dc_touch(struct diskcache *dc, const struct diskcache_version *v, uint64_t id,
              uint64_t last_use);
/* Drop one chunk whose bytes failed their checksum (takes dc->lock). */
void dc_drop_chunk(struct diskcache *dc, const struct diskcache_version *v, uint64_t id,
                   uint32_t index);
/* Free f and all it holds: closed and not listed. */
void dc_free_file(struct diskcache_file *f);
/* The listed copy of version v (id), with one more reference, or NULL. */
struct diskcache_file *dc_find_file(struct diskcache *dc, uint64_t id,
                                    const struct diskcache_version *v);
/* Put f, just opened (one reference), on dc->files, most recently used. */
void dc_list_file(struct diskcache *dc, struct diskcache_file *f);

#endif
