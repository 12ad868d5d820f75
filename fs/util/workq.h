/*
 * fs/util/workq.h - a fixed pool of worker threads running queued jobs in FIFO
 * order. The cache submits background fetches (readahead, later
 * index-guided prefetch and multipart uploads) here; the calling thread
 * never blocks on submission.
 */
#ifndef CKPTFS_WORKQ_H
#define CKPTFS_WORKQ_H

#include <stddef.h>

struct workq;
typedef void (*workq_fn)(void *arg);

/* Start nthreads workers. Returns 0 or -errno. */
int workq_create(int nthreads, struct workq **out);

/* Queue fn(arg). Returns 0, or -ESHUTDOWN once workq_destroy has begun
 * (the job is not run; the caller keeps ownership of arg). */
int workq_submit(struct workq *wq, workq_fn fn, void *arg);

/* Take fn(arg) back out of the queue if no worker has started it and no
 * idle worker would reach it: 1 (the caller now owns arg and may run it
 * itself), or 0 (it runs, or soon will, on a worker). */
int workq_take(struct workq *wq, workq_fn fn, void *arg);

/* Jobs queued and not yet started. */
size_t workq_pending(struct workq *wq);

/* Run every queued job to completion, then join and free the workers. */
void workq_destroy(struct workq *wq);

#endif
