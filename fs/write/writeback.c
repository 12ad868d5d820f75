/*
 * fs/write/writeback.c - starting the disk writes of staged bytes early (staged
 * mode only; see writeback.h).
 *
 * Staged mode's fsync waits for the staging file to reach the disk. Left to
 * the kernel, nothing is written before that fsync (its dirty thresholds are
 * gigabytes on a training node), so the flush follows the writing instead of
 * overlapping it, and ranks that the shared daemon keeps in step all flush at
 * once. A write of WRITEBACK_MIN bytes or more queues its file here; a
 * one-thread work queue (the flusher) asks the kernel to start writing the
 * file's dirty pages (sync_file_range WRITE). The thread, not the writer,
 * calls it, because the call can wait for room in the disk's queue: the
 * trainer's write returns at page-cache speed either way. Remote mode starts
 * nothing: nobody waits for the staging disk there, and a staging file is
 * often gone before the kernel would write it. Small writes do not queue: a
 * random writer dirties those pages again. A middle layer (stage.h):
 * calls the records (wfile.h) and the work queue only.
 */
#include "writeback.h"

#include "wfile.h"
#include "workq.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>

#define WRITEBACK_MIN (256u << 10)

struct flush_job {
    struct stage *st;
    struct wfile *wf; /* referenced, wb_queued set, until the job ran */
};

static void flush_run(void *arg)
{
    struct flush_job *j = arg;
    struct stage *st = j->st;
    struct wfile *wf = j->wf;
    free(j);
    pthread_mutex_lock(&st->lock);
    assert(wf->wb_queued && wf->refs > 0);
    wf->wb_queued = 0; /* a write from now on queues it again */
    int fd = wf->fd, stop = st->stopping;
    pthread_mutex_unlock(&st->lock);
    int rc = stop ? -1 : sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);
    pthread_mutex_lock(&st->lock);
    if (rc == 0)
        st->stats.writeback_starts++;
    wfile_unref(st, wf);
    pthread_mutex_unlock(&st->lock);
}

void writeback_note(struct stage *st, struct wfile *wf, ssize_t written)
{
    if (!st->flusher || written < (ssize_t)WRITEBACK_MIN || wf->wb_queued)
        return;
    struct flush_job *j = malloc(sizeof *j);
    if (!j)
        return; /* the fsync flushes it all the same */
    *j = (struct flush_job){st, wf};
    wfile_ref(wf); /* its staging file stays open until the job ran */
    wf->wb_queued = 1;
    if (workq_submit(st->flusher, flush_run, j) < 0) {
        wf->wb_queued = 0;
        wfile_unref(st, wf); /* the writer's own reference keeps it */
        free(j);
    }
}

int writeback_start(struct stage *st)
{
    return st->cfg.fsync_remote ? 0 : workq_create(1, &st->flusher);
}

void writeback_stop(struct stage *st)
{
    assert(!st->flusher || st->stopping); /* queued jobs skip the disk write */
    if (st->flusher)
        workq_destroy(st->flusher);
    st->flusher = NULL;
}
