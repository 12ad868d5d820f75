/*
 * fs/write/upload.c - moving staged files to the store (see wfile.h for the state
 * it drives).
 *
 * upload_kick() looks at one wfile and submits the jobs it is ready for to
 * the upload workers (a pool of its own, so uploads never hold up reads or
 * index builds): while the writer is still writing, a large file begins a
 * multipart upload and sends each part as soon as its bytes are all
 * written; once sealed, the remaining parts go and the upload is completed;
 * a small sealed file is one PUT. Each job calls the store without the lock
 * and reports back under it, then kicks again. Failures are retried with
 * backoff (the store already retried each request); a multipart upload that
 * the store no longer knows is started over; an upload that lands under a
 * name the file no longer has (a rename or unlink raced it) is removed. In
 * staged mode, jobs wait while the trainer writes on a contended CPU
 * (yield_to_writers). Each kind of job is a row of job_steps: its request,
 * and what the answer does to the file.
 *
 * A middle layer (stage.h): calls the records (wfile.h), the journal, the
 * store, commit.c (may a commit file go; a file landed) and recover.c (the
 * sweep after a lost begin); never stage.c, and nothing below calls it.
 */
#include "upload.h"

#include "clock.h"
#include "commit.h"
#include "cpu_pressure.h"
#include "journal.h"
#include "log.h"
#include "parts.h"
#include "recover.h"
#include "wfile.h"
#include "workq.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

enum job_kind { JOB_PUT, JOB_BEGIN, JOB_PART, JOB_COMPLETE, JOB_ABORT };

/* Staged mode, on a busy CPU: upload jobs wait while clients wrote at least
 * UPLOAD_YIELD_WRITES bytes in the last WFILE_WRITE_WINDOW or two (a save, not a
 * log trickle) and the CPU pressure (share of time some task waited for a
 * CPU) is at least UPLOAD_YIELD_PRESSURE; each job for at most
 * cfg.upload_yield_max seconds, so uploads never starve. */
#define UPLOAD_YIELD_WRITES (1u << 20)
#define UPLOAD_YIELD_PRESSURE 0.2

/* A multipart upload whose completion failed this many times in a row (each
 * after the store client's own retries) is aborted and sent again. */
#define COMPLETE_GIVE_UP 3

struct job {
    struct stage *st;
    struct wfile *wf;
    enum job_kind kind;
    uint64_t version; /* PUT, COMPLETE: the version published */
    uint64_t size;    /* PUT, COMPLETE: object size */
    char *key;        /* the key it writes */
    char *upload_id;  /* PART, COMPLETE, ABORT */
    struct store_part part;
    uint64_t part_gen;
    struct store_part *parts; /* COMPLETE */
    size_t nparts;
    int sweep_after;          /* COMPLETE: sweep the key once done (a begin's answer was lost) */
    struct store_attrs attrs; /* PUT, BEGIN: the file's attributes, sent with it */
    uint64_t attrs_gen;       /* PUT, BEGIN, COMPLETE: their change count the object has */
};

static void job_free(struct job *j)
{
    free(j->key);
    free(j->upload_id);
    free(j->parts);
    free(j);
}

static void run_job(void *arg);
static const char *job_name(enum job_kind kind);

/* Queue j (lock held): the job holds a reference on its wfile. */
static int submit(struct stage *st, struct job *j)
{
    j->st = st;
    wfile_ref(j->wf);
    j->wf->jobs++;
    if (workq_submit(st->uploads, run_job, j) < 0) {
        j->wf->jobs--;
        j->wf->refs--; /* cannot reach zero: the caller holds one */
        job_free(j);
        return -ESHUTDOWN;
    }
    return 0;
}

static struct job *job_new(struct wfile *wf, enum job_kind kind, const char *key)
{
    struct job *j = calloc(1, sizeof *j);
    if (!j)
        return NULL;
    j->wf = wf;
    j->kind = kind;
    j->attrs = wf->attrs;
    j->attrs_gen = kind == JOB_COMPLETE ? wf->mpu_attrs_gen : wf->attrs_gen;
    j->key = strdup(key);
    if (!j->key) {
        free(j);
        return NULL;
    }
    return j;
}

/* Part number's range clipped to size. */
static void part_range(const struct stage *st, uint32_t number, uint64_t size, uint64_t *off,
                       uint64_t *len)
{
    *off = parts_offset(st->cfg.part_size, number);
    *len = parts_size(st->cfg.part_size, number);
    if (*off + *len > size)
        *len = size > *off ? size - *off : 0;
}

/* Forget the parts of a multipart upload that is gone (lock held). */
static void forget_parts(struct wfile *wf)
{
    for (uint32_t i = 0; i < wf->nparts; i++)
        wf->parts[i].uploaded = 0;
}

static void end_mpu(struct wfile *wf)
{
    wf->mpu = WFILE_MPU_NONE;
    wf->complete_failures = 0;
    free(wf->upload_key);
    free(wf->upload_id);
    wf->upload_key = wf->upload_id = NULL;
    forget_parts(wf);
}

static int any_part_inflight(const struct wfile *wf)
{
    for (uint32_t i = 0; i < wf->nparts; i++)
        if (wf->parts[i].inflight)
            return 1;
    return 0;
}

/* Abort the multipart upload of wf now (lock held, none of its parts in
 * flight): its state is forgotten at once; the job only tells the store. */
static void abort_mpu(struct stage *st, struct wfile *wf)
{
    assert(wf->mpu == WFILE_MPU_ACTIVE && !any_part_inflight(wf));
    struct job *j = job_new(wf, JOB_ABORT, wf->upload_key);
    if (j && !(j->upload_id = strdup(wf->upload_id))) {
        job_free(j);
        j = NULL;
    }
    if (!j || submit(st, j) < 0)
        log_warn("upload: cannot abort the multipart upload of %s now; the next mount will",
                 wf->upload_key);
    end_mpu(wf);
}

void upload_cancel(struct stage *st, struct wfile *wf)
{
    if (wf->mpu == WFILE_MPU_ACTIVE && !any_part_inflight(wf))
        abort_mpu(st, wf);
    /* Otherwise a job in flight finishes first and kicks again: an unlinked
     * file's kick comes back here. */
}

static void start_part(struct stage *st, struct wfile *wf, uint32_t number, uint64_t off,
                       uint64_t len)
{
    struct wfile_part *p = &wf->parts[number - 1];
    struct job *j = job_new(wf, JOB_PART, wf->upload_key);
    if (j && !(j->upload_id = strdup(wf->upload_id))) {
        job_free(j);
        j = NULL;
    }
    if (!j)
        return;
    j->part = (struct store_part){.number = number, .offset = off, .length = len};
    j->part_gen = p->gen;
    p->inflight = 1;
    if (submit(st, j) < 0)
        p->inflight = 0;
}

static void start_complete(struct stage *st, struct wfile *wf, uint32_t count)
{
    struct job *j = job_new(wf, JOB_COMPLETE, wf->upload_key);
    if (!j)
        return;
    j->upload_id = strdup(wf->upload_id);
    j->parts = calloc(count, sizeof *j->parts);
    if (!j->upload_id || !j->parts) {
        job_free(j);
        return;
    }
    for (uint32_t i = 0; i < count; i++) {
        struct store_part *sp = &j->parts[i];
        sp->number = i + 1;
        part_range(st, i + 1, wf->size, &sp->offset, &sp->length);
        memcpy(sp->etag, wf->parts[i].etag, STORE_ETAG_MAX);
    }
    j->nparts = count;
    j->version = wf->version;
    j->size = wf->size;
    wf->mpu = WFILE_MPU_COMPLETING;
    if (submit(st, j) < 0)
        wf->mpu = WFILE_MPU_ACTIVE;
}

static void start_begin(struct stage *st, struct wfile *wf)
{
    struct job *j = job_new(wf, JOB_BEGIN, wf->path);
    char *key = strdup(wf->path);
    if (!j || !key) {
        free(key);
        if (j)
            job_free(j);
        return;
    }
    free(wf->upload_key);
    wf->upload_key = key;
    wf->mpu = WFILE_MPU_BEGINNING;
    forget_parts(wf);
    if (submit(st, j) < 0) {
        wf->mpu = WFILE_MPU_NONE;
        free(wf->upload_key);
        wf->upload_key = NULL;
    }
}

static void start_put(struct stage *st, struct wfile *wf)
{
    if (wfile_parts_reserve(wf, 1) < 0)
        return;
    struct job *j = job_new(wf, JOB_PUT, wf->path);
    if (!j)
        return;
    j->version = wf->version;
    j->size = wf->size;
    wf->parts[0].inflight = 1; /* writes into these bytes wait for the PUT */
    if (submit(st, j) < 0)
        wf->parts[0].inflight = 0;
}

/* Send the parts of the active multipart upload that are ready; returns 1
 * when every part of the sealed content is on the store. */
static int send_parts(struct stage *st, struct wfile *wf, int sealed)
{
    uint32_t count = parts_count(st->cfg.part_size, wf->size);
    if (wfile_parts_reserve(wf, count ? count : 1) < 0)
        return 0;
    int all_there = 1;
    for (uint32_t n = 1; n <= count; n++) {
        struct wfile_part *p = &wf->parts[n - 1];
        uint64_t off, len, full = parts_size(st->cfg.part_size, n);
        part_range(st, n, wf->size, &off, &len);
        if (p->uploaded && p->up_gen == p->gen && p->up_len == len && !p->inflight)
            continue;
        all_there = 0;
        if (p->inflight || p->busy)
            continue;
        /* Before the seal only whole, fully written parts go: the rest may
         * still change size or bytes. */
        if (!sealed && (len < full || !extents_covers(&wf->written, off, off + len)))
            continue;
        start_part(st, wf, n, off, len);
    }
    return all_there && !any_part_inflight(wf);
}

/* 1 if a file that had wf's name before it (unlinked, or replaced by a
 * create or a rename) still has a request in flight for that key: its
 * landing must come first, or the replaced bytes would land over wf's (or
 * its clean-up would remove them). Lock held. */
static int predecessor_in_flight(const struct stage *st, const struct wfile *wf)
{
    for (const struct wfile *o = st->files; o; o = o->next)
        if (o != wf && o->unlinked && o->jobs > 0 &&
            (strcmp(o->path, wf->path) == 0 ||
             (o->upload_key && strcmp(o->upload_key, wf->path) == 0)))
            return 1;
    return 0;
}

/* Kick the live file named key, which predecessor_in_flight() may have
 * held back while wf's requests were out (lock held). */
static void kick_successor(struct stage *st, struct wfile *wf, const char *key)
{
    struct wfile *successor = wfile_find(st, key);
    if (successor && successor != wf)
        upload_kick(st, successor);
}

void upload_kick(struct stage *st, struct wfile *wf)
{
    WFILE_ASSERT_LOCKED(st);
    if (st->stopping)
        return;
    if (wf->unlinked) {
        upload_cancel(st, wf);
        return;
    }
    if (wfile_clean(wf))
        return;
    if (predecessor_in_flight(st, wf))
        return; /* run_job kicks wf when the predecessor's last request is back */
    if (wf->error && mono_seconds() < wf->retry_at)
        return; /* upload_timers() kicks again when it is time */
    int sealed = wf->seal_version == wf->version;
    uint64_t first = parts_size(st->cfg.part_size, 1);

    if (wf->mpu == WFILE_MPU_ACTIVE && strcmp(wf->upload_key, wf->path) != 0) {
        if (any_part_inflight(wf))
            return; /* renamed: abort once its parts are back */
        abort_mpu(st, wf);
    }
    if (wf->mpu == WFILE_MPU_BEGINNING || wf->mpu == WFILE_MPU_COMPLETING)
        return;
    int may_stream = !wf->held && !wf->is_commit;
    if (wf->mpu == WFILE_MPU_NONE) {
        if (!sealed) {
            if (may_stream && wf->size > first && wf->nparts > 0 && !wf->parts[0].busy &&
                extents_covers(&wf->written, 0, first))
                start_begin(st, wf);
            return;
        }
        if (wf->held || !commit_allows(st, wf))
            return;
        if (wf->size <= first) {
            if (wf->nparts == 0 || !wf->parts[0].inflight)
                start_put(st, wf);
        } else {
            start_begin(st, wf);
        }
        return;
    }
    /* WFILE_MPU_ACTIVE */
    if (!may_stream && !sealed)
        return;
    if (sealed && wf->size == 0) { /* cut to nothing after parts went: no parts to complete */
        if (!any_part_inflight(wf)) {
            abort_mpu(st, wf);
            upload_kick(st, wf);
        }
        return;
    }
    int ready = send_parts(st, wf, sealed);
    if (ready && sealed && !wf->held && commit_allows(st, wf))
        start_complete(st, wf, parts_count(st->cfg.part_size, wf->size));
}

/* ---- job results ------------------------------------------------------- */

static double backoff(struct stage *st, unsigned attempts)
{
    double d = 1.0;
    for (unsigned i = 1; i < attempts && d < st->cfg.retry_max_delay; i++)
        d *= 2;
    if (d > st->cfg.retry_max_delay)
        d = st->cfg.retry_max_delay;
    return d * (0.5 + (double)(rand() % 1000) / 2000.0); /* jitter: 50-100% */
}

static void failed(struct stage *st, struct job *j, int rc)
{
    struct wfile *wf = j->wf;
    wf->error = rc;
    wf->attempts++;
    wf->retry_at = mono_seconds() + backoff(st, wf->attempts);
    st->stats.upload_failures++;
    log_warn("upload: %s of %s failed: %s; staged data kept, retrying in %.0f s", job_name(j->kind),
             j->key, strerror(-rc), wf->retry_at - mono_seconds());
}

static void succeeded(struct wfile *wf)
{
    wf->error = 0;
    wf->attempts = 0;
    wf->retry_at = 0;
}

/* Give the object that landed (ns, under j->key) the attributes set since
 * *gen (their change count it has; first: the landing itself, where a store
 * that cannot send them with an upload gets them all now) with a
 * metadata-only copy (S3), and put in ns the attributes the object has;
 * *gen becomes the count it has now. Lock held on entry and exit; dropped
 * for the request. */
static void fix_attrs(struct stage *st, struct job *j, struct store_stat *ns, uint64_t *gen,
                      int first)
{
    struct wfile *wf = j->wf;
    struct store *s = st->store;
    struct store_attrs a = wf->attrs, had = ns->attrs;
    int stale = wf->attrs_gen != *gen || (first && !s->ops->put_attrs);
    *gen = wf->attrs_gen;
    ns->attrs = a;
    if (a.set & STORE_ATTR_MTIME)
        ns->mtime_ns = a.mtime_ns;
    if (!a.set || !s->ops->set_attrs || !stale)
        return;
    pthread_mutex_unlock(&st->lock);
    char etag[STORE_ETAG_MAX];
    int rc = s->ops->set_attrs(s, j->key, 0, ns->etag, j->size, &a, etag);
    pthread_mutex_lock(&st->lock);
    if (rc < 0) {
        log_warn("upload: cannot set the attributes of %s: %s", j->key, strerror(-rc));
        ns->attrs = had;
    } else if (etag[0]) {
        memcpy(ns->etag, etag, STORE_ETAG_MAX);
    }
}

/* The object landed under j->key: either that is still the file's name (the
 * version is published) or the file moved on (renamed, unlinked): then the
 * landing is removed, unless a newer staged file now owns that name. Lock
 * held on entry and exit. */
static void landed(struct stage *st, struct job *j, const char *etag)
{
    struct wfile *wf = j->wf;
    if (!wf->unlinked && strcmp(wf->path, j->key) == 0) {
        if (j->version > wf->synced_version) {
            wf->synced_version = j->version;
            snprintf(wf->synced_etag, sizeof wf->synced_etag, "%s", etag);
            wf->synced_size = j->size;
        }
        succeeded(wf);
        st->stats.files_published++;
        st->stats.bytes_uploaded += j->size;
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        st->stats.last_publish = (double)now.tv_sec + (double)now.tv_nsec / 1e9;
        if (wf->is_commit)
            st->stats.commits++;
        else
            commit_wake(st, wf->path);
        struct store_stat ns = {.size = j->size, .mtime_ns = wall_ns(), .attrs = j->attrs};
        snprintf(ns.etag, sizeof ns.etag, "%s", etag);
        char *path = strdup(wf->path);
        struct stage_commit_snapshot *snap = wf->is_commit && st->cfg.on_publish
                                                 ? commit_snapshot(st, wf, j->version, j->size)
                                                 : NULL;
        /* Attributes set from here until the landing is done are this
         * landing's to send (stage_set_attrs counts on it): it checks for
         * them under the lock, last after the publish, and only then stops
         * being a landing. */
        wf->attrs_landings++;
        uint64_t gen = j->attrs_gen;
        for (int first = 1;; first = 0) {
            fix_attrs(st, j, &ns, &gen, first);
            pthread_mutex_unlock(&st->lock);
            if (path && st->cfg.on_publish)
                st->cfg.on_publish(st->cfg.on_publish_arg, path, &ns, snap);
            commit_snapshot_free(snap);
            snap = NULL;
            pthread_mutex_lock(&st->lock);
            /* Renamed or unlinked meanwhile: a new upload (or none) takes them. */
            if (gen == wf->attrs_gen || wf->unlinked || !path || strcmp(wf->path, path) != 0)
                break;
        }
        assert(wf->attrs_landings > 0);
        wf->attrs_landings--;
        free(path);
        return;
    }
    int owned = wfile_find(st, j->key) != NULL;
    pthread_mutex_unlock(&st->lock);
    if (!owned) {
        int rc = st->store->ops->remove(st->store, j->key);
        if (rc < 0 && rc != -ENOENT)
            log_warn("upload: cannot remove %s (uploaded under a name it no longer has): %s",
                     j->key, strerror(-rc));
    }
    pthread_mutex_lock(&st->lock);
}

/* 1 if an upload job that began waiting at `since` should go on waiting,
 * yielding to the writers (lock held). Only in staged mode, where nobody
 * waits for uploads unless a sync, a remote fsync or a full staging area
 * says so; only while a save's writes keep arriving; only while the CPUs
 * are contended, so on a machine with CPU to spare the uploads still
 * overlap the writes; and only for upload_yield_max seconds. */
static int uploads_yield(struct stage *st, double since)
{
    if (st->cfg.fsync_remote || !st->cfg.cpu_pressure || st->draining || st->stopping ||
        st->upload_waiters > 0)
        return 0;
    double now = mono_seconds();
    if (now - since >= st->cfg.upload_yield_max ||
        wfile_recent_writes(st, now) < UPLOAD_YIELD_WRITES)
        return 0;
    /* Unknown yet (the first reading of a save, after a quiet second): wait
     * for the next window's reading rather than start uploads blind. A
     * source that cannot be read any more holds nothing back. */
    double pressure = st->cfg.cpu_pressure(st->cfg.cpu_pressure_arg, now);
    if (pressure == CPU_PRESSURE_UNREADABLE)
        return 0;
    return pressure < 0 || pressure >= UPLOAD_YIELD_PRESSURE;
}

/* Wait while uploads yield to the writers (lock held). */
static void yield_to_writers(struct stage *st)
{
    double start = mono_seconds();
    if (!uploads_yield(st, start))
        return;
    st->stats.upload_yields++;
    do
        wfile_wait(st, WFILE_WRITE_WINDOW / 2);
    while (uploads_yield(st, start));
    st->stats.upload_yield_seconds += mono_seconds() - start;
}

/* An abort failed: keep the upload in the journal, as a discard record of
 * its own, so the next mount's recovery aborts it (lock held; dropped for
 * the journal). */
static void record_orphan(struct stage *st, const char *key, const char *upload_id)
{
    pthread_mutex_unlock(&st->lock);
    uint64_t id;
    int rc = journal_new_id(st->journal, &id);
    if (rc == 0) {
        struct journal_rec r = {.id = id,
                                .seq = 1,
                                .flags = JOURNAL_DISCARD,
                                .boot_id = st->boot_id,
                                .store = st->store_name,
                                .path = key,
                                .upload_key = key,
                                .upload_id = upload_id};
        rc = journal_put(st->journal, &r);
    }
    if (rc < 0)
        log_error("upload: cannot journal the multipart upload of %s left to abort: %s", key,
                  strerror(-rc));
    pthread_mutex_lock(&st->lock);
}

/* ---- the jobs, kind by kind -------------------------------------------- */

/* What the store answered besides a status. */
struct job_answer {
    char etag[STORE_ETAG_MAX];           /* PUT, COMPLETE */
    char upload_id[STORE_UPLOAD_ID_MAX]; /* BEGIN */
};

static void begin_before(struct stage *st, struct job *j)
{
    /* The journal names the key before the store hears of the upload,
     * so a crash in between leaves a trace the next mount can clean. (A
     * PUT needs none: recovery cleans every recorded path's leftovers,
     * such as a local store's temporary file.) */
    wfile_journal(st, j->wf);
}

static int put_send(struct store *s, struct job *j, struct job_answer *a)
{
    if (s->ops->put_attrs && j->attrs.set)
        return s->ops->put_attrs(s, j->key, j->wf->fd, j->size, &j->attrs, a->etag);
    return s->ops->put(s, j->key, j->wf->fd, j->size, a->etag);
}

static int begin_send(struct store *s, struct job *j, struct job_answer *a)
{
    if (s->ops->mpu_begin_attrs && j->attrs.set)
        return s->ops->mpu_begin_attrs(s, j->key, &j->attrs, a->upload_id);
    return s->ops->mpu_begin(s, j->key, a->upload_id);
}

static int part_send(struct store *s, struct job *j, struct job_answer *a)
{
    (void)a; /* the etag goes into j->part */
    return s->ops->mpu_part(s, j->key, j->upload_id, &j->part, j->wf->fd);
}

static int complete_send(struct store *s, struct job *j, struct job_answer *a)
{
    return s->ops->mpu_complete(s, j->key, j->upload_id, j->parts, j->nparts, j->size, a->etag);
}

static int abort_send(struct store *s, struct job *j, struct job_answer *a)
{
    (void)a;
    return s->ops->mpu_abort(s, j->key, j->upload_id);
}

static void put_answer(struct stage *st, struct job *j, int rc, int stopping,
                       const struct job_answer *a)
{
    j->wf->parts[0].inflight = 0;
    if (rc == 0)
        landed(st, j, a->etag);
    else if (!stopping)
        failed(st, j, rc);
}

static void begin_answer(struct stage *st, struct job *j, int rc, int stopping,
                         const struct job_answer *a)
{
    struct wfile *wf = j->wf;
    if (rc > 0 || (rc < 0 && !stopping)) {
        wf->stray_begin = 1; /* a lost answer may have begun an upload nobody holds */
        if (rc > 0)
            rc = 0;
    }
    if (rc == 0 && (wf->upload_id = strdup(a->upload_id)) != NULL) {
        wf->mpu = WFILE_MPU_ACTIVE;
        wf->mpu_attrs_gen = j->attrs_gen;
        if (!wf->unlinked)
            wfile_journal(st, wf);
        return;
    }
    wf->mpu = WFILE_MPU_NONE;
    if (rc == 0) { /* no memory for the id: give the upload up */
        pthread_mutex_unlock(&st->lock);
        st->store->ops->mpu_abort(st->store, j->key, a->upload_id);
        pthread_mutex_lock(&st->lock);
        rc = -ENOMEM;
    }
    if (!stopping)
        failed(st, j, rc);
}

static void part_answer(struct stage *st, struct job *j, int rc, int stopping,
                        const struct job_answer *a)
{
    (void)a;
    struct wfile *wf = j->wf;
    struct wfile_part *p = &wf->parts[j->part.number - 1];
    p->inflight = 0;
    if (rc == 0 && wf->mpu == WFILE_MPU_ACTIVE && wf->upload_id &&
        strcmp(wf->upload_id, j->upload_id) == 0) {
        p->uploaded = 1;
        p->up_gen = j->part_gen;
        p->up_len = j->part.length;
        memcpy(p->etag, j->part.etag, STORE_ETAG_MAX);
        /* So that a crash resumes with this part: at most once a second
         * (a record lists every part: writing it per part would cost
         * the square of the part count), and when the last part is in. */
        if (wf->seal_version == wf->version && !wf->unlinked &&
            (mono_seconds() - wf->journaled_at >= 1.0 || !any_part_inflight(wf)))
            wfile_journal(st, wf);
    } else if (rc == -ENOENT) {
        log_warn("upload: the multipart upload of %s is gone from the store; starting over",
                 j->key);
        if (wf->mpu == WFILE_MPU_ACTIVE && !any_part_inflight(wf))
            end_mpu(wf);
    } else if (rc < 0 && !stopping) {
        failed(st, j, rc);
    }
}

static void complete_answer(struct stage *st, struct job *j, int rc, int stopping,
                            const struct job_answer *a)
{
    struct wfile *wf = j->wf;
    j->sweep_after = rc == 0 && wf->stray_begin;
    if (j->sweep_after)
        wf->stray_begin = 0;
    if (rc == 0) {
        end_mpu(wf);
        landed(st, j, a->etag);
        return;
    }
    wf->mpu = WFILE_MPU_ACTIVE;
    if (rc == -ENOENT) {
        log_warn("upload: the multipart upload of %s is gone from the store; starting "
                 "over",
                 j->key);
        end_mpu(wf);
    } else if (!stopping && ++wf->complete_failures >= COMPLETE_GIVE_UP && !any_part_inflight(wf)) {
        /* The store keeps refusing to assemble it (it may have lost parts,
         * e.g. after a crash during a completion): send it all again. */
        log_warn("upload: the multipart upload of %s failed to complete %u times; "
                 "starting over",
                 j->key, wf->complete_failures);
        abort_mpu(st, wf);
    }
    if (!stopping)
        failed(st, j, rc);
}

static void abort_answer(struct stage *st, struct job *j, int rc, int stopping,
                         const struct job_answer *a)
{
    (void)stopping;
    (void)a;
    if (rc < 0 && rc != -ESHUTDOWN) {
        log_warn("upload: cannot abort the multipart upload of %s: %s (the next mount "
                 "retries)",
                 j->key, strerror(-rc));
        record_orphan(st, j->key, j->upload_id);
    }
}

/* The steps of one kind of job. */
struct job_steps {
    const char *name;  /* in the logs */
    int yields;        /* waits for the writers first (yield_to_writers) */
    int when_stopping; /* sent even when the mount stops: leave nothing behind if quick */
    /* Before the request (lock held; not when stopping), or NULL. */
    void (*before)(struct stage *st, struct job *j);
    /* The request to the store (no lock): 0 or a negative errno. */
    int (*send)(struct store *s, struct job *j, struct job_answer *a);
    /* What its answer does to the file (lock held; may unlock). rc is the
     * request's, or -ESHUTDOWN if it was not sent; stopping: the mount
     * stops and the request was not sent. */
    void (*answer)(struct stage *st, struct job *j, int rc, int stopping,
                   const struct job_answer *a);
};

static const struct job_steps job_steps[] = {
    [JOB_PUT] = {"PUT", 1, 0, NULL, put_send, put_answer},
    [JOB_BEGIN] = {"begin multipart", 1, 0, begin_before, begin_send, begin_answer},
    [JOB_PART] = {"part", 1, 0, NULL, part_send, part_answer},
    [JOB_COMPLETE] = {"complete", 1, 0, NULL, complete_send, complete_answer},
    [JOB_ABORT] = {"abort", 0, 1, NULL, abort_send, abort_answer},
};

static const char *job_name(enum job_kind kind)
{
    return job_steps[kind].name;
}

/* In staged mode the trainer waits for its writes, not for uploads: let it
 * have the CPU first. (Within this process's scheduling group only: under
 * autogroups or cgroups the daemon competes with the trainer as a whole,
 * hence also yield_to_writers.) Once per upload thread. */
static void nice_upload_thread(const struct stage *st)
{
    static _Thread_local int niced;
    if (!niced && !st->cfg.fsync_remote) {
        setpriority(PRIO_PROCESS, (id_t)gettid(), 19);
        niced = 1;
    }
}

/* A worker runs job j: its request without the lock, its answer under it,
 * then the next upload work of its file. */
static void run_job(void *arg)
{
    struct job *j = arg;
    struct stage *st = j->st;
    struct wfile *wf = j->wf;
    const struct job_steps *step = &job_steps[j->kind];
    nice_upload_thread(st);
    struct job_answer a = {.etag = "", .upload_id = ""};
    int rc = -ESHUTDOWN;
    pthread_mutex_lock(&st->lock);
    if (step->yields)
        yield_to_writers(st);
    int stop = st->stopping;
    if (!stop && step->before)
        step->before(st, j);
    pthread_mutex_unlock(&st->lock);
    if (!stop || step->when_stopping)
        rc = step->send(st->store, j, &a);

    pthread_mutex_lock(&st->lock);
    step->answer(st, j, rc, st->stopping && rc == -ESHUTDOWN, &a);
    assert(wf->jobs > 0);
    wf->jobs--;
    upload_kick(st, wf);
    if (j->sweep_after) /* once this file's upload is done, so it is not in the listing */
        recover_sweep_key(st, j->key);
    if (wf->unlinked && wf->jobs == 0) { /* the file that took its name may wait for this */
        kick_successor(st, wf, wf->path);
        if (wf->upload_key && strcmp(wf->upload_key, wf->path) != 0)
            kick_successor(st, wf, wf->upload_key);
    }
    pthread_cond_broadcast(&st->changed);
    wfile_unref(st, wf);
    pthread_mutex_unlock(&st->lock);
    job_free(j);
}

double upload_timers(struct stage *st)
{
    double now = mono_seconds(), next = 0;
    for (struct wfile *wf = st->files; wf; wf = wf->next) {
        double due = 0;
        if (wf->error && !wfile_clean(wf) && wf->jobs == 0) {
            due = wf->retry_at;
        } else if (wf->held && wf->seal_version == wf->version && !wfile_clean(wf)) {
            due = wf->sealed_at + st->cfg.hold_seconds;
            if (now >= due)
                wf->held = 0;
        }
        if (!due)
            continue;
        if (now >= due)
            upload_kick(st, wf); /* never unlocks: the walk stays valid */
        else if (!next || due < next)
            next = due;
    }
    return next;
}
