/*
 * fs/core.h - the filesystem core: FUSE-free logic behind every operation.
 *
 * Paths are absolute mount paths ("/", "/ckpt/__0_0.distcp"). Functions
 * return 0 (or a byte count) on success and a negative errno on failure,
 * so the FUSE adapter (ops.c) only unpacks requests and replies, and tests
 * can drive the core without a mount. The core owns the metadata cache
 * (attributes and negative lookups, valid for attr_timeout seconds), the
 * block cache, the worker pool and the per-open readahead state.
 */
#ifndef CKPTFS_CORE_H
#define CKPTFS_CORE_H

#include "store.h"

#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

struct core_config {
    double attr_timeout;    /* seconds attributes and lookups stay valid */
    uint64_t cache_size;    /* bytes of file data held in memory */
    uint32_t block_size;    /* cache block size (power of two) */
    uint32_t request_size;  /* largest background GET */
    uint64_t readahead_min; /* first readahead window */
    uint64_t readahead_max; /* largest readahead window */
    int workers;            /* background fetch threads */
    const char *cache_dir;  /* on-disk state (the index); NULL = none */
};

/* Defaults: 1 s attributes, 1 GiB cache, 1 MiB blocks, 8 MiB requests,
 * readahead 1 MiB .. 256 MiB, 8 workers. */
void core_config_defaults(struct core_config *cfg);

struct core;
struct core_file;

/* Takes no ownership of store; it must outlive the core. Starts threads:
 * call after daemonizing. */
int core_create(struct store *store, const struct core_config *cfg, struct core **out);
void core_destroy(struct core *core);

int core_getattr(struct core *core, const char *path, struct stat *st);

/* Calls fill once per entry of the directory (not "." and ".."); a non-zero
 * return from fill stops the listing. */
typedef int (*core_fill_fn)(void *arg, const char *name, const struct stat *st);
int core_readdir(struct core *core, const char *path, core_fill_fn fill, void *arg);

/* Open for reading. *keep_cache is set when the kernel may keep cached
 * pages of this file from an earlier open (same object version). */
int core_open(struct core *core, const char *path, int flags, struct core_file **out,
              int *keep_cache);
ssize_t core_read(struct core *core, struct core_file *f, void *buf, size_t len, uint64_t off);
/* If f reads straight from a file descriptor of the store (the local
 * directory store), set *fd and *n (len clamped to the file) for the adapter
 * to hand to the kernel (splice), count the read, and return 1; else 0. */
int core_read_direct(struct core *core, struct core_file *f, uint64_t off, size_t len, int *fd,
                     size_t *n);
void core_release(struct core *core, struct core_file *f);

/* Statistics as one JSON object into buf (NUL-terminated, truncated to
 * len). Returns the full length it needs, like snprintf. */
int core_stats_json(struct core *core, char *buf, size_t len);

#endif
