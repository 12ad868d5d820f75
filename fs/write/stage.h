/*
 * fs/write/stage.h - the write path: staged files, their uploads and commits.
 *
 * Every file written through the mount lands in a staging file under
 * CACHE_DIR/stage (writes in any order, at local-disk speed) and is
 * published to the store by background upload workers: one PUT for a small
 * file, a multipart upload whose parts stream as soon as their bytes are
 * written for a large one. A crash journal (journal.h) records each staged
 * file and its upload, so a remount with the same cache directory finishes
 * what a crash interrupted. Files named .metadata (and *.metadata) are
 * published only after every file they name is on the store (commit.c).
 * docs/semantics.md states the guarantees; the core (core.c) maps the
 * filesystem calls onto this API.
 *
 * Paths are store paths ("dir/file", no leading slash). Functions return 0
 * (or a count) or a negative errno. Thread-safe.
 *
 * ---- How fs/write is built ----
 *
 * Every file calls only the ones below it; none calls up, so no two files
 * call each other, directly or around a loop:
 *   top     stage.c (the client calls), stage_life.c (open, close, the
 *           supervisor thread), stage_names.c (the names staging adds)
 *   middle  upload.c (upload.h), which calls commit.c (commit.h) and
 *           recover.c (recover.h), which calls dirmv.c (dirmv.h: directory
 *           renames on a store of keys); writeback.c (writeback.h)
 *   bottom  wfile.c (wfile.h: the records, the table by path, references,
 *           a file's journal record, waits), journal.c, extents.c, parts.c
 * What a lower module must tell an upper one goes through a callback set by
 * the caller: a commit file found ready (commit_check_all's `ready`, which
 * the supervisor sets to upload_kick), a file published (cfg.on_publish).
 *
 * ---- The life of a staged file (its fields are in wfile.h) ----
 *
 * The stage module (stage.c, stage_life.c, stage_names.c) owns the state
 * machine: it starts every change of state a client or the mount's life
 * asks for, and the middle layer makes the others, each in its own field:
 *
 *  state       holds while                      entered by (module: how)
 *  ----------  -------------------------------  -------------------------------------------------
 *  written     version != seal_version          stage: create, a write, a truncate
 *  sealed      seal_version == version          stage: the last writer's close, flush, fsync,
 *                                               truncate(2) of a closed file, sync; adopt (the
 *                                               store's bytes); recover: restage after a crash
 *  held        sealed, named *.tmp, not sent    stage: create or rename to *.tmp; ends by a
 *                                               rename, sync, unmount (stage), or hold_seconds
 *                                               after the seal (upload: upload_timers)
 *  waiting     a sealed commit file whose files commit: commit_allows (asked by upload); back to
 *              are not all on the store yet     none by commit_reset (stage: a new seal, rename)
 *  ready       ... they are: it may go          commit: commit_check_all (ready -> upload_kick)
 *  blocked     ... waited --commit-timeout      commit: commit_check_all; waits again after
 *                                               commit_retry (stage: fsync, close, sync)
 *  uploading   a PUT, or mpu beginning, active  upload: upload_kick and the answers of its jobs
 *              or completing (parts of a large  (a failure waits for upload_timers' retry);
 *              file stream while it is written) stage: upload_cancel for an unlinked file
 *  durable     durable_version == version       stage: fsync in staged mode or of a held file
 *                                               (fdatasync, then a journal record saying so)
 *  clean       synced_version == version: on    upload: landed; unclean again after a write,
 *              the store under its current name a truncate or a rename (stage, stage_names)
 *  unlinked    out of the table; the journal    stage: unlink, or a create or rename over it;
 *              record says discard              its multipart upload is aborted (upload)
 *  dropped     gone (staging file and record)   wfile: the last wfile_unref of a clean or
 *                                               unlinked file
 *  recovered   after a crash, at open           recover: recover_journal restages a trusted
 *                                               sealed record (stage_open starts its upload),
 *                                               moves the rest to recovered/, drops discards
 */
#ifndef CKPTFS_STAGE_H
#define CKPTFS_STAGE_H

#include "store.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct stage;
struct wfile;

/* A commit file (.metadata) as it was published: its bytes, and every
 * file it names (relative to its directory) with the size its commit check
 * found on the store. */
struct stage_commit_snapshot {
    const void *bytes;
    size_t len;
    const struct store_file_size *files;
    size_t nfiles;
};

struct stage_config {
    const char *dir;        /* staging directory (created): journal, files */
    uint64_t part_size;     /* multipart base part size (default 8 MiB) */
    int fsync_remote;       /* fsync returns when on the store (1) or staged (0) */
    uint64_t budget;        /* staged bytes at most; 0 = what the disk holds */
    double commit_timeout;  /* seconds a .metadata waits for its files */
    int upload_workers;     /* upload threads */
    double hold_seconds;    /* how long a *.tmp file waits for its rename */
    double retry_max_delay; /* longest pause between upload attempts after failures */
    /* Staged mode: how contended the CPUs are at monotonic time now, as the
     * share (0..1) of time some task waited for one, -1 if not known yet,
     * CPU_PRESSURE_UNREADABLE (cpu_pressure.h) if it cannot be read; uploads
     * yield to writers at 0.2 and above, and while it is not known yet.
     * NULL = read /proc/pressure/cpu (and never yield if the kernel has no
     * such file). */
    double (*cpu_pressure)(void *arg, double now);
    void *cpu_pressure_arg;
    double upload_yield_max; /* longest a staged upload waits for writers (10 s) */
    /* Called (without locks) when a file's upload completes: path, and the
     * object's new attributes (size, mtime now, etag from the store); for a
     * commit file whose check found every file it names, also what was
     * published (else NULL), valid during the call. */
    void (*on_publish)(void *arg, const char *path, const struct store_stat *st,
                       const struct stage_commit_snapshot *commit);
    void *on_publish_arg;
    /* Called (without locks) with a clean staged file about to be deleted,
     * its bytes exactly the version (path, etag, size) the store has: 0 if it
     * took the staging file (file, a full path; moved away), else the stage
     * deletes it. NULL: deleted. */
    int (*on_retire)(void *arg, const char *path, const char *etag, uint64_t size,
                     const char *file);
    void *on_retire_arg;
    /* A directory on a store of keys with more objects below it than this is
     * not renamed (-EXDEV, so mv copies); 0 = no limit (default 100000). */
    int rename_dir_max_objects;
};

/* Defaults: 8 MiB parts, fsync remote, no budget, 600 s, 8 workers, 30 s,
 * 60 s, PSI, 10 s, directory renames of up to 100000 objects. */
void stage_config_defaults(struct stage_config *cfg);

struct stage_stats {
    uint64_t write_bytes;        /* bytes written by clients */
    uint64_t writeback_starts;   /* staged mode: disk writes started early (writeback.c) */
    uint64_t files_staged;       /* files that entered staging */
    uint64_t files_published;    /* uploads completed */
    uint64_t bytes_uploaded;     /* bytes of completed objects */
    uint64_t upload_failures;    /* upload attempts that failed for good */
    uint64_t commits;            /* commit files published after their check */
    uint64_t commit_timeouts;    /* commit files blocked at --commit-timeout */
    uint64_t budget_waits;       /* writes that waited for staging space */
    uint64_t upload_yields;      /* upload jobs that waited for writers on a busy CPU */
    double upload_yield_seconds; /* the time they waited, summed */
    uint64_t recovered_files;    /* files taken over from the journal at mount */
    uint64_t pending_files;      /* staged files not yet clean (now) */
    uint64_t pending_bytes;      /* their bytes (now) */
    uint64_t staged_bytes;       /* bytes in staging (now) */
    uint64_t budget;             /* bytes staging may hold */
    double last_publish;         /* wall-clock time of the last completed upload, 0 if none */
};

/* Open the staging area: lock cfg->dir (one mount per cache directory),
 * open the journal, start the upload workers and the supervisor, and take
 * over what a previous mount left (recover). store_name is the store's
 * canonical name (journal records are kept per store). 0, or a negative
 * errno with a one-line reason in err. */
int stage_open(struct store *store, const char *store_name, const struct stage_config *cfg,
               struct stage **out, char *err, size_t errlen);

/* Publish everything staged and wait for it (progress logged every few
 * seconds), then stop the workers and free everything. What cannot be
 * uploaded stays in the journal for the next mount. NULL is a no-op. */
void stage_close(struct stage *st);

/* Make stage_close stop waiting for uploads (a second signal at unmount). */
void stage_abandon(struct stage *st);

/* ---- namespace overlay ---- */

/* What staging knows of path: 1 and *st filled for a staged file (size,
 * mtime, etag "") or a directory holding staged files; 0 if staging knows
 * nothing of it. */
int stage_stat(struct stage *st, const char *path, struct store_stat *out);

/* Give the staged file at path the attributes of a's set fields (merged
 * with those set before; STORE_ATTR_MTIME also sets its time); they go to
 * the store with its upload, or right after it if it is in flight. 1 if an
 * upload of path is to come or in flight (it takes them); 0 if path is not
 * staged or all of it is on the store already: the caller sets them there. */
int stage_set_attrs(struct stage *st, const char *path, const struct store_attrs *a);

/* What stage_stat reports of the staged file wf (an open handle's): 0. */
int stage_wf_stat(struct stage *st, struct wfile *wf, struct store_stat *out);

/* The same for the staged file wf (an open handle's; 1 also while it is
 * open for writing, as its close uploads it, or unlinked). */
int stage_set_attrs_wf(struct stage *st, struct wfile *wf, const struct store_attrs *a);

/* Call fn for every staged file, and every directory holding staged files,
 * directly in dir (fn as in store_list). Returns how many it reported. */
int stage_list(struct stage *st, const char *dir, store_list_fn fn, void *arg);

/* 1 if name is an entry stage_list would report for dir. */
int stage_has_entry(struct stage *st, const char *dir, const char *name);

/* ---- files ---- */

/* The staged file at path with a reference, or NULL. */
struct wfile *stage_get(struct stage *st, const char *path);

/* Drop a reference from stage_get/stage_create/stage_adopt. */
void stage_put(struct stage *st, struct wfile *wf);

/* A new, empty staged file at path (replacing a staged file there, whose
 * upload is cancelled). Returns it with a reference. */
int stage_create(struct stage *st, const char *path, struct wfile **out);

/* A symbolic link at path whose target is `target` (docs/semantics.md,
 * "Symbolic links"): staged like a file whose bytes are the target, with
 * mode S_IFLNK | 0777 (and a's uid, gid if set), replacing what is staged
 * at path, sealed at once; published only after every file (not a link)
 * staged before it at or below store path wait ("" = anywhere) is on the
 * store, commit files included. 0 or a negative errno. */
int stage_symlink(struct stage *st, const char *path, const char *target, const char *wait,
                  const struct store_attrs *a);

/* Stage the existing store object at path (size bytes, version etag) to
 * modify it: its bytes up to keep (at most size) are copied into staging
 * first. Returns it with a reference. */
int stage_adopt(struct stage *st, const char *path, const char *etag, uint64_t size, uint64_t keep,
                struct wfile **out);

/* A handle that may write was opened / is closing (release): the last
 * writer's close seals the file. */
void stage_writer_open(struct stage *st, struct wfile *wf);
void stage_writer_close(struct stage *st, struct wfile *wf);
/* A writer's handle goes away without a close (the mount ended under it):
 * no seal, so what it was writing is not published. */
void stage_writer_abandon(struct stage *st, struct wfile *wf);

/* Write len bytes at off (any order; waits for staging space and for an
 * upload of the same bytes in flight). Returns len or a negative errno. */
ssize_t stage_write(struct stage *st, struct wfile *wf, const void *buf, size_t len, uint64_t off);

/* stage_write in two steps, for a caller that moves the bytes itself (the
 * FUSE adapter splices them from the kernel into the staging file): begin
 * waits as stage_write does and returns the staging file's descriptor to
 * write len bytes at off into (or a negative errno); end must follow with
 * what was written (a count, or a negative errno). */
int stage_write_begin(struct stage *st, struct wfile *wf, uint64_t off, size_t len);
void stage_write_end(struct stage *st, struct wfile *wf, uint64_t off, size_t len, ssize_t written);

/* Set the size (a hole or a cut). */
int stage_truncate(struct stage *st, struct wfile *wf, uint64_t size);

/* The staging file descriptor and current size, for reads (valid while the
 * reference is held). */
int stage_fd(struct stage *st, struct wfile *wf, uint64_t *size);

/* Size and modification counter of wf. */
uint64_t stage_size(struct stage *st, struct wfile *wf);

/* close() of a handle that may have written: seal what was written. A
 * commit file in remote mode waits until it is on the store. Returns a
 * pending upload error of the file (-EIO) or 0. */
int stage_flush(struct stage *st, struct wfile *wf);

/* fsync: seal; staged mode: the staging file and its journal record are
 * made durable; remote mode: wait until this version is on the store
 * (-EIO if its upload failed or its commit timed out). */
int stage_fsync(struct stage *st, struct wfile *wf);

/* Rename the staged file at from to to (replacing a staged file at to).
 * The upload goes to the new name only. In remote mode, a file fsynced
 * under a temporary name (*.tmp) waits here until the new name is on the
 * store. -ENOENT if from is not staged. */
int stage_rename(struct stage *st, const char *from, const char *to);

/* Move every staged file below directory from to below to (after the
 * store renamed the directory). */
int stage_rename_dir(struct stage *st, const char *from, const char *to);

/* Rename directory from to to on a store of keys (no store rename): copy
 * every object below from server-side, commit files last, then delete the
 * old ones, journaled so that a crash is finished by the next mount
 * (dirmv.h). What is staged below from must be on the store already
 * (stage_sync). to is absent, or an empty directory (to_existed: its marker
 * stays). Blocks until done. 0, -EXDEV above cfg.rename_dir_max_objects, or
 * a negative errno (from then is whole again, or to is complete). */
int stage_rename_stored_dir(struct stage *st, const char *from, const char *to, int to_existed);

/* Forget the staged file at path: its upload is cancelled (a multipart
 * upload aborted). 0, or -ENOENT if nothing is staged there. */
int stage_unlink(struct stage *st, const char *path);

/* 1 if anything is staged at or below directory dir. */
int stage_busy_below(struct stage *st, const char *dir);

/* Wait until recovery's second sweep has passed key (a key of an upload
 * the dead daemon may have begun), so a multipart upload begun for it
 * outside staging (a server-side copy) is not taken for the dead
 * daemon's. Returns at once if no sweep of key is pending. */
void stage_wait_sweep(struct stage *st, const char *key);

/* Publish everything staged at or below dir ("" = everything): seal open
 * files, stop holding temporaries, and wait until all of it is on the store.
 * 0, or -EIO if something failed to upload or commit. */
int stage_sync(struct stage *st, const char *dir);

/* 1 if name (a last component) is published only after the files it names:
 * ".metadata" and "*.metadata" (newer DCP writes one per rank), and a
 * Hugging Face "*.safetensors.index.json" (its weight_map's files). */
int is_commit_name(const char *name);

/* Counters and current state. */
void stage_get_stats(struct stage *st, struct stage_stats *out);

#endif
