/*
 * fs/core/dirtime.h - the times at which this mount changed directories.
 *
 * A directory's mtime moves when an entry is created, removed or renamed in
 * it (POSIX). The store shows creations (a new object is the newest below
 * its directory, see docs/design.md "Directory times"), but a removal or a
 * rename away leaves nothing behind to show it. The mount that made such a
 * change remembers when, here, and shows a directory's time as the later of
 * the store's and its own. The table is bounded (DIRTIME_MAX entries): when
 * full, the oldest change is forgotten, and that directory shows the store's
 * time again. One lock inside, a leaf.
 */
#ifndef CKPTFS_DIRTIME_H
#define CKPTFS_DIRTIME_H

#include <stddef.h>
#include <stdint.h>

#define DIRTIME_MAX 4096

struct dirtime;

/* A new, empty table; NULL when out of memory. */
struct dirtime *dirtime_create(void);
/* Free t (NULL is fine). */
void dirtime_destroy(struct dirtime *t);

/* Directory dir (a store path, "" for the root) changed at when (nanoseconds
 * since the epoch); an earlier time than the one kept is ignored. */
void dirtime_touch(struct dirtime *t, const char *dir, int64_t when);

/* Forget dir and every directory below it (removed, or renamed away). */
void dirtime_forget_below(struct dirtime *t, const char *dir);

/* The latest change of dir this mount made, or 0 if none is kept. */
int64_t dirtime_get(struct dirtime *t, const char *dir);

/* How many directories the table holds (for tests). */
size_t dirtime_count(struct dirtime *t);

#endif
