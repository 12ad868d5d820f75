/*
 * fs/read/cohort.c - the table of saved ranks being loaded (see cohort.h).
 */
#include "cohort.h"

#include "strutil.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

struct slot {
    uint64_t dir_hash;
    int rank;    /* -1: free */
    double last; /* when a read last entered one of its chunks */
};

struct cohort {
    pthread_mutex_t lock;
    double linger;
    struct slot slots[COHORT_SLOTS]; /* protected by lock */
};

struct cohort *cohort_create(double linger)
{
    struct cohort *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    pthread_mutex_init(&c->lock, NULL);
    c->linger = linger;
    for (int i = 0; i < COHORT_SLOTS; i++)
        c->slots[i].rank = -1;
    return c;
}

void cohort_destroy(struct cohort *c)
{
    if (!c)
        return;
    pthread_mutex_destroy(&c->lock);
    free(c);
}

static struct slot *find_locked(struct cohort *c, uint64_t h, int rank)
{
    for (int i = 0; i < COHORT_SLOTS; i++)
        if (c->slots[i].rank == rank && c->slots[i].dir_hash == h)
            return &c->slots[i];
    return NULL;
}

void cohort_touch(struct cohort *c, const char *dir, size_t dir_len, int rank, double now)
{
    if (rank < 0)
        return;
    uint64_t h = str_hash(dir, dir_len);
    pthread_mutex_lock(&c->lock);
    struct slot *s = find_locked(c, h, rank);
    if (!s) { /* a free slot, else the one touched longest ago */
        s = &c->slots[0];
        for (int i = 0; i < COHORT_SLOTS; i++) {
            struct slot *x = &c->slots[i];
            if (x->rank < 0) {
                s = x;
                break;
            }
            if (x->last < s->last)
                s = x;
        }
    }
    s->dir_hash = h;
    s->rank = rank;
    s->last = now;
    pthread_mutex_unlock(&c->lock);
}

int cohort_active(struct cohort *c, const char *dir, size_t dir_len, int rank, double now)
{
    if (rank < 0)
        return 0;
    uint64_t h = str_hash(dir, dir_len);
    pthread_mutex_lock(&c->lock);
    const struct slot *s = find_locked(c, h, rank);
    int active = s && now - s->last < c->linger;
    pthread_mutex_unlock(&c->lock);
    return active;
}
