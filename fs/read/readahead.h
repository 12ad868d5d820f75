/*
 * fs/read/readahead.h - sequential-access detection and the readahead window.
 *
 * Pure logic, one state per open file: given each read (offset, length) it
 * says which byte range to fetch ahead, if any. The design follows the
 * well-known S3 prefetcher shape: a read that continues where the previous
 * one ended (within a tolerance, because a multithreaded FUSE loop and the
 * kernel's own readahead deliver reads slightly out of order) grows the
 * window, doubling from min_window up to max_window; a jump resets it to
 * zero, so random access costs no more than the bytes it asks for. Ahead
 * requests are issued only when less than half a window remains in flight
 * ahead of the reader, which keeps requests large (a whole half-window at a
 * time) instead of one small request per read.
 */
#ifndef CKPTFS_READAHEAD_H
#define CKPTFS_READAHEAD_H

#include <stdint.h>
#include <stddef.h>

struct readahead {
    uint64_t next;      /* offset just past the furthest sequential read */
    uint64_t ahead_end; /* end of the range already requested ahead */
    uint64_t window;    /* current window in bytes; 0 = not sequential */
    uint64_t min_window, max_window;
};

void readahead_init(struct readahead *ra, uint64_t min_window, uint64_t max_window);

/* Make max_window (at least min_window) the largest window from now on;
 * a larger current window shrinks to it. */
void readahead_set_max(struct readahead *ra, uint64_t max_window);

/* Account for a read of [off, off+len) of a file of file_size bytes and set
 * [*start, *start + *len) to the range to fetch ahead (*len = 0: none). */
void readahead_advise(struct readahead *ra, uint64_t off, uint64_t len, uint64_t file_size,
                      uint64_t *start, uint64_t *ahead_len);

#endif
