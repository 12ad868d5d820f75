/*
 * tests/fuzz/fuzz_dcp.c - libFuzzer target for DCP .metadata extraction.
 * Accepted metadata must satisfy the model's invariants: every item in a
 * valid file with offset + length <= INT64_MAX, every chunk inside its
 * tensor and bound to an item of that tensor, files' items in layout order,
 * and ckpt_item_at() finding each non-empty item at its first and last byte.
 * Differential: a parse with folded records (the fast path, without its
 * plain retry) may accept only what the plain parse accepts, with the same
 * items, chunks and files.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "dcp.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int parse_mode(const uint8_t *data, size_t size, int fold, struct ckpt **c)
{
    struct dcp_options o;
    struct ckpt_err err;
    dcp_options_default(&o);
    o.pkl.fold = fold;
    o.no_refold = 1;
    return dcp_parse(data, size, &o, c, &err);
}

static void same_model(const struct ckpt *a, const struct ckpt *b)
{
    if (a->nitems != b->nitems || a->ntensors != b->ntensors || a->nfiles != b->nfiles ||
        a->nbytes != b->nbytes)
        abort();
    for (uint32_t i = 0; i < a->nitems; i++) {
        const struct ckpt_item *x = &a->items[i], *y = &b->items[i];
        if (strcmp(x->fqn, y->fqn) || x->kind != y->kind || x->tensor != y->tensor ||
            x->chunk != y->chunk || x->file != y->file || x->offset != y->offset ||
            x->length != y->length || x->index_hint != y->index_hint ||
            x->ntransforms != y->ntransforms)
            abort();
    }
    for (uint32_t f = 0; f < a->nfiles; f++)
        if (strcmp(a->files[f].name, b->files[f].name))
            abort();
    for (uint32_t t = 0; t < a->ntensors; t++) {
        const struct ckpt_tensor *x = &a->tensors[t], *y = &b->tensors[t];
        if (x->ndim != y->ndim || x->nchunks != y->nchunks || strcmp(x->fqn, y->fqn))
            abort();
        for (uint32_t k = 0; k < x->nchunks; k++)
            if (memcmp(x->chunks[k].offsets, y->chunks[k].offsets, x->ndim * sizeof(int64_t)) ||
                memcmp(x->chunks[k].sizes, y->chunks[k].sizes, x->ndim * sizeof(int64_t)))
                abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct ckpt *fast = NULL, *plain = NULL;
    int rf = parse_mode(data, size, 1, &fast), rp = parse_mode(data, size, 0, &plain);
    if (rf == 0 && rp != 0)
        abort(); /* the fast path accepted what the plain parse refuses */
    if (rf == 0)
        same_model(fast, plain);
    ckpt_free(fast);
    ckpt_free(plain);

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
