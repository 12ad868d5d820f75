/*
 * fs/write/extents.c - sorted, merged byte-range sets (see extents.h).
 *
 * A sorted array: lookups are a binary search, an insert merges the run of
 * ranges it overlaps or touches into one and shifts the tail once. Written
 * files are mostly sequential, so the set stays a handful of ranges; random
 * small writes grow it until their gaps fill.
 */
#include "extents.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

void extents_init(struct extents *e)
{
    e->r = NULL;
    e->n = e->cap = 0;
}

void extents_free(struct extents *e)
{
    free(e->r);
    extents_init(e);
}

/* Index of the first range whose end is >= off (it may touch or hold off). */
static size_t first_reaching(const struct extents *e, uint64_t off)
{
    size_t lo = 0, hi = e->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (e->r[mid].end < off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int extents_add(struct extents *e, uint64_t start, uint64_t end)
{
    if (start >= end)
        return 0;
    size_t i = first_reaching(e, start); /* first range that may merge */
    size_t j = i;                        /* one past the last range that merges */
    while (j < e->n && e->r[j].start <= end)
        j++;
    if (i == j) { /* no overlap: insert a new range at i */
        if (e->n == e->cap) {
            size_t cap = e->cap ? e->cap * 2 : 8;
            struct extent *r = realloc(e->r, cap * sizeof *r);
            if (!r)
                return -ENOMEM;
            e->r = r;
            e->cap = cap;
        }
        memmove(e->r + i + 1, e->r + i, (e->n - i) * sizeof *e->r);
        e->r[i] = (struct extent){start, end};
        e->n++;
        return 0;
    }
    /* ranges i..j-1 merge into one */
    if (e->r[i].start < start)
        start = e->r[i].start;
    if (e->r[j - 1].end > end)
        end = e->r[j - 1].end;
    e->r[i] = (struct extent){start, end};
    memmove(e->r + i + 1, e->r + j, (e->n - j) * sizeof *e->r);
    e->n -= j - i - 1;
    return 0;
}

int extents_covers(const struct extents *e, uint64_t start, uint64_t end)
{
    if (start >= end)
        return 1;
    size_t i = first_reaching(e, start + 1); /* first range with end > start */
    return i < e->n && e->r[i].start <= start && e->r[i].end >= end;
}

void extents_truncate(struct extents *e, uint64_t size)
{
    size_t i = first_reaching(e, size); /* first range with end >= size */
    if (i < e->n && e->r[i].start < size) {
        e->r[i].end = size;
        i++;
    }
    e->n = i;
    assert(e->n == 0 || e->r[e->n - 1].end <= size);
}

uint64_t extents_bytes(const struct extents *e)
{
    uint64_t n = 0;
    for (size_t i = 0; i < e->n; i++)
        n += e->r[i].end - e->r[i].start;
    return n;
}
