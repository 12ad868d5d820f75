/*
 * fs/core/meta.c - the metadata cache (meta.h): a chained hash of store
 * paths, bounded by purging expired entries and marks, then everything.
 */
#include "meta.h"

#include "clock.h"
#include "strutil.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define META_MAX_ENTRIES 262144
#define META_BUCKETS 65536

int meta_init(struct meta_cache *mc, double attr_timeout, double dir_life)
{
    mc->buckets = calloc(META_BUCKETS, sizeof *mc->buckets);
    if (!mc->buckets)
        return -ENOMEM;
    pthread_mutex_init(&mc->lock, NULL);
    mc->count = 0;
    mc->attr_timeout = attr_timeout;
    mc->dir_life = dir_life;
    return 0;
}

static size_t meta_bucket(const char *path)
{
    return str_hash(path, strlen(path)) % META_BUCKETS;
}

/* Remove every entry drop(e, arg) says to (lock held). */
static void remove_if_locked(struct meta_cache *mc,
                             int (*drop)(const struct meta_entry *e, const void *arg),
                             const void *arg)
{
    for (size_t i = 0; i < META_BUCKETS; i++) {
        struct meta_entry **pp = &mc->buckets[i];
        while (*pp) {
            struct meta_entry *e = *pp;
            if (drop(e, arg)) {
                *pp = e->next;
                free(e);
                assert(mc->count > 0);
                mc->count--;
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
static void purge_locked(struct meta_cache *mc, int everything)
{
    struct purge p = {mono_seconds(), everything};
    remove_if_locked(mc, purged, &p);
}

void meta_destroy(struct meta_cache *mc)
{
    if (!mc->buckets)
        return;
    pthread_mutex_lock(&mc->lock);
    purge_locked(mc, 1);
    assert(mc->count == 0);
    pthread_mutex_unlock(&mc->lock);
    pthread_mutex_destroy(&mc->lock);
    free(mc->buckets);
    mc->buckets = NULL;
}

/* path's entry, expired or not, or NULL (lock held). */
static struct meta_entry *entry_locked(struct meta_cache *mc, const char *path)
{
    struct meta_entry *e = mc->buckets[meta_bucket(path)];
    while (e && strcmp(e->path, path) != 0)
        e = e->next;
    return e;
}

/* a and b are the same version of one entry: both directories, or files
 * of one non-empty etag (issue #18: attributes are kept per version). */
static int same_version(const struct store_stat *a, const struct store_stat *b)
{
    if (a->is_dir || b->is_dir)
        return a->is_dir && b->is_dir;
    return a->etag[0] && store_etag_equal(a->etag, b->etag);
}

/* meta_put's work; only_if_absent: leave an existing entry alone. */
static void put(struct meta_cache *mc, const char *path, int err, const struct store_stat *st,
                double listed, int only_if_absent)
{
    if (mc->attr_timeout <= 0)
        return;
    size_t b = meta_bucket(path);
    pthread_mutex_lock(&mc->lock);
    struct meta_entry **pp = &mc->buckets[b];
    while (*pp && strcmp((*pp)->path, path) != 0)
        pp = &(*pp)->next;
    struct meta_entry *e = *pp;
    if (e && only_if_absent) {
        pthread_mutex_unlock(&mc->lock);
        return;
    }
    int existed = e != NULL;
    if (!e) {
        if (mc->count >= META_MAX_ENTRIES) {
            purge_locked(mc, 0);
            if (mc->count >= META_MAX_ENTRIES)
                purge_locked(mc, 1);
        }
        size_t n = strlen(path) + 1;
        e = malloc(sizeof *e + n);
        if (!e) {
            pthread_mutex_unlock(&mc->lock);
            return;
        }
        memcpy(e->path, path, n);
        e->next = mc->buckets[b];
        mc->buckets[b] = e;
        mc->count++;
    }
    double life = mc->attr_timeout;
    if (err == 0 && st && st->is_dir && life < mc->dir_life)
        life = mc->dir_life; /* directories come and go rarely; lookups walk them always */
    e->expires = mono_seconds() + life;
    e->listed = listed;
    e->kept_until = 0;
    e->rent = 0;
    struct store_attrs kept = {0};
    if (existed && err == 0 && st && e->err == 0 && same_version(&e->st, st) &&
        (!st->attrs.set || (e->st.attrs.set & META_ATTRS_SET_HERE) != 0) &&
        !(st->attrs.set & META_ATTRS_SET_HERE))
        kept = e->st.attrs; /* an answer without attributes (a listing) keeps them */
    e->err = err;
    if (st)
        e->st = *st;
    else
        memset(&e->st, 0, sizeof e->st);
    if (kept.set)
        e->st.attrs = kept;
    pthread_mutex_unlock(&mc->lock);
}

void meta_put(struct meta_cache *mc, const char *path, int err, const struct store_stat *st,
              double listed)
{
    put(mc, path, err, st, listed, 0);
}

void meta_put_if_absent(struct meta_cache *mc, const char *path, int err,
                        const struct store_stat *st, double listed)
{
    put(mc, path, err, st, listed, 1);
}

enum meta_state meta_get(struct meta_cache *mc, const char *path, struct meta_entry *e)
{
    enum meta_state state = META_ABSENT;
    pthread_mutex_lock(&mc->lock);
    const struct meta_entry *m = entry_locked(mc, path);
    if (m) {
        memcpy(e, m, sizeof *e);
        e->next = NULL;
        state = m->expires > mono_seconds() ? META_FRESH : META_EXPIRED;
    }
    pthread_mutex_unlock(&mc->lock);
    return state;
}

enum meta_state meta_find(struct meta_cache *mc, const char *path, int *err, struct store_stat *st)
{
    struct meta_entry e;
    enum meta_state state = meta_get(mc, path, &e);
    if (state != META_ABSENT)
        *err = e.err;
    if (state == META_FRESH && st)
        *st = e.st;
    return state;
}

static int entry_at_or_below(const struct meta_entry *e, const void *dir)
{
    return path_at_or_below(e->path, dir);
}

void meta_forget_below(struct meta_cache *mc, const char *dir)
{
    pthread_mutex_lock(&mc->lock);
    remove_if_locked(mc, entry_at_or_below, dir);
    pthread_mutex_unlock(&mc->lock);
}

void meta_forget(struct meta_cache *mc, const char *path)
{
    pthread_mutex_lock(&mc->lock);
    for (struct meta_entry **pp = &mc->buckets[meta_bucket(path)]; *pp; pp = &(*pp)->next) {
        if (strcmp((*pp)->path, path) == 0) {
            struct meta_entry *e = *pp;
            *pp = e->next;
            free(e);
            assert(mc->count > 0);
            mc->count--;
            break;
        }
    }
    pthread_mutex_unlock(&mc->lock);
}

void meta_set_dir_time(struct meta_cache *mc, const char *path, int64_t t)
{
    pthread_mutex_lock(&mc->lock);
    struct meta_entry *e = entry_locked(mc, path);
    if (e && e->err == 0 && e->st.is_dir && !e->st.mtime_ns)
        e->st.mtime_ns = t;
    pthread_mutex_unlock(&mc->lock);
}

void meta_extend(struct meta_cache *mc, const char *path, double expires)
{
    pthread_mutex_lock(&mc->lock);
    struct meta_entry *e = entry_locked(mc, path);
    if (e && e->err == 0 && e->expires < expires)
        e->expires = expires;
    pthread_mutex_unlock(&mc->lock);
}

void meta_keep_mark(struct meta_cache *mc, const char *mark, double until)
{
    pthread_mutex_lock(&mc->lock);
    struct meta_entry *e = entry_locked(mc, mark);
    if (e && (e->err == 0 || e->err == -E2BIG) && e->kept_until < until)
        e->kept_until = until; /* a large directory's mark: its rent goes on */
    pthread_mutex_unlock(&mc->lock);
}

void meta_add_rent(struct meta_cache *mc, const char *mark, uint64_t cost)
{
    pthread_mutex_lock(&mc->lock);
    struct meta_entry *e = entry_locked(mc, mark);
    if (e && e->err == -E2BIG)
        e->rent += cost;
    pthread_mutex_unlock(&mc->lock);
}

int meta_set_attrs(struct meta_cache *mc, const char *path, const struct store_stat *version,
                   const struct store_attrs *a)
{
    pthread_mutex_lock(&mc->lock);
    struct meta_entry *e = mc->buckets ? entry_locked(mc, path) : NULL;
    int done = e && e->err == 0 && same_version(&e->st, version);
    if (done)
        e->st.attrs = *a;
    pthread_mutex_unlock(&mc->lock);
    return done;
}

int meta_get_attrs(struct meta_cache *mc, const char *path, const struct store_stat *version,
                   struct store_attrs *a)
{
    pthread_mutex_lock(&mc->lock);
    struct meta_entry *e = mc->buckets ? entry_locked(mc, path) : NULL;
    int found = e && e->err == 0 && same_version(&e->st, version) && e->st.attrs.set;
    if (found)
        *a = e->st.attrs;
    pthread_mutex_unlock(&mc->lock);
    return found;
}
