/*
 * fs/read/cache.h - the bounded in-memory block cache between readers and a store.
 *
 * Objects (one version of one store file: path + etag + size) are cut into
 * fixed-size blocks. A block is fetched once, by whoever needs it first,
 * and every concurrent reader of the same bytes waits for that one fetch
 * instead of issuing its own. Readers fetch what they miss in their own
 * thread (one ranged GET per contiguous run of missing blocks); readahead
 * and, later, the index-guided prefetcher ask for exact byte ranges with
 * cache_prefetch(), which splits them into requests of request_size and
 * hands them to the worker pool, so several GETs are in flight at once.
 * Memory is bounded by capacity: ready blocks are evicted least recently
 * used first; blocks being copied or fetched are pinned. Fetch buffers go
 * back to the pool (and may be unmapped) only with the cache lock dropped.
 * Background prefetch is skipped rather than overcommit, or than evict blocks fetched
 * in the background that nobody has read yet (under pressure it fetches
 * less, not more); demand reads may exceed the bound briefly.
 * With a disk cache (cache_set_disk), a fetch copies what it holds of the
 * object's version and asks the store only for the rest; then every disk
 * chunk it touched whose blocks are all in memory (also one it cut at an
 * edge, once the fetch next to it landed) is lent, pinned, to the disk
 * cache's background writer.
 */
#ifndef CKPTFS_CACHE_H
#define CKPTFS_CACHE_H

#include "store.h"
#include "workq.h"

#include <stdint.h>
#include <sys/types.h>

struct cache;
struct cache_obj;
struct diskcache;
struct diskfill;

struct cache_config {
    uint64_t capacity;     /* bytes held at most: block data, and the fetch buffers it keeps */
    uint32_t block_size;   /* bytes per block (power of two), e.g. 1 MiB */
    uint32_t request_size; /* background GET size, a multiple of block_size (+1/8 to end a range) */
    uint64_t working_set;  /* above it, read blocks are recycled first; 0: capacity / 4 */
};

/* A fetch that timed out (-ETIMEDOUT) is remembered this long: reads and
 * prefetches of its blocks fail at once with the same error instead of
 * sending another request. The kernel retries every failed readahead with
 * a synchronous read of its first page straight away; without this, a
 * stopped server would cost each read() two full timeouts. */
#define CACHE_TIMEOUT_LINGER_MS 1000

struct cache_stats {
    uint64_t hits;                  /* blocks served from memory */
    uint64_t misses;                /* blocks a reader had to fetch itself */
    uint64_t shared;                /* blocks a reader waited for another's fetch of */
    uint64_t taken_over;            /* queued background fetches a waiting reader ran itself */
    uint64_t prefetched;            /* blocks fetched in the background */
    uint64_t prefetch_skipped;      /* background blocks skipped: cache full of pinned data */
    uint64_t prefetched_bytes;      /* bytes of background fetches that succeeded */
    uint64_t prefetch_unused_bytes; /* of those, dropped before any reader touched them */
    uint64_t prefetch_unread_bytes; /* of those, held now and not read yet */
    uint64_t evictions;             /* blocks dropped to stay within capacity */
    uint64_t evicted_unread;        /* of those, prefetched blocks still awaiting their reader */
    uint64_t recycled;              /* read blocks dropped to reuse their memory (working set) */
    uint64_t ahead_deferred;        /* cache_prefetch_ahead() ranges left to their readers */
    uint64_t released;              /* blocks dropped behind a sequential reader */
    uint64_t fetch_errors;          /* fetches that failed */
    uint64_t failed_fast;           /* reads failed at once by a recent timeout */
    uint64_t bytes_cached;          /* current block bytes held */
    uint64_t buffer_bytes;          /* bytes of the fetch buffers those blocks keep alive */
    uint64_t capacity;
    uint64_t buffers_mapped; /* fetch buffers mapped fresh (bufpool.h) */
    uint64_t buffers_reused; /* fetch buffers taken from the pool again */
};

int cache_create(struct store *store, struct workq *wq, const struct cache_config *cfg,
                 struct cache **out);

/* Fetches read what dc holds of the object's version (path, etag, size as
 * opened) instead of asking the store, and lend the chunks they complete
 * from the store to fill (issue #22). dc and fill may be NULL (none); dc
 * must outlive c, and fill be destroyed before c. Call before the first read. */
void cache_set_disk(struct cache *c, struct diskcache *dc, struct diskfill *fill);

/* Whether the disk cache (cache_set_disk) holds every byte of [off, off+len)
 * of o's version (clamped to its size), checked against its checksums: 1 and
 * *fd, the disk cache's data file of the version (bytes at their offsets in
 * the object; valid while o is), to serve the range from in place (spliced,
 * no copy through the blocks); 0 if not (cache_read fetches it: a chunk that
 * failed its checksum was dropped and comes from the store). The version's
 * chunk map is looked up once per object, each chunk checked once. */
int cache_disk_fd(struct cache *c, struct cache_obj *o, uint64_t off, size_t len, int *fd);

/* Whether the disk cache holds every chunk of [off, off+len) of o's version
 * (not checked yet, nor known bad): cache_disk_fd will likely serve it. */
int cache_disk_holds(struct cache *c, struct cache_obj *o, uint64_t off, size_t len);

/* Make queued background fetches fail at once instead of doing I/O (used
 * at unmount, so a dead server cannot hold it up). */
void cache_cancel(struct cache *c);

/* Drops every block. All objects must have been released, the work queue
 * drained (workq_destroy) and the disk cache's writer stopped
 * (diskfill_destroy: it gives back the blocks lent to it) before. */
void cache_destroy(struct cache *c);

/* The object for (path, etag, size), shared by every open of that version.
 * *was_cached (may be NULL) is set to 1 when it was already known, i.e.
 * earlier data of this very version may still be cached (the kernel's page
 * cache can be kept). Returns NULL only when out of memory. */
struct cache_obj *cache_obj_get(struct cache *c, const char *path, const char *etag, uint64_t size,
                                int *was_cached);
void cache_obj_put(struct cache *c, struct cache_obj *o);

/* A reference to the object for (path, etag, size) for background fetches
 * only: it is not an open, and a later cache_obj_get() of a version known
 * only this way reports *was_cached = 0 (the kernel never cached it through
 * us). *opened is set to 1 if some handle has opened this version before.
 * Drop it with cache_obj_unref(). NULL only when out of memory. */
struct cache_obj *cache_obj_ref(struct cache *c, const char *path, const char *etag, uint64_t size,
                                int *opened);
void cache_obj_unref(struct cache *c, struct cache_obj *o);
uint64_t cache_obj_size(const struct cache_obj *o);
const char *cache_obj_path(const struct cache_obj *o);
/* The version (etag) o was opened at. */
const char *cache_obj_etag(const struct cache_obj *o);

/* Copy [off, off+len) of o (clamped to its size) into dst. Returns the bytes
 * copied or a negative errno from the store (-EIO, -ESTALE, ...). */
ssize_t cache_read(struct cache *c, struct cache_obj *o, uint64_t off, size_t len, void *dst);

/* Blocks wholly inside [from, to) of o are dropped now (unless another
 * open handle shares o, or they are in use), so that a sequential reader's
 * memory is reused for the blocks ahead instead of growing to the cache size
 * (every new buffer costs a page fault per 4 KiB). The kernel's page cache
 * keeps what was read for re-reads. A long range is walked a few dozen
 * blocks per hold of the cache lock; the caller's open must stay meanwhile. */
void cache_release_behind(struct cache *c, struct cache_obj *o, uint64_t from, uint64_t to);

/* Schedule background fetches of [off, off+len) of o (clamped). Blocks
 * already cached or in flight are skipped. Never waits for I/O. Returns
 * the number of bytes newly scheduled. */
uint64_t cache_prefetch(struct cache *c, struct cache_obj *o, uint64_t off, uint64_t len);

/* cache_prefetch() of a range no reader is in yet (the items after the one
 * being read, other ranks' chunks): scheduled whole only while the bytes
 * fetched in the background and not read yet stay below the working set (a
 * quarter of the capacity), else nothing (the reader fetches it when it gets
 * there). Bounds how far prefetch runs ahead of all readers, so that buffers
 * are reused instead of faulted in fresh. */
uint64_t cache_prefetch_ahead(struct cache *c, struct cache_obj *o, uint64_t off, uint64_t len);

/* cache_prefetch() in requests of at most request bytes (rounded to blocks,
 * at most request_size; the last request of the range may be up to 1/8
 * longer rather than leave a short tail GET): a range that one reader waits
 * for is fetched by several GETs in parallel. */
uint64_t cache_prefetch_split(struct cache *c, struct cache_obj *o, uint64_t off, uint64_t len,
                              uint32_t request);

/* 1 if every block holding a byte of [from, to) of o is cached or being
 * fetched (from < to), 0 otherwise: bytes the kernel may have in its page
 * cache, so a reader's next read can skip them. */
int cache_has(struct cache *c, struct cache_obj *o, uint64_t from, uint64_t to);

void cache_get_stats(struct cache *c, struct cache_stats *out);

/* Whether the calling thread holds c's lock: for the cache's own asserts,
 * and for tests that check what is done outside it. */
int cache_lock_held(struct cache *c);

#endif
