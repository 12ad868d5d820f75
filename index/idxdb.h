/*
 * index/idxdb.h - the persistent checkpoint index, in LMDB.
 *
 * One LMDB environment (a directory under the cache dir, on local disk,
 * never on the mount) holds any number of checkpoints. Each is stored under
 * a caller-chosen key (ckptfs uses the store URL + path, e.g.
 * "s3://bucket/run/step_100" or an absolute local path) with a caller-chosen
 * fingerprint (e.g. the .metadata ETag and size) so a changed checkpoint can
 * be detected and rebuilt. Internally a checkpoint gets a 64-bit id and its
 * records are keyed by big-endian (id, ...) so one checkpoint's data is
 * contiguous and ordered:
 *
 *   meta    "schema" -> u32, "next_id" -> u64
 *   ckpt    key -> {id, counts, built_at, fingerprint}
 *   ckid    id -> key
 *   file    id|file -> {size, present, rank, nitems, name}
 *   fname   id|hash64(name) -> [file...]
 *   item    id|item -> {file, offset, length, kind, tensor, chunk, index hint,
 *                       fqn, chunk offsets, transform descriptors}
 *   layout  id|file|offset|item -> length        (items of a file by offset)
 *   tensor  id|tensor -> {dtype, shape, chunk items, fqn}
 *   fqn     id|hash64(fqn) -> [(kind, tensor-or-item)...]
 *
 * "Which item holds byte X of file F" is one cursor lookup on layout
 * (MDB_SET_RANGE just past (F, X), then one step back); "which items follow
 * it in layout order" is MDB_NEXT from there. A read transaction is cheap:
 * begin one per batch of lookups and end it soon (long readers pin old
 * pages). The environment is opened MDB_NOTLS, so a read transaction may be
 * used by any one thread at a time.
 *
 * Errors: 0, CKPT_NOTFOUND for a miss, CKPT_EVERSION if the database has
 * another schema, CKPT_EDB for other LMDB failures (err has LMDB's text),
 * -errno for system errors. Strings returned by lookups point into the
 * memory map and stay valid until the read transaction ends or is
 * refreshed; they are not NUL-terminated (use the _len fields).
 */
#ifndef CKPTFS_IDXDB_H
#define CKPTFS_IDXDB_H

#include <stddef.h>
#include <stdint.h>

#include "ckpt.h"

#define IDXDB_SCHEMA_VERSION 1
#define IDXDB_KEY_MAX 480 /* bytes of a checkpoint key */
#define IDXDB_FP_MAX 256  /* bytes of a fingerprint */

#define IDXDB_RDONLY 1 /* open read-only (no schema creation) */
#define IDXDB_RESET 2  /* on a schema mismatch, empty the database instead of failing */

struct idxdb_options {
    size_t map_size;     /* initial map size (default 1 GiB; grows on demand) */
    size_t max_map_size; /* growth limit (default 256 GiB) */
    unsigned flags;      /* IDXDB_RDONLY, IDXDB_RESET */
};

struct idxdb;
struct idxdb_txn;

void idxdb_options_default(struct idxdb_options *o);

/* Open (creating if needed, unless RDONLY) the index in directory dir; the
 * directory is created if missing (its parent must exist). On success *out
 * must be closed with idxdb_close. */
int idxdb_open(const char *dir, const struct idxdb_options *opt, struct idxdb **out,
               struct ckpt_err *err);
void idxdb_close(struct idxdb *db);

/* ---- writing ---------------------------------------------------------- */

/* Index checkpoint c under key (replacing whatever was there, atomically:
 * readers see the old or the new version, never a mix). *id (if non-NULL)
 * receives the checkpoint's new internal id. */
int idxdb_put(struct idxdb *db, const char *key, const char *fingerprint, const struct ckpt *c,
              uint64_t *id, struct ckpt_err *err);

/* Remove checkpoint key; CKPT_NOTFOUND if absent. */
int idxdb_drop(struct idxdb *db, const char *key, struct ckpt_err *err);

/* ---- reading ---------------------------------------------------------- */

int idxdb_begin(struct idxdb *db, struct idxdb_txn **out, struct ckpt_err *err);
void idxdb_end(struct idxdb_txn *t);
/* Drop the snapshot and take a fresh one (sees later commits). Invalidates
 * every pointer returned so far. */
int idxdb_refresh(struct idxdb_txn *t);

struct idxdb_ckpt {
    uint64_t id;
    uint32_t format; /* enum ckpt_format */
    uint32_t nfiles, ntensors, nitems, nbytes;
    uint64_t built_at; /* unix seconds */
    const char *key;
    size_t key_len;
    const char *fingerprint;
    size_t fingerprint_len;
};

int idxdb_ckpt_get(struct idxdb_txn *t, const char *key, struct idxdb_ckpt *out);
/* Every checkpoint in key order; fn returns non-zero to stop. */
int idxdb_ckpt_list(struct idxdb_txn *t, int (*fn)(void *arg, const struct idxdb_ckpt *c),
                    void *arg);

struct idxdb_file {
    uint32_t file;
    const char *name;
    size_t name_len;
    uint64_t size; /* CKPT_SIZE_UNKNOWN if not looked up at build time */
    int present;   /* 1, 0, or -1 unknown */
    int rank;      /* -1 if the name is not __R_N.distcp */
    uint32_t nitems;
    int overlapping; /* some items share bytes (see struct ckpt_file) */
};

int idxdb_file_find(struct idxdb_txn *t, uint64_t id, const char *name, uint32_t *file);
int idxdb_file_get(struct idxdb_txn *t, uint64_t id, uint32_t file, struct idxdb_file *out);
/* Every file the checkpoint names, in file order (the write path checks
 * each is on the store before publishing .metadata). */
int idxdb_files(struct idxdb_txn *t, uint64_t id, int (*fn)(void *arg, const struct idxdb_file *f),
                void *arg);

struct idxdb_span {
    uint32_t file;
    uint32_t item;
    uint64_t offset, length;
};

/* The item holding byte off of file (zero-length items hold no byte; if
 * items overlap, the one starting last among those holding it). One cursor
 * lookup, plus a backward scan only in files flagged overlapping. The
 * transaction's layout cursor stays there for idxdb_layout_next. */
int idxdb_item_at(struct idxdb_txn *t, uint64_t id, uint32_t file, uint64_t off,
                  struct idxdb_span *out);
/* The first item starting at or after off (for gaps and prefetch planning). */
int idxdb_item_from(struct idxdb_txn *t, uint64_t id, uint32_t file, uint64_t off,
                    struct idxdb_span *out);
/* The item after the last one returned by item_at/item_from/layout_next,
 * in the same file, in layout (offset) order; CKPT_NOTFOUND at the end. */
int idxdb_layout_next(struct idxdb_txn *t, struct idxdb_span *out);

struct idxdb_item {
    uint32_t item, file;
    enum ckpt_item_kind kind;
    uint32_t tensor, chunk; /* CKPT_NONE for bytes items */
    uint64_t offset, length;
    int64_t index_hint;
    const char *fqn;
    size_t fqn_len;
    uint32_t ndim;
    const unsigned char *chunk_offsets; /* ndim little-endian int64: idxdb_i64() */
    int has_transforms;
    uint32_t ntransforms;
    const char *transforms; /* ntransforms NUL-terminated strings back to back */
};

int idxdb_item_get(struct idxdb_txn *t, uint64_t id, uint32_t item, struct idxdb_item *out);

struct idxdb_tensor {
    uint32_t tensor;
    const char *fqn;
    size_t fqn_len;
    const char *dtype;
    size_t dtype_len;
    uint32_t elem_bits;
    uint32_t ndim;
    const unsigned char *size; /* ndim little-endian int64 */
    uint32_t nchunks;
    const unsigned char *chunk_items; /* nchunks little-endian uint32: idxdb_u32() */
};

int idxdb_tensor_get(struct idxdb_txn *t, uint64_t id, uint32_t tensor, struct idxdb_tensor *out);

/* Find a tensor (kind TENSOR, *index = tensor number) or bytes entry (kind
 * BYTES, *index = item number) by fqn. */
int idxdb_fqn_find(struct idxdb_txn *t, uint64_t id, const char *fqn, enum ckpt_item_kind *kind,
                   uint32_t *index);

int64_t idxdb_i64(const unsigned char *p, uint32_t i);
uint32_t idxdb_u32(const unsigned char *p, uint32_t i);

/* Statistics of the environment: bytes used by the data file. */
int idxdb_stat(struct idxdb *db, uint64_t *bytes_used, uint64_t *map_size);

#endif
