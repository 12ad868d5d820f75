/*
 * fs/diskcache/diskfill.h - keeping fetched bytes in the disk cache in the
 * background (issue #22): a reader hands over a copy of the whole chunks it
 * fetched and goes on; one thread writes them with diskcache_put. The copies
 * queued at once are bounded (max_bytes): past it a chunk is not kept
 * (counted), the reader never waits.
 */
#ifndef CKPTFS_DISKFILL_H
#define CKPTFS_DISKFILL_H

#include "diskcache.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

struct diskfill;

/* Start the writer thread for dc (which must outlive it): 0 or -errno. */
int diskfill_create(struct diskcache *dc, uint64_t max_bytes, struct diskfill **out);

/* Queue a copy of buf = [off, off + len) of v, one whole chunk as
 * diskcache_put takes it. Never waits for the disk: 0, or -ENOBUFS (the queue
 * holds max_bytes already; nothing kept) or -ENOMEM. */
int diskfill_put(struct diskfill *f, const struct diskcache_version *v, uint64_t off,
                 const void *buf, size_t len);

/* diskfill_put of the chunk made of pieces[0 .. npieces) end to end (copied
 * before it returns): 0, -ENOBUFS or -ENOMEM. */
int diskfill_put_pieces(struct diskfill *f, const struct diskcache_version *v, uint64_t off,
                        const struct iovec *pieces, int npieces);

/* Chunks not kept because the queue was full. */
uint64_t diskfill_dropped(struct diskfill *f);

/* Write what is queued, stop the thread, free f. */
void diskfill_destroy(struct diskfill *f);

#endif
