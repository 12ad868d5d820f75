/*
 * fs/writeback.c - starting the disk writes of staged bytes early (staged
 * mode only; see wfile.h).
 *
 * Staged mode's fsync waits for the staging file to reach the disk. Left to
 * the kernel, nothing is written before that fsync (its dirty thresholds are
 * gigabytes on a training node), so the flush follows the writing instead of
 * overlapping it, and ranks that the shared daemon keeps in step all flush at
 * once. A write of WRITEBACK_MIN bytes or more queues its file here; one
 * flusher thread asks the kernel to start writing the file's dirty pages
 * (sync_file_range WRITE). The thread, not the writer, calls it, because the
 * call can wait for room in the disk's queue: the trainer's write returns at
 * page-cache speed either way. Remote mode starts nothing: nobody waits for
 * the staging disk there, and a staging file is often gone before the kernel
 * would write it. Small writes do not queue: a random writer dirties those
 * pages again.
 */
#include "log.h"
#include "wfile.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

#define WRITEBACK_MIN (256u << 10)

void writeback_note(struct stage *st, struct wfile *wf, ssize_t written)
{
    if (st->cfg.fsync_remote || written < (ssize_t)WRITEBACK_MIN || wf->wb_queued ||
        !st->flusher_started)
        return;
    if (st->wb_n == st->wb_cap) {
        size_t cap = st->wb_cap ? 2 * st->wb_cap : 16;
        struct wfile **q = realloc(st->wb_queue, cap * sizeof *q);
        if (!q)
            return; /* the fsync flushes it all the same */
        st->wb_queue = q;
        st->wb_cap = cap;
    }
    wfile_ref(wf); /* its staging file stays open until the flusher is done */
    wf->wb_queued = 1;
    st->wb_queue[st->wb_n++] = wf;
    pthread_cond_broadcast(&st->changed);
}

static void *flusher_main(void *arg)
{
    struct stage *st = arg;
    pthread_mutex_lock(&st->lock);
    for (;;) {
        while (st->wb_n == 0 && !st->stopping)
            pthread_cond_wait(&st->changed, &st->lock);
        if (st->wb_n == 0)
            break;
        struct wfile *wf = st->wb_queue[0];
        memmove(st->wb_queue, st->wb_queue + 1, --st->wb_n * sizeof *st->wb_queue);
        assert(wf->wb_queued && wf->refs > 0);
        wf->wb_queued = 0; /* a write from now on queues it again */
        int fd = wf->fd;
        pthread_mutex_unlock(&st->lock);
        int rc = st->stopping ? -1 : sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WRITE);
        pthread_mutex_lock(&st->lock);
        if (rc == 0)
            st->stats.writeback_starts++;
        wfile_unref(st, wf);
    }
    pthread_mutex_unlock(&st->lock);
    return NULL;
}

int writeback_start(struct stage *st)
{
    if (st->cfg.fsync_remote)
        return 0;
    int rc = pthread_create(&st->flusher, NULL, flusher_main, st);
    if (rc != 0)
        return -rc;
    st->flusher_started = 1;
    return 0;
}

void writeback_stop(struct stage *st)
{
    if (!st->flusher_started)
        return;
    assert(st->stopping); /* the flusher drops what is queued and ends */
    pthread_join(st->flusher, NULL);
    st->flusher_started = 0;
    free(st->wb_queue);
    st->wb_queue = NULL;
    st->wb_n = st->wb_cap = 0;
}
