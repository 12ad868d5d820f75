/*
 * fs/core/notices.c - index notices held back: a listing that lists a
 * subdirectory whole on the way (subtree.h) marks it listed, but the index
 * notices it only when a lookup there uses that listing, as it would had
 * the lookup listed it itself. Noticing every checkpoint directory a
 * listing passes would build indexes (GETs of .metadata) nobody asked for.
 */
#include "core_internal.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Notices held at most: past that, subdirectories are not marked listed
 * (a lookup there lists them itself). */
#define NOTICES_MAX 256

struct held_notice {
    struct held_notice *next;
    struct ckindex_scan scan;
    char dir[];
};

/* dir's held notice, taken out of the list (listing_lock held), or NULL. */
static struct held_notice *take_locked(struct core *core, const char *dir)
{
    struct held_notice **pp = &core->notices;
    while (*pp && strcmp((*pp)->dir, dir) != 0)
        pp = &(*pp)->next;
    struct held_notice *h = *pp;
    if (h) {
        *pp = h->next;
        assert(atomic_load(&core->held_notices) > 0);
        atomic_fetch_sub(&core->held_notices, 1);
    }
    return h;
}

static void drop(struct held_notice *h)
{
    if (!h)
        return;
    ckindex_scan_drop(&h->scan);
    free(h);
}

int core_notice_hold(struct core *core, const char *dir, struct ckindex_scan *scan)
{
    if (atomic_load(&core->held_notices) >= NOTICES_MAX)
        return -ENOSPC;
    size_t n = strlen(dir) + 1;
    struct held_notice *h = malloc(sizeof *h + n);
    if (!h)
        return -ENOMEM;
    memcpy(h->dir, dir, n);
    h->scan = *scan;
    *scan = (struct ckindex_scan){0};
    pthread_mutex_lock(&core->listing_lock);
    struct held_notice *older = take_locked(core, dir); /* this listing is newer */
    h->next = core->notices;
    core->notices = h;
    atomic_fetch_add(&core->held_notices, 1);
    pthread_mutex_unlock(&core->listing_lock);
    drop(older);
    return 0;
}

/* dir's held notice, taken out of the list, or NULL. */
static struct held_notice *take(struct core *core, const char *dir)
{
    if (atomic_load(&core->held_notices) == 0)
        return NULL;
    pthread_mutex_lock(&core->listing_lock);
    struct held_notice *h = take_locked(core, dir);
    pthread_mutex_unlock(&core->listing_lock);
    return h;
}

void core_notice_due(struct core *core, const char *dir)
{
    struct held_notice *h = take(core, dir);
    if (!h)
        return;
    ckindex_scan_end(core->index, h->dir, &h->scan, 1);
    free(h);
}

void core_notice_cancel(struct core *core, const char *dir)
{
    drop(take(core, dir));
}

void core_notices_clear(struct core *core)
{
    while (core->notices) {
        struct held_notice *h = core->notices;
        core->notices = h->next;
        atomic_fetch_sub(&core->held_notices, 1);
        drop(h);
    }
    assert(atomic_load(&core->held_notices) == 0);
}
