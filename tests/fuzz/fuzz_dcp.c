/*
 * tests/fuzz/fuzz_dcp.c - libFuzzer target for DCP .metadata extraction.
 * Accepted metadata must satisfy the model's invariants: every item in a
 * valid file with offset + length <= INT64_MAX, every chunk inside its
 * tensor and bound to an item of that tensor, files' items in layout order,
 * and ckpt_item_at() finding each non-empty item at its first and last byte.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dcp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct ckpt *c = NULL;
    struct ckpt_err err;
    int rc = dcp_parse(data, size, NULL, &c, &err);
    if (rc) {
        if (c || err.code != rc || !err.msg[0])
            abort();
        return 0;
    }
    for (uint32_t i = 0; i < c->nitems; i++) {
        const struct ckpt_item *it = &c->items[i];
        if (it->file >= c->nfiles || it->offset > INT64_MAX ||
            it->length > (uint64_t)INT64_MAX - it->offset)
            abort();
        if (it->kind == CKPT_ITEM_TENSOR) {
            if (it->tensor >= c->ntensors || it->chunk >= c->tensors[it->tensor].nchunks ||
                c->tensors[it->tensor].chunks[it->chunk].item != i)
                abort();
        } else if (it->bytes >= c->nbytes || c->bytes[it->bytes].item != i) {
            abort();
        }
        if (ckpt_check_relpath(c->files[it->file].name, strlen(c->files[it->file].name), NULL, 0))
            abort();
    }
    for (uint32_t t = 0; t < c->ntensors; t++) {
        const struct ckpt_tensor *tt = &c->tensors[t];
        if (!tt->elem_bits)
            abort();
        for (uint32_t k = 0; k < tt->nchunks; k++)
            for (uint32_t d = 0; d < tt->ndim; d++)
                if (tt->chunks[k].offsets[d] < 0 || tt->chunks[k].sizes[d] < 0 ||
                    tt->chunks[k].offsets[d] + tt->chunks[k].sizes[d] > tt->size[d])
                    abort();
    }
    for (uint32_t f = 0; f < c->nfiles; f++) {
        const struct ckpt_file *fi = &c->files[f];
        for (uint32_t k = 0; k < fi->nitems; k++) {
            const struct ckpt_item *it = &c->items[fi->items[k]];
            if (it->file != f || (k && it->offset < c->items[fi->items[k - 1]].offset))
                abort();
            if (!it->length)
                continue;
            /* overlapping items are possible in hostile input: only check
             * that the answer covers the byte */
            uint32_t a = ckpt_item_at(c, f, it->offset);
            uint32_t b = ckpt_item_at(c, f, it->offset + it->length - 1);
            if (a == CKPT_NONE || b == CKPT_NONE)
                abort();
            const struct ckpt_item *x = &c->items[a];
            if (it->offset < x->offset || it->offset - x->offset >= x->length)
                abort();
        }
    }
    ckpt_free(c);
    return 0;
}
