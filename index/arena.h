/*
 * index/arena.h - bump allocator for parse results.
 *
 * The pickle reader and the checkpoint model allocate many small objects that
 * all die together (a parsed .metadata and what was extracted from it). An
 * arena hands them out from large blocks and frees everything in one pass, so
 * freeing a value graph is never recursive and cannot be bombed by sharing or
 * cycles. A byte limit bounds what one parse may allocate.
 *
 * Not thread-safe; one arena belongs to one document.
 */
#ifndef CKPTFS_ARENA_H
#define CKPTFS_ARENA_H

#include <stddef.h>

struct arena_block;

struct arena {
    struct arena_block *head; /* newest block first */
    size_t used;              /* bytes handed out plus block overhead */
    size_t limit;             /* 0 = no limit; arena_alloc fails beyond it */
    size_t next_block;        /* size of the next regular block */
};

/* An empty arena that may grow to limit bytes (0 = unlimited). */
void arena_init(struct arena *a, size_t limit);

/* n bytes aligned to 16, uninitialised; NULL if the limit would be exceeded
 * or malloc fails. Valid until arena_release. */
void *arena_alloc(struct arena *a, size_t n);

/* Same, zero-filled. */
void *arena_zalloc(struct arena *a, size_t n);

/* Copy of s[0..n) plus a terminating NUL; NULL on failure. */
char *arena_strndup(struct arena *a, const char *s, size_t n);

/* Move every block of from into a (their memory stays valid and is freed
 * with a); from is empty afterwards. The limit of a is not checked. */
void arena_adopt(struct arena *a, struct arena *from);

/* Free every block; the arena is empty (and reusable) afterwards. */
void arena_release(struct arena *a);

#endif
