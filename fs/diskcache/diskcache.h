/*
 * fs/diskcache/diskcache.h - the persistent local cache of object versions
 * (issue #22): bytes this node wrote or read, kept on local disk across
 * unmounts, remounts and kill -9, and served only for the exact version
 * (path, ETag, size) they are of.
 *
 * Layout under DIR (the mount's --cache-dir/disk-cache):
 *   lock         flock(2)ed by the one process using the cache (its pid inside)
 *   catalog/     LMDB: objects (id -> path, etag, size, bytes held, last use),
 *                chunks (id + index -> crc32c, length), lru (last use + id)
 *   data/ID      one sparse file per object version, its bytes at their offsets
 *
 * Objects are cut into DISKCACHE_CHUNK-byte chunks. A chunk is in the catalogue
 * only after its bytes are written, so a crash leaves unlisted bytes, never a
 * listed chunk without its bytes; every read of a chunk checks its crc32c, and
 * a mismatch drops the chunk (the caller fetches it again). The cache holds at
 * most its capacity (plus the chunk being written) and keeps floor_percent of
 * its file system free: least recently used objects go first. A full or
 * failing disk makes puts fail (counted, logged once), never a read.
 */
#ifndef CKPTFS_DISKCACHE_H
#define CKPTFS_DISKCACHE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define DISKCACHE_CHUNK (1u << 20)

/* A diskcache_put whose buffer and length are multiples of this is written
 * with O_DIRECT where the file system allows (write_data in diskcache.c). */
#define DISKCACHE_DIRECT_ALIGN 4096u

struct diskcache;

/* One version of one store object: what a cached byte belongs to. */
struct diskcache_version {
    const char *path; /* store path, e.g. "run/step_1/__0_0.distcp" */
    const char *etag; /* the store's ETag of this version */
    uint64_t size;    /* its size */
};

struct diskcache_config {
    uint64_t capacity;      /* bytes of cached data at most */
    unsigned floor_percent; /* keep this much of the file system free (e.g. 5) */
};

struct diskcache_stats {
    uint64_t hits, hit_bytes;     /* reads served whole from the cache */
    uint64_t misses;              /* reads that found a chunk missing */
    uint64_t stored_chunks;       /* chunks written by diskcache_put */
    uint64_t stored_bytes;        /* their bytes */
    uint64_t adopted_files;       /* files taken whole (diskcache_adopt) */
    uint64_t adopted_bytes;       /* their bytes */
    uint64_t evictions;           /* objects dropped to stay within the bounds */
    uint64_t evicted_bytes;       /* bytes they held */
    uint64_t checksum_failures;   /* chunks whose bytes did not match their crc32c */
    uint64_t checked_chunks;      /* chunks whose crc32c was checked (good or not) */
    uint64_t put_failures;        /* chunks or files not kept (disk full, I/O error) */
    uint64_t held_bytes, objects; /* what the cache holds now */
};

/* Open (creating) the cache in dir, taking its lock: 0, -EBUSY (another
 * process has it; err names its pid) or -errno, with err set. */
int diskcache_open(const char *dir, const struct diskcache_config *cfg, struct diskcache **out,
                   char *err, size_t errlen);

/* Release the lock and everything held in memory (the cache stays on disk). */
void diskcache_close(struct diskcache *dc);

/* Copy [off, off + len) of version v into buf if every chunk it touches is
 * held and passes its checksum: 1 if so, 0 if not (a chunk missing or bad;
 * a bad one is dropped; buf may then hold any bytes), -errno on an error of
 * the catalogue: diskcache_read_held when all or nothing will do. */
int diskcache_read(struct diskcache *dc, const struct diskcache_version *v, uint64_t off,
                   size_t len, void *buf);

/* Copy into buf what dc holds of [off, off + len) of version v, chunk by
 * chunk, each checked (a bad one is dropped), with one catalogue look-up and
 * one open: [*lo, *hi) of buf is left for the caller to fetch (from the first
 * chunk missing to the end of the last one; lo == hi: all of it was held).
 * 1 if all was, 0 if not, -errno on an error of the catalogue (lo 0, hi len).
 * Counts one hit (all held) or one miss. */
int diskcache_read_held(struct diskcache *dc, const struct diskcache_version *v, uint64_t off,
                        size_t len, void *buf, size_t *lo, size_t *hi);

/* Keep bytes of version v: off must be a multiple of DISKCACHE_CHUNK and len
 * whole chunks (the last chunk of the object may be short). 0, -ENOSPC
 * (the bounds leave no room), -EEXIST (another version's identity collides),
 * or -errno of the disk; the cache is unchanged for a chunk that failed.
 * Written past the page cache when buf and len are DISKCACHE_DIRECT_ALIGN-
 * aligned. */
int diskcache_put(struct diskcache *dc, const struct diskcache_version *v, uint64_t off,
                  const void *buf, size_t len);

/* diskcache_put of the bytes of pieces[0 .. npieces) laid end to end (past
 * the page cache when every piece is aligned). */
int diskcache_put_pieces(struct diskcache *dc, const struct diskcache_version *v, uint64_t off,
                         const struct iovec *pieces, int npieces);

/* Take the whole file at src (a staged copy of version v that is no longer
 * needed) as the cached copy of v: renamed into the cache when on the same
 * file system, else copied; its chunks' checksums computed from it. 0 (src
 * is gone) or -errno (src is left as it was). */
int diskcache_adopt(struct diskcache *dc, const struct diskcache_version *v, const char *src);

/* One version's held chunks, looked up once for many reads that take their
 * bytes straight from its data file (the kernel splices them to the reader):
 * see diskcache_file_open. */
struct diskcache_file;

/* Look up what dc holds of version v (one read transaction: its chunk map)
 * and open its data file: 1 and *out, 0 if no chunk of v is held, -errno.
 * Notes v's use in the lru order. *out must be closed before dc. */
int diskcache_file_open(struct diskcache *dc, const struct diskcache_version *v,
                        struct diskcache_file **out);

/* Whether every chunk holding a byte of [off, off + len) of f (clamped to the
 * version's size) is held and its bytes pass their checksum, checked here
 * once per chunk per f by reading them (which leaves them in the page cache;
 * a chunk another thread is checking is waited for, not read twice): 1 if so (the bytes may be read
 * from diskcache_file_fd), 0 if not (a chunk not held; or failing its checksum, which is then
 * dropped, from f and from the catalogue, so the caller fetches it again). Safe from several
 * threads. */
int diskcache_file_verify(struct diskcache_file *f, uint64_t off, size_t len);

/* Whether every chunk holding a byte of [off, off + len) of f is held and
 * has not failed its checksum (not checked here): 1 or 0. */
int diskcache_file_holds(struct diskcache_file *f, uint64_t off, size_t len);

/* Whether some chunk holding a byte of [off, off + len) of f is held and not
 * checked yet (nor being checked): 1 or 0. A checked chunk whose pages left
 * the page cache counts once diskcache_file_recheck_evicted marked it so. */
int diskcache_file_unchecked(struct diskcache_file *f, uint64_t off, size_t len);

/* Mark the checked chunks holding a byte of [off, off + len) of f whose
 * pages left the page cache as unchecked, all before any of them is read
 * again: a check reading one chunk pulls the next ones in by readahead,
 * which must not pass them off as checked and resident. */
void diskcache_file_recheck_evicted(struct diskcache_file *f, uint64_t off, size_t len);

/* The data file, read-only: its bytes at their offsets in the version. */
int diskcache_file_fd(const struct diskcache_file *f);

/* Close the data file and free f. */
void diskcache_file_close(struct diskcache_file *f);

/* Drop every chunk of version v: 0, or -errno of the catalogue. */
int diskcache_drop(struct diskcache *dc, const struct diskcache_version *v);

/* A snapshot of the counters. */
void diskcache_get_stats(struct diskcache *dc, struct diskcache_stats *out);

#endif
