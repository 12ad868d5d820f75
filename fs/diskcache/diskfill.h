/*
 * fs/diskcache/diskfill.h - keeping fetched bytes in the disk cache in the
 * background (issue #22): a reader lends the pieces of a whole chunk it
 * fetched (the read cache's blocks, pinned) and goes on; one thread writes
 * them with diskcache_put_pieces and gives them back. The bytes lent at once
 * are bounded (max_bytes): past it a chunk is not kept (counted), the reader
 * never waits and nothing is copied.
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

/* Called by the writer once it is done with lent pieces (written or not). */
typedef void diskfill_release_fn(void *arg);

/* Queue one chunk of v at off: the bytes of pieces[0 .. npieces) end to end,
 * which must stay valid until release(arg) (the array itself is copied).
 * Never waits for the disk: 0 (release will be called, on the writer's
 * thread), or -ENOBUFS (max_bytes are lent already; nothing kept) or -ENOMEM
 * (release is not called). */
int diskfill_lend(struct diskfill *f, const struct diskcache_version *v, uint64_t off,
                  const struct iovec *pieces, int npieces, diskfill_release_fn *release, void *arg);

/* Chunks not kept because the queue was full. */
uint64_t diskfill_dropped(struct diskfill *f);

/* Write what is queued (releasing it), stop the thread, free f. */
void diskfill_destroy(struct diskfill *f);

#endif
