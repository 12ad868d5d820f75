/*
 * fs/write/wfile.h - the state the write path's modules share (internal to
 * stage.c, upload.c, commit.c and recover.c; the core sees only stage.h).
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

#include "clock.h"
#include "extents.h"
#include "journal.h"
#include "stage.h"
#include "store.h"
#include "workq.h"

#include <pthread.h>
#include <stdint.h>

enum wf_mpu {
    MPU_NONE,      /* no multipart upload */
    MPU_BEGINNING, /* CreateMultipartUpload in flight */
    MPU_ACTIVE,    /* upload_id valid: parts may be sent */
    MPU_COMPLETING /* CompleteMultipartUpload in flight */
};

enum wf_commit {
    COMMIT_NONE,    /* not a commit file, or not sealed yet */
    COMMIT_WAITING, /* sealed; waiting for the files it names */
    COMMIT_READY,   /* the files are there: may be published (commit_version) */
    COMMIT_BLOCKED  /* waited --commit-timeout in vain; kept staged, error set */
};

struct wpart {
    uint64_t gen;    /* writes into this part so far */
    uint64_t up_gen; /* gen whose bytes the current multipart upload has */
    uint64_t up_len; /* length it was uploaded with */
    int uploaded;    /* the current multipart upload has this part (up_gen, up_len) */
    int inflight;    /* being uploaded */
    int busy;        /* writes copying into it right now */
    char etag[STORE_ETAG_MAX];
};

/* A file named in a .metadata, and the size it must have on the store. */
struct commit_need {
    char *name; /* relative to the .metadata's directory */
    uint64_t min_size;
    uint64_t found_size; /* on the store at the check that let it go; UINT64_MAX before */
};

struct wfile {
    struct wfile *hnext;       /* stage->table chain */
    struct wfile *prev, *next; /* stage->files list */
    uint64_t id;               /* journal key and staging file name */
    int fd;                    /* the staging file, open read-write */
    char *path;                /* current store path */
    uint64_t size;
    int64_t mtime_ns; /* nanoseconds since the epoch of the last change */
    struct extents written;
    int writers; /* writable handles open */
    int refs;    /* handles, jobs and waiters holding the pointer */
    int unlinked;
    uint64_t version, seal_version, synced_version, durable_version;
    double sealed_at;      /* monotonic seconds of the last seal */
    int held;              /* a name that is renamed away soon (*.tmp): not uploaded yet */
    int wb_queued;         /* in the flusher's queue (writeback.c), holding a reference */
    int fsynced_held;      /* fsync was called while held */
    int is_commit;         /* .metadata or *.metadata: published after the files it names */
    int journaled;         /* a record exists in the journal */
    int discard;           /* unlinked: the record says so until the cleanup is done */
    int sealed_in_journal; /* the record says sealed (a write must clear it) */
    uint64_t jseq;         /* sequence number of the last journal snapshot */
    double journaled_at;   /* monotonic time of that snapshot */

    /* upload */
    enum wf_mpu mpu;
    char *upload_key; /* key the multipart upload was begun for */
    char *upload_id;
    struct wpart *parts;        /* parts[i] is part i + 1 */
    uint32_t nparts;            /* entries allocated in parts */
    int jobs;                   /* upload jobs in flight */
    int error;                  /* last upload failure (negative errno), 0 if none since */
    unsigned attempts;          /* failures in a row, for the retry backoff */
    unsigned complete_failures; /* of the current multipart upload's completion */
    double retry_at;            /* no new upload before this (after a failure) */
    int stray_begin;            /* a begin failed or was retried: sweep the key once complete */

    /* commit */
    enum wf_commit commit;
    uint64_t commit_version;
    double commit_deadline, commit_next_check, commit_logged;
    int commit_parsed;     /* needs[] filled (or the .metadata could not be parsed) */
    unsigned commit_epoch; /* bumped by commit_reset: a check that unlocked starts over */
    struct commit_need *needs;
    size_t nneeds;
};

#define STAGE_BUCKETS 4096
#define STAGE_PATH_XATTR "user.ckptfs.path" /* a staging file's store path, as created */

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
    struct wfile *table[STAGE_BUCKETS]; /* by path */
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

/* ---- helpers shared by the modules (stage.c) ---- */

/* The staging file's name for id: 16 hex digits. */
void staging_name(uint64_t id, char name[32]);

/* Free wf and close its staging file (it must be out of every list). */
void wfile_free(struct wfile *wf);

/* Take a reference (lock held). */
void wfile_ref(struct wfile *wf);

/* Drop a reference (lock held); a clean, unreferenced file is dropped (its
 * staging file and journal record removed) - which unlocks and relocks. */
void wfile_unref(struct stage *st, struct wfile *wf);

/* 1 if wf's current version is on the store under its current name. */
int wfile_clean(const struct wfile *wf);

/* The writer has published the current content: record the seal and start
 * its upload (lock held, ref held). */
void seal(struct stage *st, struct wfile *wf);

/* Write the journal record of wf (lock held: snapshots under the lock,
 * writes after unlocking, then relocks; the caller holds a reference):
 * 0, or the journal's negative errno (logged). */
int wfile_journal(struct stage *st, struct wfile *wf);

/* Make sure parts[] has room for part `count` (lock held). 0 or -ENOMEM. */
int wfile_parts_reserve(struct wfile *wf, uint32_t count);

/* 1 if path lies at or below directory dir ("" = the root). */
int path_below(const char *path, const char *dir);

/* Add / remove wf in the table by path (lock held). */
void table_insert(struct stage *st, struct wfile *wf);
void table_remove(struct stage *st, struct wfile *wf);

/* References to every wfile that pick() selects, for walks that unlock
 * (lock held). *n gets the count; NULL with *n = 0 when none or no memory.
 * Give them back with release_all() (lock held). */
struct wfile **collect(struct stage *st, int (*pick)(const struct wfile *, const void *),
                       const void *arg, size_t *n);
void release_all(struct stage *st, struct wfile **v, size_t n);

/* Bytes written by clients in the last one to two WRITE_WINDOW seconds
 * (lock held). */
#define WRITE_WINDOW 0.1
uint64_t stage_recent_writes(struct stage *st, double now);

/* A thread starts / stops waiting for uploads to progress (lock held):
 * while any waits, uploads do not yield to writers. */
void stage_waiter_enter(struct stage *st);
void stage_waiter_leave(struct stage *st);

/* Wait on st->changed for at most seconds (lock held; it is dropped while
 * waiting). Callers check their condition again: wake-ups are shared. */
void stage_wait(struct stage *st, double seconds);

/* The wfile named path, or NULL (lock held). */
struct wfile *stage_find_locked(struct stage *st, const char *path);

/* 1 if name looks like a temporary that is renamed into place (*.tmp). */
int is_hold_name(const char *name);

/* ---- upload.c ---- */

/* Start whatever upload work wf is ready for (lock held; never blocks). */
void upload_kick(struct stage *st, struct wfile *wf);

/* Abort wf's multipart upload, if any, after its in-flight parts (lock held). */
void upload_cancel(struct stage *st, struct wfile *wf);

/* Timers: retries after failures, held files whose time is up (lock held).
 * Returns the monotonic time of the next deadline, or 0. */
double upload_timers(struct stage *st);

/* ---- commit.c ---- */

/* Work on every sealed commit file: check the files it names, mark it
 * ready or blocked (lock held; unlocks while listing the store). Returns the
 * monotonic time of the next check, or 0. */
double commit_check_all(struct stage *st);

/* Forget what a previous check of wf found (its content changed). */
void commit_reset(struct wfile *wf);

/* A commit file that waited --commit-timeout in vain waits again from now
 * (a sync, an fsync or a close asks for it; lock held). */
void commit_retry(struct wfile *wf);

/* A file at path reached the store: commit files in its directory are
 * checked again at once (lock held). */
void commit_wake(struct stage *st, const char *path);

/* What the index needs of commit file wf, whose version `version` (of
 * `size` bytes) just landed: its bytes and the files its check found, or
 * NULL (not parsed, too large, or rewritten meanwhile). Lock held; unlocks
 * to read the staging file. Free with commit_snapshot_free(). */
struct stage_commit_snapshot *commit_snapshot(struct stage *st, struct wfile *wf, uint64_t version,
                                              uint64_t size);
void commit_snapshot_free(struct stage_commit_snapshot *s);

/* ---- recover.c ---- */

/* Take over the journal's records after a crash or restart: re-stage the
 * sealed files and queue their uploads; move unsealed or untrustworthy data
 * to CACHE_DIR/recovered; abort multipart uploads nobody will complete.
 * Called once from stage_open, before the mount serves requests. */
void recover_journal(struct stage *st);

/* The second sweep of the multipart uploads recovery cleaned (lock held,
 * dropped for each request; the supervisor calls it): once its time has
 * come, list each key's uploads again and abort those no live file of this
 * mount holds - requests the dead daemon had sent may reach the store after
 * the first sweep. A key this mount is uploading is left alone; stopping
 * ends the sweep between keys. Returns when it is due (monotonic), or 0
 * once done or if none is pending. */
double recover_sweep_again(struct stage *st);

/* List key's multipart uploads and abort those no live file of this mount
 * holds, unless a file of this mount is uploading key (lock held, dropped for
 * the requests): the leftovers of a begin whose answer was lost. */
void recover_sweep_key(struct stage *st, const char *key);

/* 1 if the second sweep is still to pass key (lock held). */
int recover_sweep_pending(const struct stage *st, const char *key);

/* Drop a pending second sweep without making it (lock held, or the
 * supervisor joined: stage_close). */
void recover_sweep_forget(struct stage *st);

/* ---- early disk writes of staged bytes (writeback.c) ---- */

/* A client wrote `written` bytes to wf (lock held): in staged mode, queue a
 * large write's file for the flusher to start its disk write. */
void writeback_note(struct stage *st, struct wfile *wf, ssize_t written);

/* Start the flusher (staged mode only): 0 or a negative errno. */
int writeback_start(struct stage *st);

/* Stop the flusher once st->stopping is set (lock not held); the jobs
 * still queued only drop their references. A no-op if it never started. */
void writeback_stop(struct stage *st);

#endif
