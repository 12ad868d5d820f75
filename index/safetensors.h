/*
 * index/safetensors.h - safetensors headers and the Hugging Face layout.
 *
 * A safetensors file is an 8-byte little-endian header length N, N bytes of
 * UTF-8 JSON (starting with '{', possibly right-padded with spaces), then the
 * data buffer. The header maps tensor names to {dtype, shape, data_offsets
 * [begin, end)} relative to the buffer, plus an optional "__metadata__"
 * string->string map. Validation follows the reference implementation: N in
 * 1..100,000,000 and inside the file; no duplicate names; known dtypes;
 * non-negative integer shapes and offsets; (end - begin) == numel * itemsize
 * without overflow; the tensors, sorted by offset, cover the buffer exactly
 * (no overlap, no hole, no trailing bytes).
 *
 * The DCP Hugging Face layout (torch >= 2.8) adds "DCP_SHARDING_INFO" to
 * __metadata__ ({fqn: {"saved_offsets": [...]}}) and, for whole models, a
 * model.safetensors.index.json ({"metadata": {"total_size"}, "weight_map":
 * {fqn: file}}). st_build_ckpt() turns one or more parsed files into the
 * common checkpoint model, joining shards of one fqn into chunks.
 *
 * Ownership: st_header / st_index own their strings (one arena each);
 * free with st_free / st_index_free. JSON is parsed with jansson.
 */
#ifndef CKPTFS_SAFETENSORS_H
#define CKPTFS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "arena.h"
#include "ckpt.h"

#define ST_PREFIX_LEN 8
#define ST_MAX_HEADER 100000000u /* reference implementation's limit */

struct st_tensor {
    const char *name;
    const char *dtype; /* "F32", "BF16", ... */
    uint32_t elem_bits;
    uint32_t ndim;
    const int64_t *shape;
    uint64_t begin, end; /* data_offsets, relative to the data buffer */
    /* DCP_SHARDING_INFO saved_offsets (ndim entries) or NULL */
    const int64_t *saved_offsets;
};

struct st_header {
    uint64_t header_len; /* N */
    uint64_t data_start; /* 8 + N */
    uint64_t file_size;
    int has_metadata; /* "__metadata__" present */
    uint32_t nmeta;
    const char **meta_keys; /* header order */
    const char **meta_values;
    uint32_t ntensors;
    struct st_tensor *tensors; /* header order */
    struct arena arena;
};

/* Bits per element of a safetensors dtype ("BF16" -> 16), 0 if unknown. */
uint32_t st_dtype_bits(const char *name);

/* From the first 8 bytes of a file of file_size bytes: the header length,
 * checked against the file and the 100 MB limit. 0 or CKPT_E*. */
int st_header_len(const void *prefix, size_t n, uint64_t file_size, uint64_t *hlen,
                  struct ckpt_err *err);

/* Parse the hlen header bytes that follow the prefix. */
int st_parse_header(const void *json, size_t hlen, uint64_t file_size, struct st_header **out,
                    struct ckpt_err *err);

/* Both steps on a buffer holding at least the first 8 + N bytes of the file. */
int st_parse(const void *buf, size_t len, uint64_t file_size, struct st_header **out,
             struct ckpt_err *err);

void st_free(struct st_header *h);

struct st_index {
    uint64_t total_size; /* metadata.total_size, UINT64_MAX if absent */
    uint32_t n;
    const char **fqn; /* weight_map, file order */
    const char **file;
    struct arena arena;
};

/* Parse model.safetensors.index.json (at most ST_MAX_HEADER bytes, else
 * CKPT_ELIMIT); file names are validated as paths
 * inside the checkpoint directory. */
int st_index_parse(const void *json, size_t len, struct st_index **out, struct ckpt_err *err);
void st_index_free(struct st_index *ix);

/* Build a checkpoint model from nfiles parsed headers (names[i] relative to
 * the checkpoint directory, validated). Tensors present in several files
 * (DCP save_sharded) become chunks of one tensor, placed by saved_offsets;
 * the global shape is the extent of the chunks. If ix is non-NULL every
 * weight_map entry must be found in its file. Files get present = 1 and the
 * size given in their header. */
int st_build_ckpt(const char *const *names, struct st_header *const *hdrs, uint32_t nfiles,
                  const struct st_index *ix, struct ckpt **out, struct ckpt_err *err);

#endif
