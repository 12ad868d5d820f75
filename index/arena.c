/*
 * index/arena.c - bump allocator (see arena.h).
 *
 * Blocks start at 16 KiB and double up to 1 MiB; a request larger than a
 * quarter of the regular block size gets a block of its own so big strings do
 * not waste the tail of a shared block.
 */
#include "arena.h"

#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ARENA_ALIGN 16
#define ARENA_FIRST_BLOCK (16u * 1024u)
#define ARENA_MAX_BLOCK (1024u * 1024u)

struct arena_block {
    struct arena_block *next;
    size_t size; /* usable bytes in data[] */
    size_t used;
    _Alignas(16) unsigned char data[];
};

_Static_assert(offsetof(struct arena_block, data) % ARENA_ALIGN == 0,
               "a block's data starts aligned");

void arena_init(struct arena *a, size_t limit)
{
    a->head = NULL;
    a->used = 0;
    a->limit = limit;
    a->next_block = ARENA_FIRST_BLOCK;
}

static struct arena_block *arena_new_block(struct arena *a, size_t size)
{
    size_t total = sizeof(struct arena_block) + size;
    if (a->limit && (a->used > a->limit || total > a->limit - a->used))
        return NULL;
    struct arena_block *b = malloc(total);
    if (!b)
        return NULL;
    b->size = size;
    b->used = 0;
    a->used += total;
    assert(!a->limit || a->used <= a->limit);
    return b;
}

void *arena_alloc(struct arena *a, size_t n)
{
    if (n > SIZE_MAX / 2)
        return NULL;
    n = (n + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
    if (n == 0)
        n = ARENA_ALIGN;
    assert(n % ARENA_ALIGN == 0);
    assert(a->next_block >= ARENA_FIRST_BLOCK && a->next_block <= ARENA_MAX_BLOCK);
    struct arena_block *b = a->head;
    /* every block hands out whole aligned units and never more than it holds */
    assert(!b || (b->used <= b->size && b->used % ARENA_ALIGN == 0));
    if (b && b->size - b->used >= n) {
        void *p = b->data + b->used;
        b->used += n;
        assert((uintptr_t)p % ARENA_ALIGN == 0);
        return p;
    }
    if (n > a->next_block / 4) {
        /* dedicated block, linked behind the current one so the current
         * block's free tail stays usable */
        struct arena_block *big = arena_new_block(a, n);
        if (!big)
            return NULL;
        big->used = n;
        if (b) {
            big->next = b->next;
            b->next = big;
        } else {
            big->next = NULL;
            a->head = big;
        }
        return big->data;
    }
    struct arena_block *nb = arena_new_block(a, a->next_block);
    if (!nb)
        return NULL;
    if (a->next_block < ARENA_MAX_BLOCK)
        a->next_block *= 2;
    nb->next = a->head;
    a->head = nb;
    nb->used = n;
    return nb->data;
}

void *arena_zalloc(struct arena *a, size_t n)
{
    void *p = arena_alloc(a, n);
    if (p)
        memset(p, 0, n);
    return p;
}

char *arena_strndup(struct arena *a, const char *s, size_t n)
{
    if (n == SIZE_MAX)
        return NULL;
    char *p = arena_alloc(a, n + 1);
    if (!p)
        return NULL;
    if (n)
        memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

void arena_adopt(struct arena *a, struct arena *from)
{
    if (!from->head)
        return;
    /* behind a's current block, so its free tail stays in use */
    struct arena_block *tail = from->head;
    while (tail->next)
        tail = tail->next;
    if (a->head) {
        tail->next = a->head->next;
        a->head->next = from->head;
    } else {
        a->head = from->head;
    }
    a->used += from->used;
    from->head = NULL;
    from->used = 0;
}

void arena_release(struct arena *a)
{
    struct arena_block *b = a->head;
    while (b) {
        struct arena_block *next = b->next;
        free(b);
        b = next;
    }
    a->head = NULL;
    a->used = 0;
    a->next_block = ARENA_FIRST_BLOCK;
}
