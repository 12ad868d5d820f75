/*
 * index/ckpt.h - the checkpoint model shared by every parser, the LMDB index,
 * ckptfs-admin and (later) the filesystem; plus the index library's error
 * codes.
 *
 * A checkpoint is a set of files and a list of *items*: byte ranges
 * [offset, offset+length) of one file, each holding one chunk of a tensor or
 * one pickled Python object ("bytes" item). DCP .metadata and safetensors
 * headers are both reduced to this model:
 *
 *   tensors[t].chunks[c].item --> items[i] --> files[items[i].file]
 *   bytes[b].item             --> items[i]
 *
 * items[] is in the order the writer recorded them (DCP storage_data order:
 * rank by rank, each rank in write order); files[f].items lists the items of
 * one file sorted by offset ("layout order"), which is what "which item holds
 * byte X" and read-ahead need.
 *
 * Ownership: a struct ckpt owns everything reachable from it (one arena);
 * ckpt_free releases it all. Strings are NUL-terminated UTF-8 and may also
 * contain no NUL (paths with NUL are rejected by the parsers).
 *
 * Errors: functions return 0 or a negative code: -errno for system errors
 * (-ENOMEM, -EIO, -ENOENT, ...) or one of the CKPT_E* codes below.
 * ckpt_strerror() describes both. Parsers also fill a struct ckpt_err with
 * the byte position and a one-line message fit for a user.
 */
#ifndef CKPTFS_CKPT_H
#define CKPTFS_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "arena.h"

/* Error codes (negative, outside the errno range; LMDB uses -30799..-30780). */
#define CKPT_ETRUNC (-31001)    /* input ends before a declared length or STOP */
#define CKPT_EOPCODE (-31002)   /* unknown/unsupported pickle opcode or protocol */
#define CKPT_ESTACK (-31003)    /* pickle stack or mark misuse */
#define CKPT_EMEMO (-31004)     /* pickle memo misuse */
#define CKPT_ELIMIT (-31005)    /* a configured size/depth/count limit was hit */
#define CKPT_ETYPE (-31006)     /* a value has the wrong type for its place */
#define CKPT_EGLOBAL (-31007)   /* class/function reference not on the allow-list */
#define CKPT_EENCODING (-31008) /* invalid UTF-8 */
#define CKPT_EFORMAT (-31009)   /* well-formed input, but not the expected structure */
#define CKPT_EINVALID (-31010)  /* content fails validation (path, offset, chunk) */
#define CKPT_ENOTCKPT (-31011)  /* no checkpoint (.metadata / safetensors) found */
#define CKPT_NOTFOUND (-31012)  /* lookup found nothing (not an error for callers) */
#define CKPT_EVERSION (-31013)  /* index database has another schema version */
#define CKPT_EDB (-31014)       /* LMDB failure; the message has LMDB's reason */

/* A description of err (a CKPT_E* code, a negative errno, or 0). Static. */
const char *ckpt_strerror(int err);

#define CKPT_NOPOS UINT64_MAX

struct ckpt_err {
    int code;      /* same as the function's return value */
    uint64_t pos;  /* byte offset in the parsed input, CKPT_NOPOS if none */
    char msg[320]; /* one line, no trailing newline */
};

/* Record an error (first one wins: a later call does nothing if code is set).
 * e may be NULL. Returns code. */
int ckpt_err_set(struct ckpt_err *e, int code, uint64_t pos, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void ckpt_err_clear(struct ckpt_err *e);

#define CKPT_NONE UINT32_MAX
#define CKPT_SIZE_UNKNOWN UINT64_MAX

enum ckpt_format { CKPT_FORMAT_DCP = 1, CKPT_FORMAT_SAFETENSORS = 2 };
enum ckpt_item_kind { CKPT_ITEM_TENSOR = 1, CKPT_ITEM_BYTES = 2 };

struct ckpt_file {
    const char *name;    /* relative to the checkpoint directory, validated */
    int rank;            /* R of "__R_N.distcp" (DCP shard naming), else -1 */
    uint64_t size;       /* from the store, CKPT_SIZE_UNKNOWN if not looked up */
    int present;         /* 1 present, 0 missing, -1 not looked up */
    uint64_t data_start; /* safetensors: first byte of the data buffer */
    uint32_t nitems;
    uint32_t *items; /* item indexes in layout order: (offset, length, index) */
    int overlapping; /* some non-empty items share bytes (never written by torch;
                      * lookups then scan the file's items) */
};

struct ckpt_chunk {
    const int64_t *offsets; /* ndim entries */
    const int64_t *sizes;   /* ndim entries */
    uint32_t item;          /* the storage item holding it */
};

struct ckpt_tensor {
    const char *fqn;
    const char *dtype;  /* torch name (DCP: "bfloat16") or safetensors name ("BF16") */
    uint32_t elem_bits; /* bits per element; 0 if unknown */
    uint32_t ndim;
    const int64_t *size; /* global shape */
    uint32_t nchunks;
    struct ckpt_chunk *chunks;
    /* DCP TensorProperties (NULL/0 for safetensors) */
    const char *layout;        /* "torch.strided" */
    const char *memory_format; /* "torch.contiguous_format" */
    int requires_grad;
    int pin_memory;
};

struct ckpt_item {
    const char *fqn;
    enum ckpt_item_kind kind;
    uint32_t tensor; /* tensors[] index, CKPT_NONE for bytes items */
    uint32_t chunk;  /* chunk index within the tensor, CKPT_NONE for bytes */
    uint32_t bytes;  /* bytes[] index for bytes items, else CKPT_NONE */
    uint32_t file;
    uint64_t offset;    /* first byte in the file */
    uint64_t length;    /* bytes; offset + length <= INT64_MAX */
    int64_t index_hint; /* DCP MetadataIndex.index, -1 if None */
    uint32_t ntransforms;
    const char **transforms; /* DCP transform_descriptors, e.g. "stream.zstd/1" */
    int has_transforms;      /* transform_descriptors present (even if empty) */
};

struct ckpt_bytes {
    const char *fqn;
    uint32_t item;
};

/* What the DCP extractor saw besides the items (for dumps and diagnostics). */
struct ckpt_dcp_info {
    int protocol;               /* pickle protocol (PROTO) */
    const char *metadata_class; /* "module.Metadata" */
    uint32_t nfields;
    const char **fields; /* Metadata fields in pickled order */
    uint32_t nglobals;
    const char **globals;      /* "module name", first-use order */
    uint64_t opcodes[4];       /* bit i set if opcode byte i occurs */
    uint64_t size;             /* bytes of the .metadata */
    const char *enum_style;    /* "value" / "name" / NULL (no tensors) */
    const char *path_style;    /* "parts" / "local" / "str" / NULL */
    int has_storage_meta;      /* field present (torch >= 2.4) */
    int storage_meta_set;      /* and not None */
    const char *checkpoint_id; /* NULL = None; PosixPath joined to a str */
    const char *save_id;
    const char *load_id;
    uint32_t nmodules;
    const char **modules;
    int has_version;               /* field present (torch >= 2.9) */
    const char *version;           /* NULL = None */
    const char *planner_data_json; /* JSON text; "null" when None */
    uint32_t nmetadata_files;      /* per-rank checkpoint (ckpt_merge): the */
    const char **metadata_files;   /* __R.metadata merged, rank order; else 0 */
};

/* One safetensors file's header facts, for HF checkpoints (per file). */
struct ckpt_st_info {
    uint64_t header_len;
    int has_metadata; /* "__metadata__" present */
    uint32_t nmeta;
    const char **meta_keys; /* __metadata__, header order */
    const char **meta_values;
};

struct ckpt {
    enum ckpt_format format;
    struct arena arena; /* owns everything below */
    uint32_t nfiles, ntensors, nitems, nbytes;
    struct ckpt_file *files;
    struct ckpt_tensor *tensors;
    struct ckpt_item *items;
    struct ckpt_bytes *bytes;
    struct ckpt_dcp_info dcp; /* format DCP */
    struct ckpt_st_info *st;  /* format SAFETENSORS: nfiles entries */
    const char *source;       /* file the model came from (".metadata", index json) */
};

void ckpt_free(struct ckpt *c);

/* Item holding byte off of file, or CKPT_NONE (binary search in layout
 * order; zero-length items never hold a byte; if items overlap, the one
 * starting last among those holding the byte). */
uint32_t ckpt_item_at(const struct ckpt *c, uint32_t file, uint64_t off);

/* Index of the file called name, or CKPT_NONE (linear; for tools). */
uint32_t ckpt_file_index(const struct ckpt *c, const char *name);

/* Index of tensor/bytes entry fqn: returns 0 and sets *kind and *index, or
 * CKPT_NOTFOUND (linear; for tools). */
int ckpt_find_fqn(const struct ckpt *c, const char *fqn, enum ckpt_item_kind *kind,
                  uint32_t *index);

/* 1 if the items of files[f] appear in the file in the order they were
 * recorded (items[] order), else 0. */
int ckpt_file_in_save_order(const struct ckpt *c, uint32_t f);

/* Check that a relative path names a file inside the checkpoint directory:
 * non-empty, not absolute, no NUL, no "." / ".." / empty components, no
 * backslash, at most 4095 bytes. Returns 0 or CKPT_EINVALID with a reason in
 * why (if non-NULL, whylen bytes). */
int ckpt_check_relpath(const char *s, size_t len, char *why, size_t whylen);

/* Rank R of a DCP shard file name "__R_N.distcp" (any directory prefix is
 * ignored), else -1. */
int ckpt_rank_of(const char *name);

/* R of a per-rank DCP metadata file name "__R.metadata" (torch >= 2.9
 * dcp.save(use_collectives=False)), else -1. No directory part. */
int ckpt_rank_metadata_of(const char *name);

/* One checkpoint from the DCP models of the per-rank metadata files of one
 * save (merge.c): files, tensors and bytes entries united, every item kept,
 * a chunk several ranks stored is one chunk (its item: the first part's).
 * Takes parts[0..n) (freed, set to NULL, whatever the outcome); dcp info
 * and source are parts[0]'s. 0 or CKPT_EINVALID (ranks disagree on a
 * tensor), CKPT_ELIMIT, -ENOMEM; err set. */
int ckpt_merge(struct ckpt **parts, uint32_t n, struct ckpt **out, struct ckpt_err *err);

/* Bits per element of a torch dtype name ("bfloat16" -> 16), 0 if unknown. */
uint32_t ckpt_torch_dtype_bits(const char *name);

/* Lower-level construction, used by the parsers (dcp.c, safetensors.c). */
struct ckpt *ckpt_new(enum ckpt_format format, size_t arena_limit);
/* After files/tensors/items/bytes are filled: checks item ranges and chunk
 * geometry and builds files[].items. Returns 0 or CKPT_EINVALID (err set). */
int ckpt_finish(struct ckpt *c, struct ckpt_err *err);

#endif
