/*
 * fs/diskcache/diskfill.c - the background writer of fetched chunks into the
 * disk cache (see diskfill.h): each chunk's lent pieces queued on a
 * one-thread workq (fs/util/workq.h) that writes them with
 * diskcache_put_pieces and releases them; the bytes lent at once are counted
 * against max_bytes.
 */
#include "diskfill.h"

#include "workq.h"

#include <assert.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

struct diskfill {
    struct diskcache *dc;
    uint64_t max_bytes;
    struct workq *writer;          /* one thread: chunks are written in order */
    _Atomic uint64_t queued_bytes; /* bytes lent and not released yet, reserved first */
    _Atomic uint64_t dropped;      /* chunks refused: queue full */
};

struct fill_item {
    struct diskfill *f;
    char *path, *etag;
    uint64_t size, off;
    size_t len;
    diskfill_release_fn *release;
    void *release_arg;
    int npieces;
    struct iovec pieces[]; /* lent by the caller until release */
};

static void item_free(struct fill_item *it)
{
    free(it->path);
    free(it->etag);
    free(it);
}

static void unreserve(struct diskfill *f, size_t len)
{
    uint64_t was = atomic_fetch_sub(&f->queued_bytes, len);
    assert(was >= len);
    (void)was;
}

static void write_item(void *arg)
{
    struct fill_item *it = arg;
    struct diskcache_version v = {.path = it->path, .etag = it->etag, .size = it->size};
    /* failures: counted there */
    (void)diskcache_put_pieces(it->f->dc, &v, it->off, it->pieces, it->npieces);
    it->release(it->release_arg);
    unreserve(it->f, it->len);
    item_free(it);
}

int diskfill_create(struct diskcache *dc, uint64_t max_bytes, struct diskfill **out)
{
    struct diskfill *f = calloc(1, sizeof *f);
    if (!f)
        return -ENOMEM;
    f->dc = dc;
    f->max_bytes = max_bytes;
    int rc = workq_create(1, &f->writer);
    if (rc != 0) {
        free(f);
        return rc;
    }
    *out = f;
    return 0;
}

/* Reserve len bytes of the queue's bound: 1, or 0 (full: counted). */
static int reserve(struct diskfill *f, size_t len)
{
    uint64_t q = atomic_load(&f->queued_bytes);
    do {
        if (q + len > f->max_bytes) {
            atomic_fetch_add(&f->dropped, 1);
            return 0;
        }
    } while (!atomic_compare_exchange_weak(&f->queued_bytes, &q, q + len));
    return 1;
}

int diskfill_lend(struct diskfill *f, const struct diskcache_version *v, uint64_t off,
                  const struct iovec *pieces, int npieces, diskfill_release_fn *release, void *arg)
{
    size_t len = 0;
    for (int i = 0; i < npieces; i++)
        len += pieces[i].iov_len;
    if (!reserve(f, len))
        return -ENOBUFS;
    struct fill_item *it = malloc(sizeof *it + (size_t)npieces * sizeof *pieces);
    if (it) {
        it->path = strdup(v->path);
        it->etag = strdup(v->etag);
    }
    if (!it || !it->path || !it->etag) {
        if (it)
            item_free(it);
        unreserve(f, len);
        return -ENOMEM;
    }
    it->f = f;
    it->size = v->size;
    it->off = off;
    it->len = len;
    it->release = release;
    it->release_arg = arg;
    it->npieces = npieces;
    memcpy(it->pieces, pieces, (size_t)npieces * sizeof *pieces);
    int rc = workq_submit(f->writer, write_item, it);
    if (rc != 0) {
        item_free(it);
        unreserve(f, len);
    }
    return rc;
}

uint64_t diskfill_dropped(struct diskfill *f)
{
    return atomic_load(&f->dropped);
}

void diskfill_destroy(struct diskfill *f)
{
    if (!f)
        return;
    workq_destroy(f->writer); /* writes what is queued first */
    assert(atomic_load(&f->queued_bytes) == 0);
    free(f);
}
