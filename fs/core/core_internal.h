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
 * Lock order: core->meta.lock, core->files_lock and core->listing_lock are
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
#include "diskcache.h"
#include "diskfill.h"
#include "meta.h"
#include "prefetch.h"
#include "readahead.h"
#include "stage.h"
#include "workq.h"
#include "xferlog.h"

#include <pthread.h>
#include <stdatomic.h>

struct core {
    struct store *store;
    struct core_config cfg;
    struct workq *wq;
    struct cache *cache;
    struct diskcache *disk;  /* --disk-cache-size: NULL when off or unusable */
    struct diskfill *fill;   /* its background writer (with disk) */
    struct ckindex *index;   /* NULL when no cache dir or the index cannot open */
    struct stage *stage;     /* NULL when the mount is read-only */
    struct xferlog *xferlog; /* NULL when cfg.stats_interval is 0 */
    struct cohort *cohort;   /* saved ranks whose shards are being loaded (cohort.h) */
    uid_t uid;
    gid_t gid;
    double started;
    struct dirtime *dirtimes; /* when this mount changed which directories */

    struct meta_cache meta; /* what the store answered, for attr_timeout (meta.h) */

    /* Directories being listed for lookups: a lookup in one of them waits
     * for that listing instead of sending the same LIST. */
    pthread_mutex_t listing_lock;
    pthread_cond_t listing_done;        /* a listing in flight ended */
    struct listing_flight *listings;    /* protected by listing_lock */
    atomic_uint_fast64_t listing_waits; /* lookups that waited for another's listing */
    struct held_notice *notices;        /* notices.c, protected by listing_lock */
    atomic_uint held_notices;           /* length of notices */

    atomic_uint_fast64_t read_bytes;         /* bytes returned to readers */
    atomic_uint_fast64_t disk_reads;         /* reads spliced from the disk cache's files */
    atomic_uint_fast64_t passthrough_opens;  /* opens the kernel reads from those files itself */
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
    atomic_uint_fast64_t read_front;  /* the end of the furthest read so far */
    atomic_uint_fast64_t asked_front; /* ... asked for so far (set as a read arrives) */
    struct stat fd_st; /* fd's attributes at open: changed since, the version is gone */
    pthread_mutex_t ra_lock;
    struct readahead ra;  /* protected by ra_lock */
    int streaming;        /* counted in core->streams (ra.window > 0), protected by ra_lock */
    struct prefetch pf;   /* index-guided item prefetch (prefetch.h), protected by ra_lock */
    uint64_t released_to; /* blocks before this were released behind the reader */
    int superseded;       /* this mount published a newer version of its path (files_lock) */
    int in_checkpoint;    /* a file of a checkpoint directory: its close keeps the listing */
    void *tag;            /* the adapter's (core_file_set_tag) */
    struct core_file *prev, *next; /* core->files, protected by core->files_lock */
};

/* st_blksize, which sizes readers' buffers (Python's): a buffered reader
 * reads this much wherever it reads, also past the last item it wants. */
#define PREFERRED_IO_SIZE (128u << 10)
/* How long a save or a load keeps its directory's listing after its last
 * create or open there, and a directory found to exist is trusted, whatever
 * attr_timeout is (the gap between two files of a per-item save or load;
 * docs/design.md, "Request budget"). */
#define LISTING_LINGER 2.0

/* ---- attr.c: how entries show ---- */

/* "/a/b" -> "a/b"; "/" -> "". */
const char *core_store_path(const char *path);

/* The struct stat of store path spath as the mount shows it, from s (the
 * store's or staging's answer). A directory shows this mount's last change
 * to it if that is later than s's time (dirtime.h). */
void core_to_stat(const struct core *core, const char *spath, const struct store_stat *s,
                  struct stat *st);

/* While the newest open handle of spath reads another version than s, s
 * gets that version's size (the kernel keeps one size per path). */
void core_keep_opened_size(struct core *core, const char *spath, struct store_stat *s);

/* A directory holding staged files shows the later of their times and what
 * the metadata cache knows of its time on the store. */
void core_staged_dir_time(struct core *core, const char *spath, struct store_stat *st);

/* ---- notices.c: index notices of directories listed on the way ---- */

/* dir was listed whole by a listing of a directory above it: hold its scan
 * (taken: *scan is emptied) until a lookup in dir uses that listing. 0, or
 * -ENOSPC/-ENOMEM (nothing held: dir must not be marked listed). stamp: the
 * listing's (a notice is due only while its mark may be valid). */
int core_notice_hold(struct core *core, const char *dir, double stamp, struct ckindex_scan *scan);

/* A lookup in dir uses its listing: the index notices dir now if a notice
 * was held for it. */
void core_notice_due(struct core *core, const char *dir);

/* dir was listed itself (or anew): drop a notice held for it. */
void core_notice_cancel(struct core *core, const char *dir);

/* Drop every held notice (at exit, no lookup running). */
void core_notices_clear(struct core *core);

/* ---- listing.c: lookups and listings ---- */

/* Attributes of a store path from the store alone (metadata cache, then
 * the store), ignoring the staging overlay. 0, -ENOENT or another errno. */
int core_lookup_store(struct core *core, const char *spath, struct store_stat *st);

/* An entry was created, removed or renamed in dir through the mount: a time
 * set on dir no longer holds (setattr.c). */
void core_dir_entry_changed(struct core *core, const char *dir);

/* An upload landed in dir: on the local store, put back the time this mount
 * set on dir (an entry made before it was set is only now renamed in). */
void core_dir_published_in(struct core *core, const char *dir);

/* 1 if s (store path spath, the store's answer) may be a symlink whose
 * attributes the mount does not know yet: a lookup will ask (a HEAD), so a
 * listing must not hand the kernel its type (attr.c). */
int core_attrs_unknown_link(struct core *core, const char *spath, const struct store_stat *s);

/* Fill in the attributes of spath the mount knows for s's version (attr.c). */
void core_known_attrs(struct core *core, const char *spath, struct store_stat *s);

/* Attributes of a store path as the mount shows it (overlay first). */
int core_lookup(struct core *core, const char *spath, struct store_stat *st);

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

/* This mount just published a file into dir: the listing marks of dir and
 * the directories above it, and those directories' entries, last
 * attr_timeout from now. */
void core_extend_listings(struct core *core, const char *dir);

/* ckindex_known_fn over the metadata cache (arg: the core): what the mount
 * knows of the file at spath without asking the store. */
int core_known_file(void *arg, const char *spath, uint64_t *size);

/* ---- files.c: open handles ---- */

/* A new handle (not yet linked), reading a staged file or a store object. */
struct core_file *core_file_new(void);

/* A linked handle on staged file wf, whose reference it takes over (dropped
 * on failure); writable: it counts as a writer of wf. 0 or -ENOMEM. */
int core_file_staged(struct core *core, struct wfile *wf, int writable, struct core_file **out);

/* Add f to the open handles. */
void core_file_link(struct core *core, struct core_file *f);

/* Unlink and free f; abandoned: the kernel never sent its RELEASE (the
 * mount ended), so a file it was writing is not sealed. */
void core_file_release(struct core *core, struct core_file *f, int abandoned);

/* f's readahead window is open or not (f->ra_lock held): count it in the
 * streams that share the cache. */
void core_stream_note(struct core *core, struct core_file *f);

/* ---- stats.c ---- */

/* The transfer summary's view of the counters (xferlog.h; arg: the core). */
void core_sample_counters(void *arg, struct xfer_counters *out);

#endif
