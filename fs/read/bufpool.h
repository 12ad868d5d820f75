/*
 * fs/read/bufpool.h - large I/O buffers that stay mapped and faulted in.
 *
 * The block cache fills one buffer per GET (up to the request size, 8 MiB
 * by default) and frees it when its blocks go. Through malloc, such buffers
 * come and go as whole mappings or arena heaps, and every first write to a
 * fresh page is a page fault: measured on a 2-core VM, one fault per five
 * pages read, a fifth of the daemon's CPU. A pool hands out page-aligned
 * buffers in whole units (the cache block size), maps new ones
 * pre-faulted, and keeps freed ones for reuse up to a bound of spare bytes.
 * Fetch sizes vary (items, readahead windows), so a request may be cut
 * from a larger spare, and a full pool unmaps small spares to keep a
 * larger buffer.
 * No transparent huge pages: with THP in "madvise" mode (Debian's default)
 * a MADV_HUGEPAGE buffer is faulted in with direct compaction, measured at
 * 0.13-1.2 s per GiB against 0.33-0.38 s for small pages, and 8 MiB fetch
 * buffers cost the daemon 0.4-0.6 CPU-s more per GB loaded.
 *
 * Thread-safe. Buffers larger than max_units units are mapped and unmapped
 * each time (never pooled).
 */
#ifndef CKPTFS_BUFPOOL_H
#define CKPTFS_BUFPOOL_H

#include <stddef.h>
#include <stdint.h>

struct bufpool;

struct bufpool_stats {
    uint64_t maps;        /* buffers mapped fresh */
    uint64_t reuses;      /* buffers handed out again from the pool */
    uint64_t splits;      /* ... cut from a larger spare (the rest stays spare) */
    uint64_t unmaps;      /* buffers given back to the kernel */
    uint64_t spare_bytes; /* bytes held for reuse now */
};

/* unit: buffer sizes are whole units (a multiple of the page size);
 * max_units: largest pooled buffer; spare_max: bytes kept for reuse. */
int bufpool_create(size_t unit, unsigned max_units, size_t spare_max, struct bufpool **out);
/* All buffers must have been put back. */
void bufpool_destroy(struct bufpool *p);

/* A buffer of at least len bytes (len > 0), or NULL if out of memory. */
void *bufpool_get(struct bufpool *p, size_t len);
/* Give back a buffer from bufpool_get with the same len. May unmap it (the
 * pool is full, or it is larger than max_units): callers should not hold a
 * lock others wait on (the cache puts its buffers back after unlocking). */
void bufpool_put(struct bufpool *p, void *buf, size_t len);

void bufpool_get_stats(struct bufpool *p, struct bufpool_stats *out);

#endif
