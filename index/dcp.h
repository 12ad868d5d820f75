/*
 * index/dcp.h - PyTorch Distributed Checkpoint (.metadata) extraction.
 *
 * dcp_parse() reads a DCP .metadata pickle (torch 1.13 .. 2.9+/main) with
 * the bounded pickle reader and reduces it to the checkpoint model of
 * ckpt.h: every tensor (fqn, dtype, size, TensorProperties, chunks), every
 * bytes entry, and one item per storage_data entry (file, offset, length,
 * transform_descriptors), plus storage_meta / version / planner_data.
 *
 * Classes are matched by module and name (never imported). Layouts handled:
 *   Metadata             torch.distributed._shard.checkpoint.metadata (1.13)
 *                        torch.distributed.checkpoint.metadata (2.x)
 *                        fields state_dict_metadata, planner_data,
 *                        storage_data [, storage_meta (2.4+)] [, version (2.9+)]
 *   TensorProperties     BUILD state = 5-tuple (dtype, layout, requires_grad,
 *                        memory-format enum, pin_memory) or a field dict; enum
 *                        (_)MEM_FORMAT_ENCODING by value Cls(0) or by name
 *                        getattr(Cls, 'TORCH_CONTIGUOUS_FORMAT')
 *   _StorageInfo         relative_path, offset, length [, transform_descriptors]
 *   StorageMeta          checkpoint_id (None, str, pathlib[._local].PosixPath
 *                        as parts or as one string), save_id, load_id, modules
 *   torch.Size           REDUCE(torch.Size, (tuple,)); dtype GLOBAL torch.<name>;
 *                        layout REDUCE(torch.serialization._get_layout, (str,))
 * Unknown extra fields are ignored (forward compatibility).
 *
 * Validation (CKPT_EINVALID, with fqn and byte position): relative paths that
 * are empty, absolute, contain NUL/backslash or "."/".." components; offsets
 * or lengths that are negative, beyond int64 or overflow together; tensor
 * sizes < 0; chunks whose rank differs from the tensor's or that do not fit
 * it; unknown dtypes; a tensor chunk or bytes entry without a storage entry;
 * a storage entry for an unknown fqn or chunk ("orphan"); two storage entries
 * for the same (fqn, chunk offset) (Python would keep the last silently;
 * we refuse). Wrong value types give CKPT_ETYPE; a root that is not a DCP
 * Metadata gives CKPT_EFORMAT; GLOBALs off the allow-list give CKPT_EGLOBAL.
 *
 * Fast path: by default the pickle is read with pkl_options.fold, so the
 * millions of ChunkStorageMetadata / MetadataIndex / _StorageInfo objects
 * of a many-rank save arrive as compact folded records (pickle.h) rather
 * than ~30 values each. If that parse or the extraction fails for any
 * reason, the file is parsed again without folding, so errors (and their
 * byte positions) are the plain path's. The model is the same either way;
 * an item's fqn then shares the state_dict entry's string.
 */
#ifndef CKPTFS_DCP_H
#define CKPTFS_DCP_H

#include <stddef.h>

#include "ckpt.h"
#include "pickle.h"

struct dcp_options {
    struct pkl_options pkl; /* limits; filter defaults to dcp_global_allowed,
                             * fold to 1 (see "Fast path" above) */
    size_t max_memory;      /* bytes for the resulting model (default 4 GiB) */
    int no_refold;          /* tests: with pkl.fold, return the folded parse's
                             * own result, not a second, plain parse's */
};

void dcp_options_default(struct dcp_options *o);

/* The allow-list used by default: torch.Size, torch dtypes/layouts,
 * torch.serialization._get_layout, any class in torch.distributed.checkpoint
 * or torch.distributed._shard, pathlib[._local] path classes,
 * builtins/__builtin__ getattr/set/frozenset, collections.OrderedDict. */
int dcp_global_allowed(void *arg, const char *module, const char *name);

/* Parse a .metadata held in buf[0..len). On success *out is a new model
 * (format CKPT_FORMAT_DCP, files not yet looked up: present = -1) owned by
 * the caller (ckpt_free). On failure returns a negative code, *out = NULL
 * and err describes the problem. opt may be NULL. */
int dcp_parse(const void *buf, size_t len, const struct dcp_options *opt, struct ckpt **out,
              struct ckpt_err *err);

#endif
