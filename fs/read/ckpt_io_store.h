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

/* The files a checkpoint directory's index is built from (its .metadata,
 * its __R.metadata, or its Hugging Face index json and *.safetensors), each
 * read at one version. */
struct ckpt_io_pinned_file {
    const char *name; /* relative to the directory, no '/' */
    const char *etag; /* "" pins nothing */
    uint64_t size;
};

struct ckpt_io_pinset {
    struct store *store;
    const char *dir; /* store path of the checkpoint directory */
    const struct ckpt_io_pinned_file *files;
    size_t nfiles;
    /* Optional: what the mount knows of a file without a request (its
     * metadata cache): load.h's known, with known_arg. */
    int (*known)(void *known_arg, const char *path, uint64_t *size);
    void *known_arg;
    /* Private (zero them; ckpt_io_pinset_done frees): the first bytes of the
     * last pinned file read from its start, so a safetensors header (8-byte
     * length, then the JSON) costs one GET. */
    char *head_path;
    void *head;
    size_t head_len;
};

/* Fill io so that the listing of set->dir is set->files (no request: what
 * ckpt_load's detection and per-rank merge list), their stats come from the
 * set, their reads are pinned to their etags (-ESTALE once one changed) and
 * a read from the start of one fetches its first 64 KiB at most once; other
 * files are stat'ed by set->known, else the store, and read unpinned. set
 * must outlive io; call ckpt_io_pinset_done(set) after. */
void ckpt_io_from_pinset(struct ckpt_io *io, struct ckpt_io_pinset *set);

/* Free what reads through the set kept. */
void ckpt_io_pinset_done(struct ckpt_io_pinset *set);

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
