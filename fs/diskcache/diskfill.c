/*
 * fs/diskcache/diskfill.c - the background writer of fetched chunks into the
 * disk cache (see diskfill.h): a FIFO of copies under one mutex, one thread
 * draining it with diskcache_put.
 */
#include "diskfill.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct fill_item {
    struct fill_item *next;
    char *path, *etag;
    uint64_t size, off;
    size_t len;
    char data[];
};

struct diskfill {
    struct diskcache *dc;
    uint64_t max_bytes;
    pthread_mutex_t lock;
    pthread_cond_t more;
    struct fill_item *head, *tail; /* protected by lock */
    uint64_t queued_bytes;         /* bytes of the items queued (lock) */
    uint64_t dropped;              /* chunks refused: queue full (lock) */
    int stopping;                  /* lock */
    pthread_t thread;
};

static void item_free(struct fill_item *it)
{
    free(it->path);
    free(it->etag);
    free(it);
}

static void *fill_thread(void *arg)
{
    struct diskfill *f = arg;
    pthread_mutex_lock(&f->lock);
    for (;;) {
        while (!f->head && !f->stopping)
            pthread_cond_wait(&f->more, &f->lock);
        struct fill_item *it = f->head;
        if (!it)
            break; /* stopping, and everything queued is written */
        f->head = it->next;
        if (!f->head)
            f->tail = NULL;
        pthread_mutex_unlock(&f->lock);
        struct diskcache_version v = {.path = it->path, .etag = it->etag, .size = it->size};
        (void)diskcache_put(f->dc, &v, it->off, it->data, it->len); /* failures: counted there */
        pthread_mutex_lock(&f->lock);
        assert(f->queued_bytes >= it->len);
        f->queued_bytes -= it->len;
        item_free(it);
    }
    pthread_mutex_unlock(&f->lock);
    return NULL;
}

int diskfill_create(struct diskcache *dc, uint64_t max_bytes, struct diskfill **out)
{
    struct diskfill *f = calloc(1, sizeof *f);
    if (!f)
        return -ENOMEM;
    f->dc = dc;
    f->max_bytes = max_bytes;
    pthread_mutex_init(&f->lock, NULL);
    pthread_cond_init(&f->more, NULL);
    int rc = pthread_create(&f->thread, NULL, fill_thread, f);
    if (rc != 0) {
        pthread_cond_destroy(&f->more);
        pthread_mutex_destroy(&f->lock);
        free(f);
        return -rc;
    }
    *out = f;
    return 0;
}

int diskfill_put(struct diskfill *f, const struct diskcache_version *v, uint64_t off,
                 const void *buf, size_t len)
{
    pthread_mutex_lock(&f->lock);
    int full = f->queued_bytes + len > f->max_bytes;
    if (full)
        f->dropped++;
    else
        f->queued_bytes += len; /* reserved before the copy, so the bound holds */
    pthread_mutex_unlock(&f->lock);
    if (full)
        return -ENOBUFS;
    struct fill_item *it = malloc(sizeof *it + len);
    if (it) {
        it->path = strdup(v->path);
        it->etag = strdup(v->etag);
    }
    if (!it || !it->path || !it->etag) {
        if (it)
            item_free(it);
        pthread_mutex_lock(&f->lock);
        f->queued_bytes -= len;
        pthread_mutex_unlock(&f->lock);
        return -ENOMEM;
    }
    it->next = NULL;
    it->size = v->size;
    it->off = off;
    it->len = len;
    memcpy(it->data, buf, len);
    pthread_mutex_lock(&f->lock);
    if (f->tail)
        f->tail->next = it;
    else
        f->head = it;
    f->tail = it;
    pthread_cond_signal(&f->more);
    pthread_mutex_unlock(&f->lock);
    return 0;
}

uint64_t diskfill_dropped(struct diskfill *f)
{
    pthread_mutex_lock(&f->lock);
    uint64_t n = f->dropped;
    pthread_mutex_unlock(&f->lock);
    return n;
}

void diskfill_destroy(struct diskfill *f)
{
    if (!f)
        return;
    pthread_mutex_lock(&f->lock);
    f->stopping = 1;
    pthread_cond_signal(&f->more);
    pthread_mutex_unlock(&f->lock);
    pthread_join(f->thread, NULL);
    assert(!f->head && f->queued_bytes == 0);
    pthread_cond_destroy(&f->more);
    pthread_mutex_destroy(&f->lock);
    free(f);
}
