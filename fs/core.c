/*
 * fs/core.c - filesystem logic without FUSE (see core.h).
 *
 * Metadata cache: a chained hash from store path to the store's answer
 * (attributes, or ENOENT) with an expiry time. Listings fill it, so that
 * "ls -l" of a large S3 prefix costs a few LIST pages, not one HEAD per
 * entry. It is bounded: past META_MAX_ENTRIES, expired entries are purged
 * and, if that is not enough, everything is dropped.
 *
 * Lock order: core->meta_lock, then nothing; a file's ra_lock, then the
 * cache's lock (inside cache_prefetch).
 */
#include "core.h"

#include "cache.h"
#include "ckindex.h"
#include "log.h"
#include "readahead.h"
#include "strutil.h"
#include "workq.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define META_MAX_ENTRIES 262144
#define META_BUCKETS 65536

struct meta_entry {
    struct meta_entry *next;
    double expires;
    int err; /* 0 or -ENOENT */
    struct store_stat st;
    char path[];
};

struct core {
    struct store *store;
    struct core_config cfg;
    struct workq *wq;
    struct cache *cache;
    struct ckindex *index; /* NULL when no cache dir or the index cannot open */
    uid_t uid;
    gid_t gid;
    double started;

    pthread_mutex_t meta_lock;
    struct meta_entry **meta; /* META_BUCKETS chains; protected by meta_lock */
    size_t meta_count;

    atomic_uint_fast64_t read_bytes;      /* bytes returned to readers */
    atomic_uint_fast64_t item_prefetches; /* items prefetched whole, guided by the index */
    atomic_uint_fast64_t opens;

    /* Every open handle, so that an unmount can release the ones whose
     * RELEASE the kernel had not sent yet (a signal can end the loop between
     * a close() and its asynchronous RELEASE). Protected by files_lock. */
    pthread_mutex_t files_lock;
    struct core_file *files;
    int open_files; /* length of files */
};

struct core_file {
    struct cache_obj *obj;
    int fd; /* >= 0: the store gave a file descriptor; reads bypass the cache */
    pthread_mutex_t ra_lock;
    struct readahead ra; /* protected by ra_lock */
    /* Index-guided prefetch, protected by ra_lock: the item last read and
     * how far items have been requested ahead of it. */
    uint64_t item_start, item_end, items_ahead_end;
    unsigned item_streak;          /* consecutive reads that moved to the next item */
    uint64_t released_to;          /* blocks before this were released behind the reader */
    struct core_file *prev, *next; /* core->files, protected by core->files_lock */
};

void core_config_defaults(struct core_config *cfg)
{
    cfg->attr_timeout = 1.0;
    cfg->cache_size = 1ull << 30;
    cfg->block_size = 1u << 20;
    cfg->request_size = 8u << 20;
    cfg->readahead_min = 1u << 20;
    cfg->readahead_max = 256u << 20;
    cfg->workers = 8;
    cfg->cache_dir = NULL;
}

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* "/a/b" -> "a/b"; "/" -> "". */
static const char *store_path(const char *path)
{
    while (*path == '/')
        path++;
    return path;
}

/* ---- metadata cache ---- */

static size_t meta_bucket(const char *path)
{
    return str_hash(path, strlen(path)) % META_BUCKETS;
}

static void meta_purge_locked(struct core *core, int everything)
{
    double now = now_seconds();
    for (size_t i = 0; i < META_BUCKETS; i++) {
        struct meta_entry **pp = &core->meta[i];
        while (*pp) {
            struct meta_entry *e = *pp;
            if (everything || e->expires <= now) {
                *pp = e->next;
                free(e);
                core->meta_count--;
            } else {
                pp = &e->next;
            }
        }
    }
}

static void meta_put(struct core *core, const char *path, int err, const struct store_stat *st)
{
    if (core->cfg.attr_timeout <= 0)
        return;
    size_t b = meta_bucket(path);
    pthread_mutex_lock(&core->meta_lock);
    struct meta_entry **pp = &core->meta[b];
    while (*pp && strcmp((*pp)->path, path) != 0)
        pp = &(*pp)->next;
    struct meta_entry *e = *pp;
    if (!e) {
        if (core->meta_count >= META_MAX_ENTRIES) {
            meta_purge_locked(core, 0);
            if (core->meta_count >= META_MAX_ENTRIES)
                meta_purge_locked(core, 1);
            pp = &core->meta[b];
        }
        size_t n = strlen(path) + 1;
        e = malloc(sizeof *e + n);
        if (!e) {
            pthread_mutex_unlock(&core->meta_lock);
            return;
        }
        memcpy(e->path, path, n);
        e->next = core->meta[b];
        core->meta[b] = e;
        core->meta_count++;
    }
    e->expires = now_seconds() + core->cfg.attr_timeout;
    e->err = err;
    if (st)
        e->st = *st;
    else
        memset(&e->st, 0, sizeof e->st);
    pthread_mutex_unlock(&core->meta_lock);
}

/* Returns 1 and fills err and st when a fresh entry exists. */
static int meta_get(struct core *core, const char *path, int *err, struct store_stat *st)
{
    int found = 0;
    pthread_mutex_lock(&core->meta_lock);
    for (struct meta_entry *e = core->meta[meta_bucket(path)]; e; e = e->next) {
        if (strcmp(e->path, path) == 0) {
            if (e->expires > now_seconds()) {
                *err = e->err;
                *st = e->st;
                found = 1;
            }
            break;
        }
    }
    pthread_mutex_unlock(&core->meta_lock);
    return found;
}

/* Attributes of a store path, from the metadata cache or the store. */
static void to_stat(const struct core *core, const struct store_stat *s, struct stat *st)
{
    memset(st, 0, sizeof *st);
    if (s->is_dir) {
        st->st_mode = S_IFDIR | 0555;
        st->st_nlink = 2;
    } else {
        st->st_mode = S_IFREG | 0444;
        st->st_nlink = 1;
        st->st_size = (off_t)s->size;
        st->st_blocks = (blkcnt_t)((s->size + 511) / 512);
    }
    st->st_blksize = (blksize_t)core->cfg.block_size;
    st->st_uid = core->uid;
    st->st_gid = core->gid;
    st->st_mtim.tv_sec = s->mtime;
    st->st_ctim.tv_sec = s->mtime;
    st->st_atim.tv_sec = s->mtime;
}

/* One pass over a directory listing: every entry goes into the metadata
 * cache, a .metadata marks the directory as a checkpoint for the index, and
 * fill (if any) gets the entry for readdir. */
struct listing {
    struct core *core;
    const char *dir; /* store path of the directory */
    core_fill_fn fill;
    void *arg;
    char child[4096];
};

static int listing_entry(void *arg, const char *name, const struct store_stat *s)
{
    struct listing *l = arg;
    int n = snprintf(l->child, sizeof l->child, "%s%s%s", l->dir, *l->dir ? "/" : "", name);
    if (n > 0 && (size_t)n < sizeof l->child)
        meta_put(l->core, l->child, 0, s);
    if (l->core->index && !s->is_dir && strcmp(name, ".metadata") == 0)
        ckindex_notice(l->core->index, l->dir, s);
    if (!l->fill)
        return 0;
    struct stat st;
    to_stat(l->core, s, &st);
    return l->fill(l->arg, name, &st);
}

/* Inside a checkpoint directory, a load opens every shard file: one listing
 * of the directory answers all those lookups (a LIST page covers 1,000
 * files) instead of a HEAD per file. Returns 1 if dir was listed. */
static int relist_checkpoint_dir(struct core *core, const char *spath)
{
    const char *slash = strrchr(spath, '/');
    char dir[4096];
    size_t dlen = slash ? (size_t)(slash - spath) : 0;
    if (!core->index || dlen >= sizeof dir)
        return 0;
    memcpy(dir, spath, dlen);
    dir[dlen] = '\0';
    if (!ckindex_is_checkpoint(core->index, dir))
        return 0;
    struct listing l = {.core = core, .dir = dir};
    return core->store->ops->list(core->store, dir, listing_entry, &l) == 0;
}

static int lookup(struct core *core, const char *spath, struct store_stat *st)
{
    int err;
    if (meta_get(core, spath, &err, st))
        return err;
    if (relist_checkpoint_dir(core, spath) && meta_get(core, spath, &err, st))
        return err;
    err = core->store->ops->stat(core->store, spath, st);
    if (err == 0 || err == -ENOENT)
        meta_put(core, spath, err, err == 0 ? st : NULL);
    return err;
}

int core_getattr(struct core *core, const char *path, struct stat *st)
{
    struct store_stat s;
    int rc = lookup(core, store_path(path), &s);
    if (rc < 0)
        return rc;
    to_stat(core, &s, st);
    return 0;
}

int core_readdir(struct core *core, const char *path, core_fill_fn fill, void *arg)
{
    struct listing l = {.core = core, .dir = store_path(path), .fill = fill, .arg = arg};
    return core->store->ops->list(core->store, l.dir, listing_entry, &l);
}

/* Opening DIR/.metadata means DIR is a checkpoint: make sure it is indexed. */
static void notice_checkpoint(struct core *core, const char *spath, const struct store_stat *s)
{
    const char *slash = strrchr(spath, '/');
    const char *name = slash ? slash + 1 : spath;
    if (!core->index || strcmp(name, ".metadata") != 0)
        return;
    char dir[4096];
    size_t dlen = slash ? (size_t)(slash - spath) : 0;
    if (dlen >= sizeof dir)
        return;
    memcpy(dir, spath, dlen);
    dir[dlen] = '\0';
    ckindex_notice(core->index, dir, s);
}

int core_open(struct core *core, const char *path, int flags, struct core_file **out,
              int *keep_cache)
{
    if ((flags & O_ACCMODE) != O_RDONLY)
        return -EROFS;
    const char *spath = store_path(path);
    struct store_stat s;
    int rc = lookup(core, spath, &s);
    if (rc < 0)
        return rc;
    if (s.is_dir)
        return -EISDIR;
    notice_checkpoint(core, spath, &s);
    struct core_file *f = calloc(1, sizeof *f);
    if (!f)
        return -ENOMEM;
    f->obj = cache_obj_get(core->cache, spath, s.etag, s.size, keep_cache);
    if (!f->obj) {
        free(f);
        return -ENOMEM;
    }
    f->fd = -1;
    if (core->store->ops->open_fd) {
        f->fd = core->store->ops->open_fd(core->store, spath, s.etag);
        if (f->fd < 0)
            f->fd = -1; /* changed or vanished since the lookup: the cache path reports it */
    }
    pthread_mutex_init(&f->ra_lock, NULL);
    readahead_init(&f->ra, core->cfg.readahead_min, core->cfg.readahead_max);
    atomic_fetch_add(&core->opens, 1);
    pthread_mutex_lock(&core->files_lock);
    f->next = core->files;
    if (f->next)
        f->next->prev = f;
    core->files = f;
    core->open_files++;
    pthread_mutex_unlock(&core->files_lock);
    *out = f;
    return 0;
}

/* Index-guided prefetch. When the file belongs to an indexed checkpoint and
 * a read enters a new item, the whole item is fetched at once, in parallel
 * requests, ahead of the reader (a torch.load of an item seeks between the
 * zip's header, its directory at the end and the data: all of it is then
 * one round trip). While reads keep moving to the next item in layout order,
 * the items after it are fetched too, up to a window that doubles per step;
 * a partial load that skips items fetches only the items it touches.
 * Returns 1 if the read was planned here, 0 to leave it to the readahead
 * (no index, no item at off, or an item larger than the readahead window).
 * Called with f->ra_lock held. */
static int prefetch_items(struct core *core, struct core_file *f, uint64_t off)
{
    if (!core->index)
        return 0;
    if (off >= f->item_start && off < f->item_end)
        return f->item_end <= f->items_ahead_end; /* inside the current item */
    uint64_t max = core->cfg.readahead_max;
    unsigned streak = 0;
    struct ckindex_span sp[64];
    int n = ckindex_items(core->index, cache_obj_path(f->obj), off, 0, sp, 1);
    if (n == 0)
        return 0;
    if (sp[0].offset == f->item_end && f->item_end > 0)
        streak = f->item_streak + 1;
    uint64_t budget = streak ? (8ull << 20) << (streak < 6 ? streak : 6) : 0;
    if (budget > max)
        budget = max;
    if (budget)
        n = ckindex_items(core->index, cache_obj_path(f->obj), off, budget, sp, 64);
    f->item_start = sp[0].offset;
    f->item_end = sp[0].offset + sp[0].length;
    f->item_streak = streak;
    if (sp[0].length > max) {
        f->items_ahead_end = 0;
        return 0; /* a huge item: the readahead streams it */
    }
    uint64_t from = f->items_ahead_end > f->item_start ? f->items_ahead_end : f->item_start;
    for (int i = 0; i < n; i++) {
        uint64_t a = sp[i].offset, b = sp[i].offset + sp[i].length;
        if (b <= from)
            continue;
        if (a < from)
            a = from;
        cache_prefetch(core->cache, f->obj, a, b - a);
        atomic_fetch_add(&core->item_prefetches, 1);
        if (b > f->items_ahead_end)
            f->items_ahead_end = b;
    }
    return 1;
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

ssize_t core_read(struct core *core, struct core_file *f, void *buf, size_t len, uint64_t off)
{
    uint64_t size = cache_obj_size(f->obj);
    if (off >= size)
        return 0;
    if (len > size - off)
        len = (size_t)(size - off);
    pthread_mutex_lock(&f->ra_lock);
    if (!prefetch_items(core, f, off)) {
        uint64_t ahead_off, ahead_len;
        readahead_advise(&f->ra, off, len, size, &ahead_off, &ahead_len);
        if (ahead_len)
            cache_prefetch(core->cache, f->obj, ahead_off, ahead_len);
    }
    pthread_mutex_unlock(&f->ra_lock);
    ssize_t n = cache_read(core->cache, f->obj, off, len, buf);
    if (n > 0)
        atomic_fetch_add(&core->read_bytes, (uint64_t)n);
    release_behind(core, f, off);
    return n;
}

int core_read_direct(struct core *core, struct core_file *f, uint64_t off, size_t len, int *fd,
                     size_t *n)
{
    if (f->fd < 0)
        return 0;
    uint64_t size = cache_obj_size(f->obj);
    *n = off >= size ? 0 : (len < size - off ? len : (size_t)(size - off));
    *fd = f->fd;
    struct store_counters *sc = &core->store->counters;
    atomic_fetch_add(&sc->get_requests, 1);
    atomic_fetch_add(&sc->get_bytes, *n);
    atomic_fetch_add(&core->read_bytes, *n);
    return 1;
}

void core_release(struct core *core, struct core_file *f)
{
    pthread_mutex_lock(&core->files_lock);
    if (f->prev)
        f->prev->next = f->next;
    else
        core->files = f->next;
    if (f->next)
        f->next->prev = f->prev;
    core->open_files--;
    pthread_mutex_unlock(&core->files_lock);
    if (f->fd >= 0)
        close(f->fd);
    cache_obj_put(core->cache, f->obj);
    pthread_mutex_destroy(&f->ra_lock);
    free(f);
}

int core_stats_json(struct core *core, char *buf, size_t len)
{
    struct cache_stats cs;
    cache_get_stats(core->cache, &cs);
    pthread_mutex_lock(&core->files_lock);
    int open_files = core->open_files;
    pthread_mutex_unlock(&core->files_lock);
    struct ckindex_stats is = {0};
    if (core->index)
        ckindex_get_stats(core->index, &is);
    const struct store_counters *sc = &core->store->counters;
    return snprintf(
        buf, len,
        "{\"store\": \"%s\", \"uptime_s\": %.3f, \"open_files\": %d, \"opens\": %llu, "
        "\"read_bytes\": %llu, \"get_requests\": %llu, \"get_bytes\": %llu, "
        "\"head_requests\": %llu, \"list_requests\": %llu, \"retries\": %llu, \"errors\": %llu, "
        "\"cache\": {\"hits\": %llu, \"misses\": %llu, \"shared\": %llu, \"prefetched\": %llu, "
        "\"prefetch_skipped\": %llu, \"evictions\": %llu, \"released\": %llu, \"fetch_errors\": "
        "%llu, "
        "\"bytes_cached\": %llu, \"capacity\": %llu, \"block_size\": %u, \"buffers_mapped\": "
        "%llu, \"buffers_reused\": %llu}, "
        "\"index\": {\"enabled\": %s, \"ready\": %llu, \"built\": %llu, \"reused\": %llu, "
        "\"failed\": %llu, \"lookups\": %llu, \"item_prefetches\": %llu}}\n",
        core->store->ops->scheme, now_seconds() - core->started, open_files,
        (unsigned long long)atomic_load(&core->opens),
        (unsigned long long)atomic_load(&core->read_bytes),
        (unsigned long long)atomic_load(&sc->get_requests),
        (unsigned long long)atomic_load(&sc->get_bytes),
        (unsigned long long)atomic_load(&sc->head_requests),
        (unsigned long long)atomic_load(&sc->list_requests),
        (unsigned long long)atomic_load(&sc->retries), (unsigned long long)atomic_load(&sc->errors),
        (unsigned long long)cs.hits, (unsigned long long)cs.misses, (unsigned long long)cs.shared,
        (unsigned long long)cs.prefetched, (unsigned long long)cs.prefetch_skipped,
        (unsigned long long)cs.evictions, (unsigned long long)cs.released,
        (unsigned long long)cs.fetch_errors, (unsigned long long)cs.bytes_cached,
        (unsigned long long)cs.capacity, core->cfg.block_size,
        (unsigned long long)cs.buffers_mapped, (unsigned long long)cs.buffers_reused,
        core->index ? "true" : "false", (unsigned long long)is.ready, (unsigned long long)is.built,
        (unsigned long long)is.reused, (unsigned long long)is.failed,
        (unsigned long long)is.lookups, (unsigned long long)atomic_load(&core->item_prefetches));
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
    core->started = now_seconds();
    pthread_mutex_init(&core->meta_lock, NULL);
    pthread_mutex_init(&core->files_lock, NULL);
    core->meta = calloc(META_BUCKETS, sizeof *core->meta);
    int rc = core->meta ? workq_create(cfg->workers, &core->wq) : -ENOMEM;
    if (rc == 0) {
        struct cache_config cc = {.capacity = cfg->cache_size,
                                  .block_size = cfg->block_size,
                                  .request_size = cfg->request_size};
        rc = cache_create(store, core->wq, &cc, &core->cache);
    }
    if (rc == 0 && cfg->cache_dir) {
        char err[512];
        if (ckindex_open(cfg->cache_dir, store->description, store, core->wq, &core->index, err,
                         sizeof err) < 0)
            log_warn("checkpoint index disabled: %s", err);
    }
    if (rc < 0) {
        workq_destroy(core->wq);
        pthread_mutex_destroy(&core->files_lock);
        pthread_mutex_destroy(&core->meta_lock);
        free(core->meta);
        free(core);
        return rc;
    }
    *out = core;
    return 0;
}

void core_destroy(struct core *core)
{
    if (!core)
        return;
    cache_cancel(core->cache);
    ckindex_cancel(core->index);
    workq_destroy(core->wq); /* waits for fetches and builds already under way */
    while (core->files)      /* opened, but the loop ended before their RELEASE */
        core_release(core, core->files);
    pthread_mutex_destroy(&core->files_lock);
    cache_destroy(core->cache);
    ckindex_close(core->index);
    pthread_mutex_lock(&core->meta_lock);
    meta_purge_locked(core, 1);
    pthread_mutex_unlock(&core->meta_lock);
    pthread_mutex_destroy(&core->meta_lock);
    free(core->meta);
    free(core);
}
