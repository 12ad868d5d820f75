/*
 * index/merge.c - one checkpoint model from the per-rank metadata files of
 * one DCP save (see ckpt.h, ckpt_merge).
 *
 * torch >= 2.9 dcp.save(..., use_collectives=False) has each rank R write
 * __R.metadata naming only its own items (its chunks of sharded tensors,
 * and its own copy of every replicated tensor and bytes entry) and no
 * global .metadata. The files, tensors and bytes entries are the union;
 * every item of every part is kept (each is a real byte range of a real
 * file). A chunk that several ranks stored (same tensor, same offsets) is
 * one chunk whose item is the first rank's; the other copies are items of
 * that chunk too (a rank loading __R.metadata reads its own copy).
 */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt.h"
#include "strmap.h"

struct merge {
    struct ckpt *c;
    struct strmap files, tensors, bytes, chunks;
    uint32_t *cap; /* per merged tensor: chunks it may get */
    struct ckpt_err *err;
};

static int nomem(struct merge *M)
{
    return ckpt_err_set(M->err, -ENOMEM, CKPT_NOPOS, "out of memory");
}

static const char *part_name(const struct ckpt *p)
{
    return p->source ? p->source : "a metadata file";
}

/* Tensor t of part p joins the merged tensor of its fqn: *out gets its index. */
static int add_tensor(struct merge *M, const struct ckpt *p, const struct ckpt_tensor *t,
                      uint32_t *out)
{
    struct ckpt *c = M->c;
    uint32_t k = c->ntensors;
    int r = strmap_put(&M->tensors, t->fqn, strlen(t->fqn), k, &k);
    if (r < 0)
        return nomem(M);
    if (r == 0) {
        c->tensors[k] = *t;
        c->tensors[k].nchunks = 0;
        c->tensors[k].chunks = NULL;
        M->cap[k] = 0;
        c->ntensors++;
    } else {
        const struct ckpt_tensor *m = &c->tensors[k];
        int same = m->ndim == t->ndim && strcmp(m->dtype, t->dtype) == 0;
        for (uint32_t d = 0; same && d < t->ndim; d++)
            same = m->size[d] == t->size[d];
        if (!same)
            return ckpt_err_set(M->err, CKPT_EINVALID, CKPT_NOPOS,
                                "'%s': %s gives it another dtype or shape than an earlier "
                                "rank's metadata",
                                t->fqn, part_name(p));
    }
    M->cap[k] += t->nchunks;
    *out = k;
    return 0;
}

/* Item i of part p, with its part's maps (files, tensors, bytes), appended. */
static int add_item(struct merge *M, const struct ckpt *p, uint32_t i, const uint32_t *fmap,
                    const uint32_t *tmap, const uint32_t *bmap)
{
    struct ckpt *c = M->c;
    const struct ckpt_item *it = &p->items[i];
    uint32_t n = c->nitems;
    struct ckpt_item *m = &c->items[n];
    *m = *it;
    m->file = fmap[it->file];
    if (it->kind == CKPT_ITEM_BYTES) {
        m->bytes = bmap[it->bytes];
        if (c->bytes[m->bytes].item == CKPT_NONE)
            c->bytes[m->bytes].item = n;
    } else {
        m->tensor = tmap[it->tensor];
        struct ckpt_tensor *t = &c->tensors[m->tensor];
        const struct ckpt_chunk *pc = &p->tensors[it->tensor].chunks[it->chunk];
        size_t klen = sizeof(uint32_t) + t->ndim * sizeof(int64_t);
        char *key = arena_alloc(&c->arena, klen);
        if (!key)
            return nomem(M);
        memcpy(key, &m->tensor, sizeof(uint32_t));
        if (t->ndim)
            memcpy(key + sizeof(uint32_t), pc->offsets, t->ndim * sizeof(int64_t));
        uint32_t ch = t->nchunks;
        int r = strmap_put(&M->chunks, key, klen, ch, &ch);
        if (r < 0)
            return nomem(M);
        if (r == 0) {
            assert(t->nchunks < M->cap[m->tensor]);
            t->chunks[ch] = *pc;
            t->chunks[ch].item = n;
            t->nchunks++;
        } else {
            for (uint32_t d = 0; d < t->ndim; d++)
                if (t->chunks[ch].sizes[d] != pc->sizes[d])
                    return ckpt_err_set(M->err, CKPT_EINVALID, CKPT_NOPOS,
                                        "'%s': %s stores a chunk at the offsets of an earlier "
                                        "rank's chunk with other sizes",
                                        t->fqn, part_name(p));
        }
        m->chunk = ch;
    }
    c->nitems++;
    return 0;
}

/* Files, tensors and bytes entries of part p joined; its maps filled. */
static int add_names(struct merge *M, const struct ckpt *p, uint32_t *fmap, uint32_t *tmap,
                     uint32_t *bmap)
{
    struct ckpt *c = M->c;
    for (uint32_t f = 0; f < p->nfiles; f++) {
        uint32_t k = c->nfiles;
        int r = strmap_put(&M->files, p->files[f].name, strlen(p->files[f].name), k, &k);
        if (r < 0)
            return nomem(M);
        if (r == 0) {
            c->files[k] = p->files[f];
            c->files[k].nitems = 0;
            c->files[k].items = NULL;
            c->files[k].overlapping = 0;
            c->nfiles++;
        }
        fmap[f] = k;
    }
    for (uint32_t t = 0; t < p->ntensors; t++) {
        int rc = add_tensor(M, p, &p->tensors[t], &tmap[t]);
        if (rc)
            return rc;
    }
    for (uint32_t b = 0; b < p->nbytes; b++) {
        uint32_t k = c->nbytes;
        const char *fqn = p->bytes[b].fqn;
        int r = strmap_put(&M->bytes, fqn, strlen(fqn), k, &k);
        if (r < 0)
            return nomem(M);
        if (r == 0) {
            c->bytes[k].fqn = fqn;
            c->bytes[k].item = CKPT_NONE;
            c->nbytes++;
        }
        bmap[b] = k;
    }
    return 0;
}

/* The whole merge into M->c (arrays allocated). */
static int merge_into(struct merge *M, struct ckpt *const *parts, uint32_t n, size_t nt)
{
    struct ckpt *c = M->c;
    uint32_t **maps = calloc((size_t)n * 3 + 1, sizeof(*maps));
    if (!maps)
        return nomem(M);
    int rc = 0;
    for (uint32_t i = 0; i < n && !rc; i++) {
        const struct ckpt *p = parts[i];
        maps[3 * i] = malloc((p->nfiles + 1) * sizeof(uint32_t));
        maps[3 * i + 1] = malloc((p->ntensors + 1) * sizeof(uint32_t));
        maps[3 * i + 2] = malloc((p->nbytes + 1) * sizeof(uint32_t));
        if (!maps[3 * i] || !maps[3 * i + 1] || !maps[3 * i + 2])
            rc = nomem(M);
        else
            rc = add_names(M, p, maps[3 * i], maps[3 * i + 1], maps[3 * i + 2]);
    }
    /* each merged tensor's chunk array, sized by what its parts hold */
    size_t nch = 0;
    for (uint32_t k = 0; !rc && k < c->ntensors; k++)
        nch += M->cap[k];
    struct ckpt_chunk *pool = rc ? NULL : arena_zalloc(&c->arena, (nch + 1) * sizeof(*pool));
    if (!rc && !pool)
        rc = nomem(M);
    for (uint32_t k = 0; !rc && k < c->ntensors; k++) {
        c->tensors[k].chunks = pool;
        pool += M->cap[k];
    }
    if (!rc && strmap_init(&M->chunks, nt))
        rc = nomem(M);
    for (uint32_t i = 0; i < n && !rc; i++)
        for (uint32_t k = 0; k < parts[i]->nitems && !rc; k++)
            rc = add_item(M, parts[i], k, maps[3 * i], maps[3 * i + 1], maps[3 * i + 2]);
    for (uint32_t i = 0; i < 3 * n; i++)
        free(maps[i]);
    free(maps);
    return rc;
}

int ckpt_merge(struct ckpt **parts, uint32_t n, struct ckpt **out, struct ckpt_err *err)
{
    *out = NULL;
    size_t nf = 0, nt = 0, ni = 0, nb = 0;
    for (uint32_t i = 0; i < n; i++) {
        nf += parts[i]->nfiles;
        nt += parts[i]->ntensors;
        ni += parts[i]->nitems;
        nb += parts[i]->nbytes;
    }
    struct merge M = {.c = ckpt_new(CKPT_FORMAT_DCP, 0), .err = err};
    struct ckpt *c = M.c;
    int rc = 0;
    if (n == 0 || ni >= UINT32_MAX / 2 || nf >= UINT32_MAX / 2 || nt >= UINT32_MAX / 2)
        rc = ckpt_err_set(err, n ? CKPT_ELIMIT : CKPT_ENOTCKPT, CKPT_NOPOS,
                          n ? "too many items in the metadata files" : "no metadata files");
    else if (!c || strmap_init(&M.files, nf) || strmap_init(&M.tensors, nt) ||
             strmap_init(&M.bytes, nb) || !(M.cap = calloc(nt + 1, sizeof(uint32_t))))
        rc = nomem(&M);
    if (!rc) {
        c->files = arena_zalloc(&c->arena, (nf + 1) * sizeof(*c->files));
        c->tensors = arena_zalloc(&c->arena, (nt + 1) * sizeof(*c->tensors));
        c->items = arena_zalloc(&c->arena, (ni + 1) * sizeof(*c->items));
        c->bytes = arena_zalloc(&c->arena, (nb + 1) * sizeof(*c->bytes));
        if (!c->files || !c->tensors || !c->items || !c->bytes)
            rc = nomem(&M);
    }
    if (!rc)
        rc = merge_into(&M, parts, n, nt);
    strmap_free(&M.files);
    strmap_free(&M.tensors);
    strmap_free(&M.bytes);
    strmap_free(&M.chunks);
    free(M.cap);
    if (!rc) {
        /* what the first rank's file says of the save; every string stays
         * where its parse put it */
        c->dcp = parts[0]->dcp;
        c->source = parts[0]->source;
        c->dcp.metadata_files = arena_alloc(&c->arena, n * sizeof(char *));
        if (!c->dcp.metadata_files)
            rc = nomem(&M);
        for (uint32_t i = 0; !rc && i < n; i++)
            c->dcp.metadata_files[i] = parts[i]->source;
        c->dcp.nmetadata_files = rc ? 0 : n;
    }
    if (!rc) {
        for (uint32_t i = 0; i < n; i++)
            arena_adopt(&c->arena, &parts[i]->arena);
        rc = ckpt_finish(c, err);
    }
    for (uint32_t i = 0; i < n; i++) {
        ckpt_free(parts[i]);
        parts[i] = NULL;
    }
    if (rc) {
        ckpt_free(c);
        return rc;
    }
    *out = c;
    return 0;
}
