/*
 * index/load.h - find and load checkpoints through a small file-access
 * interface, so the same code serves a local directory (ckptfs-admin), an
 * S3 prefix (through fs/store/store.h) or a mount.
 *
 * struct ckpt_io mirrors the store interface: paths are relative to the
 * io's root, '/'-separated, no leading slash, "" = the root; functions return
 * 0 or a negative errno (-ENOENT when absent). ckpt_load() recognises:
 *   DCP          <dir>/.metadata (+ its shard files)
 *   Hugging Face <dir>/model.safetensors.index.json + the files it names,
 *                or every <dir>/ *.safetensors (DCP save_sharded layout)
 * and returns the checkpoint model with each file's presence and size
 * filled in from one listing of <dir> (plus a stat per file in a
 * subdirectory), so verify-style checks need no further I/O; or, with
 * CKPT_FILES_KNOWN, from what the io already knows of the files the
 * checkpoint names (no listing, no stat: a mount's index build).
 */
#ifndef CKPTFS_LOAD_H
#define CKPTFS_LOAD_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt.h"
#include "dcp.h"

/* One directory entry; return non-zero to stop the listing. */
typedef int (*ckpt_io_list_fn)(void *arg, const char *name, int is_dir, uint64_t size);

struct ckpt_io {
    void *ctx;
    int (*stat)(void *ctx, const char *path, uint64_t *size, int *is_dir);
    /* Read up to len bytes at off; *nread short only at end of file. */
    int (*read)(void *ctx, const char *path, uint64_t off, void *buf, size_t len, size_t *nread);
    int (*list)(void *ctx, const char *dir, ckpt_io_list_fn fn, void *arg);
    /* Optional (may be NULL): a short version tag of a file (ETag, or size
     * and mtime) for index freshness checks; 0 or -errno. */
    int (*fingerprint)(void *ctx, const char *path, char *buf, size_t len);
    /* Optional (may be NULL): what the io knows of the file at path without
     * any I/O: 0 and *size (a file), -ENOENT (known absent), or 1 (unknown). */
    int (*known)(void *ctx, const char *path, uint64_t *size);
};

/* How ckpt_load finds each named file's presence and size (stat_files). */
enum ckpt_files_mode {
    CKPT_FILES_NONE = 0,  /* not looked up (present -1, size unknown) */
    CKPT_FILES_LIST = 1,  /* one listing of the directory, a stat per file below it */
    CKPT_FILES_KNOWN = 2, /* io->known per file named; unknown ones stay unknown */
};

struct ckpt_load_options {
    size_t max_metadata;    /* largest .metadata / index json read (default 1 GiB) */
    int stat_files;         /* enum ckpt_files_mode (default CKPT_FILES_LIST) */
    struct dcp_options dcp; /* pickle limits etc. */
};

void ckpt_load_options_default(struct ckpt_load_options *o);

/* "dir/name" (or "name" when dir is ""), malloc'd; NULL on ENOMEM. */
char *ckpt_path_join(const char *dir, const char *name);

/* Read a whole file of at most max bytes into a malloc'd buffer (caller
 * frees). -EFBIG if larger. */
int ckpt_io_read_all(const struct ckpt_io *io, const char *path, size_t max, void **buf,
                     size_t *len);

/* Load the checkpoint in directory dir. CKPT_ENOTCKPT if dir holds none.
 * On success *out is owned by the caller. err gets the reason (with the
 * file name) on failure. opt may be NULL. */
int ckpt_load(const struct ckpt_io *io, const char *dir, const struct ckpt_load_options *opt,
              struct ckpt **out, struct ckpt_err *err);

/* Load from one file in dir: "*.safetensors" (that file alone), "*.json"
 * (a Hugging Face index), anything else a DCP .metadata pickle (shard paths
 * relative to dir). */
int ckpt_load_file(const struct ckpt_io *io, const char *dir, const char *name,
                   const struct ckpt_load_options *opt, struct ckpt **out, struct ckpt_err *err);

/* What kind of checkpoint dir looks like: CKPT_FORMAT_DCP,
 * CKPT_FORMAT_SAFETENSORS, 0 if none, or a negative error. */
int ckpt_detect(const struct ckpt_io *io, const char *dir);

/* Walk the tree under root (depth-first, names sorted, at most max_depth
 * levels below root) and call fn for every checkpoint directory found
 * (checkpoints may nest, e.g. a model repo with sub-models). fn returns
 * non-zero to stop. A subdirectory that cannot be listed for want of
 * permission, or that vanished meanwhile, is skipped. Returns 0, the first
 * other listing error (or the root's), or fn's value. */
typedef int (*ckpt_found_fn)(void *arg, const char *dir, int format);
int ckpt_find(const struct ckpt_io *io, const char *root, int max_depth, ckpt_found_fn fn,
              void *arg);

#endif
