/*
 * fs/ckpt_io_store.h - the index library's file-access interface over a store.
 */
#ifndef CKPTFS_CKPT_IO_STORE_H
#define CKPTFS_CKPT_IO_STORE_H

#include "load.h"
#include "store.h"

/* Fill io so that it reads through s. The fingerprint of a file is
 * "etag=ETAG size=SIZE", the form the index keeps to detect changes. */
void ckpt_io_from_store(struct ckpt_io *io, struct store *s);

/* One file read at one version: reads of path fail with -ESTALE once the
 * object there no longer has etag (so what is read is the version whose
 * fingerprint was taken, never a newer one under the old fingerprint). */
struct ckpt_io_pin {
    struct store *store;
    const char *path; /* store path */
    const char *etag; /* "" pins nothing (a backend without etags) */
};

/* Fill io so that it reads through pin->store, with reads of pin->path
 * pinned to pin->etag. pin (and its strings) must outlive io. */
void ckpt_io_from_store_pinned(struct ckpt_io *io, const struct ckpt_io_pin *pin);

#endif
