/*
 * fs/core/core_internal.h - the core's state, shared by core.c (lookups,
 * listings, reads, statistics, life cycle) and core_write.c (everything
 * that changes the namespace or a file). Nothing outside the core includes
 * this.
 *
 * Lookups lay the staging overlay (stage.h: files being written, and
 * directories that exist only on this mount) over the store's answers,
 * which the metadata cache keeps for attr_timeout seconds.
 *
 * Lock order: core->meta_lock, core->files_lock and core->listing_lock are
 * leaves (nothing is taken while holding them); a file's ra_lock, then the cache's lock;
 * stage calls take the stage's lock, never while holding a core lock.
 */
#ifndef CKPTFS_CORE_INTERNAL_H
#define CKPTFS_CORE_INTERNAL_H

#include "cache.h"
#include "ckindex.h"
#include "cohort.h"
#include "core.h"
#include "dirtime.h"
#include "prefetch.h"
#include "readahead.h"
#include "stage.h"
#include "workq.h"
#include "xferlog.h"

#include <pthread.h>
#include <stdatomic.h>

struct meta_entry {
    struct meta_entry *next;
    double expires;
    double listed;     /* mono time of the listing that put it (and of a mark: its own); 0 */
    double kept_until; /* a mark: a save or load keeps the listing until then (core_keep_listing) */
    int err;           /* 0 or -ENOENT (a mark: 0, or -E2BIG: large, only a first page listed) */
    uint64_t rent;     /* a -E2BIG mark: what lookups by name in the directory cost since */
    struct store_stat st; /* a mark: mtime_ns its listing found, size the keys it saw */
    char path[];
};

struct core {
    struct store *store;
    struct core_config cfg;
    struct workq *wq;
    struct cache *cache;
    struct ckindex *index;   /* NULL when no cache dir or the index cannot open */
    struct stage *stage;     /* NULL when the mount is read-only */
    struct xferlog *xferlog; /* NULL when cfg.stats_interval is 0 */
    struct cohort *cohort;   /* saved ranks whose shards are being loaded (cohort.h) */
    uid_t uid;
    gid_t gid;
    double started;
    struct dirtime *dirtimes; /* when this mount changed which directories */

    pthread_mutex_t meta_lock;
    struct meta_entry **meta; /* META_BUCKETS chains; protected by meta_lock */
    size_t meta_count;

    /* Directories being listed for lookups: a lookup in one of them waits
     * for that listing instead of sending the same LIST. */
    pthread_mutex_t listing_lock;
    pthread_cond_t listing_done;        /* a listing in flight ended */
    struct listing_flight *listings;    /* protected by listing_lock */
    atomic_uint_fast64_t listing_waits; /* lookups that waited for another's listing */

    atomic_uint_fast64_t read_bytes;         /* bytes returned to readers */
    atomic_uint_fast64_t item_prefetches;    /* items prefetched whole, guided by the index */
    atomic_uint_fast64_t sibling_prefetches; /* other ranks' chunks of an entered tensor */
    atomic_uint_fast64_t opens;
    atomic_uint streams; /* open files whose sequential readahead window is open */

    /* Every open handle, so that an unmount can release the ones whose
     * RELEASE the kernel had not sent yet (a signal can end the loop between
     * a close() and its asynchronous RELEASE). Protected by files_lock. */
    pthread_mutex_t files_lock;
    struct core_file *files;
    int open_files; /* length of files */
};

struct core_file {
    struct cache_obj *obj; /* a store object read through the cache, or NULL */
    struct wfile *wf;      /* a staged file (reads and writes go to staging), or NULL */
    int writable;          /* opened for writing: counts as a writer of wf */
    pid_t opener_thread;   /* the thread that opened it for writing (0: unknown) ... */
    pid_t opener;          /* ... and its process: only a close from that process seals */
    int fd;                /* >= 0: the store gave a file descriptor; reads bypass the cache */
    atomic_uint_fast64_t read_front; /* the end of the furthest read so far */
    struct stat fd_st; /* fd's attributes at open: changed since, the version is gone */
    pthread_mutex_t ra_lock;
    struct readahead ra;  /* protected by ra_lock */
    int streaming;        /* counted in core->streams (ra.window > 0), protected by ra_lock */
    struct prefetch pf;   /* index-guided item prefetch (prefetch.h), protected by ra_lock */
    uint64_t released_to; /* blocks before this were released behind the reader */
    int superseded;       /* this mount published a newer version of its path (files_lock) */
    int in_checkpoint;    /* a file of a checkpoint directory: its close keeps the listing */
    struct core_file *prev, *next; /* core->files, protected by core->files_lock */
};

/* "/a/b" -> "a/b"; "/" -> "". */
const char *core_store_path(const char *path);

/* Attributes of a store path from the store alone (metadata cache, then
 * the store), ignoring the staging overlay. 0, -ENOENT or another errno. */
int core_lookup_store(struct core *core, const char *spath, struct store_stat *st);

/* Attributes of a store path as the mount shows it (overlay first). */
int core_lookup(struct core *core, const char *spath, struct store_stat *st);

/* Record (err = 0, st) or a negative lookup (err = -ENOENT, st NULL) in the
 * metadata cache. */
void core_meta_put(struct core *core, const char *spath, int err, const struct store_stat *st);

/* Forget what the metadata cache knows of spath. */
void core_meta_forget(struct core *core, const char *spath);

/* Forget dir, everything cached below it and its listing marks (a
 * directory renamed or removed: names below it changed all at once). */
void core_meta_forget_below(struct core *core, const char *dir);

/* Directory dir was just made, empty: lookups in it need not ask the store. */
void core_listing_made(struct core *core, const char *dir);

/* A save or a load is working in directory dir (a file created there, or a
 * file of a checkpoint directory opened): dir's whole listing, if any, stays
 * valid until LISTING_LINGER s from now, and dir and every directory above
 * it stay known to exist that long, so the lookups of the files it creates
 * or opens and the kernel's revalidations of the path cost no request,
 * whatever --attr-timeout is (docs/design.md, "Request budget"). */
void core_keep_listing(struct core *core, const char *dir);

/* A name appeared in dir behind the metadata cache (a rename on the store):
 * the next lookup there lists it again. */
void core_listing_changed(struct core *core, const char *dir);

/* A new handle (not yet linked), reading a staged file or a store object. */
struct core_file *core_file_new(void);

/* Add f to the open handles. */
void core_file_link(struct core *core, struct core_file *f);

#endif
