/*
 * tests/unit/test_dcp_fold.c - the DCP fast path (pickle fold mode,
 * PKL_FOLDED) against the plain parse: on every DCP fixture the folded
 * parse must succeed on its own (no second parse) with records folded and
 * give a model equal field by field to the plain one, with the same value
 * count; on every malformed input the plain parse refuses, the folded one
 * must refuse too.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcp.h"
#include "test_util.h"

static void str_eq(const char *a, const char *b, const char *what, const char *name)
{
    cr_assert((a == NULL) == (b == NULL), "%s: %s NULL on one side", name, what);
    if (a)
        cr_assert_str_eq(a, b, "%s: %s", name, what);
}

static void i64s_eq(const int64_t *a, const int64_t *b, uint32_t n, const char *what,
                    const char *name)
{
    for (uint32_t i = 0; i < n; i++)
        cr_assert_eq(a[i], b[i], "%s: %s[%u]", name, what, i);
}

/* Every field of two models, strings by content. */
static void model_eq(const struct ckpt *a, const struct ckpt *b, const char *name)
{
    cr_assert_eq(a->nfiles, b->nfiles, "%s: files", name);
    cr_assert_eq(a->ntensors, b->ntensors, "%s: tensors", name);
    cr_assert_eq(a->nitems, b->nitems, "%s: items", name);
    cr_assert_eq(a->nbytes, b->nbytes, "%s: bytes", name);
    for (uint32_t f = 0; f < a->nfiles; f++) {
        const struct ckpt_file *x = &a->files[f], *y = &b->files[f];
        str_eq(x->name, y->name, "file name", name);
        cr_assert(x->rank == y->rank && x->size == y->size && x->present == y->present &&
                      x->data_start == y->data_start && x->nitems == y->nitems &&
                      x->overlapping == y->overlapping,
                  "%s: file %u", name, f);
        for (uint32_t k = 0; k < x->nitems; k++)
            cr_assert_eq(x->items[k], y->items[k], "%s: file %u layout", name, f);
    }
    for (uint32_t t = 0; t < a->ntensors; t++) {
        const struct ckpt_tensor *x = &a->tensors[t], *y = &b->tensors[t];
        str_eq(x->fqn, y->fqn, "fqn", name);
        str_eq(x->dtype, y->dtype, "dtype", name);
        str_eq(x->layout, y->layout, "layout", name);
        str_eq(x->memory_format, y->memory_format, "memory_format", name);
        cr_assert(x->elem_bits == y->elem_bits && x->ndim == y->ndim && x->nchunks == y->nchunks &&
                      x->requires_grad == y->requires_grad && x->pin_memory == y->pin_memory,
                  "%s: tensor %s", name, x->fqn);
        i64s_eq(x->size, y->size, x->ndim, "size", name);
        for (uint32_t k = 0; k < x->nchunks; k++) {
            i64s_eq(x->chunks[k].offsets, y->chunks[k].offsets, x->ndim, "offsets", name);
            i64s_eq(x->chunks[k].sizes, y->chunks[k].sizes, x->ndim, "sizes", name);
            cr_assert_eq(x->chunks[k].item, y->chunks[k].item, "%s: %s chunk %u item", name, x->fqn,
                         k);
        }
    }
    for (uint32_t i = 0; i < a->nitems; i++) {
        const struct ckpt_item *x = &a->items[i], *y = &b->items[i];
        str_eq(x->fqn, y->fqn, "item fqn", name);
        cr_assert(x->kind == y->kind && x->tensor == y->tensor && x->chunk == y->chunk &&
                      x->bytes == y->bytes && x->file == y->file && x->offset == y->offset &&
                      x->length == y->length && x->index_hint == y->index_hint &&
                      x->ntransforms == y->ntransforms && x->has_transforms == y->has_transforms,
                  "%s: item %u", name, i);
        for (uint32_t k = 0; k < x->ntransforms; k++)
            str_eq(x->transforms[k], y->transforms[k], "transform", name);
    }
    for (uint32_t k = 0; k < a->nbytes; k++) {
        str_eq(a->bytes[k].fqn, b->bytes[k].fqn, "bytes fqn", name);
        cr_assert_eq(a->bytes[k].item, b->bytes[k].item, "%s: bytes %u", name, k);
    }
    const struct ckpt_dcp_info *x = &a->dcp, *y = &b->dcp;
    cr_assert(x->protocol == y->protocol && x->nfields == y->nfields &&
                  x->nglobals == y->nglobals && x->size == y->size &&
                  x->has_storage_meta == y->has_storage_meta &&
                  x->storage_meta_set == y->storage_meta_set && x->nmodules == y->nmodules &&
                  x->has_version == y->has_version &&
                  memcmp(x->opcodes, y->opcodes, sizeof(x->opcodes)) == 0,
              "%s: dcp info", name);
    str_eq(x->metadata_class, y->metadata_class, "metadata_class", name);
    for (uint32_t i = 0; i < x->nfields; i++)
        str_eq(x->fields[i], y->fields[i], "field", name);
    for (uint32_t i = 0; i < x->nglobals; i++)
        str_eq(x->globals[i], y->globals[i], "global", name);
    for (uint32_t i = 0; i < x->nmodules; i++)
        str_eq(x->modules[i], y->modules[i], "module", name);
    str_eq(x->enum_style, y->enum_style, "enum_style", name);
    str_eq(x->path_style, y->path_style, "path_style", name);
    str_eq(x->checkpoint_id, y->checkpoint_id, "checkpoint_id", name);
    str_eq(x->save_id, y->save_id, "save_id", name);
    str_eq(x->load_id, y->load_id, "load_id", name);
    str_eq(x->version, y->version, "version", name);
    str_eq(x->planner_data_json, y->planner_data_json, "planner_data", name);
}

static int parse(const char *buf, size_t n, int fold, struct ckpt **c, struct ckpt_err *err)
{
    struct dcp_options o;
    dcp_options_default(&o);
    o.pkl.fold = fold;
    o.no_refold = 1;
    return dcp_parse(buf, n, &o, c, err);
}

/* Values and folded records of the pickle parse alone. */
static void count(const char *buf, size_t n, int fold, size_t *values, size_t *folded)
{
    struct dcp_options o;
    dcp_options_default(&o);
    o.pkl.fold = fold;
    struct pkl_doc *doc;
    struct ckpt_err err;
    cr_assert_eq(pkl_parse(buf, n, &o.pkl, &doc, &err), 0, "%s", err.msg);
    *values = doc->nvalues;
    *folded = doc->nfolded;
    pkl_free(doc);
}

/* A valid file: both parses succeed, alike; returns the records folded. */
static size_t same_model(const char *path)
{
    size_t n;
    char *buf = slurp(path, &n);
    cr_assert_not_null(buf, "%s", path);
    struct ckpt *plain = NULL, *fast = NULL;
    struct ckpt_err e1, e2;
    int rc = parse(buf, n, 0, &plain, &e1);
    cr_assert_eq(rc, 0, "%s: %s", path, e1.msg);
    rc = parse(buf, n, 1, &fast, &e2);
    cr_assert_eq(rc, 0, "%s: folded parse failed: %s", path, e2.msg);
    model_eq(fast, plain, path);
    size_t v0, v1, f0, f1;
    count(buf, n, 0, &v0, &f0);
    count(buf, n, 1, &v1, &f1);
    cr_assert_eq(f0, 0);
    cr_assert_eq(v0, v1, "%s: %zu values plain, %zu folded", path, v0, v1);
    ckpt_free(plain);
    ckpt_free(fast);
    free(buf);
    return f1;
}

static void stub_folds_the_same(const char *path, const char *name, void *arg)
{
    (void)arg;
    size_t folded = same_model(path);
    /* the first record of each class carries its class GLOBAL and key
     * strings and stays plain; the rest fold (single-tensor has one of each) */
    if (!strstr(name, "single-tensor"))
        cr_assert_gt(folded, 0, "%s: nothing folded", name);
}

Test(dcp_fold, every_stub_fixture_folds_to_the_same_model)
{
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/dcp-stub", CKPTFS_FIXTURES);
    int n = for_each_metadata(dir, stub_folds_the_same, NULL);
    cr_assert_eq(n, 32, "found %d stub fixtures", n);
}

Test(dcp_fold, real_torch_1_13_folds_to_the_same_model)
{
    const char *names[] = {"per_item", "per_rank"};
    for (int i = 0; i < 2; i++) {
        char path[512];
        snprintf(path, sizeof(path), "%s/dcp-torch1.13/%s/.metadata", CKPTFS_FIXTURES, names[i]);
        cr_assert_gt(same_model(path), 0, "%s: nothing folded", names[i]);
    }
}

/* Every malformed pickle: where the plain parse refuses, so does the
 * folded one (it may refuse more, since dcp_parse then parses plainly). */
static void refused_as_plainly(const char *path, const char *name, void *arg)
{
    (void)arg;
    size_t len;
    char *buf = slurp(path, &len);
    cr_assert_not_null(buf, "%s", path);
    struct ckpt *plain = NULL, *fast = NULL;
    struct ckpt_err e1, e2;
    int r0 = parse(buf, len, 0, &plain, &e1), r1 = parse(buf, len, 1, &fast, &e2);
    if (r0)
        cr_assert_neq(r1, 0, "%s: folded parse accepts what the plain one refuses (%s)", name,
                      e1.msg);
    else if (r1 == 0)
        model_eq(fast, plain, name);
    /* and dcp_parse as callers use it gives the plain parse's error */
    struct ckpt *c = NULL;
    struct ckpt_err e3;
    int r3 = dcp_parse(buf, len, NULL, &c, &e3);
    cr_assert_eq(r3, r0, "%s", name);
    if (r0)
        cr_assert_str_eq(e3.msg, e1.msg, "%s", name);
    ckpt_free(plain);
    ckpt_free(fast);
    ckpt_free(c);
    free(buf);
}

Test(dcp_fold, malformed_inputs_the_plain_parse_refuses_are_refused)
{
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/malformed", CKPTFS_FIXTURES);
    int n = for_each_metadata(dir, refused_as_plainly, NULL);
    cr_assert_gt(n, 40, "found %d malformed pickles", n);
}
