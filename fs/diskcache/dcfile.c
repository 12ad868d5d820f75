/*
 * fs/diskcache/dcfile.c - files held for reads in place (diskcache_file, see
 * diskcache.h): opening one version (its chunk map looked up once in the
 * catalogue, its data file opened, and mapped for mincore where the kernel
 * lacks cachestat), checking its chunks' crc32c once while they stay in the
 * page cache (again if the file is written), and the per-thread scratch
 * chunk those checks read into. The list of open and idle files, their
 * release and freeing belong to diskcache.c.
 */
#include "diskcache.h"
#include "diskcache_internal.h"

#include "crc32c.h"
#include "fdio.h"
#include "pagecache.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <lmdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* diskcache_file.state of a chunk: CHECKING while one thread reads it (the
 * others wait for its answer on f->checked); BAD: failed, or not held. */
enum { CHUNK_UNCHECKED, CHUNK_CHECKING, CHUNK_GOOD, CHUNK_BAD };

int diskcache_file_open(struct diskcache *dc, const struct diskcache_version *v,
                        struct diskcache_file **out)
{
    char etag_buf[256];
    struct diskcache_version plain = dc_plain_version(v, etag_buf, sizeof etag_buf);
    v = &plain;
    *out = NULL;
    if (v->size == 0)
        return 0;
    uint64_t id = dc_version_id(v);
    struct diskcache_file *f = dc_find_file(dc, id, v);
    if (f) {
        uint64_t now = dc_now_ns(), last = atomic_load(&f->last_use);
        if (last + TOUCH_EVERY_NS <= now &&
            atomic_compare_exchange_strong(&f->last_use, &last, now))
            dc_touch(dc, v, id, last);
        *out = f;
        return 1;
    }
    uint64_t n64 = (v->size + DISKCACHE_CHUNK - 1) / DISKCACHE_CHUNK;
    if (n64 > UINT32_MAX)
        return 0;
    uint32_t n = (uint32_t)n64;
    f = calloc(1, sizeof *f);
    if (!f)
        return -ENOMEM;
    pthread_mutex_init(&f->lock, NULL);
    pthread_cond_init(&f->checked, NULL);
    f->dc = dc;
    f->id = id;
    f->size = v->size;
    f->nchunks = n;
    f->fd = -1;
    f->map = MAP_FAILED;
    f->path = strdup(v->path);
    f->etag = strdup(v->etag);
    f->recs = calloc(n, sizeof *f->recs);
    f->state = calloc(n, sizeof *f->state);
    if (!f->path || !f->etag || !f->recs || !f->state) {
        dc_free_file(f);
        return -ENOMEM;
    }
    MDB_txn *txn;
    int rc = mdb_txn_begin(dc->env, NULL, MDB_RDONLY, &txn);
    if (rc != 0) {
        dc_free_file(f);
        return dc_mdb_errno(rc);
    }
    struct obj_head h;
    uint32_t held = 0;
    MDB_cursor *cur = NULL;
    if (dc_obj_get(dc, txn, id, v, &h) == 0 && mdb_cursor_open(txn, dc->chunks, &cur) == 0) {
        unsigned char key[12];
        dc_chunk_key(key, id, 0);
        MDB_val k = {sizeof key, key}, val;
        for (rc = mdb_cursor_get(cur, &k, &val, MDB_SET_RANGE); rc == 0;
             rc = mdb_cursor_get(cur, &k, &val, MDB_NEXT)) {
            if (k.mv_size != sizeof key || memcmp(k.mv_data, key, 8) != 0)
                break; /* past id's chunks */
            const unsigned char *kb = k.mv_data;
            uint32_t i =
                (uint32_t)kb[8] << 24 | (uint32_t)kb[9] << 16 | (uint32_t)kb[10] << 8 | kb[11];
            struct chunk_rec c;
            if (i >= n || val.mv_size != sizeof c)
                continue;
            memcpy(&c, val.mv_data, sizeof c);
            uint64_t want = v->size - (uint64_t)i * DISKCACHE_CHUNK;
            if (c.len != (want < DISKCACHE_CHUNK ? want : DISKCACHE_CHUNK))
                continue; /* not this version's chunk shape: never served */
            f->recs[i] = c;
            held++;
        }
        mdb_cursor_close(cur);
    }
    mdb_txn_abort(txn);
    if (held == 0) {
        dc_free_file(f);
        return 0;
    }
    char path[4096];
    dc_data_path(dc, id, path, sizeof path);
    f->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (f->fd < 0) {
        dc_free_file(f);
        return 0;
    }
    for (uint32_t i = 0; i < n; i++)
        if (f->recs[i].len == 0)
            atomic_store(&f->state[i], CHUNK_BAD);
    struct stat st;
    if (fstat(f->fd, &st) == 0)
        f->mtime = st.st_mtim;
    else
        st.st_size = 0;
    if (st.st_size > 0) {
        f->map_len = (uint64_t)st.st_size < v->size ? (uint64_t)st.st_size : v->size;
        f->map = mmap(NULL, (size_t)f->map_len, PROT_READ, MAP_SHARED, f->fd, 0);
    }
    /* Listed, unless another open listed the version meanwhile (then both
     * are right; this one is freed at its close). */
    f->refs = 1;
    struct diskcache_file *other = dc_find_file(dc, id, v);
    if (other) {
        diskcache_file_close(other);
    } else {
        dc_list_file(dc, f);
    }
    f->last_use = dc_now_ns();
    dc_touch(dc, v, id, h.last_use);
    *out = f;
    return 1;
}
/* Whether every page of chunk i of f is in the page cache: cachestat on its
 * fd, else mincore on a mapping never touched (no fault, no SIGBUS from a
 * short or failing file). */
static int resident(struct diskcache_file *f, uint32_t i)
{
    uint64_t base = (uint64_t)i * DISKCACHE_CHUNK, len = f->recs[i].len;
    int held = page_cache_holds(f->fd, base, len);
    if (held >= 0)
        return held;
    if (f->map == MAP_FAILED || base + len > f->map_len)
        return 0;
    unsigned char vec[DISKCACHE_CHUNK / 4096];
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t pages = (size_t)((len + page - 1) / page);
    if (pages > sizeof vec || mincore((char *)f->map + base, (size_t)len, vec) != 0)
        return 0;
    for (size_t p = 0; p < pages; p++)
        if (!(vec[p] & 1))
            return 0;
    return 1;
}

/* A check reads its chunk this much at a time into the thread's scratch
 * (CHECK_PIECE bytes) and sums each piece while it is still in the CPU's
 * cache: a whole 1 MiB read first and summed after left the cache on the way,
 * and the copy and the crc each went to memory. */
#define CHECK_PIECE (128u << 10)

/* Read chunk i of f and check its checksum: CHUNK_GOOD or CHUNK_BAD. */
static int check_chunk(struct diskcache_file *f, uint32_t i, unsigned char *buf)
{
    struct chunk_rec c = f->recs[i];
    uint64_t base = (uint64_t)i * DISKCACHE_CHUNK;
    uint32_t crc = 0;
    uint32_t at = 0;
    while (at < c.len) {
        uint32_t n = c.len - at < CHECK_PIECE ? c.len - at : CHECK_PIECE;
        if (pread_exact(f->fd, buf, n, base + at) != 0)
            break;
        crc = crc32c(crc, buf, n);
        at += n;
    }
    atomic_fetch_add(&f->dc->checked_chunks, 1);
    if (at == c.len && crc == c.crc)
        return CHUNK_GOOD;
    struct diskcache_version v = {.path = f->path, .etag = f->etag, .size = f->size};
    dc_drop_chunk(f->dc, &v, f->id, i);
    return CHUNK_BAD;
}

/* If f's data file was written since its chunks were checked (its mtime
 * moved: bytes in the page cache may have changed), check them all again. */
static void recheck_if_written(struct diskcache_file *f)
{
    struct stat st;
    if (fstat(f->fd, &st) != 0)
        return; /* the reads fail then, and so the checks */
    pthread_mutex_lock(&f->lock);
    if (st.st_mtim.tv_sec != f->mtime.tv_sec || st.st_mtim.tv_nsec != f->mtime.tv_nsec) {
        f->mtime = st.st_mtim;
        for (uint32_t i = 0; i < f->nchunks; i++) {
            unsigned char good = CHUNK_GOOD;
            atomic_compare_exchange_strong(&f->state[i], &good, CHUNK_UNCHECKED);
        }
    }
    pthread_mutex_unlock(&f->lock);
}

/* A piece's room for the calling thread's checks, kept while the thread
 * lives (a fresh buffer per check cost its page faults and zeroing): NULL if
 * out of memory. */
static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_key_make(void)
{
    (void)pthread_key_create(&scratch_key, free);
}

static unsigned char *scratch_chunk(void)
{
    pthread_once(&scratch_once, scratch_key_make);
    unsigned char *buf = pthread_getspecific(scratch_key);
    if (!buf && (buf = malloc(CHECK_PIECE)) && pthread_setspecific(scratch_key, buf) != 0) {
        free(buf);
        buf = NULL;
    }
    return buf;
}

/* The chunks [*first, *last] that [off, off + len) of f touches, clipped to
 * its size: 1, or 0 when that leaves nothing. */
static int chunk_span(const struct diskcache_file *f, uint64_t off, size_t len, uint32_t *first,
                      uint32_t *last)
{
    if (off >= f->size || len == 0)
        return 0;
    if (len > f->size - off)
        len = (size_t)(f->size - off);
    *first = (uint32_t)(off / DISKCACHE_CHUNK);
    *last = (uint32_t)((off + len - 1) / DISKCACHE_CHUNK);
    return 1;
}

int diskcache_file_verify(struct diskcache_file *f, uint64_t off, size_t len)
{
    uint32_t first, last;
    if (!chunk_span(f, off, len, &first, &last))
        return 1;
    recheck_if_written(f);
    unsigned char *buf = NULL;
    uint64_t checked = 0;
    int ok = 1;
    for (uint32_t i = first; ok && i <= last; i++) {
        unsigned char s = atomic_load(&f->state[i]);
        for (;;) {
            if (s == CHUNK_BAD || (s == CHUNK_GOOD && resident(f, i)))
                break;
            if (s == CHUNK_CHECKING) { /* another thread reads it: wait for its answer */
                pthread_mutex_lock(&f->lock);
                while ((s = atomic_load(&f->state[i])) == CHUNK_CHECKING)
                    pthread_cond_wait(&f->checked, &f->lock);
                pthread_mutex_unlock(&f->lock);
                if (s == CHUNK_GOOD)
                    break; /* just read: resident */
                continue;
            }
            /* Unchecked, or checked but its pages left the page cache (what
             * the disk gives back is checked again): ours to read, if still so. */
            unsigned char was = s;
            if (!atomic_compare_exchange_strong(&f->state[i], &s, CHUNK_CHECKING))
                continue;
            if (!buf && !(buf = scratch_chunk())) {
                s = was;
                ok = 0;
            } else {
                s = (unsigned char)check_chunk(f, i, buf);
                checked += s == CHUNK_GOOD ? f->recs[i].len : 0;
            }
            pthread_mutex_lock(&f->lock);
            atomic_store(&f->state[i], s);
            pthread_cond_broadcast(&f->checked);
            pthread_mutex_unlock(&f->lock);
            break;
        }
        ok = ok && s == CHUNK_GOOD;
    }
    if (checked) { /* each byte counted once per f, as a fetch counts what it read; a
                    * miss is counted by the fetch the caller falls back to */
        dc_cache_lock(f->dc);
        f->dc->st.hits++;
        f->dc->st.hit_bytes += checked;
        dc_cache_unlock(f->dc);
    }
    return ok;
}

int diskcache_file_holds(struct diskcache_file *f, uint64_t off, size_t len)
{
    uint32_t first, last;
    if (!chunk_span(f, off, len, &first, &last))
        return 1;
    for (uint32_t i = first; i <= last; i++)
        if (atomic_load(&f->state[i]) == CHUNK_BAD)
            return 0;
    return 1;
}

int diskcache_file_unchecked(struct diskcache_file *f, uint64_t off, size_t len)
{
    uint32_t first, last;
    if (!chunk_span(f, off, len, &first, &last))
        return 0;
    for (uint32_t i = first; i <= last; i++) {
        if (atomic_load(&f->state[i]) == CHUNK_UNCHECKED)
            return 1;
    }
    return 0;
}

void diskcache_file_recheck_evicted(struct diskcache_file *f, uint64_t off, size_t len)
{
    uint32_t first, last;
    if (!chunk_span(f, off, len, &first, &last))
        return;
    for (uint32_t i = first; i <= last; i++) {
        unsigned char good = CHUNK_GOOD;
        if (atomic_load(&f->state[i]) == CHUNK_GOOD && !resident(f, i))
            atomic_compare_exchange_strong(&f->state[i], &good, CHUNK_UNCHECKED);
    }
}

int diskcache_file_fd(const struct diskcache_file *f)
{
    return f->fd;
}
