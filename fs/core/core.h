/*
 * fs/core.h - the filesystem core: FUSE-free logic behind every operation.
 *
 * Paths are absolute mount paths ("/", "/ckpt/__0_0.distcp"). Functions
 * return 0 (or a byte count) on success and a negative errno on failure,
 * so the FUSE adapter (ops.c) only unpacks requests and replies, and tests
 * can drive the core without a mount. The core owns the metadata cache
 * (attributes and negative lookups, valid for attr_timeout seconds), the
 * block cache, the worker pool, the per-open readahead state and, when the
 * mount is writable, the staging area (stage.h) whose files it shows on top
 * of the store's. docs/semantics.md says what each call guarantees.
 */
#ifndef CKPTFS_CORE_H
#define CKPTFS_CORE_H

#include "stage.h"
#include "store.h"

#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

/* Name of the root extended attribute that returns the statistics JSON. */
#define CKPTFS_STATS_XATTR "user.ckptfs.stats"
/* Reading this attribute of a directory waits until everything written
 * below it is on the store ("ok"), or fails with EIO. */
#define CKPTFS_SYNC_XATTR "user.ckptfs.sync"

struct core_config {
    double attr_timeout;       /* seconds attributes and lookups stay valid */
    uint64_t cache_size;       /* bytes of file data held in memory */
    uint32_t block_size;       /* cache block size (power of two) */
    uint32_t request_size;     /* largest background GET */
    uint64_t readahead_min;    /* first readahead window */
    uint64_t readahead_max;    /* largest readahead window */
    uint32_t kernel_readahead; /* how far the kernel reads past a reader (prefetch.h) */
    int workers;               /* background fetch threads */
    int attrs_exact;           /* --attrs=exact: attributes from the store, once per version */
    int direct_reads;          /* --direct-reads: CORE_DIRECT_READS_* (files.c) */
    const char *cache_dir;     /* on-disk state (index, staging); NULL = none (read-only) */
    uint64_t disk_cache_size;  /* bytes kept in CACHE_DIR/disk-cache across mounts; 0 = off */
    int disk_cache_min_free;   /* percent of its file system the disk cache leaves free */
    int writable;              /* accept writes (needs cache_dir and a store that can write) */
    struct stage_config stage; /* the write path's settings (dir: CACHE_DIR/stage) */
    double stats_interval;     /* log a transfer summary this often (s); 0 = never */
};

/* Which checkpoint data files bypass the kernel's page cache (files.c). */
enum {
    CORE_DIRECT_READS_NONE,    /* none */
    CORE_DIRECT_READS_SHARDED, /* those whose items one rank each loads (default) */
    CORE_DIRECT_READS_ALL,     /* every one */
};

/* Defaults: 1 s attributes, 1 GiB cache, 1 MiB blocks, 8 MiB requests,
 * readahead 1 MiB .. 256 MiB, 8 workers, writable, stage_config_defaults(),
 * no transfer summary (the daemon's --stats-interval sets one). */
void core_config_defaults(struct core_config *cfg);

struct core;
struct core_file;

/* Takes no ownership of store; it must outlive the core. Starts threads:
 * call after daemonizing. Takes over what a previous mount with the same
 * cache directory left staged. -EBUSY (logged, naming the pid) when another
 * process holds the disk cache of the same cache directory. */
int core_create(struct store *store, const struct core_config *cfg, struct core **out);
/* Releases handles the kernel never released, publishes everything staged
 * (waiting while uploads make progress), and frees the core. */
void core_destroy(struct core *core);

/* 1 if the mount accepts writes. */
int core_writable(const struct core *core);

int core_getattr(struct core *core, const char *path, struct stat *st);
/* Attributes of an open file (also after it was unlinked). */
int core_fgetattr(struct core *core, struct core_file *f, struct stat *st);

/* chmod, chown, utimens (issue #18): give the file or directory at path
 * (or the open file f, if not NULL) a's set attributes, kept with a staged
 * file until its upload, else stored at once without sending its bytes
 * (store.h's set_attrs). 0 or a negative errno. */
int core_setattr(struct core *core, const char *path, struct core_file *f,
                 const struct store_attrs *a);

/* 1 if listings must not hand the kernel attributes (--attrs=exact). */
int core_attrs_exact(const struct core *core);

/* Calls fill once per entry of the directory (not "." and ".."); a non-zero
 * return from fill stops the listing. An entry whose st_mode has no type
 * (S_IFMT bits 0) may be a symlink the mount has not looked at yet: hand
 * the kernel neither its type nor its attributes, so it looks it up. */
typedef int (*core_fill_fn)(void *arg, const char *name, const struct stat *st);
int core_readdir(struct core *core, const char *path, core_fill_fn fill, void *arg);

/* Open (O_RDONLY, O_WRONLY or O_RDWR; O_TRUNC). *keep_cache is set when the
 * kernel may keep cached pages of this file from an earlier open (same
 * object version). Opening an existing object for writing without O_TRUNC
 * copies it into staging first. -EROFS if the mount is read-only. */
int core_open(struct core *core, const char *path, int flags, struct core_file **out,
              int *keep_cache);
ssize_t core_read(struct core *core, struct core_file *f, void *buf, size_t len, uint64_t off);
/* If f reads straight from a file descriptor of the store (the local
 * directory store), set *fd and *n (len clamped to the file) for the adapter
 * to hand to the kernel (splice), count the read, and return 1; else 0. */
int core_read_direct(struct core *core, struct core_file *f, uint64_t off, size_t len, int *fd,
                     size_t *n);
/* The kernel's RELEASE: the last writer's release seals the file. */
void core_release(struct core *core, struct core_file *f);

/* ---- changes (core_write.c) ---- */

/* Create and open a new file (replacing a file at path, as O_TRUNC would). */
int core_create_file(struct core *core, const char *path, int flags, struct core_file **out);
/* Open a file for writing (called by core_open). */
int core_open_write(struct core *core, const char *spath, int flags, struct core_file **out);
/* Write to an open file at any offset: len, or a negative errno. */
ssize_t core_write(struct core *core, struct core_file *f, const void *buf, size_t len,
                   uint64_t off);
/* A write whose bytes the caller moves itself (splice): begin returns the
 * descriptor to write len bytes at off into, end reports what was written
 * (see stage_write_begin). */
int core_write_begin(struct core *core, struct core_file *f, uint64_t off, size_t len);
void core_write_end(struct core *core, struct core_file *f, uint64_t off, size_t len,
                    ssize_t written);
/* Set the size of an open file (f) or of the file at path (f NULL). */
int core_truncate(struct core *core, const char *path, struct core_file *f, uint64_t size);
/* Remember the thread (kernel thread id, as FUSE names callers; 0 =
 * unknown) that opened f for writing, and its process. */
void core_file_set_opener(struct core_file *f, pid_t thread);

/* A pointer the adapter keeps with f (NULL until set; not freed by the core). */
void core_file_set_tag(struct core_file *f, void *tag);
void *core_file_tag(const struct core_file *f);
/* 1 if reads of f should bypass the kernel's page cache (FOPEN_DIRECT_IO):
 * a read-only handle of a checkpoint's *.distcp read through the block
 * cache, if --direct-reads picks that file (see files.c for why, and the
 * cost). May wait (up to 1 s) for the checkpoint's index being built. */
int core_file_direct_reads(const struct core *core, const struct core_file *f);

/* If f reads a store version the disk cache holds whole, small enough (8
 * MiB, or one checkpoint item of up to 256 MiB) to check at open, and every
 * chunk passes its checksum
 * (checked here, several at once; the files a per-item load reads next are
 * checked ahead too): 1 and *fd, the cache's data file (owned by the cache,
 * open while f is); else 0. For passthrough: the kernel then reads it. */
int core_file_disk_copy(struct core *core, struct core_file *f, int *fd);

/* What identifies the bytes f reads, and *size their size (NULL: not a
 * store version; *size unset). */
const void *core_file_version(const struct core_file *f, uint64_t *size);

/* An open was handed to the kernel in passthrough (counted in the stats). */
void core_note_passthrough(struct core *core);
/* close() by thread (0 = unknown): publish what the handle wrote (see
 * stage_flush). Every close(2) of a descriptor sends one, also a forked
 * child's close of one it inherited: a close from another process than the
 * opener's seals nothing (the last close, core_release, still does). */
int core_flush(struct core *core, struct core_file *f, pid_t thread);
/* fsync(): per --fsync (see stage_fsync). */
int core_fsync(struct core *core, struct core_file *f);
int core_unlink(struct core *core, const char *path);
/* symlink(2): a link at path to target (not checked: POSIX), with a's uid
 * and gid if set; staged, and published after what was staged before it at
 * or below its target (docs/semantics.md, "Symbolic links"). 0, -EEXIST,
 * -ENAMETOOLONG, -EROFS or another negative errno. */
int core_symlink(struct core *core, const char *target, const char *path,
                 const struct store_attrs *a);
/* readlink(2): the target of the link at path into buf (at most len bytes,
 * no NUL): its length, -EINVAL if path is no link, or a negative errno. */
ssize_t core_readlink(struct core *core, const char *path, char *buf, size_t len);
int core_mkdir(struct core *core, const char *path);
int core_rmdir(struct core *core, const char *path);
/* rename(2): flags 0 or RENAME_NOREPLACE (RENAME_EXCHANGE: -EINVAL). */
int core_rename(struct core *core, const char *from, const char *to, unsigned flags);
/* Wait until everything written below directory path is on the store
 * (fsyncdir, the sync attribute). 0 or -EIO. */
int core_sync(struct core *core, const char *path);
/* Space for statfs: the staging budget and what is staged. */
void core_space(struct core *core, uint64_t *total, uint64_t *used);

/* The longest name of one path component the store holds (statfs). */
unsigned core_name_max(const struct core *core);

/* Statistics as one JSON object into buf (NUL-terminated, truncated to
 * len). Returns the full length it needs, like snprintf. */
int core_stats_json(struct core *core, char *buf, size_t len);

#endif
