/*
 * fs/read/bufpool.c - pool of large, pre-faulted I/O buffers (see bufpool.h).
 *
 * One free list per size in units (1 .. max_units); a spare buffer's first
 * bytes hold the list link. A request takes a spare of its size, else the
 * smallest larger one, split (the rest stays spare: munmap works on any
 * page range of a mapping, so pieces are given back one by one). A full
 * pool makes room for a larger buffer by unmapping its smallest spares.
 * Mapping, pre-faulting and unmapping happen outside the lock.
 */
#include "bufpool.h"

#include <errno.h>
#include <assert.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

struct spare {
    struct spare *next;
    size_t units; /* its size */
};

struct bufpool {
    size_t unit;
    unsigned max_units;
    size_t spare_max;
    pthread_mutex_t lock;
    struct spare **free_lists; /* [units - 1], protected by lock */
    struct bufpool_stats st;   /* protected by lock */
};

int bufpool_create(size_t unit, unsigned max_units, size_t spare_max, struct bufpool **out)
{
    long page = sysconf(_SC_PAGESIZE);
    if (unit == 0 || max_units == 0 || (page > 0 && unit % (size_t)page))
        return -EINVAL;
    struct bufpool *p = calloc(1, sizeof *p);
    if (!p)
        return -ENOMEM;
    p->free_lists = calloc(max_units, sizeof *p->free_lists);
    if (!p->free_lists) {
        free(p);
        return -ENOMEM;
    }
    p->unit = unit;
    p->max_units = max_units;
    p->spare_max = spare_max;
    pthread_mutex_init(&p->lock, NULL);
    *out = p;
    return 0;
}

static size_t units_for(const struct bufpool *p, size_t len)
{
    return (len + p->unit - 1) / p->unit;
}

void bufpool_destroy(struct bufpool *p)
{
    if (!p)
        return;
    for (unsigned u = 1; u <= p->max_units; u++) {
        struct spare *s = p->free_lists[u - 1];
        while (s) {
            struct spare *next = s->next;
            munmap(s, u * p->unit);
            s = next;
        }
    }
    pthread_mutex_destroy(&p->lock);
    free(p->free_lists);
    free(p);
}

/* Take a spare of exactly units units, or split the smallest larger one
 * (lock held). NULL if there is none. */
static void *take_spare_locked(struct bufpool *p, size_t units)
{
    for (size_t u = units; u <= p->max_units; u++) {
        struct spare *s = p->free_lists[u - 1];
        if (!s)
            continue;
        assert(s->units == u);
        p->free_lists[u - 1] = s->next;
        p->st.spare_bytes -= units * p->unit;
        p->st.reuses++;
        if (u > units) {
            struct spare *rest = (struct spare *)((char *)s + units * p->unit);
            rest->units = u - units;
            rest->next = p->free_lists[u - units - 1];
            p->free_lists[u - units - 1] = rest;
            p->st.splits++;
        }
        return s;
    }
    return NULL;
}

void *bufpool_get(struct bufpool *p, size_t len)
{
    size_t units = units_for(p, len ? len : 1);
    if (units <= p->max_units) {
        pthread_mutex_lock(&p->lock);
        void *s = take_spare_locked(p, units);
        pthread_mutex_unlock(&p->lock);
        if (s)
            return s;
    }
    size_t bytes = units * p->unit;
    void *buf = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED)
        return NULL;
#ifdef MADV_POPULATE_WRITE
    madvise(buf, bytes, MADV_POPULATE_WRITE); /* fault it in with one call, not per page */
#endif
    pthread_mutex_lock(&p->lock);
    p->st.maps++;
    pthread_mutex_unlock(&p->lock);
    return buf;
}

/* Unlink spares smaller than units units, smallest first, until need more
 * bytes fit under spare_max, chaining them into *gone (lock held). 1 if
 * need fits then. */
static int displace_smaller_locked(struct bufpool *p, size_t units, size_t need,
                                   struct spare **gone)
{
    for (size_t u = 1; u < units && p->st.spare_bytes + need > p->spare_max; u++) {
        while (p->free_lists[u - 1] && p->st.spare_bytes + need > p->spare_max) {
            struct spare *s = p->free_lists[u - 1];
            assert(s->units == u);
            p->free_lists[u - 1] = s->next;
            p->st.spare_bytes -= u * p->unit;
            p->st.unmaps++;
            s->next = *gone;
            *gone = s;
        }
    }
    return p->st.spare_bytes + need <= p->spare_max;
}

void bufpool_put(struct bufpool *p, void *buf, size_t len)
{
    if (!buf)
        return;
    size_t units = units_for(p, len ? len : 1);
    size_t bytes = units * p->unit;
    struct spare *gone = NULL;
    pthread_mutex_lock(&p->lock);
    int kept = units <= p->max_units && (p->st.spare_bytes + bytes <= p->spare_max ||
                                         displace_smaller_locked(p, units, bytes, &gone));
    if (kept) {
        struct spare *s = buf;
        s->units = units;
        s->next = p->free_lists[units - 1];
        p->free_lists[units - 1] = s;
        p->st.spare_bytes += bytes;
    } else {
        p->st.unmaps++;
    }
    pthread_mutex_unlock(&p->lock);
    if (!kept)
        munmap(buf, bytes);
    while (gone) {
        struct spare *next = gone->next;
        munmap(gone, gone->units * p->unit);
        gone = next;
    }
}

void bufpool_get_stats(struct bufpool *p, struct bufpool_stats *out)
{
    pthread_mutex_lock(&p->lock);
    *out = p->st;
    pthread_mutex_unlock(&p->lock);
}
