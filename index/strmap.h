/*
 * index/strmap.h - a small open-addressing hash map from byte strings to
 * uint32_t, internal to the index library.
 *
 * Used to match DCP storage entries to tensor chunks and to intern file
 * names in O(1) per lookup (a 100,000-item metadata must not be quadratic).
 * Keys are not copied: the caller keeps them alive as long as the map.
 */
#ifndef CKPTFS_STRMAP_H
#define CKPTFS_STRMAP_H

#include <stddef.h>
#include <stdint.h>

struct strmap_slot {
    uint64_t hash; /* 0 = empty */
    const void *key;
    size_t len;
    uint32_t val;
};

struct strmap {
    struct strmap_slot *slots;
    size_t cap; /* power of two or 0 */
    size_t n;
};

uint64_t strmap_hash(const void *key, size_t len);

/* Reserve room for about n entries up front (optional). 0 or -ENOMEM. */
int strmap_init(struct strmap *m, size_t n);

/* Empty m, keeping (or growing) its table to hold about n entries. 0 or -ENOMEM. */
int strmap_reset(struct strmap *m, size_t n);

/* 0 and *val if present, else -1. */
int strmap_get(const struct strmap *m, const void *key, size_t len, uint32_t *val);

/* Insert key -> val. Returns 0 if inserted, 1 if the key was already there
 * (nothing changed; *old gets its value if old is non-NULL), or -ENOMEM. */
int strmap_put(struct strmap *m, const void *key, size_t len, uint32_t val, uint32_t *old);

void strmap_free(struct strmap *m);

#endif
