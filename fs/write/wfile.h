/*
 * fs/write/wfile.h - the records of the write path, its bottom layer: a
 * struct wfile per staged file, and struct stage, which holds them all
 * (stage.h draws the layers of fs/write and the state machine a staged
 * file goes through).
 *
 * Owns: the fields of both structures; the table of staged files by path
 * and the list of every one of them; references (a clean, unreferenced file
 * is dropped); the staging files' names; a file's journal record
 * (wfile_journal); the waits on stage->changed; the clients' write rate.
 * Calls only extents, parts, journal and util: never a module above it.
 *
 * A wfile is one staged file: its bytes in a staging file under the cache
 * directory, what has been written, whether the writer has sealed it
 * (close, fsync) and how far its upload has got. struct stage owns every
 * wfile, the staging directory, the journal and the upload workers.
 *
 * Versions: `version` counts modifications (every write or truncate bumps
 * it). A seal records seal_version = version: that content may be
 * published. The upload engine publishes only a sealed version that is
 * still current (seal_version == version) and records it in synced_version
 * once it is complete on the store under the file's current name. A file is
 * clean when synced_version == version; a clean file with no references is
 * dropped (staging file deleted, journal record removed).
 *
 * Parts: byte ranges of the multipart geometry (parts.h). A part is marked
 * inflight while it is being sent and busy while a write into it is copying
 * bytes into the staging file; a write waits for inflight parts it touches
 * and an upload never starts on a busy part, so every part (and every single
 * PUT, which is the upload of part 1 as a whole object) carries a consistent
 * snapshot of its bytes. gen counts writes into the part; up_gen is the gen
 * whose bytes the current multipart upload holds.
 *
 * Locking: one mutex, stage->lock, protects every field below except the
 * staging file's bytes (pread/pwrite need no lock) and the immutable ones
 * (id, fd). Store requests and journal writes are made without it. Rule:
 * whoever reads or writes a wfile's fields holds stage->lock; whoever
 * keeps a pointer to a wfile across an unlock holds a reference (refs).
 * stage->changed is broadcast after every change a waiter may care about
 * (part done, upload done, error, drop, staged bytes freed).
 */
#ifndef CKPTFS_WFILE_H
#define CKPTFS_WFILE_H

#include "extents.h"
#include "journal.h"
#include "stage.h"
#include "store.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

struct workq;
struct cpu_pressure;

/* Where a file's multipart upload is (upload.c moves it). */
enum wfile_mpu {
    WFILE_MPU_NONE,      /* no multipart upload */
    WFILE_MPU_BEGINNING, /* CreateMultipartUpload in flight */
    WFILE_MPU_ACTIVE,    /* upload_id valid: parts may be sent */
    WFILE_MPU_COMPLETING /* CompleteMultipartUpload in flight */
};

/* Where a commit file's check is (commit.c moves it). */
enum wfile_commit {
    WFILE_COMMIT_NONE,    /* not a commit file, or not sealed yet */
    WFILE_COMMIT_WAITING, /* sealed; waiting for the files it names */
    WFILE_COMMIT_READY,   /* the files are there: may be published (commit_version) */
    WFILE_COMMIT_BLOCKED  /* waited --commit-timeout in vain; kept staged, error set */
};

struct wfile_part {
    uint64_t gen;    /* writes into this part so far */
    uint64_t up_gen; /* gen whose bytes the current multipart upload has */
    uint64_t up_len; /* length it was uploaded with */
    int uploaded;    /* the current multipart upload has this part (up_gen, up_len) */
    int inflight;    /* being uploaded */
    int busy;        /* writes copying into it right now */
    char etag[STORE_ETAG_MAX];
};

/* A file named in a .metadata, and the size it must have on the store. */
struct wfile_need {
    char *name; /* relative to the .metadata's directory */
    uint64_t min_size;
    uint64_t found_size; /* on the store at the check that let it go; UINT64_MAX before */
};

struct wfile {
    struct wfile *hnext;       /* stage->table chain */
    struct wfile *prev, *next; /* stage->files list */
    uint64_t id;               /* journal key and staging file name */
    int fd;                    /* the staging file, open read-write; -1 before it has one */
    char *path;                /* current store path */
    uint64_t size;
    int64_t mtime_ns; /* nanoseconds since the epoch of the last change */
    /* Attributes set through the mount (chmod, chown, utimens; issue #18),
     * sent with the upload. attrs_gen counts changes; mpu_attrs_gen is the
     * one the current multipart upload was begun with. A write clears
     * STORE_ATTR_MTIME (the file changed after the time was set). Not in
     * the journal: a crash before the upload loses them (semantics.md). */
    struct store_attrs attrs;
    uint64_t attrs_gen, mpu_attrs_gen;
    int attrs_landings; /* landings under way that still send attributes set now (upload.c) */
    struct extents written;
    int writers; /* writable handles open */
    int refs;    /* handles, jobs and waiters holding the pointer */
    int unlinked;
    uint64_t version, seal_version, synced_version, durable_version;
    char synced_etag[STORE_ETAG_MAX]; /* the store's ETag of synced_version ("" unknown) */
    uint64_t synced_size;             /* and its size */
    double sealed_at;                 /* monotonic seconds of the last seal */
    int held;              /* a name that is renamed away soon (*.tmp): not uploaded yet */
    int wb_queued;         /* in the flusher's queue (writeback.c), holding a reference */
    int fsynced_held;      /* fsync was called while held */
    int is_commit;         /* .metadata or *.metadata: published after the files it names */
    char *link_wait;       /* a symlink (is_commit too): published after the files staged
                              before it at or below this store path ("" = any; stage_link.c) */
    int journaled;         /* a record exists in the journal */
    int discard;           /* unlinked: the record says so until the cleanup is done */
    int sealed_in_journal; /* the record says sealed (a write must clear it) */
    uint64_t jseq;         /* sequence number of the last journal snapshot */
    double journaled_at;   /* monotonic time of that snapshot */

    /* upload */
    enum wfile_mpu mpu;
    char *upload_key; /* key the multipart upload was begun for */
    char *upload_id;
    struct wfile_part *parts;   /* parts[i] is part i + 1 */
    uint32_t nparts;            /* entries allocated in parts */
    int jobs;                   /* upload jobs in flight */
    int error;                  /* last upload failure (negative errno), 0 if none since */
    unsigned attempts;          /* failures in a row, for the retry backoff */
    unsigned complete_failures; /* of the current multipart upload's completion */
    double retry_at;            /* no new upload before this (after a failure) */
    int stray_begin;            /* a begin failed or was retried: sweep the key once complete */

    /* commit */
    enum wfile_commit commit;
    uint64_t commit_version;
    double commit_deadline, commit_next_check, commit_logged;
    int commit_parsed;     /* needs[] filled (or the .metadata could not be parsed) */
    unsigned commit_epoch; /* bumped by commit_reset: a check that unlocked starts over */
    /* The last check found files it names missing on the store while no file
     * of this mount in its directory was pending: someone else (another node,
     * or this writer's later files: cp -r copies .metadata first) must write
     * them, so a close does not wait for them (stage_flush). */
    int commit_foreign;
    long commit_pending; /* this mount's files not uploaded at the last check */
    long commit_missing; /* named files missing on the store at the last check */
    struct wfile_need *needs;
    size_t nneeds;
};

#define WFILE_BUCKETS 4096
#define WFILE_PATH_XATTR "user.ckptfs.path" /* a staging file's store path, as created */

struct stage {
    pthread_mutex_t lock;
    pthread_cond_t changed;
    struct store *store;
    char *store_name;
    struct stage_config cfg;
    char *files_dir; /* staging files: files_dir/<id as 16 hex digits> */
    int lock_fd;     /* flock on the staging directory */
    int files_dirfd;
    char boot_id[64];
    struct journal *journal;
    struct workq *uploads;
    struct wfile *table[WFILE_BUCKETS]; /* by path */
    struct wfile *files;                /* every wfile, for walks */
    uint64_t staged_bytes;              /* sum of sizes of every wfile */
    int stopping;
    int draining;             /* unmount: publish held files now, no hold */
    double write_window_at;   /* mono_seconds() the current write window began */
    uint64_t write_window;    /* bytes written by clients in it */
    uint64_t write_previous;  /* ... and in the window before it */
    int upload_waiters;       /* threads waiting for uploads (sync, fsync, room) */
    struct cpu_pressure *psi; /* the kernel's CPU pressure file, if cfg.cpu_pressure reads it */
    pthread_t supervisor;
    int supervisor_started;
    struct workq *flusher; /* staged mode: one thread starting disk writes (writeback.c) */
    char **sweep_keys;     /* keys recovery cleaned, to clean again at sweep_at */
    size_t nsweep_keys;
    double sweep_at; /* monotonic; 0 = no second sweep pending */
    struct stage_stats stats;
};

/* assert() that st->lock is held (by this thread, as the callers are
 * written; the check sees only that someone holds it). */
#define WFILE_ASSERT_LOCKED(st) assert(pthread_mutex_trylock(&(st)->lock) == EBUSY)

/* ---- names ---- */

/* The staging file's name for id: 16 hex digits. */
void wfile_staging_name(uint64_t id, char name[32]);
/* wf is being deleted: hand its staging file to cfg.on_retire if it holds
 * exactly the version the store has (clean, not unlinked, its ETag known).
 * 1 if taken (the file is gone), 0 if the caller deletes it. Called with wf
 * out of every list, without the lock. */
int wfile_retire(struct stage *st, const struct wfile *wf);

/* 1 if name (a last component) is published only after the files it names
 * (".metadata", "*.metadata", "*.safetensors.index.json"): what stage.h's
 * is_commit_name answers. */
int wfile_is_commit_name(const char *name);

/* 1 if name is a Hugging Face shard index ("model.safetensors.index.json",
 * any "*.safetensors.index.json"): it names its .safetensors files in
 * weight_map. */
int wfile_is_hf_index_name(const char *name);

/* 1 if name looks like a temporary that is renamed into place (*.tmp). */
int wfile_is_hold_name(const char *name);

/* ---- one record ---- */

/* A new record for path: one reference, no staging file (fd -1), in no
 * list. NULL when out of memory. */
struct wfile *wfile_alloc(const char *path);

/* Free wf and close its staging file (it must be out of every list). */
void wfile_free(struct wfile *wf);

/* Take a reference (lock held). */
void wfile_ref(struct wfile *wf);

/* Drop a reference (lock held); a clean, unreferenced file is dropped (its
 * staging file and journal record removed) - which unlocks and relocks. */
void wfile_unref(struct stage *st, struct wfile *wf);

/* 1 if wf's current version is on the store under its current name. */
int wfile_clean(const struct wfile *wf);

/* Make sure parts[] has room for part `count` (lock held). 0 or -ENOMEM. */
int wfile_parts_reserve(struct wfile *wf, uint32_t count);

/* Write the journal record of wf (lock held: snapshots under the lock,
 * writes after unlocking, then relocks; the caller holds a reference):
 * 0, or the journal's negative errno (logged). */
int wfile_journal(struct stage *st, struct wfile *wf);

/* ---- the table and the list ---- */

/* Put a new record into the table and the list, its size counted in
 * staged_bytes (lock held). The caller counts it in the statistics. */
void wfile_link(struct stage *st, struct wfile *wf);

/* Add / remove wf in the table by path (lock held). */
void wfile_table_insert(struct stage *st, struct wfile *wf);
void wfile_table_remove(struct stage *st, struct wfile *wf);

/* The wfile named path, or NULL (lock held). */
struct wfile *wfile_find(struct stage *st, const char *path);

/* References to every wfile that pick() selects, for walks that unlock
 * (lock held). *n gets the count; NULL with *n = 0 when none or no memory.
 * Give them back with wfile_release_all() (lock held). */
struct wfile **wfile_collect(struct stage *st, int (*pick)(const struct wfile *, const void *),
                             const void *arg, size_t *n);
void wfile_release_all(struct stage *st, struct wfile **v, size_t n);

/* ---- waiting ---- */

/* Wait on st->changed for at most seconds (lock held; it is dropped while
 * waiting). Callers check their condition again: wake-ups are shared. */
void wfile_wait(struct stage *st, double seconds);

/* A thread starts / stops waiting for uploads to progress (lock held):
 * while any waits, uploads do not yield to writers. */
void wfile_waiter_enter(struct stage *st);
void wfile_waiter_leave(struct stage *st);

/* ---- the clients' write rate ---- */

#define WFILE_WRITE_WINDOW 0.1 /* seconds */

/* Count n bytes written by a client now (lock held). */
void wfile_note_write(struct stage *st, uint64_t n);

/* Bytes written by clients in the last one to two WFILE_WRITE_WINDOW
 * seconds (lock held). */
uint64_t wfile_recent_writes(struct stage *st, double now);

#endif
