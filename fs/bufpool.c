/*
 * fs/bufpool.c - pool of large, pre-faulted I/O buffers (see bufpool.h).
 *
 * One free list per size in units (1 .. max_units); a spare buffer's first
 * bytes hold the list link. Mapping, pre-faulting and unmapping happen
 * outside the lock.
 */
#include "bufpool.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

struct spare {
    struct spare *next;
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

void *bufpool_get(struct bufpool *p, size_t len)
{
    size_t units = units_for(p, len ? len : 1);
    if (units <= p->max_units) {
        pthread_mutex_lock(&p->lock);
        struct spare *s = p->free_lists[units - 1];
        if (s) {
            p->free_lists[units - 1] = s->next;
            p->st.spare_bytes -= units * p->unit;
            p->st.reuses++;
            pthread_mutex_unlock(&p->lock);
            return s;
        }
        pthread_mutex_unlock(&p->lock);
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

void bufpool_put(struct bufpool *p, void *buf, size_t len)
{
    if (!buf)
        return;
    size_t units = units_for(p, len ? len : 1);
    pthread_mutex_lock(&p->lock);
    if (units <= p->max_units && p->st.spare_bytes + units * p->unit <= p->spare_max) {
        struct spare *s = buf;
        s->next = p->free_lists[units - 1];
        p->free_lists[units - 1] = s;
        p->st.spare_bytes += units * p->unit;
        pthread_mutex_unlock(&p->lock);
        return;
    }
    p->st.unmaps++;
    pthread_mutex_unlock(&p->lock);
    munmap(buf, units * p->unit);
}

void bufpool_get_stats(struct bufpool *p, struct bufpool_stats *out)
{
    pthread_mutex_lock(&p->lock);
    *out = p->st;
    pthread_mutex_unlock(&p->lock);
}
