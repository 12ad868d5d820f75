/*
 * fs/write/stage_life.c - the staging area's life (part of the top of
 * fs/write, with stage.c): opening it (the directory lock, the journal,
 * recovery of what a previous mount left, then the uploads of what it
 * restaged, the upload workers and the supervisor thread that runs retry
 * and hold timers, commit checks and recovery's second sweep), the
 * statistics, and unmount (publish and wait while uploads progress, then
 * stop). Calls downward only: upload.c, commit.c, recover.c, writeback.c,
 * the records (wfile.h) and the journal.
 */
#include "stage.h"

#include "clock.h"
#include "commit.h"
#include "cpu_pressure.h"
#include "journal.h"
#include "log.h"
#include "recover.h"
#include "strutil.h"
#include "upload.h"
#include "wfile.h"
#include "workq.h"
#include "writeback.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

/* ---- recovery's second sweep, statistics -------------------------------- */

void stage_wait_sweep(struct stage *st, const char *key)
{
    pthread_mutex_lock(&st->lock);
    while (!st->stopping && recover_sweep_pending(st, key)) {
        wfile_wait(st, 1.0);
    }
    pthread_mutex_unlock(&st->lock);
}

void stage_get_stats(struct stage *st, struct stage_stats *out)
{
    pthread_mutex_lock(&st->lock);
    *out = st->stats;
    out->pending_files = out->pending_bytes = 0;
    for (struct wfile *wf = st->files; wf; wf = wf->next) {
        if (!wf->unlinked && !wfile_clean(wf)) {
            out->pending_files++;
            out->pending_bytes += wf->size;
        }
    }
    out->staged_bytes = st->staged_bytes;
    out->budget = st->cfg.budget;
    pthread_mutex_unlock(&st->lock);
}

/* ---- the supervisor ---------------------------------------------------- */

static void *supervisor_main(void *arg)
{
    struct stage *st = arg;
    pthread_mutex_lock(&st->lock);
    while (!st->stopping) {
        double next = mono_seconds() + 1.0;
        double t = upload_timers(st);
        if (t > 0 && t < next)
            next = t;
        t = commit_check_all(st, upload_kick); /* a commit file found ready goes at once */
        if (t > 0 && t < next)
            next = t;
        t = recover_sweep_again(st);
        if (t > 0 && t < next)
            next = t;
        if (st->stopping)
            break;
        double wait = next - mono_seconds();
        if (wait > 0)
            wfile_wait(st, wait);
    }
    pthread_mutex_unlock(&st->lock);
    return NULL;
}

/* ---- open and close ---------------------------------------------------- */

/* Start the upload of every staged file (lock not held): at open, what
 * recovery restaged, once every record's stray uploads are swept (a later
 * record naming the same key, a file renamed away from it or a discarded
 * one, would abort an upload begun before its sweep). */
static void kick_all(struct stage *st)
{
    pthread_mutex_lock(&st->lock);
    for (struct wfile *wf = st->files; wf; wf = wf->next)
        upload_kick(st, wf);
    pthread_mutex_unlock(&st->lock);
}

static double psi_share(void *arg, double now)
{
    return cpu_pressure_share(arg, now);
}

static void read_boot_id(char *buf, size_t len)
{
    snprintf(buf, len, "unknown");
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (!f)
        return;
    if (fgets(buf, (int)len, f))
        buf[strcspn(buf, "\n")] = '\0';
    fclose(f);
}

/* The default budget: what the staging disk has free now, less 5%. */
static uint64_t disk_budget(const char *dir)
{
    struct statvfs sv;
    if (statvfs(dir, &sv) < 0)
        return 0;
    uint64_t free_bytes = (uint64_t)sv.f_bavail * sv.f_frsize;
    return free_bytes - free_bytes / 20;
}

static int lock_dir(struct stage *st, char *err, size_t errlen)
{
    char *lockpath = str_printf("%s/lock", st->cfg.dir);
    if (!lockpath)
        return -ENOMEM;
    st->lock_fd = open(lockpath, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    int rc = st->lock_fd < 0 ? -errno : 0;
    if (rc == 0 && flock(st->lock_fd, LOCK_EX | LOCK_NB) < 0) {
        rc = errno == EWOULDBLOCK ? -EBUSY : -errno;
        char pid[32] = "";
        ssize_t n = pread(st->lock_fd, pid, sizeof pid - 1, 0);
        pid[n > 0 ? n : 0] = '\0';
        pid[strcspn(pid, "\n")] = '\0';
        snprintf(
            err, errlen,
            "the cache directory is in use by another ckptfs mount%s%s%s (%s): give each mount "
            "its own --cache-dir",
            *pid ? " (pid " : "", pid, *pid ? ")" : "", st->cfg.dir);
    } else if (rc == 0) {
        char pid[32];
        int n = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
        if (ftruncate(st->lock_fd, 0) == 0 && pwrite(st->lock_fd, pid, (size_t)n, 0) < 0)
            rc = 0; /* the pid is only informative */
    } else {
        snprintf(err, errlen, "cannot open %s: %s", lockpath, strerror(-rc));
    }
    free(lockpath);
    return rc;
}

static int make_dir(const char *path)
{
    return mkdir(path, 0700) < 0 && errno != EEXIST ? -errno : 0;
}

int stage_open(struct store *store, const char *store_name, const struct stage_config *cfg,
               struct stage **out, char *err, size_t errlen)
{
    *out = NULL;
    struct stage *st = calloc(1, sizeof *st);
    if (!st) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    st->store = store;
    st->cfg = *cfg;
    st->lock_fd = st->files_dirfd = -1;
    pthread_mutex_init(&st->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_cond_init(&st->changed, &ca);
    pthread_condattr_destroy(&ca);
    read_boot_id(st->boot_id, sizeof st->boot_id);
    st->store_name = strdup(store_name);
    st->cfg.dir = strdup(cfg->dir); /* ours: the caller's string may not outlive us */
    st->files_dir = str_printf("%s/files", cfg->dir);
    char *jdir = str_printf("%s/journal", cfg->dir);
    int rc = st->store_name && st->cfg.dir && st->files_dir && jdir ? make_dir(cfg->dir) : -ENOMEM;
    if (rc < 0)
        snprintf(err, errlen, "cannot create the staging directory %s: %s", cfg->dir,
                 strerror(-rc));
    if (rc == 0)
        rc = lock_dir(st, err, errlen);
    if (rc == 0 && (rc = make_dir(st->files_dir)) < 0)
        snprintf(err, errlen, "cannot create %s: %s", st->files_dir, strerror(-rc));
    if (rc == 0) {
        st->files_dirfd = open(st->files_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (st->files_dirfd < 0) {
            rc = -errno;
            snprintf(err, errlen, "cannot open %s: %s", st->files_dir, strerror(-rc));
        }
    }
    if (rc == 0)
        rc = journal_open(jdir, &st->journal, err, errlen);
    free(jdir);
    if (rc == 0 && st->cfg.budget == 0)
        st->cfg.budget = disk_budget(cfg->dir);
    if (rc == 0 && !cfg->fsync_remote && !cfg->cpu_pressure) {
        if (cpu_pressure_open(CPU_PRESSURE_FILE, &st->psi) == 0) {
            st->cfg.cpu_pressure = psi_share;
            st->cfg.cpu_pressure_arg = st->psi;
        } else {
            log_info("stage: no CPU pressure information (%s): uploads do not yield to writers",
                     CPU_PRESSURE_FILE);
        }
    }
    if (rc == 0 && (rc = workq_create(cfg->upload_workers, &st->uploads)) < 0)
        snprintf(err, errlen, "cannot start upload workers: %s", strerror(-rc));
    if (rc == 0) {
        recover_journal(st);
        kick_all(st);
        rc = -pthread_create(&st->supervisor, NULL, supervisor_main, st);
        if (rc < 0)
            snprintf(err, errlen, "cannot start the upload supervisor: %s", strerror(-rc));
        else
            st->supervisor_started = 1;
    }
    if (rc == 0 && (rc = writeback_start(st)) < 0)
        snprintf(err, errlen, "cannot start the staging flusher: %s", strerror(-rc));
    if (rc < 0) {
        st->stopping = 1;
        stage_close(st);
        return rc;
    }
    *out = st;
    return 0;
}

void stage_abandon(struct stage *st)
{
    if (!st)
        return;
    pthread_mutex_lock(&st->lock);
    st->stopping = 1;
    pthread_cond_broadcast(&st->changed);
    pthread_mutex_unlock(&st->lock);
}

static int pick_any(const struct wfile *wf, const void *arg)
{
    (void)wf;
    (void)arg;
    return 1;
}

/* Unmount: publish everything and wait while uploads make progress. */
static void drain(struct stage *st)
{
    pthread_mutex_lock(&st->lock);
    st->draining = 1;
    size_t n;
    struct wfile **all = wfile_collect(st, pick_any, NULL, &n);
    for (size_t i = 0; i < n; i++) { /* temporaries go now; nothing is sealed here */
        struct wfile *wf = all[i];
        wf->held = 0;
        wf->retry_at = 0;
        upload_kick(st, wf);
    }
    wfile_release_all(st, all, n);
    double start = mono_seconds(), logged = start;
    while (!st->stopping) {
        size_t left = 0, stuck = 0, unsealed = 0;
        uint64_t bytes = 0;
        for (struct wfile *wf = st->files; wf; wf = wf->next) {
            if (wf->unlinked ? wf->jobs == 0 : wfile_clean(wf))
                continue;
            if (!wf->unlinked && wf->version != wf->seal_version) {
                unsealed++; /* its writer never closed it: not ours to publish */
                continue;
            }
            if (!wf->unlinked && wf->jobs == 0 &&
                (wf->error || wf->commit == WFILE_COMMIT_BLOCKED)) {
                stuck++;
                continue;
            }
            left++;
            bytes += wf->size;
        }
        double now = mono_seconds();
        if (left == 0 && st->sweep_at) { /* recovery's second sweep first */
            if (now - logged >= 1) {
                logged = now;
                log_info("unmount: waiting for recovery's second sweep of %zu key%s (%.0f s)",
                         st->nsweep_keys, st->nsweep_keys == 1 ? "" : "s", now - start);
            }
            wfile_wait(st, 1.0);
            continue;
        }
        if (left == 0) {
            if (stuck)
                log_warn("unmount: %zu file%s could not be uploaded; kept in %s for the next "
                         "mount with this --cache-dir",
                         stuck, stuck == 1 ? "" : "s", st->cfg.dir);
            if (unsealed)
                log_warn("unmount: %zu file%s still being written (never closed): not "
                         "published; the next mount moves their bytes to %s/recovered",
                         unsealed, unsealed == 1 ? " was" : "s were", st->cfg.dir);
            break;
        }
        if (now - logged >= 1) {
            logged = now;
            log_info("unmount: waiting for %zu file%s (%.1f MiB) to reach the store (%.0f s; "
                     "SIGTERM again to leave them staged for the next mount)",
                     left, left == 1 ? "" : "s", (double)bytes / (1 << 20), now - start);
        }
        wfile_wait(st, 1.0);
    }
    pthread_mutex_unlock(&st->lock);
}

void stage_close(struct stage *st)
{
    if (!st)
        return;
    if (st->supervisor_started && !st->stopping)
        drain(st);
    pthread_mutex_lock(&st->lock);
    st->stopping = 1;
    pthread_cond_broadcast(&st->changed);
    pthread_mutex_unlock(&st->lock);
    if (st->supervisor_started)
        pthread_join(st->supervisor, NULL);
    writeback_stop(st);
    recover_sweep_forget(st);   /* an abandoned unmount does not wait for it */
    workq_destroy(st->uploads); /* jobs still queued see `stopping` and return at once */
    size_t kept = 0;
    while (st->files) {
        struct wfile *wf = st->files;
        st->files = wf->next;
        if (!wfile_clean(wf) || wf->unlinked)
            kept++;
        else if (wf->journaled)
            journal_del(st->journal, wf->id);
        if (wfile_clean(wf) && !wf->unlinked && !wfile_retire(st, wf)) {
            char name[32];
            wfile_staging_name(wf->id, name);
            unlinkat(st->files_dirfd, name, 0);
        }
        wfile_free(wf);
    }
    if (kept)
        log_warn("stage: %zu staged file%s left for the next mount with cache dir %s", kept,
                 kept == 1 ? "" : "s", st->cfg.dir);
    journal_close(st->journal);
    cpu_pressure_close(st->psi);
    if (st->files_dirfd >= 0)
        close(st->files_dirfd);
    if (st->lock_fd >= 0)
        close(st->lock_fd);
    pthread_cond_destroy(&st->changed);
    pthread_mutex_destroy(&st->lock);
    free(st->files_dir);
    free(st->store_name);
    free((char *)st->cfg.dir);
    free(st);
}
