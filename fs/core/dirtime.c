/*
 * fs/core/dirtime.c - the times at which this mount changed directories (see
 * dirtime.h): a small chained hash from store path to a wall-clock second.
 */
#include "dirtime.h"

#include "strutil.h"

#include <assert.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define DIRTIME_BUCKETS 1024

struct dt_entry {
    struct dt_entry *next;
    int64_t when;
    char dir[];
};

struct dirtime {
    pthread_mutex_t lock;
    struct dt_entry *buckets[DIRTIME_BUCKETS]; /* protected by lock */
    size_t count;                              /* entries in buckets */
};

struct dirtime *dirtime_create(void)
{
    struct dirtime *t = calloc(1, sizeof *t);
    if (t)
        pthread_mutex_init(&t->lock, NULL);
    return t;
}

void dirtime_destroy(struct dirtime *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < DIRTIME_BUCKETS; i++)
        while (t->buckets[i]) {
            struct dt_entry *e = t->buckets[i];
            t->buckets[i] = e->next;
            free(e);
        }
    pthread_mutex_destroy(&t->lock);
    free(t);
}

static struct dt_entry **find_locked(struct dirtime *t, const char *dir)
{
    struct dt_entry **pp = &t->buckets[str_hash(dir, strlen(dir)) % DIRTIME_BUCKETS];
    while (*pp && strcmp((*pp)->dir, dir) != 0)
        pp = &(*pp)->next;
    return pp;
}

/* Unlink and free the entry with the oldest change (lock held, count > 0). */
static void drop_oldest_locked(struct dirtime *t)
{
    assert(t->count > 0);
    struct dt_entry **oldest = NULL;
    for (size_t i = 0; i < DIRTIME_BUCKETS; i++)
        for (struct dt_entry **pp = &t->buckets[i]; *pp; pp = &(*pp)->next)
            if (!oldest || (*pp)->when < (*oldest)->when)
                oldest = pp;
    struct dt_entry *e = *oldest;
    *oldest = e->next;
    free(e);
    t->count--;
}

void dirtime_touch(struct dirtime *t, const char *dir, int64_t when)
{
    if (!t)
        return;
    pthread_mutex_lock(&t->lock);
    struct dt_entry **pp = find_locked(t, dir);
    if (*pp) {
        if ((*pp)->when < when)
            (*pp)->when = when;
    } else {
        if (t->count >= DIRTIME_MAX)
            drop_oldest_locked(t);
        size_t n = strlen(dir) + 1;
        struct dt_entry *e = malloc(sizeof *e + n);
        if (e) {
            memcpy(e->dir, dir, n);
            e->when = when;
            pp = find_locked(t, dir); /* the drop may have changed the chain */
            e->next = *pp;
            *pp = e;
            t->count++;
        }
    }
    assert(t->count <= DIRTIME_MAX);
    pthread_mutex_unlock(&t->lock);
}

void dirtime_forget_below(struct dirtime *t, const char *dir)
{
    if (!t)
        return;
    size_t n = strlen(dir);
    pthread_mutex_lock(&t->lock);
    for (size_t i = 0; i < DIRTIME_BUCKETS; i++) {
        struct dt_entry **pp = &t->buckets[i];
        while (*pp) {
            struct dt_entry *e = *pp;
            int below =
                n == 0 || (strncmp(e->dir, dir, n) == 0 && (e->dir[n] == '\0' || e->dir[n] == '/'));
            if (below) {
                *pp = e->next;
                free(e);
                t->count--;
            } else {
                pp = &e->next;
            }
        }
    }
    pthread_mutex_unlock(&t->lock);
}

int64_t dirtime_get(struct dirtime *t, const char *dir)
{
    if (!t)
        return 0;
    pthread_mutex_lock(&t->lock);
    struct dt_entry **pp = find_locked(t, dir);
    int64_t when = *pp ? (*pp)->when : 0;
    pthread_mutex_unlock(&t->lock);
    return when;
}

size_t dirtime_count(struct dirtime *t)
{
    pthread_mutex_lock(&t->lock);
    size_t n = t->count;
    pthread_mutex_unlock(&t->lock);
    return n;
}
