/*
 * fs/core/core.c - filesystem logic without FUSE (see core.h): the metadata
 * cache, lookups and listings (the store's answers with the staging overlay
 * on top), opening and reading files, statistics, and the core's life
 * cycle. Changes to files and names are in core_write.c.
 *
 * Metadata cache: a chained hash from store path to the store's answer
 * (attributes, or ENOENT) with an expiry time. Listings fill it, so that
 * "ls -l" of a large S3 prefix costs a few LIST pages, not one HEAD per
 * entry. It is bounded: past META_MAX_ENTRIES, expired entries are purged
 * and, if that is not enough, everything is dropped.
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

#define META_MAX_ENTRIES 262144
#define META_BUCKETS 65536
/* st_blksize, which sizes readers' buffers (Python's): a buffered reader
 * reads this much wherever it reads, also past the last item it wants. */
#define PREFERRED_IO_SIZE (128u << 10)
/* A lookup's first listing of a directory stops after this many keys (one
 * S3 LIST page): a directory with as many is large, and lookups there ask
 * the store by name until they have cost what listing it whole would
 * (docs/design.md, "Request budget": ski rental). */
#define LISTING_MAX 1000
/* What a LIST page costs against a HEAD or a GET (S3 prices: ~10x). */
#define LIST_PAGE_COST 10
/* How long a save or a load keeps its directory's listing after its last
 * create or open there, and a directory found to exist is trusted, whatever
 * attr_timeout is (the gap between two files of a per-item save or load;
 * docs/design.md, "Request budget"). */
#define LISTING_LINGER 2.0
/* The time of a directory with nothing below it on the store (an empty
 * bucket root): known, so not asked again, and the earliest there is. */
#define DIR_TIME_EMPTY 1

void core_config_defaults(struct core_config *cfg)
{
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
    cfg->workers = 8;
    cfg->cache_dir = NULL;
    cfg->writable = 1;
    stage_config_defaults(&cfg->stage);
}

const char *core_store_path(const char *path)
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

/* Remove every entry drop(e, arg) says to (meta_lock held). */
static void meta_remove_if_locked(struct core *core,
                                  int (*drop)(const struct meta_entry *e, const void *arg),
                                  const void *arg)
{
    for (size_t i = 0; i < META_BUCKETS; i++) {
        struct meta_entry **pp = &core->meta[i];
        while (*pp) {
            struct meta_entry *e = *pp;
            if (drop(e, arg)) {
                *pp = e->next;
                free(e);
                core->meta_count--;
            } else {
                pp = &e->next;
            }
        }
    }
}

struct purge {
    double now;
    int everything;
};

static int purged(const struct meta_entry *e, const void *arg)
{
    const struct purge *p = arg;
    size_t n = strlen(e->path);
    return p->everything || e->expires <= p->now || (n > 0 && e->path[n - 1] == '/');
}

/* Drop expired entries (or all). Listing marks ("dir/") go too: a mark
 * says that a name missing from the cache is missing from the store, which
 * stops being true once entries are purged. */
static void meta_purge_locked(struct core *core, int everything)
{
    struct purge p = {mono_seconds(), everything};
    meta_remove_if_locked(core, purged, &p);
}

/* path's entry in the metadata cache, expired or not, or NULL (meta lock held). */
static struct meta_entry *meta_entry_locked(struct core *core, const char *path)
{
    struct meta_entry *e = core->meta[meta_bucket(path)];
    while (e && strcmp(e->path, path) != 0)
        e = e->next;
    return e;
}

/* core_meta_put, for an entry a listing made at mono time listed reported. */
static void meta_put_listed(struct core *core, const char *path, int err,
                            const struct store_stat *st, double listed)
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
    double life = core->cfg.attr_timeout;
    if (err == 0 && st && st->is_dir && life < LISTING_LINGER)
        life = LISTING_LINGER; /* directories come and go rarely; lookups walk them always */
    e->expires = mono_seconds() + life;
    e->listed = listed;
    e->kept_until = 0;
    e->rent = 0;
    e->err = err;
    if (st)
        e->st = *st;
    else
        memset(&e->st, 0, sizeof e->st);
    pthread_mutex_unlock(&core->meta_lock);
}

void core_meta_put(struct core *core, const char *path, int err, const struct store_stat *st)
{
    meta_put_listed(core, path, err, st, 0);
}

enum meta_state { META_ABSENT, META_EXPIRED, META_FRESH };

/* A copy of what the cache has of path, expired or not: META_ABSENT, or the
 * entry's state with *e filled (e->next and e->path not). */
static enum meta_state meta_get(struct core *core, const char *path, struct meta_entry *e)
{
    enum meta_state state = META_ABSENT;
    pthread_mutex_lock(&core->meta_lock);
    const struct meta_entry *m = meta_entry_locked(core, path);
    if (m) {
        memcpy(e, m, sizeof *e);
        e->next = NULL;
        state = m->expires > mono_seconds() ? META_FRESH : META_EXPIRED;
    }
    pthread_mutex_unlock(&core->meta_lock);
    return state;
}

/* What the cache knows of path; err and st (if not NULL) are filled for
 * META_FRESH, err alone for META_EXPIRED. */
static enum meta_state meta_find(struct core *core, const char *path, int *err,
                                 struct store_stat *st)
{
    struct meta_entry e;
    enum meta_state state = meta_get(core, path, &e);
    if (state != META_ABSENT)
        *err = e.err;
    if (state == META_FRESH && st)
        *st = e.st;
    return state;
}

static int at_or_below(const struct meta_entry *e, const void *dir)
{
    size_t n = strlen(dir);
    return strncmp(e->path, dir, n) == 0 && (e->path[n] == '/' || e->path[n] == '\0');
}

void core_meta_forget_below(struct core *core, const char *dir)
{
    pthread_mutex_lock(&core->meta_lock);
    meta_remove_if_locked(core, at_or_below, dir);
    pthread_mutex_unlock(&core->meta_lock);
}

void core_meta_forget(struct core *core, const char *path)
{
    pthread_mutex_lock(&core->meta_lock);
    for (struct meta_entry **pp = &core->meta[meta_bucket(path)]; *pp; pp = &(*pp)->next) {
        if (strcmp((*pp)->path, path) == 0) {
            struct meta_entry *e = *pp;
            *pp = e->next;
            free(e);
            core->meta_count--;
            break;
        }
    }
    pthread_mutex_unlock(&core->meta_lock);
}

/* Attributes of store path spath as the mount shows them, from s (the
 * store's or staging's answer). A directory shows this mount's last change
 * to it if that is later than s's time (dirtime.h). */
static void to_stat(const struct core *core, const char *spath, const struct store_stat *s,
                    struct stat *st)
{
    memset(st, 0, sizeof *st);
    int64_t mtime = s->mtime_ns;
    if (s->is_dir) {
        st->st_mode = S_IFDIR | (core->stage ? 0755 : 0555);
        st->st_nlink = 2;
        int64_t changed = dirtime_get(core->dirtimes, spath);
        if (changed > mtime)
            mtime = changed;
    } else {
        st->st_mode = S_IFREG | (core->stage ? 0644 : 0444);
        st->st_nlink = 1;
        st->st_size = (off_t)s->size;
        st->st_blocks = (blkcnt_t)((s->size + 511) / 512);
    }
    st->st_blksize = (blksize_t)PREFERRED_IO_SIZE;
    st->st_uid = core->uid;
    st->st_gid = core->gid;
    st->st_mtim.tv_sec = (time_t)(mtime / 1000000000);
    st->st_mtim.tv_nsec = (long)(mtime % 1000000000);
    st->st_ctim = st->st_atim = st->st_mtim;
}

/* One pass over a directory listing: every entry goes into the metadata
 * cache, a .metadata marks the directory as a checkpoint for the index, and
 * fill (if any) gets the entry for readdir. */
struct listing {
    struct core *core;
    const char *dir; /* store path of the directory */
    core_fill_fn fill;
    void *arg;
    size_t count, limit; /* entries seen; stop at limit (0: no limit) */
    int cut;             /* limit stopped it: more may follow (a large directory) */
    double stamp;        /* mono time the listing began: its entries' and mark's */
    int dir_listed;      /* readdir: dir was listed for its subdirectories' times */
    char **staged;       /* readdir: the names the overlay reported, sorted */
    size_t nstaged, staged_cap;
    char child[4096];
};

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Whether readdir's overlay already reported name (an upload that ended
 * between the overlay's report and the store's listing shows it in both). */
static int reported_staged(const struct listing *l, const char *name)
{
    return l->nstaged && bsearch(&name, l->staged, l->nstaged, sizeof *l->staged, cmp_name);
}

enum listing_state { NOT_LISTED, LISTED };
static enum listing_state dir_listing(struct core *core, const char *dir);

/* Whether directories' times come from listings (a store of keys), or
 * with their attributes (a local directory). */
static int dir_times_by_listing(const struct core *core)
{
    return core->store->ops->list_below != NULL;
}

/* ---- directory times ---- */

struct newest_below {
    size_t keys;
    int64_t newest;
};

static int newest_entry(void *arg, const char *rel, const struct store_stat *s)
{
    (void)rel;
    struct newest_below *n = arg;
    if (s->mtime_ns > n->newest)
        n->newest = s->mtime_ns;
    return ++n->keys >= STORE_DIR_TIME_KEYS;
}

static int listing_from_mark(struct core *core, const char *dir, double *stamp,
                             struct meta_entry *mark);

/* The time of directory spath the metadata cache knows (its fresh entry's,
 * or the one its valid listing mark recorded), or 0. */
static int64_t known_dir_time(struct core *core, const char *spath)
{
    struct meta_entry e;
    if (meta_get(core, spath, &e) == META_FRESH && e.err == 0 && e.st.is_dir && e.st.mtime_ns)
        return e.st.mtime_ns;
    double stamp;
    if (listing_from_mark(core, spath, &stamp, &e) >= 0)
        return e.st.mtime_ns;
    return 0;
}

/* Directory spath's entry, if the cache has one without a time, gets t
 * (its expiry and listing stamp stay). */
static void meta_set_dir_time(struct core *core, const char *spath, int64_t t)
{
    pthread_mutex_lock(&core->meta_lock);
    struct meta_entry *e = meta_entry_locked(core, spath);
    if (e && e->err == 0 && e->st.is_dir && !e->st.mtime_ns)
        e->st.mtime_ns = t;
    pthread_mutex_unlock(&core->meta_lock);
}

/* Fill in s->mtime_ns of directory spath when the store gave none (an S3
 * common prefix, the root): from the metadata cache if it knows it, else, if
 * ask, from the listing lookups in spath use (dir_listing: it records the
 * directory's time), else by the rule of store.h alone (one LIST page). */
static void fill_dir_time(struct core *core, const char *spath, struct store_stat *s, int ask)
{
    if (!s->is_dir || s->mtime_ns || !dir_times_by_listing(core))
        return;
    if ((s->mtime_ns = known_dir_time(core, spath))) {
        meta_set_dir_time(core, spath, s->mtime_ns); /* found by its listing: kept with it */
        return;
    }
    if (!ask)
        return;
    log_debug("asking the store for the time of /%s", spath);
    dir_listing(core, spath);
    if ((s->mtime_ns = known_dir_time(core, spath))) {
        meta_set_dir_time(core, spath, s->mtime_ns);
        return;
    }
    struct newest_below n = {0};
    if (core->store->ops->list_below(core->store, spath, newest_entry, &n) == 0) {
        s->mtime_ns = n.keys ? n.newest : DIR_TIME_EMPTY;
        core_meta_put(core, spath, 0, s);
    }
}

/* An open file keeps the version it opened, and the kernel keeps one size
 * per path (its GETATTR of an fstat carries no handle): while the newest
 * open handle of spath has another version than the store's s, report that
 * version's size, so that the kernel does not cut the open file's reads
 * short; the store's version shows once it is closed or newer opened. A file
 * being written on this mount (staged) shows as staging has it, and once
 * this mount has published a newer version its older handles no longer
 * count (superseded): a rewrite through the mount shows its size to every
 * new reader, as on a local disk. Lookups and listings (readdirplus sets
 * sizes too) both pass through here. */
static void keep_opened_size(struct core *core, const char *spath, struct store_stat *s)
{
    int found = 0;
    uint64_t size = 0;
    pthread_mutex_lock(&core->files_lock);
    for (struct core_file *f = core->files; f; f = f->next) /* newest first */
        if (f->obj && !f->superseded && strcmp(cache_obj_path(f->obj), spath) == 0) {
            found = strcmp(cache_obj_etag(f->obj), s->etag) != 0;
            size = cache_obj_size(f->obj);
            break;
        }
    pthread_mutex_unlock(&core->files_lock);
    if (found && !(core->stage && stage_stat(core->stage, spath, &(struct store_stat){0})))
        s->size = size;
}

/* One entry of a listing into the cache (and to fill). */
static int listing_put(struct listing *l, const char *name, const struct store_stat *s)
{
    if (reported_staged(l, name) ||
        (l->core->stage && stage_has_entry(l->core->stage, l->dir, name)))
        return 0; /* staged here: the overlay reported it (and knows better) */
    int n = snprintf(l->child, sizeof l->child, "%s%s%s", l->dir, *l->dir ? "/" : "", name);
    if (n <= 0 || (size_t)n >= sizeof l->child)
        l->child[0] = '\0'; /* too long to be looked up: listed only */
    struct store_stat stored = *s;
    if (s->is_dir && !s->mtime_ns && l->fill && !l->dir_listed && dir_times_by_listing(l->core)) {
        l->dir_listed = 1; /* one listing below dir times all its small subdirectories */
        dir_listing(l->core, l->dir);
    }
    if (l->child[0]) {
        fill_dir_time(l->core, l->child, &stored, l->fill != NULL);
        meta_put_listed(l->core, l->child, 0, &stored, l->stamp);
    }
    if (l->core->index && !s->is_dir && strcmp(name, ".metadata") == 0)
        ckindex_notice(l->core->index, l->dir, s);
    if (!l->fill)
        return 0;
    struct stat st;
    struct store_stat shown = stored;
    if (!s->is_dir && l->child[0])
        keep_opened_size(l->core, l->child, &shown);
    to_stat(l->core, l->child, &shown, &st);
    return l->fill(l->arg, name, &st);
}

static int listing_entry(void *arg, const char *name, const struct store_stat *s)
{
    struct listing *l = arg;
    int rc = listing_put(l, name, s);
    if (rc == 0 && ++l->count >= l->limit && l->limit) {
        l->cut = 1; /* a page's worth: large, looked up by name (no second page) */
        return 1;
    }
    return rc;
}

/* Directory listings stand in for lookups. A complete listing of dir marks
 * it in the metadata cache under the key "dir/" (no store path ends in '/'):
 * for as long as the mark lasts, a name of dir that the cache does not have
 * does not exist, without asking the store. A DCP load opens every shard
 * file of a directory and a save creates them: one listing answers all
 * those lookups instead of a HEAD (and a directory probe) per file. The mark
 * lasts attr_timeout, and for as long as this mount is writing into the
 * directory: a save then costs one listing per directory.
 *
 * A lookup's listing stops after LISTING_MAX keys (one page). A directory
 * that has as many is marked large (-E2BIG) and its names are looked up by
 * name, each lookup adding its cost to the mark's rent (ski rental: a mount
 * of a 1,024-node load opens 1/1,024 of a checkpoint's files, and a HEAD
 * each is far cheaper than 99 pages). Once a checkpoint directory's rent
 * reaches what listing it whole costs (listing_price), the next lookup
 * lists it whole. Other large directories are always looked up by name. */
static void marker_of(const char *dir, char *buf, size_t len)
{
    snprintf(buf, len, "%s/", dir);
}

/* Forget that dir was listed (a name appeared in it behind the cache). */
static void forget_listing(struct core *core, const char *dir)
{
    char m[4100];
    marker_of(dir, m, sizeof m);
    core_meta_forget(core, m);
}

/* Mark dir as listed in full (err 0: it was just made empty, or listed by
 * the listing that began at stamp) or as large, its first page listed
 * (-E2BIG); newest: the directory's time the listing found (store.h), 0 if
 * none; keys: how many keys (or entries) the listing saw. */
static void mark_listed(struct core *core, const char *dir, int err, double stamp, int64_t newest,
                        uint64_t keys)
{
    char m[4100];
    marker_of(dir, m, sizeof m);
    meta_put_listed(core, m, err, &(struct store_stat){.mtime_ns = newest, .size = keys}, stamp);
}

/* A positive entry of path lasts at least until expires (meta lock held). */
static void meta_extend_locked(struct core *core, const char *path, double expires)
{
    struct meta_entry *e = meta_entry_locked(core, path);
    if (e && e->err == 0 && e->expires < expires)
        e->expires = expires;
}

/* This mount just published a file into dir: the end of writing there.
 * The listing marks that the writing kept valid, of dir and of every
 * directory above it (see dir_listing), and those directories' own entries
 * last attr_timeout from now: the lookups of the .metadata.tmp a DCP save
 * creates after its shards are on the store need no new request. */
static void extend_listings(struct core *core, const char *dir)
{
    char m[4100];
    marker_of(dir, m, sizeof m);
    double expires = mono_seconds() + core->cfg.attr_timeout;
    pthread_mutex_lock(&core->meta_lock);
    for (;;) { /* m: "a/b/", then "a/", then "/" (the root's mark) */
        meta_extend_locked(core, m, expires);
        size_t n = strlen(m);
        if (n <= 1)
            break;
        m[n - 1] = '\0';
        meta_extend_locked(core, m, expires); /* the directory itself: it is there */
        char *slash = strrchr(m, '/');
        if (slash)
            slash[1] = '\0';
        else
            strcpy(m, "/");
    }
    pthread_mutex_unlock(&core->meta_lock);
}

/* list_below: every key below a directory; its direct children are the
 * first components (keys sharing one come together, in key order). A
 * subdirectory is reported when its keys end, with its time by the rule of
 * store.h (the newest of its first keys); one cut off by the limit is not
 * reported (lookups ask for it by name). The listed directory's own time
 * comes out the same way (newest). */
struct below {
    struct listing *l;
    size_t keys;
    int64_t newest;             /* of the first STORE_DIR_TIME_KEYS keys */
    char group[256];            /* the subdirectory whose keys come now, or "" */
    size_t group_keys;          /* how many of its keys came */
    struct store_stat group_st; /* its attributes so far */
};

/* The pending subdirectory's keys ended: report it. */
static int below_flush(struct below *b)
{
    if (!b->group[0])
        return 0;
    int rc = listing_entry(b->l, b->group, &b->group_st);
    b->group[0] = '\0';
    return rc;
}

/* One key of list_below (b->keys counts it already). */
static int below_key(struct below *b, const char *rel, const struct store_stat *s)
{
    if (b->keys <= STORE_DIR_TIME_KEYS && s->mtime_ns > b->newest)
        b->newest = s->mtime_ns;
    if (!*rel)
        return 0; /* the directory's own marker: its time only */
    const char *slash = strchr(rel, '/');
    size_t n = slash ? (size_t)(slash - rel) : 0;
    if (slash && n > 0 && n < sizeof b->group && strncmp(b->group, rel, n) == 0 &&
        b->group[n] == '\0') {
        if (++b->group_keys <= STORE_DIR_TIME_KEYS && s->mtime_ns > b->group_st.mtime_ns)
            b->group_st.mtime_ns = s->mtime_ns;
        return 0;
    }
    int rc = below_flush(b);
    if (rc != 0 || !slash)
        return rc != 0 ? rc : listing_entry(b->l, rel, s);
    if (n == 0 || n >= sizeof b->group)
        return 0;
    memcpy(b->group, rel, n);
    b->group[n] = '\0';
    b->group_keys = 1;
    b->group_st = (struct store_stat){.is_dir = 1, .mtime_ns = s->mtime_ns};
    return 0;
}

static int below_entry(void *arg, const char *rel, const struct store_stat *s)
{
    struct below *b = arg;
    b->keys++;
    int rc = below_key(b, rel, s);
    if (rc == 0 && b->l->limit && b->keys >= b->l->limit) {
        b->l->cut = 1;      /* a page's worth: large, looked up by name (no second page) */
        b->group[0] = '\0'; /* its keys may go on: its time is not known, not reported */
        return 1;
    }
    return rc;
}

struct listing_flight {
    struct listing_flight *next;
    char dir[]; /* the directory being listed */
};

static struct listing_flight *listing_in_flight_locked(struct core *core, const char *dir)
{
    struct listing_flight *l = core->listings;
    while (l && strcmp(l->dir, dir) != 0)
        l = l->next;
    return l;
}

/* 1 if this thread is now the one listing dir (*mine is its entry, for
 * listing_finish()); 0 after waiting for another thread's listing of dir to
 * end (its mark answers now, or it failed). -ENOMEM: list without taking
 * part (*mine NULL). */
static int listing_claim(struct core *core, const char *dir, struct listing_flight **mine)
{
    *mine = NULL;
    pthread_mutex_lock(&core->listing_lock);
    if (listing_in_flight_locked(core, dir)) {
        atomic_fetch_add(&core->listing_waits, 1);
        while (listing_in_flight_locked(core, dir))
            pthread_cond_wait(&core->listing_done, &core->listing_lock);
        pthread_mutex_unlock(&core->listing_lock);
        return 0;
    }
    size_t n = strlen(dir) + 1;
    struct listing_flight *l = malloc(sizeof *l + n);
    if (l) {
        memcpy(l->dir, dir, n);
        l->next = core->listings;
        core->listings = l;
    }
    pthread_mutex_unlock(&core->listing_lock);
    *mine = l;
    return l ? 1 : -ENOMEM;
}

/* The listing this thread claimed (mine) ended: wake who waits for it. */
static void listing_finish(struct core *core, struct listing_flight *mine)
{
    pthread_mutex_lock(&core->listing_lock);
    struct listing_flight **pp = &core->listings;
    while (*pp && *pp != mine)
        pp = &(*pp)->next;
    assert(*pp); /* claimed by this thread, so still there */
    *pp = mine->next;
    free(mine);
    pthread_cond_broadcast(&core->listing_done);
    pthread_mutex_unlock(&core->listing_lock);
}

/* Whether a cached entry e (in state) answers a lookup: fresh, or put by
 * its directory's valid listing that began at stamp (0: none valid). */
static int entry_answers(enum meta_state state, const struct meta_entry *e, double stamp)
{
    return state == META_FRESH || (state == META_EXPIRED && e->listed > 0 && e->listed == stamp);
}

/* What dir's listing mark says: LISTED (*stamp: the listing's), NOT_LISTED
 * (large: its first page was listed at *stamp, lookups ask by name), or -1
 * (no valid mark: list it). A mark is valid for attr_timeout and while a
 * save or a load keeps it (core_keep_listing); a whole listing also while
 * this mount writes below dir. *mark (if not NULL) gets the mark. */
static int listing_from_mark(struct core *core, const char *dir, double *stamp,
                             struct meta_entry *mark)
{
    char m[4100];
    marker_of(dir, m, sizeof m);
    struct meta_entry own;
    if (!mark)
        mark = &own;
    enum meta_state state = meta_get(core, m, mark);
    if (state != META_ABSENT) {
        *stamp = mark->listed;
        int valid = state == META_FRESH || mark->kept_until > mono_seconds();
        if (mark->err == 0 && (valid || (core->stage && stage_busy_below(core->stage, dir))))
            return LISTED;
        if (mark->err == -E2BIG && valid)
            return NOT_LISTED;
    }
    return -1;
}

/* What listing large directory dir whole would cost, in HEADs: LIST_PAGE_COST
 * per page of its keys (the .metadata and the files it names, or, until the
 * index has counted them, one page more than the first listing saw), or
 * UINT64_MAX while no whole listing is wanted: dir is no checkpoint (its
 * names are looked up by name for good), or its .metadata is being indexed
 * (the count comes then). */
static uint64_t listing_price(struct core *core, const char *dir, const struct meta_entry *mark)
{
    if (!core->index || !ckindex_is_checkpoint(core->index, dir))
        return UINT64_MAX;
    int64_t files = ckindex_file_count(core->index, dir);
    if (files == 0)
        return UINT64_MAX;
    uint64_t keys = mark->st.size + 1; /* the first page was full: one more key at least */
    if (files > 0 && (uint64_t)files + 1 > keys)
        keys = (uint64_t)files + 1;
    return LIST_PAGE_COST * ((keys + LISTING_MAX - 1) / LISTING_MAX);
}

/* A lookup by name in dir cost cost (in HEADs): it goes on dir's rent if dir
 * is marked large. */
static void pay_rent(struct core *core, const char *dir, uint64_t cost)
{
    char m[4100];
    marker_of(dir, m, sizeof m);
    pthread_mutex_lock(&core->meta_lock);
    struct meta_entry *mark = meta_entry_locked(core, m);
    if (mark && mark->err == -E2BIG)
        mark->rent += cost;
    pthread_mutex_unlock(&core->meta_lock);
}

static enum listing_state list_dir(struct core *core, const char *dir, double *stamp, int whole);

/* Whether dir's entries are in the metadata cache: LISTED, or NOT_LISTED
 * (a large directory: look names up by name). Lists dir if its mark is
 * stale (its first page; one LIST per directory however many lookups wait
 * for it), or whole once the lookups by name in a large checkpoint
 * directory have cost what that costs. *stamp (if not NULL) gets the
 * listing's stamp (0 if none). */
static enum listing_state dir_listing_stamp(struct core *core, const char *dir, double *stamp)
{
    double ignored;
    if (!stamp)
        stamp = &ignored;
    *stamp = 0;
    if (core->cfg.attr_timeout <= 0)
        return NOT_LISTED; /* nothing is cached: a listing would answer one lookup */
    for (;;) {
        struct meta_entry mark;
        int known = listing_from_mark(core, dir, stamp, &mark);
        if (known == LISTED)
            return LISTED;
        int whole = known == NOT_LISTED; /* large: list it whole once the rent is paid */
        if (whole && mark.rent < listing_price(core, dir, &mark))
            return NOT_LISTED;
        struct listing_flight *mine;
        int claimed = listing_claim(core, dir, &mine);
        if (claimed == 0)
            continue; /* another thread's listing ended: its mark answers, or it failed */
        int now = claimed == 1 ? listing_from_mark(core, dir, stamp, &mark) : -1;
        enum listing_state st;
        if (now == LISTED || (now == NOT_LISTED && !whole))
            st = (enum listing_state)now; /* listed between our look and our claim */
        else
            st = list_dir(core, dir, stamp, whole);
        if (mine)
            listing_finish(core, mine);
        return st;
    }
}

static enum listing_state dir_listing(struct core *core, const char *dir)
{
    return dir_listing_stamp(core, dir, NULL);
}

/* List dir from the store into the metadata cache and mark it listed
 * (*stamp: the listing's): whole, or (whole 0) its first LISTING_MAX keys,
 * which are all of it or make it large (NOT_LISTED). */
static enum listing_state list_dir(struct core *core, const char *dir, double *stamp, int whole)
{
    struct listing l = {
        .core = core, .dir = dir, .limit = whole ? 0 : LISTING_MAX, .stamp = mono_seconds()};
    *stamp = l.stamp;
    log_debug("listing /%s for lookups%s", dir, whole ? " (large, rent paid: whole)" : "");
    int rc;
    int64_t newest = 0;
    uint64_t keys;
    if (core->store->ops->list_below) {
        struct below b = {.l = &l};
        rc = core->store->ops->list_below(core->store, dir, below_entry, &b);
        if (rc == 0 && !l.cut)
            rc = below_flush(&b);
        newest = b.keys ? b.newest : DIR_TIME_EMPTY;
        keys = b.keys;
        if (rc == 0 && b.keys > 0) /* something below: a directory, of this time */
            core_meta_put(core, dir, 0, &(struct store_stat){.is_dir = 1, .mtime_ns = b.newest});
        if (rc == 0 && b.keys == 0) { /* nothing below: an empty directory, or none */
            struct store_stat ds;
            int e = core->store->ops->stat(core->store, dir, &ds);
            rc = e == 0 && !ds.is_dir ? -ENOTDIR : e == -ENOENT ? -ENOENT : e < 0 ? e : 0;
        }
    } else {
        rc = core->store->ops->list(core->store, dir, listing_entry, &l);
        keys = l.count;
    }
    if (rc == -ENOENT || rc == -ENOTDIR) { /* no such directory: nothing is in it */
        mark_listed(core, dir, 0, l.stamp, 0, 0);
        return LISTED;
    }
    if (rc < 0)
        return NOT_LISTED; /* the lookup by name reports the store's trouble */
    /* The rent a large directory's expired mark had carries over: what its
     * lookups by name cost is spent (a GET on a busy store can outlast the
     * 2 s a load keeps the mark, and the load goes on). */
    char m[4100];
    marker_of(dir, m, sizeof m);
    struct meta_entry old;
    uint64_t rent = meta_get(core, m, &old) != META_ABSENT && old.err == -E2BIG ? old.rent : 0;
    mark_listed(core, dir, l.cut ? -E2BIG : 0, l.stamp, newest, keys);
    if (l.cut && rent)
        pay_rent(core, dir, rent);
    if (l.cut)
        log_debug("/%s is large (%llu keys in a page, rent %llu): lookups there ask by name", dir,
                  (unsigned long long)keys, (unsigned long long)rent);
    return l.cut ? NOT_LISTED : LISTED;
}

int core_lookup_store(struct core *core, const char *spath, struct store_stat *st)
{
    int err;
    enum meta_state known = meta_find(core, spath, &err, st);
    if (known == META_FRESH)
        return err;
    char dir[4096];
    double stamp;
    int in_dir = *spath && path_dir(spath, dir, sizeof dir) == 0;
    /* A name absent from the cache of a listed directory is not in the
     * listing, and one the valid listing reported (its entry carries the
     * listing's stamp) is as the listing says, however old; so is a name the
     * first page of a large directory reported, while its mark is valid. One
     * whose entry expired and came from elsewhere (a lookup by name, a
     * publish) is asked for by name below. */
    enum listing_state listed = in_dir ? dir_listing_stamp(core, dir, &stamp) : NOT_LISTED;
    if (in_dir) {
        struct meta_entry e;
        known = meta_get(core, spath, &e); /* the listing may have put it */
        if (entry_answers(known, &e, stamp)) {
            if (e.err == 0)
                *st = e.st;
            return e.err;
        }
        if (listed == LISTED && known == META_ABSENT) {
            meta_put_listed(core, spath, -ENOENT, NULL, stamp);
            return -ENOENT;
        }
    }
    err = core->store->ops->stat(core->store, spath, st);
    /* Its cost goes on a large directory's rent: a HEAD, and for a name that
     * is no file the one-page directory probe too (S3's stat). A 404 is an
     * answer like any other: cached for attr_timeout, as every lookup's. */
    if (in_dir && listed == NOT_LISTED)
        pay_rent(core, dir, err == 0 && !st->is_dir ? 1 : 1 + LIST_PAGE_COST);
    if (err == 0)
        fill_dir_time(core, spath, st, 0); /* the root: its time from its listing */
    if (err == 0 || err == -ENOENT)
        core_meta_put(core, spath, err, err == 0 ? st : NULL);
    return err;
}

void core_listing_made(struct core *core, const char *dir)
{
    mark_listed(core, dir, 0, mono_seconds(), 0, 0);
}

void core_keep_listing(struct core *core, const char *dir)
{
    if (core->cfg.attr_timeout <= 0)
        return; /* nothing is cached */
    double until =
        mono_seconds() +
        (LISTING_LINGER > core->cfg.attr_timeout ? LISTING_LINGER : core->cfg.attr_timeout);
    char m[4100];
    marker_of(dir, m, sizeof m);
    pthread_mutex_lock(&core->meta_lock);
    struct meta_entry *mark = meta_entry_locked(core, m);
    if (mark && (mark->err == 0 || mark->err == -E2BIG) && mark->kept_until < until)
        mark->kept_until = until; /* a large directory's mark: its rent goes on */
    m[strlen(m) - 1] = '\0';
    for (;;) { /* "a/b", "a", "" (the root) */
        meta_extend_locked(core, m, until);
        if (!*m)
            break;
        char *slash = strrchr(m, '/');
        *(slash ? slash : m) = '\0';
    }
    pthread_mutex_unlock(&core->meta_lock);
}

void core_listing_changed(struct core *core, const char *dir)
{
    forget_listing(core, dir);
}

/* A directory that holds staged files shows the later of its staged files'
 * times and what the metadata cache knows of its time on the store. */
static void staged_dir_time(struct core *core, const char *spath, struct store_stat *st)
{
    struct store_stat known;
    int err;
    if (st->is_dir && meta_find(core, spath, &err, &known) == META_FRESH && err == 0 &&
        known.mtime_ns > st->mtime_ns)
        st->mtime_ns = known.mtime_ns;
}

int core_lookup(struct core *core, const char *spath, struct store_stat *st)
{
    if (core->stage && stage_stat(core->stage, spath, st)) {
        staged_dir_time(core, spath, st);
        return 0;
    }
    return core_lookup_store(core, spath, st);
}

int core_getattr(struct core *core, const char *path, struct stat *st)
{
    struct store_stat s;
    const char *spath = core_store_path(path);
    int rc = core_lookup(core, spath, &s);
    if (rc < 0)
        return rc;
    if (!s.is_dir)
        keep_opened_size(core, spath, &s);
    fill_dir_time(core, spath, &s, 1);
    to_stat(core, spath, &s, st);
    return 0;
}

int core_fgetattr(struct core *core, struct core_file *f, struct stat *st)
{
    struct store_stat s = {.mtime_ns = (int64_t)time(NULL)};
    if (f->wf)
        s.size = stage_size(core->stage, f->wf);
    else
        s.size = cache_obj_size(f->obj);
    to_stat(core, "", &s, st);
    return 0;
}

/* Overlay entries go to the caller's fill, directories with their time. */
static int overlay_entry(void *arg, const char *name, const struct store_stat *s)
{
    struct listing *l = arg;
    struct stat st;
    struct store_stat shown = *s;
    int n = snprintf(l->child, sizeof l->child, "%s%s%s", l->dir, *l->dir ? "/" : "", name);
    if (n > 0 && (size_t)n < sizeof l->child)
        staged_dir_time(l->core, l->child, &shown);
    if (l->nstaged == l->staged_cap) {
        size_t cap = l->staged_cap ? 2 * l->staged_cap : 64;
        char **grown = realloc(l->staged, cap * sizeof *grown);
        if (!grown)
            return -ENOMEM;
        l->staged = grown;
        l->staged_cap = cap;
    }
    if (!(l->staged[l->nstaged] = strdup(name)))
        return -ENOMEM;
    l->nstaged++;
    to_stat(l->core, l->child, &shown, &st);
    return l->fill ? l->fill(l->arg, name, &st) : 0;
}

int core_readdir(struct core *core, const char *path, core_fill_fn fill, void *arg)
{
    struct listing l = {.core = core,
                        .dir = core_store_path(path),
                        .fill = fill,
                        .arg = arg,
                        .stamp = mono_seconds()};
    int staged = core->stage ? stage_list(core->stage, l.dir, overlay_entry, &l) : 0;
    if (l.nstaged)
        qsort(l.staged, l.nstaged, sizeof *l.staged, cmp_name);
    int rc = core->store->ops->list(core->store, l.dir, listing_entry, &l);
    for (size_t i = 0; i < l.nstaged; i++)
        free(l.staged[i]);
    free(l.staged);
    if (rc == 0)
        mark_listed(core, l.dir, 0, l.stamp, known_dir_time(core, l.dir), l.count);
    if (rc == -ENOENT &&
        (staged || (core->stage && stage_stat(core->stage, l.dir, &(struct store_stat){0}))))
        rc = 0; /* a directory that exists only on this mount so far */
    return rc;
}

/* ckindex_known_fn over the metadata cache: what the mount knows of the
 * file at store path spath without asking the store (an index build's file
 * sizes): a fresh entry, one its directory's valid listing put, or a name
 * absent from a whole listing. A file staged here is not known. */
static int known_file(void *arg, const char *spath, uint64_t *size)
{
    struct core *core = arg;
    struct store_stat staged;
    if (core->stage && stage_stat(core->stage, spath, &staged))
        return 1;
    struct meta_entry e;
    enum meta_state state = meta_get(core, spath, &e);
    char dir[4096];
    double stamp = 0;
    int listed = state != META_FRESH && path_dir(spath, dir, sizeof dir) == 0
                     ? listing_from_mark(core, dir, &stamp, NULL)
                     : -1;
    if (entry_answers(state, &e, listed >= 0 ? stamp : 0)) {
        if (e.err == 0 && !e.st.is_dir) {
            *size = e.st.size;
            return 0;
        }
        return e.err == 0 || e.err == -ENOENT ? -ENOENT : 1; /* a directory is no file */
    }
    return state == META_ABSENT && listed == LISTED ? -ENOENT : 1;
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

/* A file of a checkpoint directory was closed: the load is still working
 * there (its read may have outlasted the listing, as a large .metadata read
 * from a busy store does), so the listing is kept from now on. */
static void keep_listing_after_close(struct core *core, const struct core_file *f)
{
    char dir[4096];
    if (f->in_checkpoint && f->obj && path_dir(cache_obj_path(f->obj), dir, sizeof dir) == 0)
        core_keep_listing(core, dir);
}

struct core_file *core_file_new(void)
{
    struct core_file *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    f->fd = -1;
    pthread_mutex_init(&f->ra_lock, NULL);
    return f;
}

void core_file_link(struct core *core, struct core_file *f)
{
    atomic_fetch_add(&core->opens, 1);
    pthread_mutex_lock(&core->files_lock);
    f->next = core->files;
    if (f->next)
        f->next->prev = f;
    core->files = f;
    core->open_files++;
    pthread_mutex_unlock(&core->files_lock);
}

int core_open(struct core *core, const char *path, int flags, struct core_file **out,
              int *keep_cache)
{
    const char *spath = core_store_path(path);
    *keep_cache = 0;
    if ((flags & O_ACCMODE) != O_RDONLY || (flags & O_TRUNC))
        return core_open_write(core, spath, flags, out);
    struct wfile *wf = core->stage ? stage_get(core->stage, spath) : NULL;
    if (wf) { /* being written: read what staging has */
        struct core_file *f = core_file_new();
        if (!f) {
            stage_put(core->stage, wf);
            return -ENOMEM;
        }
        f->wf = wf;
        core_file_link(core, f);
        *out = f;
        return 0;
    }
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
    uint64_t probe;
    if (!prefetch_read(&f->pf, off, len, &probe))
        return prefetch_planned(&f->pf);
    struct ckindex_span sp[64];
    const char *path = cache_obj_path(f->obj);
    int n = ckindex_items(core->index, path, probe, 0, sp, 1);
    if (n == 0) /* a load's first reads may come before its index: no guesses then */
        return ckindex_building(core->index, path);
    struct prefetch_span cur = {sp[0].offset, sp[0].length};
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
    if (meta_find(core, spath, &err, st) != META_FRESH || err != 0 || st->is_dir)
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

/* f's readahead window is open or not (f->ra_lock held): count it in the
 * streams that share the cache. */
static void stream_note(struct core *core, struct core_file *f)
{
    int now = f->ra.window > 0;
    if (now == f->streaming)
        return;
    f->streaming = now;
    if (now) {
        atomic_fetch_add(&core->streams, 1);
    } else {
        assert(atomic_load(&core->streams) > 0);
        atomic_fetch_sub(&core->streams, 1);
    }
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

ssize_t core_read(struct core *core, struct core_file *f, void *buf, size_t len, uint64_t off)
{
    if (f->wf)
        return read_staged(core, f, buf, len, off);
    uint64_t size = cache_obj_size(f->obj);
    if (off >= size)
        return 0;
    if (len > size - off)
        len = (size_t)(size - off);
    uint64_t entered = UINT64_MAX;
    pthread_mutex_lock(&f->ra_lock);
    if (!prefetch_items(core, f, off, len, &entered)) {
        uint64_t ahead_off, ahead_len;
        unsigned streams = atomic_load(&core->streams) + (f->streaming ? 0 : 1);
        readahead_set_max(&f->ra, stream_share(core, streams));
        readahead_advise(&f->ra, off, len, size, &ahead_off, &ahead_len);
        if (ahead_len)
            cache_prefetch(core->cache, f->obj, ahead_off, ahead_len);
    } else {
        /* the item rule has it: a window left from streaming a larger item
         * must not make release_behind drop this item's fetched blocks */
        f->ra.window = 0;
    }
    stream_note(core, f);
    pthread_mutex_unlock(&f->ra_lock);
    if (entered != UINT64_MAX)
        prefetch_siblings(core, f, entered);
    ssize_t n = cache_read(core->cache, f->obj, off, len, buf);
    if (n > 0) {
        atomic_fetch_add(&core->read_bytes, (uint64_t)n);
        uint64_t end = off + (uint64_t)n, at = atomic_load(&f->read_front);
        while (end > at && !atomic_compare_exchange_weak(&f->read_front, &at, end))
            ;
    }
    release_behind(core, f, off);
    return n;
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
    if (f->fd < 0)
        return 0;
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

/* Release f; abandoned: the kernel never sent its RELEASE (the mount
 * ended), so a file it was writing is not sealed. */
static void release(struct core *core, struct core_file *f, int abandoned)
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
    if (!abandoned)
        keep_listing_after_close(core, f);
    if (f->wf) {
        if (f->writable && abandoned)
            stage_writer_abandon(core->stage, f->wf);
        else if (f->writable)
            stage_writer_close(core->stage, f->wf);
        stage_put(core->stage, f->wf);
    }
    if (f->obj)
        cache_obj_put(core->cache, f->obj);
    f->ra.window = 0; /* its stream ends: no other thread has f now */
    stream_note(core, f);
    pthread_mutex_destroy(&f->ra_lock);
    free(f);
}

void core_release(struct core *core, struct core_file *f)
{
    release(core, f, 0);
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
    struct stage_stats ws = {0};
    if (core->stage)
        stage_get_stats(core->stage, &ws);
    const struct store_counters *sc = &core->store->counters;
#define U(x) (unsigned long long)(x)
#define A(x) U(atomic_load(&sc->x))
    char writes[1536];
    snprintf(writes, sizeof writes,
             "\"write\": {\"enabled\": %s, \"fsync\": \"%s\", \"write_bytes\": %llu, "
             "\"writeback_starts\": %llu, "
             "\"files_staged\": %llu, \"files_published\": %llu, \"bytes_uploaded\": %llu, "
             "\"pending_files\": %llu, \"pending_bytes\": %llu, \"staged_bytes\": %llu, "
             "\"upload_failures\": %llu, \"commits\": %llu, \"commit_timeouts\": %llu, "
             "\"budget_waits\": %llu, \"upload_yields\": %llu, \"upload_yield_s\": %.3f, "
             "\"recovered_files\": %llu, \"put_requests\": %llu, "
             "\"put_bytes\": %llu, \"mpu_begin_requests\": %llu, \"part_requests\": %llu, "
             "\"complete_requests\": %llu, \"abort_requests\": %llu, "
             "\"upload_list_requests\": %llu, \"copy_requests\": %llu, "
             "\"delete_requests\": %llu, \"last_publish\": %.3f}",
             core->stage ? "true" : "false", core->cfg.stage.fsync_remote ? "remote" : "staged",
             U(ws.write_bytes), U(ws.writeback_starts), U(ws.files_staged), U(ws.files_published),
             U(ws.bytes_uploaded), U(ws.pending_files), U(ws.pending_bytes), U(ws.staged_bytes),
             U(ws.upload_failures), U(ws.commits), U(ws.commit_timeouts), U(ws.budget_waits),
             U(ws.upload_yields), ws.upload_yield_seconds, U(ws.recovered_files), A(put_requests),
             A(put_bytes), A(mpu_begin_requests), A(part_requests), A(complete_requests),
             A(abort_requests), A(upload_list_requests), A(copy_requests), A(delete_requests),
             ws.last_publish);
#undef A
#undef U
    return snprintf(
        buf, len,
        "{\"store\": \"%s\", \"uptime_s\": %.3f, \"open_files\": %d, \"opens\": %llu, "
        "\"read_bytes\": %llu, \"get_requests\": %llu, \"get_bytes\": %llu, "
        "\"head_requests\": %llu, \"list_requests\": %llu, \"listing_waits\": %llu, "
        "\"retries\": %llu, \"errors\": %llu, "
        "\"cache\": {\"hits\": %llu, \"misses\": %llu, \"shared\": %llu, \"taken_over\": %llu, "
        "\"prefetched\": %llu, "
        "\"prefetch_skipped\": %llu, \"prefetched_bytes\": %llu, \"prefetch_unused_bytes\": %llu, "
        "\"prefetch_unread_bytes\": %llu, \"evictions\": %llu, \"evicted_unread\": %llu, "
        "\"recycled\": %llu, \"ahead_deferred\": %llu, \"released\": %llu, "
        "\"fetch_errors\": %llu, \"failed_fast\": %llu, "
        "\"bytes_cached\": %llu, \"buffer_bytes\": %llu, \"capacity\": %llu, \"block_size\": %u, "
        "\"buffers_mapped\": "
        "%llu, \"buffers_reused\": %llu}, "
        "\"index\": {\"enabled\": %s, \"ready\": %llu, \"built\": %llu, \"reused\": %llu, "
        "\"failed\": %llu, \"lookups\": %llu, \"item_prefetches\": %llu, "
        "\"sibling_prefetches\": %llu}, %s}\n",
        core->store->ops->scheme, mono_seconds() - core->started, open_files,
        (unsigned long long)atomic_load(&core->opens),
        (unsigned long long)atomic_load(&core->read_bytes),
        (unsigned long long)atomic_load(&sc->get_requests),
        (unsigned long long)atomic_load(&sc->get_bytes),
        (unsigned long long)atomic_load(&sc->head_requests),
        (unsigned long long)atomic_load(&sc->list_requests),
        (unsigned long long)atomic_load(&core->listing_waits),
        (unsigned long long)atomic_load(&sc->retries), (unsigned long long)atomic_load(&sc->errors),
        (unsigned long long)cs.hits, (unsigned long long)cs.misses, (unsigned long long)cs.shared,
        (unsigned long long)cs.taken_over, (unsigned long long)cs.prefetched,
        (unsigned long long)cs.prefetch_skipped, (unsigned long long)cs.prefetched_bytes,
        (unsigned long long)cs.prefetch_unused_bytes, (unsigned long long)cs.prefetch_unread_bytes,
        (unsigned long long)cs.evictions, (unsigned long long)cs.evicted_unread,
        (unsigned long long)cs.recycled, (unsigned long long)cs.ahead_deferred,
        (unsigned long long)cs.released, (unsigned long long)cs.fetch_errors,
        (unsigned long long)cs.failed_fast, (unsigned long long)cs.bytes_cached,
        (unsigned long long)cs.buffer_bytes, (unsigned long long)cs.capacity, core->cfg.block_size,
        (unsigned long long)cs.buffers_mapped, (unsigned long long)cs.buffers_reused,
        core->index ? "true" : "false", (unsigned long long)is.ready, (unsigned long long)is.built,
        (unsigned long long)is.reused, (unsigned long long)is.failed,
        (unsigned long long)is.lookups, (unsigned long long)atomic_load(&core->item_prefetches),
        (unsigned long long)atomic_load(&core->sibling_prefetches), writes);
}

/* The stage published a file: the store has it now, with this version. */
static void on_publish(void *arg, const char *path, const struct store_stat *st,
                       const struct stage_commit_snapshot *commit)
{
    struct core *core = arg;
    core_meta_put(core, path, 0, st);
    pthread_mutex_lock(&core->files_lock);
    for (struct core_file *f = core->files; f; f = f->next)
        if (f->obj && strcmp(cache_obj_path(f->obj), path) == 0 &&
            strcmp(cache_obj_etag(f->obj), st->etag) != 0)
            f->superseded = 1;
    pthread_mutex_unlock(&core->files_lock);
    char dir[4096];
    if (path_dir(path, dir, sizeof dir) != 0)
        return;
    extend_listings(core, dir);
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
    if (!core->index || strcmp(path_base(path), ".metadata") != 0)
        return;
    /* Loads right after a save use the index: built from what was published
     * (no requests), or else from the store. */
    if (commit)
        ckindex_notice_published(core->index, dir, st, commit->bytes, commit->len, commit->files,
                                 commit->nfiles);
    else
        ckindex_notice(core->index, dir, st);
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
    int rc = stage_open(core->store, core->store->description, &sc, &core->stage, err, errlen);
    free(dir);
    return rc;
}

/* The transfer summary's view of the counters (xferlog.h). */
static void sample_counters(void *arg, struct xfer_counters *out)
{
    struct core *core = arg;
    struct cache_stats cs;
    cache_get_stats(core->cache, &cs);
    struct stage_stats ws = {0};
    if (core->stage)
        stage_get_stats(core->stage, &ws);
    const struct store_counters *sc = &core->store->counters;
    *out = (struct xfer_counters){
        .read_bytes = atomic_load(&core->read_bytes),
        .get_requests = atomic_load(&sc->get_requests),
        .get_bytes = atomic_load(&sc->get_bytes),
        .hits = cs.hits,
        .misses = cs.misses,
        .shared = cs.shared,
        .write_bytes = ws.write_bytes,
        .put_requests = atomic_load(&sc->put_requests) + atomic_load(&sc->part_requests),
        .put_bytes = atomic_load(&sc->put_bytes),
        .errors = atomic_load(&sc->errors),
    };
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
    pthread_mutex_init(&core->meta_lock, NULL);
    pthread_mutex_init(&core->files_lock, NULL);
    pthread_mutex_init(&core->listing_lock, NULL);
    pthread_cond_init(&core->listing_done, NULL);
    core->meta = calloc(META_BUCKETS, sizeof *core->meta);
    /* Ranks stay "being read" this long after their last file closed: the
     * gap between two files of a per-item load. */
    core->cohort = cohort_create(2.0);
    int rc = core->meta && core->cohort && core->dirtimes ? workq_create(cfg->workers, &core->wq)
                                                          : -ENOMEM;
    if (rc == 0) {
        /* A GET is a run of whole blocks: --request-size 1.3M means 1.25M. */
        uint32_t bs = cfg->block_size, whole = bs ? cfg->request_size / bs * bs : 0;
        struct cache_config cc = {
            .capacity = cfg->cache_size, .block_size = bs, .request_size = whole > bs ? whole : bs};
        rc = cache_create(store, core->wq, &cc, &core->cache);
    }
    if (rc == 0 && cfg->cache_dir) {
        char err[512];
        if (ckindex_open(cfg->cache_dir, store->description, store, core->wq, known_file, core,
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
        cache_destroy(core->cache);
        ckindex_close(core->index);
        pthread_mutex_destroy(&core->files_lock);
        pthread_mutex_destroy(&core->meta_lock);
        pthread_mutex_destroy(&core->listing_lock);
        pthread_cond_destroy(&core->listing_done);
        cohort_destroy(core->cohort);
        dirtime_destroy(core->dirtimes);
        free(core->meta);
        free(core);
        return rc;
    }
    if (cfg->stats_interval > 0 &&
        xferlog_start(cfg->stats_interval, sample_counters, core, &core->xferlog) < 0)
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
        release(core, core->files, 1);
    stage_close(core->stage); /* publishes what is staged (its callbacks use the rest) */
    cache_cancel(core->cache);
    ckindex_cancel(core->index);
    workq_destroy(core->wq); /* waits for fetches and builds already under way */
    pthread_mutex_destroy(&core->files_lock);
    cache_destroy(core->cache);
    ckindex_close(core->index);
    pthread_mutex_lock(&core->meta_lock);
    meta_purge_locked(core, 1);
    pthread_mutex_unlock(&core->meta_lock);
    pthread_mutex_destroy(&core->meta_lock);
    assert(!core->listings); /* every lookup has returned */
    pthread_mutex_destroy(&core->listing_lock);
    pthread_cond_destroy(&core->listing_done);
    cohort_destroy(core->cohort);
    dirtime_destroy(core->dirtimes);
    free(core->meta);
    free(core);
}
