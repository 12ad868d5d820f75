/*
 * fs/read/ckpt_io_store.h - the index library's file-access interface over a store.
 */
#ifndef CKPTFS_CKPT_IO_STORE_H
#define CKPTFS_CKPT_IO_STORE_H

#include "load.h"
#include "store.h"

/* Fill io so that it reads through s (io->known: none). The fingerprint of a file is
 * "etag=ETAG size=SIZE", the form the index keeps to detect changes. */
void ckpt_io_from_store(struct ckpt_io *io, struct store *s);

/* One file read at one version: reads of path fail with -ESTALE once the
 * object there no longer has etag (so what is read is the version whose
 * fingerprint was taken, never a newer one under the old fingerprint). */
struct ckpt_io_pin {
    struct store *store;
    const char *path; /* store path */
    const char *etag; /* "" pins nothing (a backend without etags) */
    uint64_t size;    /* pin->path's size in that version */
    /* Optional: the io's known (load.h): what the mount knows of a file
     * without a request (its metadata cache), with known_arg. */
    int (*known)(void *known_arg, const char *path, uint64_t *size);
    void *known_arg;
};

/* Fill io so that it reads through pin->store, with reads of pin->path
 * pinned to pin->etag and its stat answered from the pin (no request; a
 * read of another version fails -ESTALE), and io->known from pin->known.
 * pin (and its strings) must outlive io. */
void ckpt_io_from_store_pinned(struct ckpt_io *io, const struct ckpt_io_pin *pin);

/* A checkpoint directory as this mount just published it: the .metadata's
 * bytes and every file it names with the size the commit check found on the
 * store. An index built through it asks the store nothing about them. */
struct ckpt_io_snapshot {
    struct store *store; /* asked for anything the snapshot does not hold */
    const char *dir;     /* store path of the checkpoint directory */
    const char *mpath;   /* dir/.metadata */
    const void *bytes;   /* its content */
    size_t len;
    const struct store_file_size *files;
    size_t nfiles;
};

/* Fill io so that stats and reads of snap->mpath, stats of the known files
 * and the listing of snap->dir come from the snapshot (the listing holds
 * .metadata and the known files directly in dir); everything else goes
 * through snap->store. snap (and what it points to) must outlive io. */
void ckpt_io_from_snapshot(struct ckpt_io *io, const struct ckpt_io_snapshot *snap);

#endif
