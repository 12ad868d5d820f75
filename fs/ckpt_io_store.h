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

#endif
