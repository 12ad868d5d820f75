/*
 * fs/fuse/openmodes.h - how each path's open handles read: in passthrough (the
 * kernel reads a local backing file itself) or through us.
 *
 * The kernel holds one mode per inode while any handle is open: once one
 * handle is in passthrough, every other open of that inode must name the same
 * backing file (else the open fails with EIO), and none may while a handle
 * reads through the page cache of the inode. So the first open of a path
 * decides for all opens that overlap it; the table follows renames and
 * forgets unlinked paths (their open handles keep their entry).
 */
#ifndef CKPTFS_OPENMODES_H
#define CKPTFS_OPENMODES_H

#include <stdint.h>

struct openmode;

/* What an open asks for. */
struct openmode_want {
    /* Identifies the bytes a read-only open that may be in passthrough
     * reads; NULL for any other open (it never joins a passthrough set). */
    const void *version;
    uint64_t size; /* the version's size */
    /* For a version's first open of a set of overlapping opens: a backing id
     * for passthrough (> 0), or 0 (the set reads through us). Called without
     * the table's lock, once per set. */
    int (*decide)(void *arg);
    void *arg;
    /* Closes a backing id: a refused open may end a set (the others closed
     * while it waited). */
    void (*close_backing)(int id);
};

/* Register an open of path: 0 and *out with *backing_id the id to open in
 * passthrough with (> 0) or 0; -ETXTBSY if the path is open in passthrough
 * and this open cannot join it (a writer, another version: the kernel would
 * fail it with EIO); -ENOMEM. Waits while another open of path decides. A
 * set renamed here takes a read-only open of its new path of the same size
 * (the same bytes under their new name). */
int openmodes_open(const char *path, const struct openmode_want *w, struct openmode **out,
                   int *backing_id);

/* The handle registered by openmodes_open closed: the last one of a
 * passthrough set gives its backing id to close_backing. */
void openmodes_close(struct openmode *m, void (*close_backing)(int id));

/* Paths from and below it are now called to and below it (a rename). */
void openmodes_rename(const char *from, const char *to);

/* path no longer names the inode its open handles have (unlink, or replaced
 * by a rename): later opens of path start afresh. */
void openmodes_forget(const char *path);

/* Free every entry, also those of handles never closed (after the FUSE
 * loop ended: an unmount with files still open). */
void openmodes_clear(void);

#endif
