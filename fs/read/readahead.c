/*
 * fs/read/readahead.c - sequential detection and window growth (see readahead.h).
 */
#include "readahead.h"

/* Reads this close to the expected offset still count as sequential. */
#define READAHEAD_TOLERANCE (4u << 20)

void readahead_init(struct readahead *ra, uint64_t min_window, uint64_t max_window)
{
    ra->next = 0;
    ra->ahead_end = 0;
    ra->window = 0;
    ra->min_window = min_window;
    ra->max_window = max_window < min_window ? min_window : max_window;
}

void readahead_set_max(struct readahead *ra, uint64_t max_window)
{
    ra->max_window = max_window < ra->min_window ? ra->min_window : max_window;
    if (ra->window > ra->max_window)
        ra->window = ra->max_window;
}

static int is_sequential(const struct readahead *ra, uint64_t off)
{
    uint64_t lo = ra->next > READAHEAD_TOLERANCE ? ra->next - READAHEAD_TOLERANCE : 0;
    return off >= lo && off <= ra->next + READAHEAD_TOLERANCE;
}

void readahead_advise(struct readahead *ra, uint64_t off, uint64_t len, uint64_t file_size,
                      uint64_t *start, uint64_t *ahead_len)
{
    *start = 0;
    *ahead_len = 0;
    uint64_t end = off + len;
    if (!is_sequential(ra, off)) {
        /* A jump: forget the stream; the next read decides again. */
        ra->window = 0;
        ra->ahead_end = 0;
        ra->next = end;
        return;
    }
    if (end > ra->next)
        ra->next = end;
    if (ra->window == 0)
        ra->window = ra->min_window;
    if (ra->ahead_end < ra->next)
        ra->ahead_end = ra->next;
    /* Refill only when less than half a window is left in flight ahead. */
    if (ra->ahead_end - ra->next > ra->window / 2)
        return;
    uint64_t target = ra->next + ra->window;
    if (target > file_size)
        target = file_size;
    if (target > ra->ahead_end) {
        *start = ra->ahead_end;
        *ahead_len = target - ra->ahead_end;
        ra->ahead_end = target;
    }
    if (ra->window < ra->max_window) {
        ra->window *= 2;
        if (ra->window > ra->max_window)
            ra->window = ra->max_window;
    }
}
