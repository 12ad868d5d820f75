/*
 * tests/fuzz/fuzz_safetensors.c - libFuzzer target for safetensors headers
 * (st_parse + st_build_ckpt) and the HF index json (st_index_parse).
 * Accepted headers must tile the data buffer exactly and every tensor's
 * byte count must match its shape and dtype.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct st_header *h = NULL;
    struct ckpt_err err;
    int rc = st_parse(data, size, size, &h, &err);
    if (rc) {
        if (h || err.code != rc || !err.msg[0])
            abort();
    } else {
        uint64_t total = 0;
        for (uint32_t t = 0; t < h->ntensors; t++) {
            const struct st_tensor *x = &h->tensors[t];
            unsigned __int128 bits = x->elem_bits;
            for (uint32_t d = 0; d < x->ndim; d++)
                if (__builtin_mul_overflow(bits, (unsigned __int128)x->shape[d], &bits))
                    abort(); /* accepted a shape whose size does not fit: a parser bug */
            if (x->end < x->begin || bits / 8 != x->end - x->begin || x->end > size)
                abort();
            total += x->end - x->begin;
        }
        if (h->data_start + total != size)
            abort();
        const char *name = "model.safetensors";
        struct ckpt *c = NULL;
        if (st_build_ckpt(&name, &h, 1, NULL, &c, &err) == 0) {
            if (c->nitems != h->ntensors)
                abort();
            ckpt_free(c);
        }
        st_free(h);
    }
    struct st_index *ix = NULL;
    rc = st_index_parse(data, size, &ix, &err);
    if (!rc) {
        for (uint32_t i = 0; i < ix->n; i++)
            if (ckpt_check_relpath(ix->file[i], strlen(ix->file[i]), NULL, 0))
                abort();
        st_index_free(ix);
    } else if (ix) {
        abort();
    }
    return 0;
}
