/*
 * fs/write/stage.c - the write path's client calls (see stage.h), the top of
 * fs/write and the owner of each staged file's state machine (the table in
 * stage.h): creating and adopting staged files, writes and truncates into
 * their staging files, the disk budget, seals (close, fsync), renames,
 * unlinks and sync. It moves files between the states and calls downward
 * only: upload.c to start or cancel uploads, commit.c to reset a commit
 * check, writeback.c, and the records (wfile.h) and the journal.
 * stage_life.c opens and closes the staging area and runs the supervisor;
 * stage_names.c answers for the names staging adds to the namespace.
 */
#include "stage.h"

#include "clock.h"
#include "commit.h"
#include "journal.h"
#include "log.h"
#include "parts.h"
#include "strutil.h"
#include "upload.h"
#include "wfile.h"
#include "writeback.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#define ADOPT_CHUNK (8u << 20)

void stage_config_defaults(struct stage_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->part_size = 8ull << 20;
    cfg->fsync_remote = 1;
    cfg->budget = 0;
    cfg->commit_timeout = 600;
    cfg->upload_workers = 8;
    cfg->hold_seconds = 30;
    cfg->retry_max_delay = 60;
    cfg->upload_yield_max = 10;
    cfg->rename_dir_max_objects = 100000;
}

int is_commit_name(const char *name)
{
    return wfile_is_commit_name(name);
}

/* ---- new files --------------------------------------------------------- */

/* A fresh wfile at path with a staging file of its own (lock held; unlocks
 * to allocate the id). Returned with one reference, not yet in the table. */
static int new_staged_file(struct stage *st, const char *path, struct wfile **out)
{
    uint64_t id;
    pthread_mutex_unlock(&st->lock);
    int rc = journal_new_id(st->journal, &id);
    pthread_mutex_lock(&st->lock);
    if (rc < 0)
        return rc;
    struct wfile *wf = wfile_alloc(path);
    if (!wf)
        return -ENOMEM;
    char name[32];
    wfile_staging_name(id, name);
    wf->fd = openat(st->files_dirfd, name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (wf->fd < 0) {
        rc = -errno;
        log_error("stage: cannot create a staging file in %s: %s", st->files_dir, strerror(-rc));
        wfile_free(wf);
        return rc;
    }
    wf->id = id;
    /* A hint for recovery, should a crash come before the journal names it. */
    fsetxattr(wf->fd, WFILE_PATH_XATTR, path, strlen(path), 0);
    wf->version = 1; /* even an empty new file differs from "nothing on the store" */
    wf->mtime_ns = wall_ns();
    wf->is_commit = wfile_is_commit_name(path_base(path));
    wf->held = wfile_is_hold_name(path_base(path));
    *out = wf;
    return 0;
}

/* Remove the staging file of a new wfile that never entered the table, and
 * free it (no lock needed: nobody else knows it). */
static void forget_new_file(struct stage *st, struct wfile *wf)
{
    char name[32];
    wfile_staging_name(wf->id, name);
    unlinkat(st->files_dirfd, name, 0);
    wfile_free(wf);
}

/* Put a new wfile into the table and the list (lock held). */
static void link_new_file(struct stage *st, struct wfile *wf)
{
    wfile_link(st, wf);
    st->stats.files_staged++;
}

/* ---- seals ------------------------------------------------------------- */

/* Seal without writing the journal record yet (the caller writes it). */
static void seal_unrecorded(struct stage *st, struct wfile *wf)
{
    if (wf->seal_version != wf->version)
        commit_reset(wf);
    wf->seal_version = wf->version;
    wf->sealed_at = mono_seconds();
    upload_kick(st, wf);
}

/* The writer has published the current content: record the seal and start
 * its upload (lock held, ref held). */
static void seal(struct stage *st, struct wfile *wf)
{
    if (wf->seal_version == wf->version && wf->sealed_in_journal)
        return;
    seal_unrecorded(st, wf);
    wfile_journal(st, wf);
}

/* Wait until version v of wf is on the store (lock held, ref held): 0, or
 * -EIO if an upload attempt made after the wait began failed, or the commit
 * timed out. for_close: a commit file's close also returns 0 once its check
 * found named files that nobody on this mount is writing (commit.c). */
static int wait_published(struct stage *st, struct wfile *wf, uint64_t v, const char *why,
                          int for_close)
{
    unsigned attempts = wf->attempts;
    double start = mono_seconds(), logged = start;
    wf->retry_at = 0; /* someone waits: retry a failed upload now */
    commit_retry(wf); /* ... and a commit that timed out */
    upload_kick(st, wf);
    wfile_waiter_enter(st);
    int rc = 0;
    /* Published: that version landed, and its landing is done (it may still
     * be giving the object attributes set meanwhile, upload.c). */
    while (!(wf->synced_version >= v && !wf->unlinked && !wf->attrs_landings)) {
        if (wf->unlinked)
            break; /* removed meanwhile: nothing left to wait for */
        if (for_close && wf->commit == WFILE_COMMIT_WAITING && wf->commit_version == v &&
            wf->commit_foreign) {
            log_info("close: %s names files that are neither on the store nor written through "
                     "this mount yet: close returns, and it is published once they are there "
                     "(a sync waits for it)",
                     wf->path);
            break;
        }
        if ((wf->commit == WFILE_COMMIT_BLOCKED && wf->commit_version == wf->version) ||
            (wf->attempts > attempts && wf->error) || st->stopping) {
            rc = -EIO;
            break;
        }
        double now = mono_seconds();
        if (now - logged >= 5) {
            logged = now;
            log_info("%s: %s waits for its upload (%.0f s)", why, wf->path, now - start);
        }
        wfile_wait(st, 1.0);
    }
    wfile_waiter_leave(st);
    return rc;
}

/* ---- public: files ----------------------------------------------------- */

struct wfile *stage_get(struct stage *st, const char *path)
{
    pthread_mutex_lock(&st->lock);
    struct wfile *wf = wfile_find(st, path);
    if (wf)
        wfile_ref(wf);
    pthread_mutex_unlock(&st->lock);
    return wf;
}

void stage_put(struct stage *st, struct wfile *wf)
{
    if (!wf)
        return;
    pthread_mutex_lock(&st->lock);
    wfile_unref(st, wf);
    pthread_mutex_unlock(&st->lock);
}

/* Take wf out of the namespace (lock held): its upload is cancelled and it
 * is dropped once unreferenced. */
static void unlink_locked(struct stage *st, struct wfile *wf)
{
    wfile_table_remove(st, wf);
    wf->unlinked = 1;
    wf->discard = 1;
    wfile_ref(wf);
    if (wf->journaled ||
        wf->mpu != WFILE_MPU_NONE) /* a record to take back, or an upload to abort */
        wfile_journal(st, wf);
    upload_cancel(st, wf);
    wfile_unref(st, wf);
    pthread_cond_broadcast(&st->changed);
}

int stage_create(struct stage *st, const char *path, struct wfile **out)
{
    pthread_mutex_lock(&st->lock);
    struct wfile *wf;
    int rc = new_staged_file(st, path, &wf);
    if (rc == 0) {
        struct wfile *old = wfile_find(st, path);
        if (old)
            unlink_locked(st, old);
        /* No journal record yet: what is not sealed is not published after a
         * crash anyway, and recovery keeps unrecorded staging files. */
        link_new_file(st, wf);
        *out = wf;
    }
    pthread_mutex_unlock(&st->lock);
    return rc;
}

int stage_symlink(struct stage *st, const char *path, const char *target, const char *wait,
                  const struct store_attrs *a)
{
    size_t len = strlen(target);
    char *w = strdup(wait);
    if (!w)
        return -ENOMEM;
    pthread_mutex_lock(&st->lock);
    struct wfile *wf;
    int rc = new_staged_file(st, path, &wf);
    if (rc < 0) {
        pthread_mutex_unlock(&st->lock);
        free(w);
        return rc;
    }
    /* Made whole before it enters the table: no lookup sees a file first. */
    if (pwrite(wf->fd, target, len, 0) != (ssize_t)len || extents_add(&wf->written, 0, len) < 0) {
        forget_new_file(st, wf);
        pthread_mutex_unlock(&st->lock);
        free(w);
        return -EIO;
    }
    wf->size = len;
    wf->link_wait = w;
    wf->is_commit = 1; /* its upload waits in commit.c (link_pending) */
    wf->held = 0;
    wf->attrs.set = STORE_ATTR_MODE | (a ? a->set & (STORE_ATTR_UID | STORE_ATTR_GID) : 0);
    wf->attrs.mode = S_IFLNK | 0777;
    if (a) {
        wf->attrs.uid = a->uid;
        wf->attrs.gid = a->gid;
    }
    wf->attrs_gen++;
    struct wfile *old = wfile_find(st, path);
    if (old)
        unlink_locked(st, old);
    link_new_file(st, wf);
    seal(st, wf); /* journaled (JOURNAL_LINK), its upload asked for */
    wfile_unref(st, wf);
    pthread_mutex_unlock(&st->lock);
    return 0;
}

/* Copy [0, keep) of the store object into wf's staging file (no lock). */
static int adopt_copy(struct stage *st, struct wfile *wf, const char *etag, uint64_t keep)
{
    char *buf = malloc(ADOPT_CHUNK);
    if (!buf)
        return -ENOMEM;
    int rc = 0;
    for (uint64_t off = 0; off < keep && rc == 0;) {
        size_t want = keep - off < ADOPT_CHUNK ? (size_t)(keep - off) : ADOPT_CHUNK, got = 0;
        rc = st->store->ops->read(st->store, wf->path, etag, off, want, buf, &got);
        if (rc == 0 && got == 0)
            rc = -EIO; /* shorter than it said: changed under us */
        for (size_t done = 0; rc == 0 && done < got;) {
            ssize_t n = pwrite(wf->fd, buf + done, got - done, (off_t)(off + done));
            if (n < 0 && errno != EINTR)
                rc = -errno;
            else if (n > 0)
                done += (size_t)n;
        }
        off += got;
    }
    free(buf);
    return rc;
}

int stage_adopt(struct stage *st, const char *path, const char *etag, uint64_t size, uint64_t keep,
                struct wfile **out)
{
    if (keep > size)
        keep = size;
    pthread_mutex_lock(&st->lock);
    struct wfile *wf = wfile_find(st, path);
    if (wf) { /* staged meanwhile by another opener */
        wfile_ref(wf);
        pthread_mutex_unlock(&st->lock);
        *out = wf;
        return 0;
    }
    int rc = new_staged_file(st, path, &wf);
    pthread_mutex_unlock(&st->lock);
    if (rc < 0)
        return rc;
    rc = adopt_copy(st, wf, etag, keep);
    if (rc == 0 && ftruncate(wf->fd, (off_t)keep) < 0)
        rc = -errno;
    if (rc < 0) {
        forget_new_file(st, wf);
        return rc;
    }
    pthread_mutex_lock(&st->lock);
    struct wfile *raced = wfile_find(st, path);
    if (raced) { /* another opener adopted it first: use theirs */
        wfile_ref(raced);
        pthread_mutex_unlock(&st->lock);
        forget_new_file(st, wf);
        *out = raced;
        return 0;
    }
    wf->size = keep;
    if (extents_add(&wf->written, 0, keep) < 0) {
        pthread_mutex_unlock(&st->lock);
        wfile_free(wf);
        return -ENOMEM;
    }
    /* Unchanged so far: the store has this content already. */
    wf->synced_version = keep == size ? wf->version : 0;
    snprintf(wf->synced_etag, sizeof wf->synced_etag, "%s", etag ? etag : "");
    wf->synced_size = size;
    wf->seal_version = wf->version;
    link_new_file(st, wf);
    pthread_mutex_unlock(&st->lock);
    *out = wf;
    return 0;
}

void stage_writer_open(struct stage *st, struct wfile *wf)
{
    pthread_mutex_lock(&st->lock);
    wf->writers++;
    pthread_mutex_unlock(&st->lock);
}

void stage_writer_abandon(struct stage *st, struct wfile *wf)
{
    pthread_mutex_lock(&st->lock);
    assert(wf->writers > 0);
    wf->writers--;
    pthread_mutex_unlock(&st->lock);
}

void stage_writer_close(struct stage *st, struct wfile *wf)
{
    pthread_mutex_lock(&st->lock);
    assert(wf->writers > 0);
    if (--wf->writers == 0 && !wf->unlinked && wf->version != wf->seal_version)
        seal(st, wf);
    pthread_mutex_unlock(&st->lock);
}

/* 1 if some staged bytes can leave staging without a writer's help. */
static int uploads_can_drain(struct stage *st)
{
    for (struct wfile *wf = st->files; wf; wf = wf->next)
        if (wf->jobs > 0 || (!wfile_clean(wf) && wf->seal_version == wf->version))
            return 1;
    return 0;
}

/* Wait until growing by `grow` bytes fits the budget (lock held). */
static int wait_for_room(struct stage *st, uint64_t grow)
{
    if (!st->cfg.budget || st->staged_bytes + grow <= st->cfg.budget)
        return 0;
    double logged = 0;
    int rc = 0;
    wfile_waiter_enter(st);
    while (st->staged_bytes + grow > st->cfg.budget) {
        if (!uploads_can_drain(st)) {
            rc = -ENOSPC;
            break;
        }
        double now = mono_seconds();
        if (now - logged > 10) {
            if (!logged)
                st->stats.budget_waits++;
            logged = now;
            log_info("stage: staging is full (%" PRIu64 " of %" PRIu64
                     " MiB): writes wait for uploads to finish",
                     st->staged_bytes >> 20, st->cfg.budget >> 20);
        }
        wfile_wait(st, 1.0);
    }
    wfile_waiter_leave(st);
    return rc;
}

/* pwrite all of buf; a full disk waits for uploads while they drain. */
static ssize_t write_staging(struct stage *st, struct wfile *wf, const void *buf, size_t len,
                             uint64_t off)
{
    size_t done = 0;
    int waited = 0;
    while (done < len) {
        ssize_t n = pwrite(wf->fd, (const char *)buf + done, len - done, (off_t)(off + done));
        if (n >= 0) {
            done += (size_t)n;
            continue;
        }
        if (errno == EINTR)
            continue;
        if (errno != ENOSPC)
            return -errno;
        pthread_mutex_lock(&st->lock);
        int can = uploads_can_drain(st);
        if (can) {
            if (!waited++)
                log_warn("stage: the staging disk (%s) is full: writes wait for uploads",
                         st->files_dir);
            wfile_waiter_enter(st);
            wfile_wait(st, 1.0);
            wfile_waiter_leave(st);
        }
        pthread_mutex_unlock(&st->lock);
        if (!can)
            return -ENOSPC;
    }
    return (ssize_t)len;
}

/* The largest file this stage can publish: what the part geometry holds,
 * and no more than the store's own limit (S3: 5 TiB). */
static uint64_t max_file_size(const struct stage *st)
{
    uint64_t parts = parts_max_object(st->cfg.part_size), store = st->store->max_object;
    return store && store < parts ? store : parts;
}

/* Write the record saying wf is no longer sealed, before its bytes change
 * (lock held; unlocks): 0, or the journal's error, and then the bytes must
 * not change (a crash would publish them). One replacing a durable record is
 * synced too:
 * the journal's commits may be undone by a power loss (MDB_NOMETASYNC),
 * while the new bytes might reach the disk and be taken for the sealed ones. */
static int unseal_record(struct stage *st, struct wfile *wf)
{
    int was_durable = wf->durable_version == wf->seal_version;
    int rc = wfile_journal(st, wf);
    if (rc == 0 && was_durable) {
        pthread_mutex_unlock(&st->lock);
        rc = journal_sync(st->journal);
        pthread_mutex_lock(&st->lock);
    }
    return rc;
}

int stage_write_begin(struct stage *st, struct wfile *wf, uint64_t off, size_t len)
{
    if (len == 0)
        return -EINVAL;
    if (off > UINT64_MAX - len || off + len > max_file_size(st))
        return -EFBIG;
    uint64_t end = off + len, base = st->cfg.part_size;
    uint32_t p0 = parts_at(base, off), p1 = parts_at(base, end - 1);
    pthread_mutex_lock(&st->lock);
    int rc = wfile_parts_reserve(wf, p1);
    if (rc == 0 && end > wf->size)
        rc = wait_for_room(st, end - wf->size);
    for (uint32_t p = p0; rc == 0 && p <= p1;) { /* an upload of these bytes in flight: wait */
        if (wf->parts[p - 1].inflight) {
            pthread_cond_wait(&st->changed, &st->lock);
            p = p0;
        } else {
            p++;
        }
    }
    if (rc < 0) {
        pthread_mutex_unlock(&st->lock);
        return rc;
    }
    for (uint32_t p = p0; p <= p1; p++)
        wf->parts[p - 1].busy++;
    uint64_t was = wf->size;
    if (end > wf->size) {
        st->staged_bytes += end - wf->size;
        wf->size = end;
    }
    wf->version++;
    /* the record must stop saying "sealed" before bytes change */
    rc = wf->sealed_in_journal ? unseal_record(st, wf) : 0;
    if (rc < 0 && wf->size == end && end > was) { /* the write does not happen */
        st->staged_bytes -= end - was;
        wf->size = was;
    }
    pthread_mutex_unlock(&st->lock);
    if (rc < 0) {
        stage_write_end(st, wf, off, len, 0); /* give back the parts it held */
        return -EIO;
    }
    return wf->fd;
}

void stage_write_end(struct stage *st, struct wfile *wf, uint64_t off, size_t len, ssize_t written)
{
    uint64_t base = st->cfg.part_size;
    uint32_t p0 = parts_at(base, off), p1 = parts_at(base, off + len - 1);
    pthread_mutex_lock(&st->lock);
    if (written > 0 && extents_add(&wf->written, off, off + (uint64_t)written) < 0)
        log_error("stage: out of memory recording a write to %s", wf->path);
    for (uint32_t p = p0; p <= p1; p++) {
        assert(wf->parts[p - 1].busy > 0);
        wf->parts[p - 1].busy--;
        wf->parts[p - 1].gen++;
    }
    wf->mtime_ns = wall_ns();
    wf->attrs.set &= ~STORE_ATTR_MTIME; /* changed since its time was set */
    if (written > 0) {
        st->stats.write_bytes += (uint64_t)written;
        wfile_note_write(st, (uint64_t)written);
        writeback_note(st, wf, written);
    }
    upload_kick(st, wf);
    pthread_mutex_unlock(&st->lock);
}

ssize_t stage_write(struct stage *st, struct wfile *wf, const void *buf, size_t len, uint64_t off)
{
    if (len == 0)
        return 0;
    int fd = stage_write_begin(st, wf, off, len);
    if (fd < 0)
        return fd;
    ssize_t n = write_staging(st, wf, buf, len, off);
    stage_write_end(st, wf, off, len, n);
    return n;
}

int stage_truncate(struct stage *st, struct wfile *wf, uint64_t size)
{
    if (size > max_file_size(st))
        return -EFBIG;
    pthread_mutex_lock(&st->lock);
    if (wf->sealed_in_journal) { /* the record stops saying "sealed" before the file changes */
        wf->version++;
        if (unseal_record(st, wf) < 0) {
            pthread_mutex_unlock(&st->lock);
            return -EIO;
        }
    }
    uint64_t old = wf->size, low = old < size ? old : size, base = st->cfg.part_size;
    int rc = size > old ? wait_for_room(st, size - old) : 0;
    uint32_t first = parts_at(base, low), last = parts_count(base, size > old ? size : old);
    if (rc == 0)
        rc = wfile_parts_reserve(wf, last);
    for (uint32_t p = first; rc == 0 && p <= last;) { /* bytes being uploaded: wait */
        if (wf->parts[p - 1].inflight || wf->parts[p - 1].busy) {
            pthread_cond_wait(&st->changed, &st->lock);
            p = first;
        } else {
            p++;
        }
    }
    if (rc == 0 && ftruncate(wf->fd, (off_t)size) < 0)
        rc = -errno;
    if (rc == 0) {
        for (uint32_t p = first; p <= last; p++)
            wf->parts[p - 1].gen++;
        extents_truncate(&wf->written, size);
        st->staged_bytes = st->staged_bytes - old + size;
        wf->size = size;
        wf->version++;
        wf->mtime_ns = wall_ns();
        wf->attrs.set &= ~STORE_ATTR_MTIME;
        if (wf->sealed_in_journal)
            unseal_record(st, wf);
        if (wf->writers == 0) /* truncate(2) without an open file is complete in itself */
            seal(st, wf);
        upload_kick(st, wf);
    }
    pthread_mutex_unlock(&st->lock);
    return rc;
}

int stage_fd(struct stage *st, struct wfile *wf, uint64_t *size)
{
    pthread_mutex_lock(&st->lock);
    *size = wf->size;
    pthread_mutex_unlock(&st->lock);
    return wf->fd;
}

uint64_t stage_size(struct stage *st, struct wfile *wf)
{
    pthread_mutex_lock(&st->lock);
    uint64_t n = wf->size;
    pthread_mutex_unlock(&st->lock);
    return n;
}

int stage_flush(struct stage *st, struct wfile *wf)
{
    pthread_mutex_lock(&st->lock);
    int rc = 0;
    if (!wf->unlinked && wf->version != wf->seal_version)
        seal(st, wf);
    if (wf->is_commit && st->cfg.fsync_remote && !wf->unlinked)
        rc = wait_published(st, wf, wf->seal_version, "close", 1);
    else if (wf->error && !wfile_clean(wf))
        rc = -EIO;
    pthread_mutex_unlock(&st->lock);
    return rc;
}

int stage_fsync(struct stage *st, struct wfile *wf)
{
    pthread_mutex_lock(&st->lock);
    if (wf->unlinked) {
        pthread_mutex_unlock(&st->lock);
        return 0;
    }
    int rc = 0;
    if (!st->cfg.fsync_remote || wf->held) {
        /* One journal record, after the bytes are on disk: sealed and durable. */
        if (wf->version != wf->seal_version)
            seal_unrecorded(st, wf);
        uint64_t v = wf->version;
        pthread_mutex_unlock(&st->lock);
        if (fdatasync(wf->fd) < 0)
            rc = -errno;
        pthread_mutex_lock(&st->lock);
        if (rc == 0 && v > wf->durable_version) {
            uint64_t was = wf->durable_version;
            wf->durable_version = v;
            if (wf->held)
                wf->fsynced_held = 1;
            rc = wfile_journal(st, wf); /* durable only once its record says so */
            pthread_mutex_unlock(&st->lock);
            if (rc == 0)
                rc = journal_sync(st->journal);
            pthread_mutex_lock(&st->lock);
            if (rc < 0 && wf->durable_version == v)
                wf->durable_version = was; /* the next fsync records it again */
        }
        if (rc == 0 && wf->error && !wfile_clean(wf))
            rc = -EIO; /* durable here, but the store refused it so far */
    } else {
        if (wf->version != wf->seal_version)
            seal(st, wf);
        rc = wait_published(st, wf, wf->seal_version, "fsync", 0);
    }
    pthread_mutex_unlock(&st->lock);
    return rc;
}

/* Wait until no upload of wf is in flight (lock held, ref held): an upload
 * that lands under a name the file no longer has is removed by its job, so
 * after this the store shows nothing under the old name. */
static void wait_jobs(struct stage *st, struct wfile *wf)
{
    while (wf->jobs > 0)
        pthread_cond_wait(&st->changed, &st->lock);
}

int stage_rename(struct stage *st, const char *from, const char *to)
{
    pthread_mutex_lock(&st->lock);
    struct wfile *wf = wfile_find(st, from);
    if (!wf) {
        pthread_mutex_unlock(&st->lock);
        return -ENOENT;
    }
    if (strcmp(from, to) == 0) {
        pthread_mutex_unlock(&st->lock);
        return 0;
    }
    char *name = strdup(to);
    if (!name) {
        pthread_mutex_unlock(&st->lock);
        return -ENOMEM;
    }
    wfile_ref(wf);
    struct wfile *old = wfile_find(st, to);
    if (old)
        unlink_locked(st, old);
    wfile_table_remove(st, wf);
    free(wf->path);
    wf->path = name;
    wfile_table_insert(st, wf);
    int was_fsynced_held = wf->fsynced_held;
    wf->held = wfile_is_hold_name(path_base(to)) && !st->draining;
    wf->fsynced_held = wf->held && was_fsynced_held;
    wf->is_commit = wf->link_wait || is_commit_name(path_base(to));
    commit_reset(wf);
    if (wf->synced_version) /* what is on the store is under the old name */
        wf->synced_version = 0;
    wf->retry_at = 0;
    wfile_journal(st, wf);
    wait_jobs(st, wf); /* an upload under the old name lands and is removed */
    upload_kick(st, wf);
    pthread_cond_broadcast(&st->changed);
    int rc = 0;
    if (st->cfg.fsync_remote && was_fsynced_held && !wf->held)
        rc = wait_published(st, wf, wf->seal_version, "rename", 0);
    wfile_unref(st, wf);
    pthread_mutex_unlock(&st->lock);
    return rc;
}

int stage_unlink(struct stage *st, const char *path)
{
    pthread_mutex_lock(&st->lock);
    struct wfile *wf = wfile_find(st, path);
    if (wf) {
        wfile_ref(wf);
        unlink_locked(st, wf);
        wait_jobs(st, wf); /* parts back, the upload aborted, a landing removed */
        wfile_unref(st, wf);
    }
    pthread_mutex_unlock(&st->lock);
    return wf ? 0 : -ENOENT;
}

int stage_busy_below(struct stage *st, const char *dir)
{
    pthread_mutex_lock(&st->lock);
    int busy = 0;
    for (struct wfile *wf = st->files; wf && !busy; wf = wf->next)
        busy = !wf->unlinked && path_at_or_below(wf->path, dir);
    pthread_mutex_unlock(&st->lock);
    return busy;
}

/* ---- sync -------------------------------------------------------------- */

struct sync_target {
    struct wfile *wf;
    uint64_t version;
    unsigned attempts;
};

int stage_sync(struct stage *st, const char *dir)
{
    pthread_mutex_lock(&st->lock);
    struct sync_target *t = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    for (struct wfile *wf = st->files; wf; wf = wf->next) {
        if (wf->unlinked || (wfile_clean(wf) && !wf->attrs_landings) ||
            !path_at_or_below(wf->path, dir))
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            struct sync_target *nt = realloc(t, cap * sizeof *nt);
            if (!nt) {
                rc = -ENOMEM;
                break;
            }
            t = nt;
        }
        wfile_ref(wf);
        t[n++] = (struct sync_target){wf, wf->version, wf->attempts};
    }
    for (size_t i = 0; i < n; i++) {
        struct wfile *wf = t[i].wf;
        wf->held = 0;
        wf->retry_at = 0;
        if (wf->version != wf->seal_version)
            seal(st, wf);
        commit_retry(wf); /* "retried on the next sync" */
        upload_kick(st, wf);
    }
    wfile_waiter_enter(st);
    double start = mono_seconds(), logged = start;
    for (;;) {
        size_t left = 0, failed = 0;
        uint64_t bytes = 0;
        for (size_t i = 0; i < n; i++) {
            struct wfile *wf = t[i].wf;
            if (wf->unlinked || (wf->synced_version >= t[i].version && !wf->attrs_landings))
                continue; /* landed, attributes set meanwhile too */
            if ((wf->attempts > t[i].attempts && wf->error) ||
                (wf->commit == WFILE_COMMIT_BLOCKED && wf->commit_version == wf->version)) {
                failed++;
                continue;
            }
            left++;
            bytes += wf->size;
        }
        if (left == 0 && (!st->sweep_at || st->stopping)) { /* and recovery's sweep done */
            if (failed)
                rc = -EIO;
            break;
        }
        if (st->stopping) {
            rc = -EIO;
            break;
        }
        double now = mono_seconds();
        if (left && now - logged >= 2) {
            logged = now;
            log_info("sync: %zu file%s (%.1f MiB) left to upload after %.0f s", left,
                     left == 1 ? "" : "s", (double)bytes / (1 << 20), now - start);
        }
        wfile_wait(st, 1.0);
    }
    wfile_waiter_leave(st);
    for (size_t i = 0; i < n; i++)
        wfile_unref(st, t[i].wf);
    pthread_mutex_unlock(&st->lock);
    free(t);
    return rc;
}
