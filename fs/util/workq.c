/*
 * fs/util/workq.c - fixed-size thread pool with a FIFO job queue; a caller may
 * take back a queued job that no idle worker would reach, to run it itself.
 *
 * Lock order: wq->lock is a leaf lock; jobs run without it held.
 */
#include "workq.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>

struct job {
    workq_fn fn;
    void *arg;
    struct job *next;
};

struct workq {
    pthread_mutex_t lock;
    pthread_cond_t cond;     /* signalled on a new job or on shutdown */
    struct job *head, *tail; /* protected by lock */
    size_t pending;          /* protected by lock */
    size_t idle;             /* workers waiting for a job; protected by lock */
    int stopping;            /* protected by lock */
    int nthreads;
    pthread_t threads[];
};

static void *worker_main(void *p)
{
    struct workq *wq = p;
    pthread_mutex_lock(&wq->lock);
    for (;;) {
        while (!wq->head && !wq->stopping) {
            wq->idle++;
            pthread_cond_wait(&wq->cond, &wq->lock);
            assert(wq->idle > 0);
            wq->idle--;
        }
        struct job *j = wq->head;
        if (!j)
            break; /* stopping and drained */
        wq->head = j->next;
        if (!wq->head)
            wq->tail = NULL;
        wq->pending--;
        pthread_mutex_unlock(&wq->lock);
        j->fn(j->arg);
        free(j);
        pthread_mutex_lock(&wq->lock);
    }
    pthread_mutex_unlock(&wq->lock);
    return NULL;
}

int workq_create(int nthreads, struct workq **out)
{
    if (nthreads < 1)
        return -EINVAL;
    struct workq *wq = calloc(1, sizeof *wq + (size_t)nthreads * sizeof(pthread_t));
    if (!wq)
        return -ENOMEM;
    pthread_mutex_init(&wq->lock, NULL);
    pthread_cond_init(&wq->cond, NULL);
    for (int i = 0; i < nthreads; i++) {
        int rc = pthread_create(&wq->threads[i], NULL, worker_main, wq);
        if (rc != 0) {
            wq->nthreads = i;
            workq_destroy(wq);
            return -rc;
        }
    }
    wq->nthreads = nthreads;
    *out = wq;
    return 0;
}

int workq_submit(struct workq *wq, workq_fn fn, void *arg)
{
    struct job *j = malloc(sizeof *j);
    if (!j)
        return -ENOMEM;
    j->fn = fn;
    j->arg = arg;
    j->next = NULL;
    pthread_mutex_lock(&wq->lock);
    if (wq->stopping) {
        pthread_mutex_unlock(&wq->lock);
        free(j);
        return -ESHUTDOWN;
    }
    if (wq->tail)
        wq->tail->next = j;
    else
        wq->head = j;
    wq->tail = j;
    wq->pending++;
    pthread_cond_signal(&wq->cond);
    pthread_mutex_unlock(&wq->lock);
    return 0;
}

int workq_take(struct workq *wq, workq_fn fn, void *arg)
{
    pthread_mutex_lock(&wq->lock);
    struct job *prev = NULL, *j = wq->head;
    size_t ahead = 0;
    while (j && (j->fn != fn || j->arg != arg)) {
        prev = j;
        j = j->next;
        ahead++;
    }
    if (j && ahead < wq->idle)
        j = NULL; /* a free worker gets to it first */
    if (j) {
        if (prev)
            prev->next = j->next;
        else
            wq->head = j->next;
        if (wq->tail == j)
            wq->tail = prev;
        assert(wq->pending > 0);
        wq->pending--;
    }
    pthread_mutex_unlock(&wq->lock);
    int taken = j != NULL;
    free(j);
    return taken;
}

size_t workq_pending(struct workq *wq)
{
    pthread_mutex_lock(&wq->lock);
    size_t n = wq->pending;
    pthread_mutex_unlock(&wq->lock);
    return n;
}

void workq_destroy(struct workq *wq)
{
    if (!wq)
        return;
    pthread_mutex_lock(&wq->lock);
    wq->stopping = 1;
    pthread_cond_broadcast(&wq->cond);
    pthread_mutex_unlock(&wq->lock);
    for (int i = 0; i < wq->nthreads; i++)
        pthread_join(wq->threads[i], NULL);
    pthread_cond_destroy(&wq->cond);
    pthread_mutex_destroy(&wq->lock);
    free(wq);
}
