/*
 * fs/read/cache.c - block cache with shared fetches, LRU eviction and background
 * prefetch (see cache.h for the contract).
 *
 * Data structures, all protected by cache->lock:
 *  - objects: chained hash by (path, etag); an object lives while open
 *    handles or cached blocks reference it.
 *  - blocks: chained hash by (object id, block index). A block is FETCHING
 *    (in the table, no data yet), READY (data valid, on the LRU list) or
 *    FAILED (out of the table; freed by its last waiter).
 *  - one fetch fills one contiguous buffer (struct cbuf) shared by the
 *    blocks of that run; when its last block goes, it leaves buffer_bytes
 *    and is queued on cache->dead, and goes back to the buffer pool
 *    (bufpool.h, which may unmap it) once the lock is dropped.
 *  - recent timeouts: a small ring of block runs whose fetch timed out
 *    lately; reads of them fail at once until the entry lapses or the
 *    object answers again (CACHE_TIMEOUT_LINGER_MS in cache.h).
 * Waiters pin a block (pins > 0) and sleep on the condition variable its
 * (object, index) hashes to, broadcast when a block with waiters leaves
 * FETCHING (one of WAIT_CONDS: a published block wakes few threads).
 * Pinned blocks are never evicted. I/O and copies happen with the lock
 * dropped, and so does giving buffers back: cache_unlock() takes the dead
 * list, drops the lock, then releases them (so the list is empty whenever
 * the lock is free). cache_lock()/cache_unlock()/cache_wait() record the
 * holding thread, for the lock-ownership asserts (cache_lock_held()).
 */
#include "cache.h"

#include "bufpool.h"
#include "clock.h"
#include "diskcache.h"
#include "diskfill.h"
#include "log.h"
#include "strutil.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define WAIT_CONDS 64    /* condition variables waiters are spread over */
#define TIMEOUT_SLOTS 16 /* timed-out runs remembered at once */

struct recent_timeout {
    uint64_t obj_id;     /* 0: free slot */
    uint64_t first, end; /* blocks [first, end) */
    int64_t until_ms;    /* monotonic; lapses then */
};

enum block_state { BLOCK_FETCHING, BLOCK_READY, BLOCK_FAILED };

struct cbuf {
    unsigned refs;  /* blocks still pointing into data; protected by cache->lock */
    unsigned spare; /* make_room_locked's count of its evictable blocks; 0 outside it */
    size_t len;
    char *data;        /* from cache->pool */
    struct cbuf *next; /* on cache->dead, once refs is 0 */
};

struct cblock {
    struct cblock *hnext;               /* hash chain */
    struct cblock *lru_prev, *lru_next; /* LRU list, READY blocks only */
    struct cache_obj *obj;
    uint64_t idx;
    enum block_state state;
    int err;                  /* FAILED: the negative errno */
    int in_table;             /* still reachable through the hash */
    unsigned pins;            /* readers copying from or waiting on this block */
    int prefetched;           /* fetched in the background ... */
    int used;                 /* ... and a reader has touched it since */
    int64_t ready_ms;         /* monotonic ms it became READY */
    struct fetch_job *queued; /* FETCHING: its background job, until that starts */
    struct cbuf *buf;
    char *data;
    uint32_t len;
};

struct cache_obj {
    struct cache_obj *hnext;
    uint64_t id;
    char *path;
    char etag[STORE_ETAG_MAX];
    uint64_t size;
    unsigned refs;   /* open handles + blocks + fetch jobs + background references */
    unsigned opens;  /* open handles alone */
    uint64_t blocks; /* its blocks in the table (FETCHING or READY) */
    int opened;      /* some handle has opened this version (not only prefetched) */
    /* The disk cache's copy of this version for reads in place (cache_disk_fd):
     * looked up once, by the first read that asks (disk_state). */
    enum { DISK_UNKNOWN, DISK_LOOKING, DISK_KNOWN } disk_state;
    struct diskcache_file *disk_file; /* DISK_KNOWN: NULL if none */
};

struct cache {
    struct store *store;
    struct workq *wq;
    struct cache_config cfg;
    pthread_mutex_t lock;
    pthread_cond_t conds[WAIT_CONDS]; /* waiters of FETCHING blocks, by block hash */
    struct cblock **blocks;
    size_t nbuckets; /* power of two */
    struct cache_obj **objs;
    size_t nobj_buckets;
    uint64_t next_obj_id;
    struct cblock lru; /* sentinel: lru.lru_next is most recent */
    struct cache_stats st;
    struct bufpool *pool; /* fetch buffers */
    /* Bytes of the fetch buffers alive: a block keeps its whole buffer, so
     * this, not bytes_cached, is the memory the blocks hold. */
    atomic_uint_fast64_t buffer_bytes;
    atomic_int stopping;    /* set by cache_cancel: background fetches fail fast */
    atomic_uintptr_t owner; /* thread_mark of the thread holding lock, 0 if none */
    /* Buffers whose last block went, to give back to the pool once the lock
     * is dropped (protected by lock): the pool may unmap them, and unmapping
     * megabytes must not stall every reader. */
    struct cbuf *dead;
    /* Memory a load works in (a quarter of the capacity): above it, a fetch
     * reuses the buffers of blocks already read rather than mapping fresh
     * ones, and read-ahead (cache_prefetch_ahead) waits for readers. */
    uint64_t working_set;
    uint64_t ahead_inflight; /* bytes of background fetches not READY yet (lock) */
    struct recent_timeout timeouts[TIMEOUT_SLOTS];
    unsigned next_timeout;  /* ring cursor into timeouts */
    struct diskcache *disk; /* fetches try it first (NULL: none); see cache_set_disk */
    atomic_uint_fast64_t checks_inflight; /* bytes of disk_check_ahead jobs not done */
    struct diskfill *fill;                /* what a fetch got from the store is kept through it */
};

struct fetch_job {
    struct cache *c;
    struct cache_obj *obj;
    uint64_t first; /* first block index */
    uint32_t n;     /* blocks in the run */
};

/* ---- the lock ---- */

/* An address unique to the calling thread: what cache->owner holds while
 * the thread holds the lock (for lock-ownership asserts). */
static _Thread_local char thread_mark;

static void cbufs_release(struct cache *c, struct cbuf *dead);

static void cache_lock(struct cache *c)
{
    pthread_mutex_lock(&c->lock);
    assert(atomic_load_explicit(&c->owner, memory_order_relaxed) == 0);
    assert(!c->dead); /* emptied by every unlock */
    atomic_store_explicit(&c->owner, (uintptr_t)&thread_mark, memory_order_relaxed);
}

int cache_lock_held(struct cache *c)
{
    return atomic_load_explicit(&c->owner, memory_order_relaxed) == (uintptr_t)&thread_mark;
}

/* Drop the lock, then give back the buffers freed while it was held. */
static void cache_unlock(struct cache *c)
{
    assert(cache_lock_held(c));
    struct cbuf *dead = c->dead;
    c->dead = NULL;
    atomic_store_explicit(&c->owner, 0, memory_order_relaxed);
    pthread_mutex_unlock(&c->lock);
    if (dead)
        cbufs_release(c, dead);
}

/* Sleep on cv, the lock dropped meanwhile (lock held). */
static void cache_wait(struct cache *c, pthread_cond_t *cv)
{
    assert(cache_lock_held(c));
    assert(!c->dead); /* nothing freed yet that the wait would leave queued */
    atomic_store_explicit(&c->owner, 0, memory_order_relaxed);
    pthread_cond_wait(cv, &c->lock);
    assert(atomic_load_explicit(&c->owner, memory_order_relaxed) == 0);
    atomic_store_explicit(&c->owner, (uintptr_t)&thread_mark, memory_order_relaxed);
}

/* ---- hashing ---- */

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static uint64_t hash_str(const char *s)
{
    return str_hash(s, strlen(s));
}

static size_t block_bucket(const struct cache *c, uint64_t obj_id, uint64_t idx)
{
    return mix64(obj_id * 0x9e3779b97f4a7c15ULL + idx) & (c->nbuckets - 1);
}

/* The condition variable waiters of block b sleep on. */
static pthread_cond_t *block_cond(struct cache *c, const struct cblock *b)
{
    return &c->conds[mix64(b->obj->id * 31 + b->idx) % WAIT_CONDS];
}

/* b left FETCHING (lock held): wake its waiters, if any. */
static void block_wake_locked(struct cache *c, const struct cblock *b)
{
    if (b->pins)
        pthread_cond_broadcast(block_cond(c, b));
}

static struct cblock *block_find(struct cache *c, struct cache_obj *o, uint64_t idx)
{
    for (struct cblock *b = c->blocks[block_bucket(c, o->id, idx)]; b; b = b->hnext)
        if (b->obj == o && b->idx == idx)
            return b;
    return NULL;
}

static void block_unhash(struct cache *c, struct cblock *b)
{
    assert(cache_lock_held(c));
    struct cblock **pp = &c->blocks[block_bucket(c, b->obj->id, b->idx)];
    while (*pp != b)
        pp = &(*pp)->hnext;
    *pp = b->hnext;
    b->in_table = 0;
    assert(b->obj->blocks > 0);
    b->obj->blocks--;
}

/* ---- LRU ---- */

static void lru_unlink(struct cblock *b)
{
    b->lru_prev->lru_next = b->lru_next;
    b->lru_next->lru_prev = b->lru_prev;
    b->lru_prev = b->lru_next = NULL;
}

static void lru_push_front(struct cache *c, struct cblock *b)
{
    b->lru_next = c->lru.lru_next;
    b->lru_prev = &c->lru;
    c->lru.lru_next->lru_prev = b;
    c->lru.lru_next = b;
}

static void lru_touch(struct cache *c, struct cblock *b)
{
    lru_unlink(b);
    lru_push_front(c, b);
}

/* ---- objects ---- */

static void obj_unref_locked(struct cache *c, struct cache_obj *o)
{
    assert(cache_lock_held(c));
    if (--o->refs > 0)
        return;
    struct cache_obj **pp = &c->objs[hash_str(o->path) & (c->nobj_buckets - 1)];
    while (*pp != o)
        pp = &(*pp)->hnext;
    *pp = o->hnext;
    assert(o->disk_state != DISK_LOOKING); /* the looking reader holds a reference */
    diskcache_file_close(o->disk_file);    /* a close(2) and frees: cheap under the lock */
    free(o->path);
    free(o);
}

/* The object for (path, etag, size), found or made, with one more
 * reference (and open, if open). *was_cached: an open of it came before. */
static struct cache_obj *obj_get(struct cache *c, const char *path, const char *etag, uint64_t size,
                                 int open, int *was_cached)
{
    size_t bucket = hash_str(path) & (c->nobj_buckets - 1);
    *was_cached = 0;
    cache_lock(c);
    struct cache_obj *o = c->objs[bucket];
    while (o && (strcmp(o->path, path) != 0 || strcmp(o->etag, etag) != 0 || o->size != size))
        o = o->hnext;
    if (!o) {
        o = calloc(1, sizeof *o);
        if (!o || !(o->path = strdup(path))) {
            free(o);
            cache_unlock(c);
            return NULL;
        }
        o->id = ++c->next_obj_id;
        snprintf(o->etag, sizeof o->etag, "%s", etag);
        o->size = size;
        o->hnext = c->objs[bucket];
        c->objs[bucket] = o;
    }
    o->refs++;
    *was_cached = o->opened;
    if (open) {
        o->opened = 1;
        o->opens++;
    }
    cache_unlock(c);
    return o;
}

struct cache_obj *cache_obj_get(struct cache *c, const char *path, const char *etag, uint64_t size,
                                int *was_cached)
{
    int known;
    struct cache_obj *o = obj_get(c, path, etag, size, 1, &known);
    if (was_cached)
        *was_cached = known;
    return o;
}

struct cache_obj *cache_obj_ref(struct cache *c, const char *path, const char *etag, uint64_t size,
                                int *opened)
{
    return obj_get(c, path, etag, size, 0, opened);
}

void cache_obj_unref(struct cache *c, struct cache_obj *o)
{
    cache_lock(c);
    assert(o->refs > o->opens);
    obj_unref_locked(c, o);
    cache_unlock(c);
}

void cache_obj_put(struct cache *c, struct cache_obj *o)
{
    if (!o)
        return;
    cache_lock(c);
    assert(o->opens > 0 && o->refs >= o->opens);
    o->opens--;
    obj_unref_locked(c, o);
    cache_unlock(c);
}

uint64_t cache_obj_size(const struct cache_obj *o)
{
    return o->size;
}

const char *cache_obj_path(const struct cache_obj *o)
{
    return o->path;
}

const char *cache_obj_etag(const struct cache_obj *o)
{
    return o->etag;
}

/* ---- blocks ---- */

static struct cbuf *cbuf_new(struct cache *c, size_t len)
{
    struct cbuf *buf = malloc(sizeof *buf);
    if (!buf)
        return NULL;
    buf->refs = 1; /* the fetch's; blocks add theirs as they are published */
    buf->spare = 0;
    buf->len = len;
    buf->data = bufpool_get(c->pool, len);
    if (!buf->data) {
        free(buf);
        return NULL;
    }
    atomic_fetch_add(&c->buffer_bytes, len);
    return buf;
}

/* Drop a reference to buf (lock held). The last one takes its bytes out of
 * buffer_bytes at once (make_room_locked reads it) and queues buf on
 * c->dead: cache_unlock gives it back to the pool after the lock is dropped. */
static void cbuf_unref_locked(struct cache *c, struct cbuf *buf)
{
    assert(cache_lock_held(c));
    assert(buf->refs > 0);
    if (--buf->refs > 0)
        return;
    assert(atomic_load(&c->buffer_bytes) >= buf->len);
    atomic_fetch_sub(&c->buffer_bytes, buf->len);
    buf->next = c->dead;
    c->dead = buf;
}

/* Give dead buffers (no references left, off c->dead) back to the pool,
 * which may unmap them: never under the lock. */
static void cbufs_release(struct cache *c, struct cbuf *dead)
{
    assert(!cache_lock_held(c));
    while (dead) {
        struct cbuf *next = dead->next;
        assert(dead->refs == 0);
        bufpool_put(c->pool, dead->data, dead->len);
        free(dead);
        dead = next;
    }
}

/* A prefetched block goes: if no reader touched it, its bytes were fetched
 * for nothing (counted once its fetch succeeded). */
static void prefetch_account_drop(struct cache *c, struct cblock *b)
{
    if (!b->prefetched || b->used || b->state != BLOCK_READY)
        return;
    c->st.prefetch_unread_bytes -= b->len;
    c->st.prefetch_unused_bytes += b->len;
}

/* A reader found block b (READY or still FETCHING). */
static void prefetch_account_use(struct cache *c, struct cblock *b)
{
    if (!b->prefetched || b->used)
        return;
    b->used = 1;
    if (b->state == BLOCK_READY)
        c->st.prefetch_unread_bytes -= b->len;
}

static void block_free_locked(struct cache *c, struct cblock *b)
{
    assert(cache_lock_held(c));
    prefetch_account_drop(c, b);
    if (b->buf)
        cbuf_unref_locked(c, b->buf);
    obj_unref_locked(c, b->obj);
    free(b);
}

static uint32_t block_len(const struct cache *c, const struct cache_obj *o, uint64_t idx)
{
    uint64_t start = idx * c->cfg.block_size;
    uint64_t left = o->size - start;
    return left < c->cfg.block_size ? (uint32_t)left : c->cfg.block_size;
}

/* How long a prefetched block of a version nobody has opened (a sibling
 * chunk for a rank that has not opened its file yet) waits for its reader. */
#define PREFETCH_WAIT_FOR_OPEN_MS 10000

/* Whether prefetched block b still waits for a reader who may come: it is
 * unread and its version is open, or was never opened and b is recent. A
 * closed or replaced version's unread blocks have no reader any more. */
static int prefetch_awaits_reader(const struct cblock *b, int64_t now_ms)
{
    if (!b->prefetched || b->used)
        return 0;
    const struct cache_obj *o = b->obj;
    return o->opens > 0 || (!o->opened && now_ms - b->ready_ms < PREFETCH_WAIT_FOR_OPEN_MS);
}

/* The memory the cache holds against its capacity: its blocks' bytes, or
 * the fetch buffers they keep alive if those are more. */
static uint64_t held_locked(struct cache *c)
{
    uint64_t bufs = atomic_load(&c->buffer_bytes);
    return bufs > c->st.bytes_cached ? bufs : c->st.bytes_cached;
}

/* Whether make_room_locked may evict b (lock held): READY, unpinned, and
 * not a prefetched block still awaiting its reader. */
static int evictable_locked(const struct cblock *b, int64_t now_ms)
{
    return b->pins == 0 && !prefetch_awaits_reader(b, now_ms);
}

/* Drop READY, unpinned block b from the LRU list, the table and the cache's
 * bytes, and free it (lock held). */
static void drop_ready_locked(struct cache *c, struct cblock *b)
{
    assert(cache_lock_held(c) && b->state == BLOCK_READY && b->pins == 0);
    lru_unlink(b);
    block_unhash(c, b);
    c->st.bytes_cached -= b->len;
    block_free_locked(c, b);
}

static void evict_locked(struct cache *c, struct cblock *b, int64_t now_ms)
{
    c->st.evictions++;
    c->st.evicted_unread += (uint64_t)prefetch_awaits_reader(b, now_ms);
    drop_ready_locked(c, b);
}

/* Above the working set, drop least recently used blocks that a reader has
 * had (not prefetched blocks still unread) until need bytes went, so that a
 * load much larger than the working set refills buffers it has read instead
 * of faulting in fresh memory (every fresh page is zeroed and charged: a
 * fifth of the daemon's CPU in a cold load). The kernel's page cache keeps
 * what was read for re-reads (lock held). */
static void recycle_read_blocks_locked(struct cache *c, uint64_t need)
{
    assert(cache_lock_held(c));
    uint64_t dropped = 0;
    struct cblock *b = c->lru.lru_prev;
    while (dropped < need && held_locked(c) + need > c->working_set && b != &c->lru) {
        struct cblock *prev = b->lru_prev;
        if (b->pins == 0 && !(b->prefetched && !b->used)) {
            c->st.recycled++;
            dropped += b->len;
            drop_ready_locked(c, b);
        }
        b = prev;
    }
}

/* Make need more bytes fit within the capacity by evicting least recently
 * used blocks (lock held). Never evicted: pinned blocks, and prefetched
 * blocks still awaiting their reader. Under pressure, those are the next
 * bytes some stream reads: evicting them (for a prefetch, or for a reader
 * whose own prefetch was skipped) costs their reader a second fetch, and its
 * demand read then evicts the next stream's blocks in turn; a demand read
 * goes over the capacity instead, by at most its own blocks, which are
 * evictable once read. Memory is counted as held_locked() does: a block's
 * eviction frees its fetch buffer only with the buffer's last block, so the
 * LRU order is first walked without evicting, to find how far eviction must
 * go. If need cannot fit, nothing would be gained by evicting blocks whose
 * buffer stays: a background fetch (background), which is then skipped,
 * evicts nothing, and a demand read evicts only the blocks whose whole
 * buffer goes. Returns 1 if need fits. */
static int make_room_locked(struct cache *c, uint64_t need, int background)
{
    assert(cache_lock_held(c));
    const uint64_t cap = c->cfg.capacity;
    if (held_locked(c) + need <= cap) {
        recycle_read_blocks_locked(c, need); /* within capacity, above the working set */
        return 1;
    }
    int64_t now_ms = (int64_t)(mono_seconds() * 1000);
    uint64_t bytes = c->st.bytes_cached, bufs = atomic_load(&c->buffer_bytes);
    struct cblock *stop = NULL, *b;
    for (b = c->lru.lru_prev; b != &c->lru && !stop; b = b->lru_prev) {
        if (!evictable_locked(b, now_ms))
            continue;
        assert(b->buf && b->buf->spare < b->buf->refs);
        bytes -= b->len;
        if (++b->buf->spare == b->buf->refs)
            bufs -= b->buf->len; /* its last block: the buffer would go */
        if ((bufs > bytes ? bufs : bytes) + need <= cap)
            stop = b;
    }
    if (!stop && background) {
        for (b = c->lru.lru_prev; b != &c->lru; b = b->lru_prev)
            if (evictable_locked(b, now_ms))
                b->buf->spare = 0;
        return 0;
    }
    /* Up to stop, every block counted goes (each takes its count back); with
     * no stop, the blocks of buffers that go whole, and the other buffers'
     * counts are cleared. */
    for (b = c->lru.lru_prev; b != &c->lru;) {
        struct cblock *prev = b->lru_prev;
        if (evictable_locked(b, now_ms)) {
            struct cbuf *buf = b->buf;
            if (stop || buf->spare == buf->refs) {
                assert(buf->spare > 0);
                buf->spare--;
                evict_locked(c, b, now_ms);
            } else {
                buf->spare = 0;
            }
        }
        if (b == stop)
            break;
        b = prev;
    }
    assert(!stop || held_locked(c) + need <= cap);
    return held_locked(c) + need <= cap;
}

/* Insert a FETCHING block for (o, idx). Takes an object reference. */
static struct cblock *block_insert_fetching(struct cache *c, struct cache_obj *o, uint64_t idx)
{
    assert(cache_lock_held(c));
    struct cblock *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    b->obj = o;
    o->refs++;
    b->idx = idx;
    b->state = BLOCK_FETCHING;
    b->len = block_len(c, o, idx);
    b->in_table = 1;
    o->blocks++;
    size_t h = block_bucket(c, o->id, idx);
    b->hnext = c->blocks[h];
    c->blocks[h] = b;
    c->st.bytes_cached += b->len;
    return b;
}

/* Remember that fetching blocks [first, first+n) of o timed out (lock held). */
static void timeout_note_locked(struct cache *c, const struct cache_obj *o, uint64_t first,
                                uint32_t n)
{
    struct recent_timeout *t = &c->timeouts[c->next_timeout++ % TIMEOUT_SLOTS];
    *t = (struct recent_timeout){o->id, first, first + n,
                                 (int64_t)(mono_seconds() * 1000) + CACHE_TIMEOUT_LINGER_MS};
}

/* Forget o's timeouts: it answered (lock held). */
static void timeout_forget_locked(struct cache *c, const struct cache_obj *o)
{
    for (unsigned i = 0; i < TIMEOUT_SLOTS; i++)
        if (c->timeouts[i].obj_id == o->id)
            c->timeouts[i].obj_id = 0;
}

/* Whether block idx of o timed out within the linger (lock held). */
static int timed_out_lately_locked(struct cache *c, const struct cache_obj *o, uint64_t idx)
{
    int64_t now = -1;
    for (unsigned i = 0; i < TIMEOUT_SLOTS; i++) {
        struct recent_timeout *t = &c->timeouts[i];
        if (t->obj_id != o->id || idx < t->first || idx >= t->end)
            continue;
        if (now < 0)
            now = (int64_t)(mono_seconds() * 1000);
        if (now < t->until_ms)
            return 1;
        t->obj_id = 0; /* lapsed */
    }
    return 0;
}

/* Whether block idx of o is neither held nor recently timed out: a run to
 * fetch may claim it (lock held). */
static int block_claimable_locked(struct cache *c, struct cache_obj *o, uint64_t idx)
{
    return !block_find(c, o, idx) && !timed_out_lately_locked(c, o, idx);
}

/* A run of blocks being fetched: blocks [first, first+published) are READY
 * already, the rest FETCHING and owned by the fetching thread. */
struct fetch {
    struct cache *c;
    struct cache_obj *o;
    uint64_t first;
    uint32_t n, published;
    size_t published_bytes; /* bytes of the published blocks */
    size_t base;            /* bytes of buf read from the disk cache before the store's */
    struct cbuf *buf;       /* holds one reference for the fetch itself */
};

/* FETCHING block b's background fetch is over (READY or FAILED): it is no
 * longer in flight ahead of readers (lock held). */
static void ahead_landed_locked(struct cache *c, const struct cblock *b)
{
    assert(cache_lock_held(c) && b->state == BLOCK_FETCHING);
    if (!b->prefetched)
        return;
    assert(c->ahead_inflight >= b->len);
    c->ahead_inflight -= b->len;
}

/* Publish the next block of f READY (lock held). */
static void fetch_publish_next_locked(struct fetch *f)
{
    struct cache *c = f->c;
    assert(cache_lock_held(c));
    assert(f->published < f->n);
    struct cblock *b = block_find(c, f->o, f->first + f->published);
    assert(b && b->state == BLOCK_FETCHING);
    assert(f->buf->refs > 0); /* the fetch's own reference keeps the buffer */
    f->buf->refs++;
    b->buf = f->buf;
    b->data = f->buf->data + f->published_bytes;
    ahead_landed_locked(c, b);
    b->state = BLOCK_READY;
    if (b->prefetched) {
        b->ready_ms = (int64_t)(mono_seconds() * 1000);
        c->st.prefetched_bytes += b->len;
        if (!b->used)
            c->st.prefetch_unread_bytes += b->len;
    }
    lru_push_front(c, b);
    block_wake_locked(c, b);
    f->published++;
    f->published_bytes += b->len;
}

/* Whether f's next unpublished block lies whole in buf[0, ready). */
static int fetch_next_block_in(const struct fetch *f, size_t ready)
{
    return f->published < f->n &&
           ready >= f->published_bytes + block_len(f->c, f->o, f->first + f->published);
}

/* store_progress_fn: publish the blocks whose bytes are all final, so
 * readers waiting for them go on while the rest of the GET arrives. */
static void fetch_progress(void *arg, size_t ready)
{
    struct fetch *f = arg;
    struct cache *c = f->c;
    ready += f->base; /* the store fills buf from base on */
    /* Only this thread changes f: no lock to find that no block is whole yet. */
    if (!fetch_next_block_in(f, ready))
        return;
    cache_lock(c);
    while (fetch_next_block_in(f, ready))
        fetch_publish_next_locked(f);
    cache_unlock(c);
}

/* ---- the disk cache ---- */

void cache_set_disk(struct cache *c, struct diskcache *dc, struct diskfill *fill)
{
    c->disk = dc;
    c->fill = dc ? fill : NULL;
}

/* Copy into buf what the disk cache holds of [off, off + len) of o, piece by
 * piece (a piece: the part of one disk chunk in the range). [*lo, *hi) of buf
 * is left for the store: from the first piece missing to the end of the last
 * one (lo == hi: every piece was on disk). Called without the lock. */
static void disk_read(struct cache *c, struct cache_obj *o, uint64_t off, size_t len, char *buf,
                      size_t *lo, size_t *hi)
{
    *lo = 0;
    *hi = len;
    if (!c->disk || !o->etag[0])
        return;
    struct diskcache_version v = {.path = o->path, .etag = o->etag, .size = o->size};
    (void)diskcache_read_held(c->disk, &v, off, len, buf, lo, hi);
}

/* o's copy in the disk cache, looked up by the first caller (others meanwhile
 * get NULL and read through the blocks). Called without the lock; o is
 * referenced by the caller. */
static struct diskcache_file *obj_disk_file(struct cache *c, struct cache_obj *o)
{
    cache_lock(c);
    int state = o->disk_state;
    struct diskcache_file *df = o->disk_file;
    if (state == DISK_UNKNOWN)
        o->disk_state = DISK_LOOKING;
    cache_unlock(c);
    if (state != DISK_UNKNOWN)
        return df;
    struct diskcache_version v = {.path = o->path, .etag = o->etag, .size = o->size};
    if (diskcache_file_open(c->disk, &v, &df) != 1)
        df = NULL;
    cache_lock(c);
    o->disk_file = df;
    o->disk_state = DISK_KNOWN;
    cache_unlock(c);
    return df;
}

/* A background check of chunks [off, off + len) of o's disk copy, ahead of
 * their reader (disk_check_ahead). */
struct check_job {
    struct cache *c;
    struct cache_obj *o; /* referenced by the job */
    struct diskcache_file *df;
    uint64_t off, len;
};

static void check_job_run(void *arg)
{
    struct check_job *j = arg;
    struct cache *c = j->c;
    if (!atomic_load(&c->stopping))
        (void)diskcache_file_verify(j->df, j->off, (size_t)j->len);
    atomic_fetch_sub(&c->checks_inflight, j->len);
    cache_lock(c);
    obj_unref_locked(c, j->o);
    cache_unlock(c);
    free(j);
}

/* Bytes one background check reads, in order: 8 chunks, so that a file of
 * up to 8 MiB is read by one worker from start to end (one sequential stream
 * for the kernel's readahead; 2 MiB jobs had 4 workers read one file at 4
 * places at once: smaller disk reads, 50% more daemon CPU, slower restarts,
 * docs/bench-load.md "One stream per file"), while other files' jobs run on
 * the other workers. */
#define CHECK_JOB_BYTES (8 * (uint64_t)DISKCACHE_CHUNK)

/* If the disk cache holds all of [off, off + len) of o: have the workers
 * check its chunks (and so read them into the page cache) ahead of the
 * reader, who then waits at most for the chunk it needs, and return 1 (the
 * range needs no fetch into blocks). bounded: not past working_set bytes of
 * checks in flight. 0 if the disk copy lacks some of it. Without the lock. */
static int disk_check_ahead(struct cache *c, struct cache_obj *o, uint64_t off, uint64_t len,
                            int bounded)
{
    if (!c->disk || !o->etag[0])
        return 0;
    struct diskcache_file *df = obj_disk_file(c, o);
    if (!df || !diskcache_file_holds(df, off, (size_t)len))
        return 0;
    uint64_t from = off / DISKCACHE_CHUNK * DISKCACHE_CHUNK, end = off + len;
    diskcache_file_recheck_evicted(df, from, (size_t)(end - from));
    for (uint64_t at = from; at < end; at += CHECK_JOB_BYTES) {
        uint64_t n = end - at < CHECK_JOB_BYTES ? end - at : CHECK_JOB_BYTES;
        if (!diskcache_file_unchecked(df, at, (size_t)n))
            continue; /* checked, or being checked */
        if (bounded && atomic_load(&c->checks_inflight) >= c->working_set)
            break; /* its reader checks the rest itself */
        struct check_job *j = malloc(sizeof *j);
        if (!j)
            break;
        *j = (struct check_job){.c = c, .o = o, .df = df, .off = at, .len = n};
        cache_lock(c);
        o->refs++;
        cache_unlock(c);
        atomic_fetch_add(&c->checks_inflight, n);
        if (workq_submit(c->wq, check_job_run, j) < 0) {
            atomic_fetch_sub(&c->checks_inflight, n);
            cache_lock(c);
            obj_unref_locked(c, o);
            cache_unlock(c);
            free(j);
            break;
        }
    }
    return 1;
}

int cache_disk_holds(struct cache *c, struct cache_obj *o, uint64_t off, size_t len)
{
    if (!c->disk || !o->etag[0] || off >= o->size)
        return 0;
    struct diskcache_file *df = obj_disk_file(c, o);
    return df && diskcache_file_holds(df, off, len);
}

int cache_disk_fd(struct cache *c, struct cache_obj *o, uint64_t off, size_t len, int *fd)
{
    if (!c->disk || !o->etag[0] || off >= o->size)
        return 0;
    struct diskcache_file *df = obj_disk_file(c, o);
    if (!df || diskcache_file_verify(df, off, len) != 1)
        return 0;
    *fd = diskcache_file_fd(df);
    return 1;
}

/* Blocks of one disk chunk lent to the disk cache's writer, pinned until it
 * is done with them (disk_keep_chunk). */
struct disk_loan {
    struct cache *c;
    uint32_t n;
    struct cblock *blocks[];
};

/* diskfill_release_fn: the writer is done with a loan's blocks. */
static void disk_loan_release(void *arg)
{
    struct disk_loan *l = arg;
    cache_lock(l->c);
    for (uint32_t i = 0; i < l->n; i++) {
        assert(l->blocks[i]->pins > 0 && l->blocks[i]->state == BLOCK_READY);
        l->blocks[i]->pins--;
    }
    cache_unlock(l->c);
    free(l);
}

/* Keep disk chunk k of o if every block of it is READY in memory: lend its
 * blocks (pinned, not copied) to the background writer. A fetch's own whole
 * chunks are so; the chunk it cuts at an edge is whole once the fetch next
 * to it has landed too (a load fetches item by item, and items do not start
 * on chunk boundaries: a per-rank file's every item boundary). Never waits
 * for the disk. Called without the lock. */
static void disk_keep_chunk(struct cache *c, struct cache_obj *o, uint64_t k)
{
    uint64_t bs = c->cfg.block_size;
    uint64_t start = k * DISKCACHE_CHUNK;
    uint64_t end = start + DISKCACHE_CHUNK < o->size ? start + DISKCACHE_CHUNK : o->size;
    if (start >= end)
        return;
    uint64_t first = start / bs; /* the blocks over the chunk: [first, first + n) */
    uint32_t n = (uint32_t)((end - 1) / bs - first + 1), pinned = 0;
    struct disk_loan *l = malloc(sizeof *l + n * sizeof *l->blocks);
    struct iovec *pieces = malloc(n * sizeof *pieces);
    if (l && pieces) {
        *l = (struct disk_loan){.c = c, .n = n};
        cache_lock(c);
        for (; pinned < n; pinned++) {
            struct cblock *b = block_find(c, o, first + pinned);
            if (!b || b->state != BLOCK_READY)
                break;
            b->pins++;
            l->blocks[pinned] = b;
            uint64_t bstart = b->idx * bs, bend = bstart + b->len;
            uint64_t from = start > bstart ? start : bstart, to = end < bend ? end : bend;
            pieces[pinned] = (struct iovec){.iov_base = b->data + (from - bstart),
                                            .iov_len = (size_t)(to - from)};
        }
        cache_unlock(c);
    }
    struct diskcache_version v = {.path = o->path, .etag = o->etag, .size = o->size};
    if (pinned == n && diskfill_lend(c->fill, &v, start, pieces, (int)n, disk_loan_release, l) == 0)
        l = NULL; /* the writer releases it */
    if (l && pinned > 0) {
        l->n = pinned;
        disk_loan_release(l);
    } else {
        free(l);
    }
    free(pieces);
}

/* After a fetch of [from, to) of o from the store (its blocks published):
 * keep every chunk it touches that is whole in memory (disk_keep_chunk). */
static void disk_keep(struct cache *c, struct cache_obj *o, uint64_t from, uint64_t to)
{
    if (!c->fill || !o->etag[0] || from >= to)
        return;
    for (uint64_t k = from / DISKCACHE_CHUNK; k <= (to - 1) / DISKCACHE_CHUNK; k++)
        disk_keep_chunk(c, o, k);
}

/* Fetch blocks [first, first+n) of o, all FETCHING and owned by the
 * caller, then publish them READY or FAILED; with a progressive store,
 * blocks are published as their bytes arrive. Called without the lock. */
static int fetch_run(struct cache *c, struct cache_obj *o, uint64_t first, uint32_t n,
                     int background)
{
    uint64_t off = first * c->cfg.block_size;
    uint64_t want = 0;
    for (uint32_t i = 0; i < n; i++)
        want += block_len(c, o, first + i);
    struct fetch f = {.c = c, .o = o, .first = first, .n = n, .buf = cbuf_new(c, want)};
    size_t got = 0;
    int rc;
    size_t lo = 0, hi = 0; /* the part of the run asked of the store */
    const struct store_ops *ops = c->store->ops;
    if (!f.buf)
        rc = -ENOMEM;
    else if (background && atomic_load(&c->stopping))
        rc = -ESHUTDOWN;
    else {
        /* What the disk cache holds is not asked of the store: [lo, hi) is. */
        size_t sgot = 0;
        disk_read(c, o, off, want, f.buf->data, &lo, &hi);
        f.base = lo;
        if (lo == hi)
            rc = 0;
        else if (ops->read_progressive)
            rc = ops->read_progressive(c->store, o->path, o->etag, off + lo, hi - lo,
                                       f.buf->data + lo, &sgot, fetch_progress, &f);
        else
            rc = ops->read(c->store, o->path, o->etag, off + lo, hi - lo, f.buf->data + lo, &sgot);
        got = rc == 0 && sgot == hi - lo ? want : lo + sgot;
    }
    if (rc == 0 && got != want) {
        log_warn("%s: object shorter than expected (%zu of %llu bytes at %llu): changed on the "
                 "store?",
                 o->path, got, (unsigned long long)want, (unsigned long long)off);
        rc = -ESTALE;
    }
    if (rc < 0 && rc != -ENOENT && rc != -ESTALE && rc != -ESHUTDOWN)
        log_warn("%s: read of %llu bytes at %llu failed: %s", o->path, (unsigned long long)want,
                 (unsigned long long)off, strerror(-rc));

    cache_lock(c);
    if (rc == 0) {
        timeout_forget_locked(c, o);
        while (f.published < n)
            fetch_publish_next_locked(&f);
    } else {
        c->st.fetch_errors++;
        if (rc == -ETIMEDOUT)
            timeout_note_locked(c, o, first + f.published, n - f.published);
        /* Blocks published already hold final bytes: they stay. */
        for (uint32_t i = f.published; i < n; i++) {
            struct cblock *b = block_find(c, o, first + i);
            assert(b && b->state == BLOCK_FETCHING);
            ahead_landed_locked(c, b);
            b->state = BLOCK_FAILED;
            b->err = rc;
            block_unhash(c, b);
            c->st.bytes_cached -= b->len;
            block_wake_locked(c, b);
            if (b->pins == 0)
                block_free_locked(c, b);
        }
    }
    if (f.buf)
        cbuf_unref_locked(c, f.buf);
    cache_unlock(c);
    if (rc == 0)
        disk_keep(c, o, off + lo, off + hi);
    return rc;
}

/* The job's blocks stop naming it: it has started, or a reader is taking it
 * over (lock held). */
static void job_started_locked(struct cache *c, struct fetch_job *j)
{
    assert(cache_lock_held(c));
    for (uint32_t i = 0; i < j->n; i++) {
        struct cblock *b = block_find(c, j->obj, j->first + i);
        assert(b && b->state == BLOCK_FETCHING); /* published only by the job */
        if (b->queued == j)
            b->queued = NULL;
    }
}

static void fetch_job_run(void *arg)
{
    struct fetch_job *j = arg;
    cache_lock(j->c);
    job_started_locked(j->c, j);
    cache_unlock(j->c);
    fetch_run(j->c, j->obj, j->first, j->n, 1);
    cache_lock(j->c);
    obj_unref_locked(j->c, j->obj);
    cache_unlock(j->c);
    free(j);
}

/* Copy the bytes of block b that fall in [off, off+len) to dst. b is
 * READY and pinned; called without the lock. */
static void copy_from_block(struct cache *c, struct cblock *b, uint64_t off, size_t len, char *dst)
{
    uint64_t bstart = b->idx * c->cfg.block_size;
    uint64_t from = off > bstart ? off : bstart;
    uint64_t to = off + len < bstart + b->len ? off + len : bstart + b->len;
    memcpy(dst + (from - off), b->data + (from - bstart), to - from);
}

ssize_t cache_read(struct cache *c, struct cache_obj *o, uint64_t off, size_t len, void *dst)
{
    if (off >= o->size)
        return 0;
    if (len > o->size - off)
        len = o->size - off;
    if (len == 0)
        return 0;
    uint64_t bs = c->cfg.block_size;
    uint64_t first = off / bs, last = (off + len - 1) / bs;
    int rc = 0;
    uint64_t fetched_end = first; /* blocks below this were fetched by us: not hits */

    cache_lock(c);
    for (uint64_t idx = first; idx <= last && rc == 0;) {
        struct cblock *b = block_find(c, o, idx);
        if (!b) {
            if (timed_out_lately_locked(c, o, idx)) {
                c->st.failed_fast++;
                rc = -ETIMEDOUT;
                break;
            }
            /* Miss: claim the run of missing blocks from here and fetch it. */
            uint32_t n = 0;
            while (idx + n <= last && block_claimable_locked(c, o, idx + n))
                n++;
            make_room_locked(c, (uint64_t)n * bs, 0);
            for (uint32_t i = 0; i < n; i++) {
                if (!block_insert_fetching(c, o, idx + i)) {
                    n = i;
                    break;
                }
            }
            if (n == 0) {
                rc = -ENOMEM;
                break;
            }
            c->st.misses += n;
            cache_unlock(c);
            rc = fetch_run(c, o, idx, n, 0);
            cache_lock(c);
            fetched_end = idx + n;
            continue; /* the blocks are READY now (may be evicted again: look up) */
        }
        b->pins++;
        prefetch_account_use(c, b);
        if (b->state == BLOCK_FETCHING) {
            c->st.shared++;
            struct fetch_job *j = b->queued;
            if (j) { /* still queued, perhaps behind other files' prefetch: run it here */
                job_started_locked(c, j);
                cache_unlock(c);
                int taken = workq_take(c->wq, fetch_job_run, j);
                if (taken)
                    fetch_job_run(j);
                cache_lock(c);
                c->st.taken_over += taken;
            }
            while (b->state == BLOCK_FETCHING)
                cache_wait(c, block_cond(c, b));
        } else if (idx >= fetched_end) {
            c->st.hits++;
        }
        if (b->state == BLOCK_FAILED) {
            rc = b->err;
            if (--b->pins == 0)
                block_free_locked(c, b);
            break;
        }
        lru_touch(c, b);
        cache_unlock(c);
        copy_from_block(c, b, off, len, dst);
        cache_lock(c);
        assert(b->pins > 0);
        b->pins--;
        idx++;
    }
    cache_unlock(c);
    return rc < 0 ? rc : (ssize_t)len;
}

static uint64_t prefetch_split(struct cache *c, struct cache_obj *o, uint64_t off, uint64_t len,
                               uint32_t request, int bounded);

uint64_t cache_prefetch(struct cache *c, struct cache_obj *o, uint64_t off, uint64_t len)
{
    return prefetch_split(c, o, off, len, c->cfg.request_size, 0);
}

uint64_t cache_prefetch_ahead(struct cache *c, struct cache_obj *o, uint64_t off, uint64_t len)
{
    return prefetch_split(c, o, off, len, c->cfg.request_size, 1);
}

/* A full run may stretch by up to 1/STRETCH_DIV of a request to take the
 * rest of the range: an item a little over the request size (a torch item is
 * its tensor's bytes plus a zip header and directory) is one GET, not a full
 * one and a tail of a block or two. */
#define STRETCH_DIV 8

/* How many blocks from idx to last (all claimable, at most max) to add to
 * the run before idx: all of them or none (lock held). */
static uint32_t stretch_to_end_locked(struct cache *c, struct cache_obj *o, uint64_t idx,
                                      uint64_t last, uint32_t max)
{
    assert(cache_lock_held(c));
    if (idx > last || last - idx + 1 > max)
        return 0;
    for (uint64_t i = idx; i <= last; i++)
        if (!block_claimable_locked(c, o, i))
            return 0;
    return (uint32_t)(last - idx + 1);
}

uint64_t cache_prefetch_split(struct cache *c, struct cache_obj *o, uint64_t off, uint64_t len,
                              uint32_t request)
{
    return prefetch_split(c, o, off, len, request, 0);
}

/* Bytes fetched in the background that no reader has had yet: in flight, or
 * READY and unread (lock held). */
static uint64_t ahead_locked(const struct cache *c)
{
    return c->ahead_inflight + c->st.prefetch_unread_bytes;
}

/* cache_prefetch_split(); bounded: only while ahead_locked() is below the
 * working set. */
static uint64_t prefetch_split(struct cache *c, struct cache_obj *o, uint64_t off, uint64_t len,
                               uint32_t request, int bounded)
{
    if (off >= o->size || len == 0)
        return 0;
    if (len > o->size - off)
        len = o->size - off;
    if (disk_check_ahead(c, o, off, len, bounded))
        return 0; /* read in place from the disk cache's copy (cache_disk_fd): no blocks */
    uint64_t bs = c->cfg.block_size;
    uint64_t first = off / bs, last = (off + len - 1) / bs;
    if (request > c->cfg.request_size)
        request = c->cfg.request_size;
    uint32_t max_run = request > bs ? (uint32_t)(request / bs) : 1;
    assert(max_run >= 1);
    uint64_t scheduled = 0;

    cache_lock(c);
    if (bounded && ahead_locked(c) >= c->working_set) {
        c->st.ahead_deferred++; /* whole ranges: an item is fetched whole or not at all */
        cache_unlock(c);
        return 0;
    }
    for (uint64_t idx = first; idx <= last;) {
        if (!block_claimable_locked(c, o, idx)) {
            idx++;
            continue;
        }
        uint32_t n = 0;
        while (n < max_run && idx + n <= last && block_claimable_locked(c, o, idx + n))
            n++;
        n += stretch_to_end_locked(c, o, idx + n, last, n == max_run ? max_run / STRETCH_DIV : 0);
        uint64_t bytes = 0;
        for (uint32_t i = 0; i < n; i++)
            bytes += block_len(c, o, idx + i);
        if (!make_room_locked(c, bytes, 1)) {
            c->st.prefetch_skipped += last - idx + 1;
            break;
        }
        struct fetch_job *j = malloc(sizeof *j);
        if (!j)
            break;
        uint32_t made = 0;
        struct cblock *nb;
        while (made < n && (nb = block_insert_fetching(c, o, idx + made))) {
            nb->prefetched = 1;
            nb->queued = j;
            made++;
        }
        if (made == 0) {
            free(j);
            break;
        }
        o->refs++; /* the job's reference */
        *j = (struct fetch_job){.c = c, .obj = o, .first = idx, .n = made};
        if (workq_submit(c->wq, fetch_job_run, j) < 0) {
            /* Shutting down: publish the claimed blocks as failed. */
            for (uint32_t i = 0; i < made; i++) {
                struct cblock *b = block_find(c, o, idx + i);
                b->queued = NULL;
                b->state = BLOCK_FAILED;
                b->err = -ESHUTDOWN;
                block_unhash(c, b);
                c->st.bytes_cached -= b->len;
                if (b->pins == 0)
                    block_free_locked(c, b);
            }
            obj_unref_locked(c, o);
            free(j);
            break;
        }
        c->st.prefetched += made;
        uint64_t made_bytes = 0;
        for (uint32_t i = 0; i < made; i++)
            made_bytes += block_len(c, o, idx + i);
        c->ahead_inflight += made_bytes;
        scheduled += made_bytes;
        idx += made;
    }
    cache_unlock(c);
    return scheduled;
}

/* Block indices cache_release_behind() looks up per hold of the lock: a
 * long range (a stream's first release after a jump starts at 0) must not
 * hold every reader off for the whole walk. */
#define RELEASE_CHUNK 64

void cache_release_behind(struct cache *c, struct cache_obj *o, uint64_t from, uint64_t to)
{
    uint64_t bs = c->cfg.block_size;
    uint64_t first = (from + bs - 1) / bs, end = to / bs; /* whole blocks only */
    uint64_t nblocks = (o->size + bs - 1) / bs;
    if (end > nblocks)
        end = nblocks; /* no blocks beyond the object */
    for (uint64_t idx = first; idx < end;) {
        uint64_t stop = end - idx > RELEASE_CHUNK ? idx + RELEASE_CHUNK : end;
        cache_lock(c);
        /* The caller's open keeps o while the lock is dropped between chunks;
         * another open (now) shares the blocks, and none left: nothing to do. */
        assert(o->opens > 0 && o->refs >= o->opens);
        if (o->opens != 1 || o->blocks == 0) {
            cache_unlock(c);
            break;
        }
        for (; idx < stop; idx++) {
            struct cblock *b = block_find(c, o, idx);
            if (!b || b->state != BLOCK_READY || b->pins)
                continue;
            c->st.released++;
            drop_ready_locked(c, b);
        }
        cache_unlock(c); /* and the buffers of the dropped blocks go back */
    }
}

int cache_has(struct cache *c, struct cache_obj *o, uint64_t from, uint64_t to)
{
    if (from >= to)
        return 0;
    uint64_t bs = c->cfg.block_size;
    cache_lock(c);
    int all = 1;
    for (uint64_t idx = from / bs; idx <= (to - 1) / bs && all; idx++)
        all = block_find(c, o, idx) != NULL;
    cache_unlock(c);
    return all;
}

void cache_cancel(struct cache *c)
{
    if (c)
        atomic_store(&c->stopping, 1);
}

void cache_get_stats(struct cache *c, struct cache_stats *out)
{
    cache_lock(c);
    *out = c->st;
    out->capacity = c->cfg.capacity;
    out->buffer_bytes = atomic_load(&c->buffer_bytes);
    cache_unlock(c);
    struct bufpool_stats ps;
    bufpool_get_stats(c->pool, &ps);
    out->buffers_mapped = ps.maps;
    out->buffers_reused = ps.reuses;
}

static size_t pow2_at_least(size_t n)
{
    size_t p = 64;
    while (p < n)
        p <<= 1;
    return p;
}

int cache_create(struct store *store, struct workq *wq, const struct cache_config *cfg,
                 struct cache **out)
{
    if (cfg->block_size == 0 || (cfg->block_size & (cfg->block_size - 1)) ||
        cfg->request_size < cfg->block_size || cfg->request_size % cfg->block_size ||
        cfg->capacity < cfg->block_size)
        return -EINVAL;
    struct cache *c = calloc(1, sizeof *c);
    if (!c)
        return -ENOMEM;
    c->store = store;
    c->wq = wq;
    c->cfg = *cfg;
    c->nbuckets = pow2_at_least(2 * (cfg->capacity / cfg->block_size));
    c->nobj_buckets = 4096;
    c->blocks = calloc(c->nbuckets, sizeof *c->blocks);
    c->objs = calloc(c->nobj_buckets, sizeof *c->objs);
    if (!c->blocks || !c->objs) {
        free(c->blocks);
        free(c->objs);
        free(c);
        return -ENOMEM;
    }
    /* Pool units are blocks (pages when blocks are smaller); spare buffers
     * up to an eighth of the capacity, at most 128 MiB, at least one GET. */
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t unit = cfg->block_size % page == 0 ? cfg->block_size : page;
    uint64_t spare = cfg->capacity / 8 < (128u << 20) ? cfg->capacity / 8 : (128u << 20);
    if (spare < cfg->request_size)
        spare = cfg->request_size;
    size_t largest = cfg->request_size + cfg->request_size / STRETCH_DIV; /* a stretched run */
    int rc = bufpool_create(unit, (unsigned)((largest + unit - 1) / unit), spare, &c->pool);
    if (rc < 0) {
        free(c->blocks);
        free(c->objs);
        free(c);
        return rc;
    }
    /* A quarter of the capacity, at least four requests, at most all of it. */
    c->working_set = cfg->working_set ? cfg->working_set : cfg->capacity / 4;
    if (c->working_set < 4 * (uint64_t)cfg->request_size)
        c->working_set = 4 * (uint64_t)cfg->request_size;
    if (c->working_set > cfg->capacity)
        c->working_set = cfg->capacity;
    c->lru.lru_next = c->lru.lru_prev = &c->lru;
    pthread_mutex_init(&c->lock, NULL);
    for (int i = 0; i < WAIT_CONDS; i++)
        pthread_cond_init(&c->conds[i], NULL);
    *out = c;
    return 0;
}

void cache_destroy(struct cache *c)
{
    if (!c)
        return;
    cache_lock(c);
    while (c->lru.lru_next != &c->lru) {
        struct cblock *b = c->lru.lru_next;
        assert(b->pins == 0); /* no reader, and the disk cache's writer gave its loans back */
        lru_unlink(b);
        block_unhash(c, b);
        block_free_locked(c, b);
    }
    cache_unlock(c); /* gives the buffers back to the pool */
    assert(atomic_load(&c->buffer_bytes) == 0);
    for (int i = 0; i < WAIT_CONDS; i++)
        pthread_cond_destroy(&c->conds[i]);
    pthread_mutex_destroy(&c->lock);
    bufpool_destroy(c->pool);
    free(c->blocks);
    free(c->objs);
    free(c);
}
