/*
 * fs/write/extents.h - a set of byte ranges: which bytes of a staged file have been
 * written.
 *
 * Ranges are half-open [start, end), kept sorted, disjoint and with no two
 * touching (adding merges). The upload engine asks whether a part's byte
 * range is fully written before it streams the part; reads and uploads
 * never depend on it for content (the staging file holds the bytes, holes
 * read as zeros). Not thread-safe: the owner's lock protects it.
 */
#ifndef CKPTFS_EXTENTS_H
#define CKPTFS_EXTENTS_H

#include <stddef.h>
#include <stdint.h>

struct extent {
    uint64_t start, end; /* [start, end), start < end */
};

struct extents {
    struct extent *r; /* sorted by start; disjoint; not touching */
    size_t n, cap;
};

/* An empty set. */
void extents_init(struct extents *e);

/* Free the ranges; e is empty afterwards and may be reused. */
void extents_free(struct extents *e);

/* Add [start, end), merging with every range it overlaps or touches. An
 * empty range (start >= end) is a no-op. 0, or -ENOMEM (e unchanged). */
int extents_add(struct extents *e, uint64_t start, uint64_t end);

/* 1 if every byte of [start, end) is in the set (an empty range is), else 0. */
int extents_covers(const struct extents *e, uint64_t start, uint64_t end);

/* Drop every byte at or beyond size. */
void extents_truncate(struct extents *e, uint64_t size);

/* Number of bytes in the set. */
uint64_t extents_bytes(const struct extents *e);

#endif
