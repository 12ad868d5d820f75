/*
 * fs/read/ckindex.h - the mount's checkpoint indexes.
 *
 * Every format the offline index reads (index/load.h, ckpt_load) is
 * indexed here too, with the same detection and parsers:
 *   DCP            .metadata                       (a listing, an open, a publish)
 *   DCP per rank   __R.metadata, no .metadata      (a listing; a publish here)
 *                  (torch >= 2.9 use_collectives=False; merged: ckpt_merge)
 *   Hugging Face   model.safetensors.index.json and/or *.safetensors
 *                  with neither of the above       (a listing)
 * The files of the first kind a directory has are its metadata files (ckindex_pick).
 * A complete listing of a directory notices it by them; an open or a
 * publish of .metadata, and a publish by this mount of an __R.metadata,
 * notice that file (others of the set as last noticed); a listing cut at
 * its first page (a large directory) notices a .metadata only. Opens of the
 * other files notice nothing: the lookup's listing did, or a partial set
 * would be built only to be rebuilt. Bare *.safetensors directories (a
 * model repository without an index json) are indexed like the others:
 * reading their headers costs one GET per file.
 *
 * ckindex makes sure the persistent index (index/idxdb.h, under
 * CACHE_DIR/index) describes those files: if the stored fingerprint (of
 * every metadata file's name, ETag and size: ckindex_fingerprint) matches,
 * the index is reused as it is, which is what a remount sees; otherwise it
 * is (re)built in the background from the store, one GET per metadata file
 * (a safetensors file's header: its first 64 KiB) and no listing. Metadata
 * that cannot be parsed is logged once per version and its directory stays
 * unindexed: reads work, unguided.
 *
 * The prefetcher asks ckindex_items() which item holds a byte of a file and
 * which items follow it in layout order.
 */
#ifndef CKPTFS_CKINDEX_H
#define CKPTFS_CKINDEX_H

#include "ckpt_io_store.h"
#include "store.h"
#include "workq.h"

#include <stdint.h>

struct ckindex;

struct ckindex_span {
    uint64_t offset, length; /* one item's bytes in its file */
};

struct ckindex_stats {
    uint64_t ready;   /* checkpoint directories with a usable index */
    uint64_t built;   /* indexes built by this mount */
    uint64_t reused;  /* indexes found up to date in the cache dir */
    uint64_t failed;  /* .metadata versions that could not be indexed */
    uint64_t lookups; /* lookups in a ready index (item plans, siblings) */
};

/* One file of a directory that may describe a checkpoint: its name (no
 * directory part) and its attributes on the store. */
struct ckindex_meta {
    const char *name;
    struct store_stat st;
};

/* 1 if a file called name may describe a checkpoint (.metadata,
 * __R.metadata, model.safetensors.index.json, *.safetensors), else 0. */
int ckindex_metadata_name(const char *name);

/* The metadata files among a directory's files[0..n) (distinct names), by
 * ckpt_load's detection: .metadata alone; else every __R.metadata; else the
 * index json and every *.safetensors. Writes their positions in files to
 * pick (room for n) and returns how many (0: no checkpoint). */
size_t ckindex_pick(const struct ckindex_meta *files, size_t n, size_t *pick);

/* The fingerprint of the metadata files files[0..n) (any order; distinct
 * names) into out (IDXDB_FP_MAX bytes fit any): a .metadata alone gets
 * store_fingerprint's (what ckptfs-admin records for it); any other set a
 * hash of every file's name, ETag and size in name order. */
void ckindex_fingerprint(const struct ckindex_meta *files, size_t n, char *out, size_t len);

/* The candidates one listing of a directory saw (zero it to begin). */
struct ckindex_scan {
    struct ckindex_meta *files; /* names owned */
    size_t n, cap;
    int oom;
};

/* Note a listed file if its name may describe a checkpoint. */
void ckindex_scan_add(struct ckindex_scan *sc, const char *name, const struct store_stat *st);

/* The listing of dir (store path) ended: notice dir by the metadata files
 * it saw (complete: the whole directory was listed; else only a .metadata
 * counts), then free sc's contents. */
void ckindex_scan_end(struct ckindex *ci, const char *dir, struct ckindex_scan *sc, int complete);

/* Free sc's contents without noticing anything (a listing nobody uses). */
void ckindex_scan_drop(struct ckindex_scan *sc);

/* What the mount knows of the file at store path without a request (its
 * metadata cache): 0 and *size, -ENOENT (known absent), or 1 (unknown). */
typedef int (*ckindex_known_fn)(void *arg, const char *path, uint64_t *size);

/* Open (creating) the index under cache_dir/index. store_url names the
 * store in index keys ("s3://bucket/prefix" or an absolute directory), the
 * same keys ckptfs-admin uses. Builds run on wq. A build takes the files
 * from the .metadata and their sizes from known(known_arg, ...) (NULL:
 * none): it never lists the directory, and a size known nowhere is
 * recorded unknown (the mount reads by the sizes its lookups find). */
int ckindex_open(const char *cache_dir, const char *store_url, struct store *store,
                 struct workq *wq, ckindex_known_fn known, void *known_arg, struct ckindex **out,
                 char *err, size_t errlen);

/* Stop starting builds (queued ones return at once); call before draining
 * the work queue. */
void ckindex_cancel(struct ckindex *ci);

/* Free everything; the work queue must be drained first. */
void ckindex_close(struct ckindex *ci);

/* The checkpoint directory dir (store path) has this .metadata: make sure
 * its index matches, scheduling a build if needed. Never blocks on I/O. */
void ckindex_notice(struct ckindex *ci, const char *dir, const struct store_stat *metadata);

/* As ckindex_notice, for the metadata file name of dir at version st (an
 * __R.metadata this mount published): merged into the files last noticed
 * for dir (ckindex_pick decides what counts). */
void ckindex_notice_file(struct ckindex *ci, const char *dir, const char *name,
                         const struct store_stat *st);

/* As ckindex_notice, for a .metadata this mount has just published: its
 * bytes and every file it names with its size on the store (what the commit
 * check found), copied, so the build asks the store nothing; should that
 * build fail, it reads the store as ckindex_notice does. */
void ckindex_notice_published(struct ckindex *ci, const char *dir,
                              const struct store_stat *metadata, const void *bytes, size_t len,
                              const struct store_file_size *files, size_t nfiles);

/* Items of the file at store path, starting with the one holding byte off
 * and continuing in layout order while the total length stays within
 * budget (the first item always counts). Writes at most max spans to out and
 * returns how many: 0 when the file is not part of a ready index or no item
 * holds off. */
int ckindex_items(struct ckindex *ci, const char *path, uint64_t off, uint64_t budget,
                  struct ckindex_span *out, int max);

/* One chunk of a tensor, in its file (name relative to the checkpoint
 * directory, NUL-terminated) with the rank that wrote it (-1: unknown). */
struct ckindex_chunk {
    char name[256];
    int rank;
    uint64_t offset, length;
};

/* The other chunks of the tensor whose item holds byte off of the file at
 * store path (a sharded tensor's chunks live in the files of the ranks that
 * saved them; ranks that load it load every chunk they overlap). Writes at
 * most max to out and returns how many: 0 when the file is not part of a
 * ready index, no item holds off, or the item is not a tensor chunk. Chunks
 * in the same file and files with names longer than out->name are left out. */
int ckindex_siblings(struct ckindex *ci, const char *path, uint64_t off, struct ckindex_chunk *out,
                     int max);

/* How the items of the file at store path are loaded: *total their bytes,
 * *shared the bytes of those every loading rank reads (whole tensors, bytes
 * items) rather than one rank (a chunk of a tensor saved in several), counting
 * only such items at least min_len long. Waits up to wait_s seconds for an
 * index being built. 0, or -1 when the file is not part of a ready index. */
int ckindex_file_sharing(struct ckindex *ci, const char *path, double wait_s, uint64_t min_len,
                         uint64_t *shared, uint64_t *total);

/* 1 if the file at store path is in a checkpoint directory whose index is
 * being built (ckindex_items() will answer once it is ready). */
int ckindex_building(struct ckindex *ci, const char *path);

/* 1 if dir (store path) is a checkpoint directory this mount has noticed
 * (indexed, being indexed, or failed to index). */
int ckindex_is_checkpoint(struct ckindex *ci, const char *dir);

/* How many files the metadata of checkpoint directory dir names: > 0 once
 * its index is ready, 0 while it is being built, -1 if it will not be known
 * (not a checkpoint noticed here, or its index failed). */
int64_t ckindex_file_count(struct ckindex *ci, const char *dir);

void ckindex_get_stats(struct ckindex *ci, struct ckindex_stats *out);

#endif
