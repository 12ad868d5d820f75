/*
 * fs/core/listing.c - lookups and listings: the store's answers, through the
 * metadata cache (meta.h), with the staging overlay on top. Directory
 * listings stand in for lookups (one LIST answers every lookup in a
 * directory; large directories are looked up by name until that has cost a
 * whole listing: ski rental), directories get their times from listings
 * (store.h's rule), and readdir lays the staged names over the store's.
 * docs/design.md, "Request budget" and "Large directories: ski rental".
 */
#include "core_internal.h"

#include "clock.h"
#include "log.h"
#include "strutil.h"
#include "subtree.h"

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

/* A lookup's first listing of a directory stops after this many keys (one
 * S3 LIST page): a directory with as many is large, and lookups there ask
 * the store by name until they have cost what listing it whole would
 * (docs/design.md, "Request budget": ski rental). */
#define LISTING_MAX 1000
/* What a LIST page costs against a HEAD or a GET (S3 prices: ~10x). */
#define LIST_PAGE_COST 10
/* The time of a directory with nothing below it on the store (an empty
 * bucket root): known, so not asked again, and the earliest there is. */
#define DIR_TIME_EMPTY 1

/* One pass over a directory listing: every entry goes into the metadata
 * cache, the files that may describe a checkpoint (.metadata, __R.metadata,
 * Hugging Face files) are noted for the index (which notices the directory
 * by them when the listing ends: ckindex_scan_end), and fill (if any) gets
 * the entry for readdir. */
struct listing {
    struct core *core;
    const char *dir; /* store path of the directory */
    core_fill_fn fill;
    void *arg;
    size_t count, limit;      /* entries seen; stop at limit (0: no limit) */
    int cut;                  /* limit stopped it: more may follow (a large directory) */
    double stamp;             /* mono time the listing began: its entries' and mark's */
    int dir_listed;           /* readdir: dir was listed for its subdirectories' times */
    struct ckindex_scan scan; /* the index's candidates among the entries */
    char **staged;            /* readdir: the names the overlay reported, sorted */
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
    if (meta_get(&core->meta, spath, &e) == META_FRESH && e.err == 0 && e.st.is_dir &&
        e.st.mtime_ns)
        return e.st.mtime_ns;
    double stamp;
    if (listing_from_mark(core, spath, &stamp, &e) >= 0)
        return e.st.mtime_ns;
    return 0;
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
        meta_set_dir_time(&core->meta, spath, s->mtime_ns); /* found by its listing: kept with it */
        return;
    }
    if (!ask)
        return;
    log_debug("asking the store for the time of /%s", spath);
    dir_listing(core, spath);
    if ((s->mtime_ns = known_dir_time(core, spath))) {
        meta_set_dir_time(&core->meta, spath, s->mtime_ns);
        return;
    }
    struct newest_below n = {0};
    if (core->store->ops->list_below(core->store, spath, newest_entry, &n) == 0) {
        s->mtime_ns = n.keys ? n.newest : DIR_TIME_EMPTY;
        meta_put(&core->meta, spath, 0, s, 0);
    }
}

/* One entry of a listing into the cache (and to fill). */
static int listing_put(struct listing *l, const char *name, const struct store_stat *s)
{
    int n = snprintf(l->child, sizeof l->child, "%s%s%s", l->dir, *l->dir ? "/" : "", name);
    if (n <= 0 || (size_t)n >= sizeof l->child)
        l->child[0] = '\0'; /* too long to be looked up: listed only */
    if (reported_staged(l, name) ||
        (l->core->stage && stage_has_entry(l->core->stage, l->dir, name))) {
        /* Staged here: the overlay reported it (and knows better), but the
         * store's object stays the store's answer (core_lookup_store): a
         * staged file renamed away must take it along (semantics.md §6).
         * Only where the cache has nothing: the publish of the staged file
         * may have put its new version meanwhile, and this listing may have
         * seen an older one (or s3rver's half-received object). */
        if (l->child[0])
            meta_put_if_absent(&l->core->meta, l->child, 0, s, l->stamp);
        return 0;
    }
    struct store_stat stored = *s;
    if (s->is_dir && !s->mtime_ns && l->fill && !l->dir_listed && dir_times_by_listing(l->core)) {
        l->dir_listed = 1; /* one listing below dir times all its small subdirectories */
        dir_listing(l->core, l->dir);
    }
    if (l->child[0]) {
        fill_dir_time(l->core, l->child, &stored, l->fill != NULL);
        meta_put(&l->core->meta, l->child, 0, &stored, l->stamp);
    }
    if (l->core->index)
        ckindex_scan_add(&l->scan, name, s);
    if (!l->fill)
        return 0;
    struct stat st;
    struct store_stat shown = stored;
    if (!s->is_dir && l->child[0])
        core_keep_opened_size(l->core, l->child, &shown);
    if (l->child[0] && !shown.attrs.set)
        meta_get_attrs(&l->core->meta, l->child, &shown, &shown.attrs);
    core_to_stat(l->core, l->child, &shown, &st);
    if (l->child[0] && core_attrs_unknown_link(l->core, l->child, &shown))
        st.st_mode &= ~(mode_t)S_IFMT; /* a symlink? the kernel looks it up (core.h) */
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
    meta_forget(&core->meta, m);
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
    meta_put(&core->meta, m, err, &(struct store_stat){.mtime_ns = newest, .size = keys}, stamp);
}

/* This mount just published a file into dir: the end of writing there.
 * The listing marks that the writing kept valid, of dir and of every
 * directory above it (see dir_listing), and those directories' own entries
 * last attr_timeout from now: the lookups of the .metadata.tmp a DCP save
 * creates after its shards are on the store need no new request. */
void core_extend_listings(struct core *core, const char *dir)
{
    char m[4100];
    marker_of(dir, m, sizeof m);
    double expires = mono_seconds() + core->cfg.attr_timeout;
    for (;;) { /* m: "a/b/", then "a/", then "/" (the root's mark) */
        meta_extend(&core->meta, m, expires);
        size_t n = strlen(m);
        if (n <= 1)
            break;
        m[n - 1] = '\0';
        meta_extend(&core->meta, m, expires); /* the directory itself: it is there */
        char *slash = strrchr(m, '/');
        if (slash)
            slash[1] = '\0';
        else
            strcpy(m, "/");
    }
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
    struct subtree sub;         /* subdirectories listed whole on the way */
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
    if (rc == 0)
        subtree_key(&b->sub, rel, s);
    if (rc == 0 && b->l->limit && b->keys >= b->l->limit) {
        b->l->cut = 1;      /* a page's worth: large, looked up by name (no second page) */
        b->group[0] = '\0'; /* its keys may go on: its time is not known, not reported */
        subtree_end(&b->sub, 0);
        return 1;
    }
    return rc;
}

/* l->dir's subdirectory sub (relative): its store path into buf, or -1 if
 * too long. */
static int sub_path(const struct listing *l, const char *sub, char *buf, size_t len)
{
    int n = snprintf(buf, len, "%s%s%s", l->dir, *l->dir ? "/" : "", sub);
    return n > 0 && (size_t)n < len ? 0 : -1;
}

/* subtree_ops.entry: an entry of a subdirectory listed on the way goes into
 * the metadata cache as its own listing would put it (listing_put). */
static void sub_entry(void *arg, const char *sub, const char *name, const struct store_stat *st)
{
    struct listing *l = arg;
    char dir[4096], child[4096];
    if (sub_path(l, sub, dir, sizeof dir) < 0 ||
        snprintf(child, sizeof child, "%s/%s", dir, name) >= (int)sizeof child)
        return;
    if (l->core->stage && stage_has_entry(l->core->stage, dir, name))
        meta_put_if_absent(&l->core->meta, child, 0, st, l->stamp);
    else
        meta_put(&l->core->meta, child, 0, st, l->stamp);
}

/* subtree_ops.whole: a subdirectory whose keys all came is marked listed by
 * this listing (its stamp); the index notices it when a lookup there uses
 * the mark (notices.c). Too many held: not marked (its lookups list it). */
static void sub_whole(void *arg, const char *sub, int64_t newest, uint64_t keys,
                      struct ckindex_scan *scan)
{
    struct listing *l = arg;
    char dir[4096];
    if (sub_path(l, sub, dir, sizeof dir) == 0 &&
        (!l->core->index || core_notice_hold(l->core, dir, l->stamp, scan) == 0))
        mark_listed(l->core, dir, 0, l->stamp, newest, keys);
    ckindex_scan_drop(scan); /* held: emptied already */
}

static const struct subtree_ops sub_ops = {.entry = sub_entry, .whole = sub_whole};

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
    enum meta_state state = meta_get(&core->meta, m, mark);
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
    meta_add_rent(&core->meta, m, cost);
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
        if (known == LISTED) {
            core_notice_due(core, dir); /* listed on the way by a directory above */
            return LISTED;
        }
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

/* The listing l of dir ended (complete: the whole directory): the index
 * notices dir by the metadata files it saw. After the mark: a build asks the
 * metadata cache what the listing found (a file absent from it is absent). */
static void notice_listed(struct core *core, const char *dir, struct listing *l, int complete)
{
    core_notice_cancel(core, dir); /* one held from a listing above: this one is newer */
    if (core->index)
        ckindex_scan_end(core->index, dir, &l->scan, complete);
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
        subtree_init(&b.sub, &sub_ops, &l);
        rc = core->store->ops->list_below(core->store, dir, below_entry, &b);
        if (rc == 0 && !l.cut)
            rc = below_flush(&b);
        subtree_end(&b.sub, rc == 0 && !l.cut);
        newest = b.keys ? b.newest : DIR_TIME_EMPTY;
        keys = b.keys;
        if (rc == 0 && b.keys > 0) /* something below: a directory, of this time */
            meta_put(&core->meta, dir, 0, &(struct store_stat){.is_dir = 1, .mtime_ns = b.newest},
                     0);
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
        notice_listed(core, dir, &l, 0);
        return LISTED;
    }
    if (rc < 0) {
        notice_listed(core, dir, &l, 0);
        return NOT_LISTED; /* the lookup by name reports the store's trouble */
    }
    /* The rent a large directory's expired mark had carries over: what its
     * lookups by name cost is spent (a GET on a busy store can outlast the
     * 2 s a load keeps the mark, and the load goes on). */
    char m[4100];
    marker_of(dir, m, sizeof m);
    struct meta_entry old;
    uint64_t rent =
        meta_get(&core->meta, m, &old) != META_ABSENT && old.err == -E2BIG ? old.rent : 0;
    mark_listed(core, dir, l.cut ? -E2BIG : 0, l.stamp, newest, keys);
    notice_listed(core, dir, &l, !l.cut);
    if (l.cut && rent)
        pay_rent(core, dir, rent);
    if (l.cut)
        log_debug("/%s is large (%llu keys in a page, rent %llu): lookups there ask by name", dir,
                  (unsigned long long)keys, (unsigned long long)rent);
    return l.cut ? NOT_LISTED : LISTED;
}

/* A lookup of spath is answered from the metadata cache: if a listing of a
 * directory above put spath's directory there on the way, the index
 * notices that directory now (notices.c). */
static void notice_parent_due(struct core *core, const char *spath)
{
    char dir[4096];
    if (atomic_load(&core->held_notices) && *spath && path_dir(spath, dir, sizeof dir) == 0)
        core_notice_due(core, dir);
}

int core_lookup_store(struct core *core, const char *spath, struct store_stat *st)
{
    int err;
    enum meta_state known = meta_find(&core->meta, spath, &err, st);
    if (known == META_FRESH) {
        notice_parent_due(core, spath);
        return err;
    }
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
        known = meta_get(&core->meta, spath, &e); /* the listing may have put it */
        if (entry_answers(known, &e, stamp)) {
            if (e.err == 0)
                *st = e.st;
            return e.err;
        }
        if (listed == LISTED && known == META_ABSENT) {
            meta_put(&core->meta, spath, -ENOENT, NULL, stamp);
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
        meta_put(&core->meta, spath, err, err == 0 ? st : NULL, 0);
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
    meta_keep_mark(&core->meta, m, until);
    m[strlen(m) - 1] = '\0';
    for (;;) { /* "a/b", "a", "" (the root) */
        meta_extend(&core->meta, m, until);
        if (!*m)
            break;
        char *slash = strrchr(m, '/');
        *(slash ? slash : m) = '\0';
    }
}

void core_listing_changed(struct core *core, const char *dir)
{
    forget_listing(core, dir);
}

int core_lookup(struct core *core, const char *spath, struct store_stat *st)
{
    if (core->stage && stage_stat(core->stage, spath, st)) {
        core_staged_dir_time(core, spath, st);
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
        core_keep_opened_size(core, spath, &s);
    fill_dir_time(core, spath, &s, 1);
    core_known_attrs(core, spath, &s);
    core_to_stat(core, spath, &s, st);
    return 0;
}

int core_fgetattr(struct core *core, struct core_file *f, struct stat *st)
{
    struct store_stat s = {.mtime_ns = (int64_t)time(NULL) * 1000000000};
    if (f->wf)
        stage_wf_stat(core->stage, f->wf, &s); /* its size, time and attributes */
    else
        s.size = cache_obj_size(f->obj);
    core_to_stat(core, "", &s, st);
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
        core_staged_dir_time(l->core, l->child, &shown);
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
    core_to_stat(l->core, l->child, &shown, &st);
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
    notice_listed(core, l.dir, &l, rc == 0);
    if (rc == -ENOENT &&
        (staged || (core->stage && stage_stat(core->stage, l.dir, &(struct store_stat){0}))))
        rc = 0; /* a directory that exists only on this mount so far */
    return rc;
}

/* ckindex_known_fn over the metadata cache: what the mount knows of the
 * file at store path spath without asking the store (an index build's file
 * sizes): a fresh entry, one its directory's valid listing put, or a name
 * absent from a whole listing. A file staged here is not known. */
int core_known_file(void *arg, const char *spath, uint64_t *size)
{
    struct core *core = arg;
    struct store_stat staged;
    if (core->stage && stage_stat(core->stage, spath, &staged))
        return 1;
    struct meta_entry e;
    enum meta_state state = meta_get(&core->meta, spath, &e);
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
