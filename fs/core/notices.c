/*
 * fs/core/notices.c - index notices held back: a listing that lists a
 * subdirectory whole on the way (subtree.h) marks it listed, but the index
 * notices it only when a lookup there uses that listing, as it would had
 * the lookup listed it itself. Noticing every checkpoint directory a
 * listing passes would build indexes (GETs of .metadata) nobody asked for.
 */
#include "core_internal.h"

#include "clock.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Notices held at most: past that, subdirectories are not marked listed
 * (a lookup there lists them itself). */
#define NOTICES_MAX 256

struct held_notice {
    struct held_notice *next;
    double stamp; /* mono time of the listing */
    struct ckindex_scan scan;
    char dir[];
};

/* How long a held notice may still be due: as long as the listing's mark
 * of its directory is valid without being kept (a kept mark's directory was
 * noticed already). Older ones are dropped: a lookup there lists it anew. */
static double notice_life(const struct core *core)
{
    return (core->cfg.attr_timeout > LISTING_LINGER ? core->cfg.attr_timeout : LISTING_LINGER) +
           1.0;
}

/* dir's held notice, taken out of the list (listing_lock held), or NULL;
 * notices past their life go to *stale on the way (freed by the caller,
 * without the lock). */
static struct held_notice *take_locked(struct core *core, const char *dir,
                                       struct held_notice **stale)
{
    double oldest = mono_seconds() - notice_life(core);
    struct held_notice *found = NULL;
    for (struct held_notice **pp = &core->notices; *pp;) {
        struct held_notice *h = *pp;
        int mine = !found && strcmp(h->dir, dir) == 0;
        if (!mine && h->stamp >= oldest) {
            pp = &h->next;
            continue;
        }
        *pp = h->next;
        assert(atomic_load(&core->held_notices) > 0);
        atomic_fetch_sub(&core->held_notices, 1);
        if (mine) {
            found = h;
        } else {
            h->next = *stale;
            *stale = h;
        }
    }
    return found;
}

static void drop(struct held_notice *h)
{
    while (h) {
        struct held_notice *next = h->next;
        ckindex_scan_drop(&h->scan);
        free(h);
        h = next;
    }
}

int core_notice_hold(struct core *core, const char *dir, double stamp, struct ckindex_scan *scan)
{
    if (atomic_load(&core->held_notices) >= NOTICES_MAX)
        return -ENOSPC;
    size_t n = strlen(dir) + 1;
    struct held_notice *h = malloc(sizeof *h + n);
    if (!h)
        return -ENOMEM;
    memcpy(h->dir, dir, n);
    h->stamp = stamp;
    h->scan = *scan;
    *scan = (struct ckindex_scan){0};
    struct held_notice *stale = NULL;
    pthread_mutex_lock(&core->listing_lock);
    struct held_notice *older = take_locked(core, dir, &stale); /* this listing is newer */
    h->next = core->notices;
    core->notices = h;
    atomic_fetch_add(&core->held_notices, 1);
    pthread_mutex_unlock(&core->listing_lock);
    if (older)
        older->next = stale;
    drop(older ? older : stale);
    return 0;
}

/* dir's held notice, taken out of the list, or NULL. */
static struct held_notice *take(struct core *core, const char *dir)
{
    if (atomic_load(&core->held_notices) == 0)
        return NULL;
    struct held_notice *stale = NULL;
    pthread_mutex_lock(&core->listing_lock);
    struct held_notice *h = take_locked(core, dir, &stale);
    pthread_mutex_unlock(&core->listing_lock);
    drop(stale);
    if (h)
        h->next = NULL;
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
    drop(core->notices);
    core->notices = NULL;
    atomic_store(&core->held_notices, 0);
}
