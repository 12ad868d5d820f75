/*
 * fs/fuse/openmodes.c - the table of open paths and their read mode (see
 * openmodes.h): a hash table of paths under one lock, and a condition for
 * opens waiting on a decision.
 */
#include "openmodes.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

struct openmode {
    char *path;            /* NULL once forgotten */
    const void *version;   /* of the passthrough set */
    uint64_t size;         /* its size */
    int renamed;           /* renamed since: its version has another identity */
    int backing_id;        /* > 0: in passthrough; 0: not; -1: being decided */
    unsigned refs;         /* handles registered here, and opens deciding or waiting */
    struct openmode *next; /* in the table while path != NULL */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t decided = PTHREAD_COND_INITIALIZER;
#define BUCKETS 1024
static struct openmode *table[BUCKETS];
static struct openmode *forgotten; /* unlisted entries with handles open */

static struct openmode **bucket(const char *path)
{
    uint32_t h = 2166136261u; /* FNV-1a */
    for (const unsigned char *p = (const unsigned char *)path; *p; p++)
        h = (h ^ *p) * 16777619u;
    return &table[h % BUCKETS];
}

static struct openmode *find_locked(const char *path)
{
    for (struct openmode *m = *bucket(path); m; m = m->next)
        if (strcmp(m->path, path) == 0)
            return m;
    return NULL;
}

static void unlist_locked(struct openmode *m)
{
    for (struct openmode **p = bucket(m->path); *p; p = &(*p)->next)
        if (*p == m) {
            *p = m->next;
            break;
        }
    free(m->path);
    m->path = NULL;
}

/* A new entry for path's first open, listed, deciding: NULL if out of memory. */
static struct openmode *add_locked(const char *path)
{
    struct openmode *m = calloc(1, sizeof *m);
    if (!m || !(m->path = strdup(path))) {
        free(m);
        return NULL;
    }
    m->backing_id = -1;
    struct openmode **b = bucket(path);
    m->next = *b;
    *b = m;
    return m;
}

/* The first open of a set decides, without the lock (the decision reads the
 * file); the others wait for it. */
static void decide(struct openmode *m, const struct openmode_want *w)
{
    pthread_mutex_unlock(&lock);
    int id = w->version ? w->decide(w->arg) : 0;
    pthread_mutex_lock(&lock);
    m->backing_id = id > 0 ? id : 0;
    m->version = w->version;
    m->size = w->size;
    pthread_cond_broadcast(&decided);
}

/* Drop a reference to m; the last one frees it. Its backing id (> 0) if
 * that was the last, else 0. */
static int put_locked(struct openmode *m)
{
    assert(m->refs > 0);
    if (--m->refs > 0)
        return 0;
    int id = m->backing_id;
    if (m->path) {
        unlist_locked(m);
    } else {
        for (struct openmode **p = &forgotten; *p; p = &(*p)->next)
            if (*p == m) {
                *p = m->next;
                break;
            }
    }
    free(m);
    return id > 0 ? id : 0;
}

int openmodes_open(const char *path, const struct openmode_want *w, struct openmode **out,
                   int *backing_id)
{
    for (;;) {
        pthread_mutex_lock(&lock);
        struct openmode *m = find_locked(path);
        int first = !m;
        if (first && !(m = add_locked(path))) {
            pthread_mutex_unlock(&lock);
            return -ENOMEM;
        }
        m->refs++; /* also while it waits: a close meanwhile must not free m */
        if (first)
            decide(m, w);
        while (m->backing_id < 0)
            pthread_cond_wait(&decided, &lock);
        int id = m->backing_id;
        int same = w->version && (w->version == m->version || (m->renamed && w->size == m->size));
        if (id > 0 && !same) {
            int ended = put_locked(m);
            pthread_mutex_unlock(&lock);
            if (!ended)
                return -ETXTBSY;
            w->close_backing(ended); /* the set closed while this open waited: decide afresh */
            continue;
        }
        pthread_mutex_unlock(&lock);
        *out = m;
        *backing_id = id;
        return 0;
    }
}

void openmodes_close(struct openmode *m, void (*close_backing)(int id))
{
    pthread_mutex_lock(&lock);
    int id = put_locked(m);
    pthread_mutex_unlock(&lock);
    if (id > 0)
        close_backing(id);
}

/* m's path with its first fl bytes replaced by to: NULL if out of memory. */
static char *renamed_path(const struct openmode *m, size_t fl, const char *to)
{
    size_t tl = strlen(to), rest = strlen(m->path + fl);
    char *p = malloc(tl + rest + 1);
    if (p) {
        memcpy(p, to, tl);
        memcpy(p + tl, m->path + fl, rest + 1);
    }
    return p;
}

void openmodes_rename(const char *from, const char *to)
{
    size_t fl = strlen(from);
    struct openmode *moved = NULL;
    pthread_mutex_lock(&lock);
    for (size_t b = 0; b < BUCKETS; b++) {
        for (struct openmode **p = &table[b]; *p;) {
            struct openmode *m = *p;
            char *np;
            if (strncmp(m->path, from, fl) != 0 || (m->path[fl] != '\0' && m->path[fl] != '/') ||
                !(np = renamed_path(m, fl, to))) {
                p = &m->next; /* not below from (or out of memory: the old name stays) */
                continue;
            }
            *p = m->next;
            free(m->path);
            m->path = np;
            m->renamed = 1;
            m->next = moved;
            moved = m;
        }
    }
    while (moved) { /* into the buckets of their new names */
        struct openmode *m = moved, **b = bucket(m->path);
        moved = m->next;
        m->next = *b;
        *b = m;
    }
    pthread_mutex_unlock(&lock);
}

void openmodes_forget(const char *path)
{
    pthread_mutex_lock(&lock);
    struct openmode *m = find_locked(path);
    if (m) {
        unlist_locked(m);
        m->next = forgotten;
        forgotten = m;
    }
    pthread_mutex_unlock(&lock);
}

void openmodes_clear(void)
{
    pthread_mutex_lock(&lock);
    for (size_t b = 0; b <= BUCKETS; b++) {
        struct openmode **head = b < BUCKETS ? &table[b] : &forgotten;
        while (*head) {
            struct openmode *m = *head;
            *head = m->next;
            free(m->path);
            free(m);
        }
    }
    pthread_mutex_unlock(&lock);
}
