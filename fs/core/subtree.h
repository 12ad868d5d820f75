/*
 * fs/core/subtree.h - the subdirectories a listing lists whole on the way.
 *
 * Pure logic, no I/O and no locks: an S3 listing of a directory reports
 * every key below it, in key order, so the keys of each subdirectory come
 * together. The tracker follows them (up to SUBTREE_DEPTH levels down) and
 * says, through its callbacks, what each subdirectory holds once its keys
 * ended: a subdirectory whose keys all came is listed as completely as a
 * listing of its own would list it (the same entries, the same time by
 * store.h's rule), and lookups there need no LIST of their own. Nothing is
 * said of a subdirectory a listing cut short (its entries wait until its
 * keys end: at most SUBTREE_HELD_MAX of them).
 */
#ifndef CKPTFS_SUBTREE_H
#define CKPTFS_SUBTREE_H

#include "ckindex.h"
#include "store.h"

#include <stddef.h>
#include <stdint.h>

/* Subdirectory levels below the listed directory that are followed. */
#define SUBTREE_DEPTH 8
/* Entries a followed subdirectory may have: a larger one is not whole. */
#define SUBTREE_HELD_MAX 4096

struct subtree_ops {
    /* A direct entry of subdirectory sub (a path relative to the listed
     * directory), once sub's keys all came, just before whole(): a file
     * (its key) or a subdirectory (is_dir, its time). */
    void (*entry)(void *arg, const char *sub, const char *name, const struct store_stat *st);
    /* Every key below sub came: newest is its time (store.h), keys how many
     * keys are below it; scan holds its metadata-named files and is the
     * callee's (it must end or drop it). */
    void (*whole)(void *arg, const char *sub, int64_t newest, uint64_t keys,
                  struct ckindex_scan *scan);
};

struct subtree_entry {
    char *name;
    struct store_stat st;
};

struct subtree_level {
    size_t end;                 /* its path is path[0..end) */
    struct subtree_entry *held; /* its entries so far */
    size_t nheld, held_cap;
    uint64_t keys;  /* keys below it so far */
    int64_t newest; /* the newest of its first STORE_DIR_TIME_KEYS keys */
    int whole;      /* every entry of it is known so far */
    struct ckindex_scan scan;
};

struct subtree {
    const struct subtree_ops *ops;
    void *arg;
    struct subtree_level level[SUBTREE_DEPTH];
    size_t depth;    /* levels followed now (the current key's directories) */
    char path[4096]; /* the deepest followed subdirectory, relative */
};

/* A tracker calling ops with arg. */
void subtree_init(struct subtree *t, const struct subtree_ops *ops, void *arg);

/* The listing's next key, rel to the listed directory ("a/b/f", "a/" for a
 * directory marker, "f" for the directory's own file). */
void subtree_key(struct subtree *t, const char *rel, const struct store_stat *st);

/* The listing ended: complete (every key came) reports the subdirectories
 * still open; else (cut short or failed) they are dropped. Frees everything;
 * t may be reused after subtree_init(). */
void subtree_end(struct subtree *t, int complete);

#endif
