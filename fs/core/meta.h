/*
 * fs/core/meta.h - the metadata cache: what the store answered about each
 * path (attributes, or ENOENT) and each directory's listing mark, for
 * attr_timeout seconds.
 *
 * A chained hash from store path to an entry with an expiry time. A mark is
 * the entry of "dir/" (no store path ends in '/'): dir was listed (err 0),
 * or its first page was (err -E2BIG: a large directory), at the mono time
 * `listed`. It is bounded: past META_MAX_ENTRIES, expired entries and marks
 * are purged and, if that is not enough, everything is dropped. What the
 * entries mean for lookups is listing.c's business; this module only keeps
 * them. Thread-safe: one mutex, a leaf (nothing is taken while holding it).
 */
#ifndef CKPTFS_META_H
#define CKPTFS_META_H

#include "store.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

struct meta_entry {
    struct meta_entry *next;
    double expires;
    double listed;        /* mono time of the listing that put it (and of a mark: its own); 0 */
    double kept_until;    /* a mark: a save or load keeps the listing until then (meta_keep_mark) */
    int err;              /* 0 or -ENOENT (a mark: 0, or -E2BIG: large, only a first page listed) */
    uint64_t rent;        /* a -E2BIG mark: what lookups by name in the directory cost since */
    struct store_stat st; /* a mark: mtime_ns its listing found, size the keys it saw */
    char path[];
};

struct meta_cache {
    pthread_mutex_t lock;
    struct meta_entry **buckets; /* META_BUCKETS chains; protected by lock */
    size_t count;
    double attr_timeout; /* how long an entry lasts; <= 0: nothing is kept */
    double dir_life;     /* a directory's entry lasts at least this long */
};

enum meta_state { META_ABSENT, META_EXPIRED, META_FRESH };

/* An empty cache whose entries last attr_timeout (directories at least
 * dir_life). 0 or -ENOMEM. */
int meta_init(struct meta_cache *mc, double attr_timeout, double dir_life);

/* Free every entry and the table. */
void meta_destroy(struct meta_cache *mc);

/* Record (err 0, st) or a negative lookup (err -ENOENT, st NULL) for path,
 * put by the listing that began at mono time listed (0: not by a listing). */
void meta_put(struct meta_cache *mc, const char *path, int err, const struct store_stat *st,
              double listed);

/* meta_put, only if the cache has no entry for path (an answer that may be
 * older than one put meanwhile must not replace it). */
void meta_put_if_absent(struct meta_cache *mc, const char *path, int err,
                        const struct store_stat *st, double listed);

/* A copy of what the cache has of path, expired or not: META_ABSENT, or the
 * entry's state with *e filled (e->next and e->path not). */
enum meta_state meta_get(struct meta_cache *mc, const char *path, struct meta_entry *e);

/* What the cache knows of path; err and st (if not NULL) are filled for
 * META_FRESH, err alone for META_EXPIRED. */
enum meta_state meta_find(struct meta_cache *mc, const char *path, int *err, struct store_stat *st);

/* Attributes (issue #18) are kept per version: meta_put of an answer
 * without attributes (a listing's) for the same version (the same etag; a
 * directory) keeps those the entry has. meta_set_attrs: path's entry, if it
 * is of version's version, gets attributes a (its expiry and listing stamp
 * stay); 1 if it did. Attributes marked META_ATTRS_SET_HERE (set through
 * this mount) stay over any later answer for the same version (the local
 * store's directory time moves when an upload lands in it; the mount shows
 * what was set). meta_get_attrs: path's attributes if its entry (fresh
 * or not) is of version's version and has some; 1 then. */
#define META_ATTRS_SET_HERE 0x80000000u /* in attrs.set: this mount set them; they stay */
int meta_set_attrs(struct meta_cache *mc, const char *path, const struct store_stat *version,
                   const struct store_attrs *a);
int meta_get_attrs(struct meta_cache *mc, const char *path, const struct store_stat *version,
                   struct store_attrs *a);

/* Forget path's entry. */
void meta_forget(struct meta_cache *mc, const char *path);

/* Forget dir, everything below it and the marks there. */
void meta_forget_below(struct meta_cache *mc, const char *dir);

/* Directory path's entry, if the cache has one without a time, gets t (its
 * expiry and listing stamp stay). */
void meta_set_dir_time(struct meta_cache *mc, const char *path, int64_t t);

/* A positive entry of path lasts at least until expires. */
void meta_extend(struct meta_cache *mc, const char *path, double expires);

/* Mark mark (a "dir/" entry, whole or large) stays valid until until. */
void meta_keep_mark(struct meta_cache *mc, const char *mark, double until);

/* If mark is a large directory's (-E2BIG), cost goes on its rent. */
void meta_add_rent(struct meta_cache *mc, const char *mark, uint64_t cost);

#endif
