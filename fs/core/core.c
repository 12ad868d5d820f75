/*
 * fs/core/core.c - the top of the core (see core.h): its life cycle, open
 * (for reading here; for writing through core_write.c), reads with their
 * readahead and index-guided prefetch, and what a publish changes. Lookups
 * and listings are in listing.c over the metadata cache (meta.c), handles
 * in files.c, statistics in stats.c, changes to files and names in
 * core_write.c.
 *
 * Lock order: see core_internal.h.
 */
#include "core_internal.h"

#include "ckpt.h"
#include "clock.h"
#include "fdio.h"

#include "log.h"
#include "strutil.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void core_config_defaults(struct core_config *cfg)
{
    *cfg = (struct core_config){0}; /* every field has a value (stats_interval: 0, none) */
    cfg->attr_timeout = 1.0;
    cfg->cache_size = 1ull << 30;
    /* Small blocks: a fetch covers the bytes wanted to within 64 KiB at each
     * end (requests are still request_size: a run of blocks is one GET).
     * 8 MiB GETs, for items too: a server's cost per request is what a load
     * pays on s3rver (1 MiB: 1.9x the time) and on S3 (tens of ms to the
     * first byte), and blocks are handed out as their bytes arrive, so a
     * reader does not wait for a whole GET (docs/design.md). */
    cfg->block_size = 64u << 10;
    cfg->request_size = 8u << 20;
    cfg->readahead_min = 1u << 20;
    cfg->readahead_max = 256u << 20;
    cfg->kernel_readahead = 256u << 10;
    cfg->direct_reads = CORE_DIRECT_READS_SHARDED;
    cfg->workers = 8;
    cfg->disk_cache_min_free = 5;
    cfg->cache_dir = NULL;
    cfg->writable = 1;
    stage_config_defaults(&cfg->stage);
}

/* Opening DIR/.metadata means DIR is a checkpoint: make sure it is indexed.
 * 1 if spath is a file of a checkpoint directory (its listing was kept). */
static int notice_checkpoint(struct core *core, const char *spath, const struct store_stat *s)
{
    char dir[4096];
    if (!core->index || path_dir(spath, dir, sizeof dir) != 0)
        return 0;
    if (strcmp(path_base(spath), ".metadata") == 0)
        ckindex_notice(core->index, dir, s);
    if (!ckindex_is_checkpoint(core->index, dir))
        return 0;
    core_keep_listing(core, dir);
    return 1;
}

int core_open(struct core *core, const char *path, int flags, struct core_file **out,
              int *keep_cache)
{
    const char *spath = core_store_path(path);
    *keep_cache = 0;
    if ((flags & O_ACCMODE) != O_RDONLY || (flags & O_TRUNC))
        return core_open_write(core, spath, flags, out);
    struct wfile *wf = core->stage ? stage_get(core->stage, spath) : NULL;
    if (wf) /* being written: read what staging has */
        return core_file_staged(core, wf, 0, out);
    struct store_stat s;
    int rc = core_lookup_store(core, spath, &s);
    if (rc < 0)
        return rc;
    if (s.is_dir)
        return -EISDIR;
    int in_checkpoint = notice_checkpoint(core, spath, &s);
    struct core_file *f = core_file_new();
    if (!f)
        return -ENOMEM;
    f->in_checkpoint = in_checkpoint;
    f->obj = cache_obj_get(core->cache, spath, s.etag, s.size, keep_cache);
    if (!f->obj) {
        pthread_mutex_destroy(&f->ra_lock);
        free(f);
        return -ENOMEM;
    }
    if (core->store->ops->open_fd) {
        f->fd = core->store->ops->open_fd(core->store, spath, s.etag);
        if (f->fd >= 0 && fstat(f->fd, &f->fd_st) < 0) {
            close(f->fd);
            f->fd = -1;
        }
        if (f->fd < 0)
            f->fd = -1; /* changed or vanished since the lookup: the cache path reports it */
    }
    readahead_init(&f->ra, core->cfg.readahead_min, core->cfg.readahead_max);
    /* How far readers read past what they want: the kernel keeps up to two
     * readahead windows ahead of a sequential reader, after a buffer. */
    prefetch_init(&f->pf, core->cfg.readahead_max,
                  2 * (uint64_t)core->cfg.kernel_readahead + PREFERRED_IO_SIZE);
    core_file_link(core, f);
    *out = f;
    return 0;
}

/* The furthest read asked of another open handle of f's file that ends at off, or
 * within `within` bytes before it with the bytes between cached (the kernel
 * skipped them): where a read stream of the file's page cache ended. 0 if
 * none. Reads other handles' read fronts without their locks (atomics);
 * called with f->ra_lock held: takes files_lock (a leaf), then the cache's. */
static uint64_t stream_of_others(struct core *core, struct core_file *f, uint64_t off,
                                 uint64_t within)
{
    uint64_t best = 0;
    pthread_mutex_lock(&core->files_lock);
    for (struct core_file *g = core->files; g; g = g->next) {
        if (g == f || g->obj != f->obj)
            continue;
        uint64_t e = atomic_load(&g->asked_front);
        if (e > 0 && e <= off && off - e <= within && e > best)
            best = e;
    }
    pthread_mutex_unlock(&core->files_lock);
    if (best && best < off && !cache_has(core->cache, f->obj, best, off))
        return 0;
    return best;
}

/* Index-guided prefetch: when the file belongs to an indexed checkpoint and
 * a read enters a new item, ask the index for the item and the ones after it
 * that the rule (prefetch.h) may speculate on, and fetch what it says in
 * parallel requests. Returns 1 if the read was planned here (the readahead
 * stays out), 0 to leave it to the readahead (no index, no item at off, or
 * an item larger than the readahead window). While the file's index is being built, reads fetch
 * only what they ask for. *entered is set to the item's offset when the read
 * confirmed that it is in a new item. Called with f->ra_lock held. */
static int prefetch_items(struct core *core, struct core_file *f, uint64_t off, size_t len,
                          uint64_t *entered)
{
    if (!core->index)
        return 0;
    /* A read past cached bytes after a stream's end continues that stream:
     * the kernel skipped pages another rank's reads brought in. */
    uint64_t probe, from = prefetch_stream_before(&f->pf, off, f->pf.overshoot);
    if (!from || !cache_has(core->cache, f->obj, from, off))
        from = off;
    if (!prefetch_is_end(&f->pf, from) && prefetch_leaves_item(&f->pf, off)) {
        /* ... or a stream another handle of the file ended (the kernel sends
         * its readahead on the handle of whichever reader hit its mark) */
        uint64_t e = stream_of_others(core, f, off, f->pf.overshoot);
        if (e) {
            prefetch_adopt_end(&f->pf, e);
            from = e;
        }
    }
    if (!prefetch_read_after(&f->pf, off, len, from, &probe))
        return prefetch_planned(&f->pf);
    struct ckindex_span sp[64];
    const char *path = cache_obj_path(f->obj);
    int n = ckindex_items(core->index, path, probe, 0, sp, 1);
    if (n == 0) /* a load's first reads may come before its index: no guesses then */
        return ckindex_building(core->index, path);
    struct prefetch_span cur = {sp[0].offset, sp[0].length};
    struct ckindex_span at;
    if (probe != off && ckindex_items(core->index, path, off, 0, &at, 1) == 1 &&
        prefetch_ambiguous(off, (struct prefetch_span){at.offset, at.length}, cur))
        return 1; /* which item the read is for is unknown: its own bytes only */
    uint64_t budget = prefetch_budget(&f->pf, cur);
    if (budget) {
        /* The index may be rebuilt in between: use the longer answer only if
         * it starts with the same item. */
        int more = ckindex_items(core->index, path, probe, cur.length + budget, sp, 64);
        n = more > 0 && sp[0].offset == cur.offset && sp[0].length == cur.length ? more : 1;
    }
    struct prefetch_span next[63], out[64];
    for (int i = 1; i < n; i++)
        next[i - 1] = (struct prefetch_span){sp[i].offset, sp[i].length};
    int k = prefetch_enter(&f->pf, cur, next, n - 1, out);
    if (prefetch_confirmed(&f->pf))
        *entered = cur.offset; /* a read is in this item for sure: its siblings are wanted */
    for (int i = 0; i < k; i++) {
        log_debug("prefetch: %s item %llu+%llu: fetch %llu+%llu", path,
                  (unsigned long long)cur.offset, (unsigned long long)cur.length,
                  (unsigned long long)out[i].offset, (unsigned long long)out[i].length);
        if (out[i].offset < cur.offset + cur.length) /* the item being read: now */
            cache_prefetch(core->cache, f->obj, out[i].offset, out[i].length);
        else /* speculation: only while readers keep up */
            cache_prefetch_ahead(core->cache, f->obj, out[i].offset, out[i].length);
    }
    atomic_fetch_add(&core->item_prefetches, (uint64_t)k);
    return prefetch_planned(&f->pf);
}

/* The version of spath to prefetch: the one open handles read, with *front
 * set to how far their reads have gone, else a fresh answer of the metadata
 * cache (*front = 0). Never asks the store (a reader's thread runs this).
 * 1 if open, 0 if only cached, -ENOENT if unknown. */
static int version_to_prefetch(struct core *core, const char *spath, struct store_stat *st,
                               uint64_t *front)
{
    int open = 0;
    *front = 0;
    pthread_mutex_lock(&core->files_lock);
    for (struct core_file *g = core->files; g; g = g->next) {
        if (!g->obj || strcmp(cache_obj_path(g->obj), spath) != 0)
            continue;
        uint64_t at = atomic_load(&g->read_front);
        if (!open) {
            memset(st, 0, sizeof *st);
            snprintf(st->etag, sizeof st->etag, "%s", cache_obj_etag(g->obj));
            st->size = cache_obj_size(g->obj);
        }
        open = 1;
        if (at > *front)
            *front = at;
    }
    pthread_mutex_unlock(&core->files_lock);
    if (open)
        return 1;
    int err;
    if (meta_find(&core->meta, spath, &err, st) != META_FRESH || err != 0 || st->is_dir)
        return -ENOENT;
    return 0;
}

/* Cohort prefetch (cohort.h): a read entered the item at offset item of f's
 * file. If it is a chunk of a sharded tensor, the tensor's other chunks that
 * this mount's loaders are going to read are fetched whole now, so the rank
 * that gets there first fetches for the rest instead of each rank waiting
 * for its own chunk. Going to read: the chunk's saved rank is being loaded
 * here, and its file is open with every reader still before the chunk, or
 * was never opened (a per-item layout opens the file when it gets there).
 * A chunk a reader has passed is not fetched again, even if evicted. */
static void prefetch_siblings(struct core *core, struct core_file *f, uint64_t item)
{
    struct ckindex_chunk ch[16];
    const char *path = cache_obj_path(f->obj);
    int n = ckindex_siblings(core->index, path, item, ch, 16);
    if (n == 0)
        return; /* not a chunk of a sharded tensor */
    const char *base = strrchr(path, '/');
    size_t dlen = base ? (size_t)(base - path) : 0;
    double now = mono_seconds();
    cohort_touch(core->cohort, path, dlen, ckpt_rank_of(path), now);
    for (int i = 0; i < n; i++) {
        char spath[4096];
        struct store_stat st;
        uint64_t front;
        if (ch[i].length > core->cfg.readahead_max ||
            !cohort_active(core->cohort, path, dlen, ch[i].rank, now))
            continue;
        if (snprintf(spath, sizeof spath, "%.*s%s%s", (int)dlen, path, dlen ? "/" : "",
                     ch[i].name) >= (int)sizeof spath)
            continue;
        int open = version_to_prefetch(core, spath, &st, &front);
        if (open < 0 || ch[i].offset + ch[i].length > st.size || (open && front > ch[i].offset))
            continue;
        int opened;
        struct cache_obj *o = cache_obj_ref(core->cache, spath, st.etag, st.size, &opened);
        if (!o)
            continue;
        if ((open || !opened) &&
            cache_prefetch_ahead(core->cache, o, ch[i].offset, ch[i].length) > 0)
            atomic_fetch_add(&core->sibling_prefetches, 1);
        cache_obj_unref(core->cache, o);
    }
}

/* Free-behind for a sequential stream: the blocks it has passed by more than
 * the reordering tolerance go back to the allocator (see
 * cache_release_behind). Random and item-guided readers keep their blocks. */
static void release_behind(struct core *core, struct core_file *f, uint64_t off)
{
    const uint64_t keep = 8u << 20; /* > the readahead's reordering tolerance */
    uint64_t from, to = off > keep ? off - keep : 0;
    pthread_mutex_lock(&f->ra_lock);
    int streaming = f->ra.window >= f->ra.max_window / 2 && to > f->released_to;
    from = f->released_to;
    if (streaming)
        f->released_to = to;
    pthread_mutex_unlock(&f->ra_lock);
    if (streaming)
        cache_release_behind(core->cache, f->obj, from, to);
}

/* A read of a staged file: its staging file has the bytes (holes are zeros). */
static ssize_t read_staged(struct core *core, struct core_file *f, void *buf, size_t len,
                           uint64_t off)
{
    uint64_t size;
    int fd = stage_fd(core->stage, f->wf, &size);
    if (off >= size)
        return 0;
    if (len > size - off)
        len = (size_t)(size - off);
    size_t done;
    int rc = pread_full(fd, buf, len, off, &done);
    if (rc < 0)
        return rc;
    memset((char *)buf + done, 0, len - done); /* a hole at the end not yet materialised */
    atomic_fetch_add(&core->read_bytes, len);
    return (ssize_t)len;
}

/* The largest readahead window of one of n sequential streams: together
 * they may hold at most half the cache ahead of their readers, so that
 * under pressure their prefetched blocks leave room for demand reads and
 * for what was just read (the kernel re-reads some of it); never more than
 * --readahead. */
static uint64_t stream_share(const struct core *core, unsigned n)
{
    uint64_t share = core->cfg.cache_size / 2 / (n ? n : 1);
    return share < core->cfg.readahead_max ? share : core->cfg.readahead_max;
}

static void plan_ahead(struct core *core, struct core_file *f, uint64_t off, size_t len,
                       uint64_t size);
static void note_read(struct core *core, struct core_file *f, uint64_t off, uint64_t n);

ssize_t core_read(struct core *core, struct core_file *f, void *buf, size_t len, uint64_t off)
{
    if (f->wf)
        return read_staged(core, f, buf, len, off);
    uint64_t size = cache_obj_size(f->obj);
    if (off >= size)
        return 0;
    if (len > size - off)
        len = (size_t)(size - off);
    plan_ahead(core, f, off, len, size);
    ssize_t n = cache_read(core->cache, f->obj, off, len, buf);
    if (n > 0)
        note_read(core, f, off, (uint64_t)n);
    release_behind(core, f, off);
    return n;
}

/* A read of [off, off + len) of f (len > 0, within size) is coming: prefetch
 * for it and for what comes next, guided by the index or by the stream's
 * readahead (with a disk cache copy, its chunks are checked ahead instead). */
static void plan_ahead(struct core *core, struct core_file *f, uint64_t off, size_t len,
                       uint64_t size)
{
    uint64_t entered = UINT64_MAX;
    log_debug("read: %s %llu+%zu", cache_obj_path(f->obj), (unsigned long long)off, len);
    for (uint64_t end = off + len, at = atomic_load(&f->asked_front);
         end > at && !atomic_compare_exchange_weak(&f->asked_front, &at, end);)
        ;
    pthread_mutex_lock(&f->ra_lock);
    if (!prefetch_items(core, f, off, len, &entered)) {
        uint64_t ahead_off, ahead_len;
        unsigned streams = atomic_load(&core->streams) + (f->streaming ? 0 : 1);
        readahead_set_max(&f->ra, stream_share(core, streams));
        readahead_advise(&f->ra, off, len, size, &ahead_off, &ahead_len);
        if (ahead_len) {
            log_debug("readahead: %s fetch %llu+%llu", cache_obj_path(f->obj),
                      (unsigned long long)ahead_off, (unsigned long long)ahead_len);
            cache_prefetch(core->cache, f->obj, ahead_off, ahead_len);
        }
    } else {
        /* the item rule has it: a window left from streaming a larger item
         * must not make release_behind drop this item's fetched blocks */
        f->ra.window = 0;
    }
    core_stream_note(core, f);
    pthread_mutex_unlock(&f->ra_lock);
    if (entered != UINT64_MAX)
        prefetch_siblings(core, f, entered);
}

/* n bytes at off of f went to a reader. */
static void note_read(struct core *core, struct core_file *f, uint64_t off, uint64_t n)
{
    atomic_fetch_add(&core->read_bytes, n);
    uint64_t end = off + n, at = atomic_load(&f->read_front);
    while (end > at && !atomic_compare_exchange_weak(&f->read_front, &at, end))
        ;
}

int core_read_direct(struct core *core, struct core_file *f, uint64_t off, size_t len, int *fd,
                     size_t *n)
{
    if (f->wf) {
        uint64_t size;
        int sfd = stage_fd(core->stage, f->wf, &size);
        struct stat sb;
        /* Splice only what the staging file holds: a cut past its end
         * (size grown by truncate) is read as zeros by read_staged. */
        if (off >= size || fstat(sfd, &sb) < 0 || (uint64_t)sb.st_size < size)
            return 0;
        *n = len < size - off ? len : (size_t)(size - off);
        *fd = sfd;
        atomic_fetch_add(&core->read_bytes, *n);
        return 1;
    }
    if (f->fd < 0) {
        /* The disk cache's checked copy of the opened version (issue #22): the
         * kernel splices it from that file, as from a local store's. */
        uint64_t size = f->obj ? cache_obj_size(f->obj) : 0;
        if (off >= size || len == 0)
            return 0;
        *n = len < size - off ? len : (size_t)(size - off);
        if (!cache_disk_holds(core->cache, f->obj, off, *n))
            return 0;
        plan_ahead(core, f, off, *n, size); /* checks the chunks of what comes next */
        if (!cache_disk_fd(core->cache, f->obj, off, *n, fd))
            return 0; /* core_read fetches it (and plans again: no harm) */
        note_read(core, f, off, *n);
        atomic_fetch_add(&core->disk_reads, 1);
        return 1;
    }
    uint64_t size = cache_obj_size(f->obj);
    struct stat sb;
    if (fstat(f->fd, &sb) < 0 || sb.st_size != f->fd_st.st_size ||
        sb.st_mtim.tv_sec != f->fd_st.st_mtim.tv_sec ||
        sb.st_mtim.tv_nsec != f->fd_st.st_mtim.tv_nsec)
        return 0; /* rewritten in place: the opened version is gone (the cache path: ESTALE) */
    *n = off >= size ? 0 : (len < size - off ? len : (size_t)(size - off));
    *fd = f->fd;
    struct store_counters *sc = &core->store->counters;
    atomic_fetch_add(&sc->get_requests, 1);
    atomic_fetch_add(&sc->get_bytes, *n);
    atomic_fetch_add(&core->read_bytes, *n);
    return 1;
}

/* A disk copy is checked whole at open for passthrough if the file is this
 * small, or is one item of its checkpoint (a load reads it whole anyway) up
 * to the second size; else reads go through the daemon, which checks only
 * the chunks they touch (a partial read of a larger file reads no more, and
 * an open never waits for a long check). */
#define PASSTHROUGH_SMALL_FILE (8u << 20)
#define PASSTHROUGH_ONE_ITEM_MAX (256u << 20)

/* Whether a disk copy of spath, size bytes, may be checked whole at open. */
static int checkable_at_open(struct core *core, const char *spath, uint64_t size)
{
    if (size <= PASSTHROUGH_SMALL_FILE)
        return 1;
    struct ckindex_span sp[2];
    return size <= PASSTHROUGH_ONE_ITEM_MAX && core->index &&
           ckindex_items(core->index, spath, 0, size, sp, 2) == 1 &&
           sp[0].offset + sp[0].length >= size;
}

/* Check ahead the disk copy of file path if the disk cache holds it whole
 * and an open would check it (metadata cache only: never asks the store).
 * 1 if path is a known file, 0 if the metadata cache does not know it. */
static int check_ahead_file(struct core *core, const char *path)
{
    struct store_stat st;
    uint64_t front;
    if (version_to_prefetch(core, path, &st, &front) < 0)
        return 0;
    if (!checkable_at_open(core, path, st.size))
        return 1;
    int opened;
    struct cache_obj *o = cache_obj_ref(core->cache, path, st.etag, st.size, &opened);
    if (!o)
        return 1;
    if (cache_disk_holds(core->cache, o, 0, st.size))
        (void)cache_prefetch_ahead(core->cache, o, 0, st.size);
    cache_obj_unref(core->cache, o);
    return 1;
}

/* Files of its rank that the open of a rank's file checks ahead (the
 * workers' bound on checks in flight, the working set, holds back the rest). */
#define CHECK_AHEAD_FILES 8

/* Ranks whose first file the open of a .metadata checks ahead, at most. */
#define CHECK_AHEAD_RANKS 4096

/* Check ahead the disk copies of the files a per-item load (torch 1.13's
 * names) reads next, so that their opens find them checked: after spath
 * (__R_K.distcp), __R_K+1 .. __R_K+CHECK_AHEAD_FILES of the same rank R
 * (checks wait for the disk: several files in flight keep it busy while the
 * rank reads one); after the
 * directory's .metadata (every rank reads it first), each rank's first file
 * __R_0 that the disk cache holds (what this node saved or read before). */
static void check_next_files(struct core *core, const char *spath)
{
    const char *base = strrchr(spath, '/');
    base = base ? base + 1 : spath;
    int dirlen = (int)(base - spath);
    char path[4096];
    if (strcmp(base, ".metadata") == 0) {
        for (unsigned rank = 0; rank < CHECK_AHEAD_RANKS; rank++)
            if (snprintf(path, sizeof path, "%.*s__%u_0.distcp", dirlen, spath, rank) >=
                    (int)sizeof path ||
                !check_ahead_file(core, path))
                return;
        return;
    }
    unsigned rank, k;
    int end = 0;
    if (sscanf(base, "__%u_%u.distcp%n", &rank, &k, &end) != 2 || base[end] != '\0')
        return;
    for (unsigned next = k + 1; next <= k + CHECK_AHEAD_FILES; next++)
        if (snprintf(path, sizeof path, "%.*s__%u_%u.distcp", dirlen, spath, rank, next) <
            (int)sizeof path)
            (void)check_ahead_file(core, path);
}

int core_file_disk_copy(struct core *core, struct core_file *f, int *fd)
{
    if (f->wf || f->fd >= 0 || !f->obj || f->writable || !core->disk)
        return 0;
    const char *spath = cache_obj_path(f->obj);
    uint64_t size = cache_obj_size(f->obj);
    if (size == 0 || !cache_disk_holds(core->cache, f->obj, 0, size))
        return 0;
    if (!checkable_at_open(core, spath, size))
        return 0;
    (void)cache_prefetch(core->cache, f->obj, 0, size); /* checks its chunks, several at once */
    check_next_files(core, spath);
    return cache_disk_fd(core->cache, f->obj, 0, size, fd);
}

const void *core_file_version(const struct core_file *f, uint64_t *size)
{
    if (f->wf || f->fd >= 0 || !f->obj)
        return NULL;
    *size = cache_obj_size(f->obj);
    return f->obj;
}

void core_note_passthrough(struct core *core)
{
    atomic_fetch_add(&core->passthrough_opens, 1);
}

void core_release(struct core *core, struct core_file *f)
{
    core_file_release(core, f, 0);
}

/* The stage published a file: the store has it now, with this version. */
static void on_publish(void *arg, const char *path, const struct store_stat *st,
                       const struct stage_commit_snapshot *commit)
{
    struct core *core = arg;
    meta_put(&core->meta, path, 0, st, 0);
    pthread_mutex_lock(&core->files_lock);
    for (struct core_file *f = core->files; f; f = f->next)
        if (f->obj && strcmp(cache_obj_path(f->obj), path) == 0 &&
            strcmp(cache_obj_etag(f->obj), st->etag) != 0)
            f->superseded = 1;
    pthread_mutex_unlock(&core->files_lock);
    char dir[4096];
    if (path_dir(path, dir, sizeof dir) != 0)
        return;
    core_extend_listings(core, dir);
    core_dir_published_in(core, dir); /* issue #18 */
    /* A new object is the newest below each directory above it (store.h's
     * rule): they show its time now, not when their listings are next asked. */
    char up[4096];
    memcpy(up, dir, strlen(dir) + 1);
    for (;;) { /* "a/b", "a", "" (the root) */
        dirtime_touch(core->dirtimes, up, st->mtime_ns);
        if (!*up)
            break;
        char *slash = strrchr(up, '/');
        *(slash ? slash : up) = '\0';
    }
    if (!core->index)
        return;
    /* A per-rank metadata file (use_collectives=False) joins the ones of
     * its directory noticed so far; its index is built from the store. */
    if (ckpt_rank_metadata_of(path_base(path)) >= 0)
        ckindex_notice_file(core->index, dir, path_base(path), st);
    if (strcmp(path_base(path), ".metadata") != 0)
        return;
    /* Loads right after a save use the index: built from what was published
     * (no requests), or else from the store. */
    if (commit)
        ckindex_notice_published(core->index, dir, st, commit->bytes, commit->len, commit->files,
                                 commit->nfiles);
    else
        ckindex_notice(core->index, dir, st);
}

/* The stage deletes a clean staged file: it becomes the disk cache's copy
 * of the version it was uploaded as (stage.h's on_retire). */
static int on_retire(void *arg, const char *path, const char *etag, uint64_t size, const char *file)
{
    struct core *core = arg;
    struct diskcache_version v = {.path = path, .etag = etag, .size = size};
    return core->disk ? diskcache_adopt(core->disk, &v, file) : -ENOENT;
}

/* Bytes of fetched chunks waiting for the disk at once, at most: a quarter
 * of the read cache, whose blocks they are (lent, pinned, not copied), and
 * at least 16 MiB. 64 MiB dropped 3-5% of a per-rank 1 GiB cold load's
 * chunks on 2 busy cores (docs/bench-load.md "A read checkpoint kept whole"). */
static uint64_t disk_fill_queue(const struct core *core)
{
    uint64_t quarter = core->cfg.cache_size / 4;
    return quarter > (16ull << 20) ? quarter : 16ull << 20;
}

/* --disk-cache-size: open CACHE_DIR/disk-cache and its writer. 0, -EBUSY
 * (another process has it: logged), or 0 without a disk cache (logged) when
 * it cannot be used otherwise: reads go to the store. */
static int open_disk_cache(struct core *core)
{
    if (!core->cfg.cache_dir || core->cfg.disk_cache_size == 0)
        return 0;
    if (core->store->ops->open_fd) {
        log_info("disk cache not used: %s is a local directory (reads come from its files)",
                 core->store->description);
        return 0;
    }
    char *dir = str_printf("%s/disk-cache", core->cfg.cache_dir);
    if (!dir)
        return -ENOMEM;
    struct diskcache_config dcc = {.capacity = core->cfg.disk_cache_size,
                                   .floor_percent = (unsigned)core->cfg.disk_cache_min_free};
    char err[512] = "";
    int rc = diskcache_open(dir, &dcc, &core->disk, err, sizeof err);
    if (rc == -EBUSY) {
        log_error("%s", err);
    } else if (rc < 0) {
        log_warn("disk cache %s disabled: %s", dir, err);
        rc = 0;
    } else if ((rc = diskfill_create(core->disk, disk_fill_queue(core), &core->fill)) < 0) {
        diskcache_close(core->disk);
        core->disk = NULL;
    } else {
        cache_set_disk(core->cache, core->disk, core->fill);
        log_info("disk cache %s: up to %llu MiB", dir,
                 (unsigned long long)(core->cfg.disk_cache_size >> 20));
    }
    free(dir);
    return rc;
}

static int open_stage(struct core *core, char *err, size_t errlen)
{
    struct stage_config sc = core->cfg.stage;
    char *dir = str_printf("%s/stage", core->cfg.cache_dir);
    if (!dir)
        return -ENOMEM;
    sc.dir = dir;
    sc.on_publish = on_publish;
    sc.on_publish_arg = core;
    if (core->disk) {
        sc.on_retire = on_retire;
        sc.on_retire_arg = core;
    }
    int rc = stage_open(core->store, core->store->description, &sc, &core->stage, err, errlen);
    free(dir);
    return rc;
}

int core_create(struct store *store, const struct core_config *cfg, struct core **out)
{
    struct core *core = calloc(1, sizeof *core);
    if (!core)
        return -ENOMEM;
    core->store = store;
    core->cfg = *cfg;
    if (core->cfg.readahead_max > cfg->cache_size / 4)
        core->cfg.readahead_max = cfg->cache_size / 4;
    if (core->cfg.readahead_min > core->cfg.readahead_max)
        core->cfg.readahead_min = core->cfg.readahead_max;
    core->uid = getuid();
    core->gid = getgid();
    core->started = mono_seconds();
    core->dirtimes = dirtime_create();
    pthread_mutex_init(&core->files_lock, NULL);
    pthread_mutex_init(&core->listing_lock, NULL);
    pthread_cond_init(&core->listing_done, NULL);
    int meta_rc = meta_init(&core->meta, cfg->attr_timeout, LISTING_LINGER);
    /* Ranks stay "being read" this long after their last file closed: the
     * gap between two files of a per-item load. */
    core->cohort = cohort_create(2.0);
    int rc = meta_rc == 0 && core->cohort && core->dirtimes ? workq_create(cfg->workers, &core->wq)
                                                            : -ENOMEM;
    if (rc == 0) {
        /* A GET is a run of whole blocks: --request-size 1.3M means 1.25M. */
        uint32_t bs = cfg->block_size, whole = bs ? cfg->request_size / bs * bs : 0;
        struct cache_config cc = {
            .capacity = cfg->cache_size, .block_size = bs, .request_size = whole > bs ? whole : bs};
        rc = cache_create(store, core->wq, &cc, &core->cache);
    }
    if (rc == 0)
        rc = open_disk_cache(core);
    if (rc == 0 && cfg->cache_dir) {
        char err[512];
        if (ckindex_open(cfg->cache_dir, store->description, store, core->wq, core_known_file, core,
                         &core->index, err, sizeof err) < 0)
            log_warn("checkpoint index disabled: %s", err);
    }
    if (rc == 0 && cfg->cache_dir && cfg->writable && store->ops->put) {
        char err[512] = "";
        rc = open_stage(core, err, sizeof err);
        if (rc < 0)
            log_error("cannot start the write path: %s", err);
    }
    if (rc < 0) {
        cache_cancel(core->cache);
        ckindex_cancel(core->index);
        workq_destroy(core->wq);
        diskfill_destroy(core->fill);
        cache_destroy(core->cache);
        diskcache_close(core->disk);
        ckindex_close(core->index);
        pthread_mutex_destroy(&core->files_lock);
        meta_destroy(&core->meta);
        pthread_mutex_destroy(&core->listing_lock);
        pthread_cond_destroy(&core->listing_done);
        cohort_destroy(core->cohort);
        dirtime_destroy(core->dirtimes);
        free(core);
        return rc;
    }
    if (cfg->stats_interval > 0 &&
        xferlog_start(cfg->stats_interval, core_sample_counters, core, &core->xferlog) < 0)
        log_warn("no transfer summaries: cannot start their thread");
    *out = core;
    return 0;
}

void core_destroy(struct core *core)
{
    if (!core)
        return;
    xferlog_stop(core->xferlog); /* the last summary; it samples the stage, closed next */
    while (core->files)          /* opened, but the loop ended before their RELEASE */
        core_file_release(core, core->files, 1);
    stage_close(core->stage); /* publishes what is staged (its callbacks use the rest) */
    cache_cancel(core->cache);
    ckindex_cancel(core->index);
    workq_destroy(core->wq); /* waits for fetches and builds already under way */
    pthread_mutex_destroy(&core->files_lock);
    diskfill_destroy(core->fill); /* writes the chunks still queued */
    cache_destroy(core->cache);
    diskcache_close(core->disk); /* after the stage: it adopts staged files */
    ckindex_close(core->index);
    meta_destroy(&core->meta);
    core_notices_clear(core);
    assert(!core->listings); /* every lookup has returned */
    pthread_mutex_destroy(&core->listing_lock);
    pthread_cond_destroy(&core->listing_done);
    cohort_destroy(core->cohort);
    dirtime_destroy(core->dirtimes);
    free(core);
}
