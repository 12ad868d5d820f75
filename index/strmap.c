/*
 * index/strmap.c - open-addressing string map (see strmap.h).
 *
 * Linear probing, load factor at most 1/2, FNV-1a hashes mixed with a
 * final avalanche so short, similar keys ("__0_1.distcp") spread well.
 */
#include "strmap.h"

#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

uint64_t strmap_hash(const void *key, size_t len)
{
    const unsigned char *p = key;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h ? h : 1;
}

static int strmap_grow(struct strmap *m, size_t want)
{
    size_t cap = m->cap ? m->cap : 16;
    while (cap / 2 < want) {
        if (cap > SIZE_MAX / 4 / sizeof(struct strmap_slot))
            return -ENOMEM;
        cap *= 2;
    }
    assert((cap & (cap - 1)) == 0 && want <= cap / 2);
    if (cap == m->cap)
        return 0;
    struct strmap_slot *s = calloc(cap, sizeof(*s));
    if (!s)
        return -ENOMEM;
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->slots[i].hash)
            continue;
        size_t j = m->slots[i].hash & (cap - 1);
        while (s[j].hash)
            j = (j + 1) & (cap - 1);
        s[j] = m->slots[i];
    }
    free(m->slots);
    m->slots = s;
    m->cap = cap;
    return 0;
}

int strmap_init(struct strmap *m, size_t n)
{
    m->slots = NULL;
    m->cap = 0;
    m->n = 0;
    return n ? strmap_grow(m, n) : 0;
}

int strmap_reset(struct strmap *m, size_t n)
{
    if (m->cap > 64 && m->cap / 8 > n)
        strmap_free(m); /* clearing stays linear in n however large m was */
    else if (m->cap)
        memset(m->slots, 0, m->cap * sizeof(*m->slots));
    m->n = 0;
    return n ? strmap_grow(m, n) : 0;
}

int strmap_get(const struct strmap *m, const void *key, size_t len, uint32_t *val)
{
    if (!m->cap)
        return -1;
    /* load factor at most 1/2: some slot is empty, so every probe sequence ends */
    assert(m->n <= m->cap / 2);
    uint64_t h = strmap_hash(key, len);
    for (size_t j = h & (m->cap - 1);; j = (j + 1) & (m->cap - 1)) {
        const struct strmap_slot *s = &m->slots[j];
        if (!s->hash)
            return -1;
        if (s->hash == h && s->len == len && memcmp(s->key, key, len) == 0) {
            *val = s->val;
            return 0;
        }
    }
}

int strmap_put(struct strmap *m, const void *key, size_t len, uint32_t val, uint32_t *old)
{
    if (m->n + 1 > m->cap / 2) {
        int rc = strmap_grow(m, m->n + 1);
        if (rc)
            return rc;
    }
    assert(m->cap && m->n + 1 <= m->cap / 2);
    uint64_t h = strmap_hash(key, len);
    for (size_t j = h & (m->cap - 1);; j = (j + 1) & (m->cap - 1)) {
        struct strmap_slot *s = &m->slots[j];
        if (!s->hash) {
            s->hash = h;
            s->key = key;
            s->len = len;
            s->val = val;
            m->n++;
            return 0;
        }
        if (s->hash == h && s->len == len && memcmp(s->key, key, len) == 0) {
            if (old)
                *old = s->val;
            return 1;
        }
    }
}

void strmap_free(struct strmap *m)
{
    free(m->slots);
    m->slots = NULL;
    m->cap = 0;
    m->n = 0;
}
