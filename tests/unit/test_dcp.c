/*
 * tests/unit/test_dcp.c - DCP .metadata extraction (index/dcp.c) and the
 * checkpoint model (index/ckpt.c): every dcp-stub and real torch 1.13
 * fixture against its .expected.json, layout-order lookups, path checks.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcp.h"
#include "test_util.h"

static struct ckpt *parse_file(const char *path, int *rc, struct ckpt_err *err)
{
    size_t n;
    char *b = slurp(path, &n);
    struct ckpt *c = NULL;
    *rc = dcp_parse(b, n, NULL, &c, err);
    free(b);
    return c;
}

static void expect_i64s(json_t *a, const int64_t *v, uint32_t n, const char *what, const char *fqn)
{
    cr_assert(json_is_array(a), "%s %s", fqn, what);
    cr_assert_eq(json_array_size(a), n, "%s %s: rank", fqn, what);
    for (uint32_t i = 0; i < n; i++)
        cr_assert_eq(json_integer_value(json_array_get(a, i)), v[i], "%s %s[%u]", fqn, what, i);
}

static const char *jstr(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    cr_assert(json_is_string(v), "key %s", k);
    return json_string_value(v);
}

/* Compare c with the parse-result fields of an expected JSON file. */
static void compare(const struct ckpt *c, json_t *exp, const char *name)
{
    json_t *ts = json_object_get(exp, "tensors"), *bs = json_object_get(exp, "bytes"),
           *st = json_object_get(exp, "storage");
    cr_assert_eq(json_array_size(ts), c->ntensors, "%s: tensors", name);
    cr_assert_eq(json_array_size(bs), c->nbytes, "%s: bytes", name);
    cr_assert_eq(json_array_size(st), c->nitems, "%s: storage", name);
    cr_assert_eq(json_integer_value(json_object_get(exp, "pickle_protocol")), c->dcp.protocol);
    cr_assert_str_eq(jstr(exp, "metadata_class"), c->dcp.metadata_class);
    json_t *gl = json_object_get(exp, "globals");
    cr_assert_eq(json_array_size(gl), c->dcp.nglobals, "%s: globals", name);
    for (uint32_t i = 0; i < c->dcp.nglobals; i++)
        cr_assert_str_eq(json_string_value(json_array_get(gl, i)), c->dcp.globals[i]);
    for (uint32_t t = 0; t < c->ntensors; t++) {
        json_t *e = json_array_get(ts, t);
        const struct ckpt_tensor *tt = &c->tensors[t];
        cr_assert_str_eq(jstr(e, "fqn"), tt->fqn, "%s tensor %u", name, t);
        cr_assert_str_eq(jstr(e, "dtype"), tt->dtype);
        expect_i64s(json_object_get(e, "size"), tt->size, tt->ndim, "size", tt->fqn);
        json_t *p = json_object_get(e, "properties");
        cr_assert_str_eq(jstr(p, "layout"), tt->layout);
        cr_assert_str_eq(jstr(p, "memory_format"), tt->memory_format);
        cr_assert_eq(json_is_true(json_object_get(p, "requires_grad")), tt->requires_grad);
        cr_assert_eq(json_is_true(json_object_get(p, "pin_memory")), tt->pin_memory);
        json_t *es = json_object_get(e, "element_size");
        if (es)
            cr_assert_eq(json_integer_value(es), tt->elem_bits / 8);
        json_t *ch = json_object_get(e, "chunks");
        cr_assert_eq(json_array_size(ch), tt->nchunks);
        for (uint32_t k = 0; k < tt->nchunks; k++) {
            expect_i64s(json_object_get(json_array_get(ch, k), "offsets"), tt->chunks[k].offsets,
                        tt->ndim, "chunk offsets", tt->fqn);
            expect_i64s(json_object_get(json_array_get(ch, k), "sizes"), tt->chunks[k].sizes,
                        tt->ndim, "chunk sizes", tt->fqn);
            const struct ckpt_item *it = &c->items[tt->chunks[k].item];
            cr_assert_eq(it->tensor, t);
            cr_assert_eq(it->chunk, k);
        }
    }
    for (uint32_t b = 0; b < c->nbytes; b++)
        cr_assert_str_eq(jstr(json_array_get(bs, b), "fqn"), c->bytes[b].fqn);
    for (uint32_t i = 0; i < c->nitems; i++) {
        json_t *e = json_array_get(st, i);
        const struct ckpt_item *it = &c->items[i];
        cr_assert_str_eq(jstr(e, "fqn"), it->fqn, "%s item %u", name, i);
        cr_assert_str_eq(jstr(e, "relative_path"), c->files[it->file].name);
        cr_assert_eq((uint64_t)json_integer_value(json_object_get(e, "offset")), it->offset);
        cr_assert_eq((uint64_t)json_integer_value(json_object_get(e, "length")), it->length);
        json_t *hint = json_object_get(e, "index_hint");
        cr_assert_eq(json_is_null(hint) ? -1 : json_integer_value(hint), it->index_hint);
        json_t *co = json_object_get(e, "chunk_offset");
        if (json_is_null(co)) {
            cr_assert_eq(it->kind, CKPT_ITEM_BYTES);
        } else {
            const struct ckpt_tensor *tt = &c->tensors[it->tensor];
            expect_i64s(co, tt->chunks[it->chunk].offsets, tt->ndim, "chunk_offset", it->fqn);
        }
        json_t *td = json_object_get(e, "transform_descriptors");
        cr_assert_eq(td != NULL, it->has_transforms != 0, "%s: transforms", it->fqn);
        for (uint32_t k = 0; td && k < it->ntransforms; k++)
            cr_assert_str_eq(json_string_value(json_array_get(td, k)), it->transforms[k]);
    }
    json_error_t je;
    json_t *pd = json_loads(c->dcp.planner_data_json, JSON_DECODE_ANY, &je);
    cr_assert_not_null(pd);
    cr_assert(json_equal(pd, json_object_get(exp, "planner_data")), "%s: planner_data", name);
    json_decref(pd);
    json_t *sm = json_object_get(exp, "storage_meta");
    cr_assert_eq(sm != NULL, c->dcp.has_storage_meta != 0, "%s: storage_meta field", name);
    if (sm && !json_is_null(sm)) {
        cr_assert_str_eq(jstr(sm, "checkpoint_id"), c->dcp.checkpoint_id);
        cr_assert_str_eq(jstr(sm, "save_id"), c->dcp.save_id);
        cr_assert_null(c->dcp.load_id);
        cr_assert_eq(c->dcp.nmodules, 0);
    }
    json_t *ver = json_object_get(exp, "version");
    cr_assert_eq(ver != NULL, c->dcp.has_version != 0);
    if (ver)
        cr_assert_str_eq(json_string_value(ver), c->dcp.version);
}

static void stub_matches_expected(const char *path, const char *name, void *arg)
{
    (void)arg;
    char jpath[1024];
    snprintf(jpath, sizeof(jpath), "%.*s.expected.json", (int)(strlen(path) - 9), path);
    int rc;
    struct ckpt_err err;
    struct ckpt *c = parse_file(path, &rc, &err);
    cr_assert_eq(rc, 0, "%s: %s", name, err.msg);
    json_error_t je;
    json_t *exp = json_load_file(jpath, 0, &je);
    cr_assert_not_null(exp, "%s", jpath);
    compare(c, exp, name);
    cr_assert_eq(c->dcp.size, (uint64_t)json_integer_value(json_object_get(exp, "size")));
    json_decref(exp);
    ckpt_free(c);
}

Test(dcp, every_stub_fixture)
{
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/dcp-stub", CKPTFS_FIXTURES);
    int n = for_each_metadata(dir, stub_matches_expected, NULL);
    cr_assert_eq(n, 32, "found %d stub fixtures", n);
}

Test(dcp, real_torch_1_13)
{
    const char *names[] = {"per_item", "per_rank"};
    for (int i = 0; i < 2; i++) {
        char path[512], jpath[512];
        snprintf(path, sizeof(path), "%s/dcp-torch1.13/%s/.metadata", CKPTFS_FIXTURES, names[i]);
        snprintf(jpath, sizeof(jpath), "%s/dcp-torch1.13/%s.expected.json", CKPTFS_FIXTURES,
                 names[i]);
        int rc;
        struct ckpt_err err;
        struct ckpt *c = parse_file(path, &rc, &err);
        cr_assert_eq(rc, 0, "%s: %s", names[i], err.msg);
        json_error_t je;
        json_t *exp = json_load_file(jpath, 0, &je);
        compare(c, exp, names[i]);
        cr_assert_str_eq(c->dcp.enum_style, "name"); /* Debian's Python 3.11.2 */
        cr_assert_eq(c->files[0].rank, 0);
        json_decref(exp);
        ckpt_free(c);
    }
}

Test(dcp, layout_order_and_item_at)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/dcp-torch1.13/per_rank/.metadata", CKPTFS_FIXTURES);
    int rc;
    struct ckpt_err err;
    struct ckpt *c = parse_file(path, &rc, &err);
    cr_assert_eq(rc, 0);
    uint32_t f = ckpt_file_index(c, "__0_0.distcp");
    cr_assert_neq(f, CKPT_NONE);
    const struct ckpt_file *fi = &c->files[f];
    cr_assert(ckpt_file_in_save_order(c, f));
    for (uint32_t k = 0; k < fi->nitems; k++) {
        const struct ckpt_item *it = &c->items[fi->items[k]];
        if (k)
            cr_assert(it->offset >= c->items[fi->items[k - 1]].offset);
        /* first byte, last byte, one past the end */
        cr_assert_eq(ckpt_item_at(c, f, it->offset), fi->items[k]);
        cr_assert_eq(ckpt_item_at(c, f, it->offset + it->length - 1), fi->items[k]);
        uint32_t next = ckpt_item_at(c, f, it->offset + it->length);
        cr_assert_eq(next, k + 1 < fi->nitems ? fi->items[k + 1] : CKPT_NONE);
    }
    cr_assert_eq(ckpt_item_at(c, f, UINT64_MAX), CKPT_NONE);
    cr_assert_eq(ckpt_item_at(c, 99, 0), CKPT_NONE);
    enum ckpt_item_kind kind;
    uint32_t idx;
    cr_assert_eq(ckpt_find_fqn(c, "optim.step", &kind, &idx), 0);
    cr_assert_eq(kind, CKPT_ITEM_BYTES);
    cr_assert_eq(ckpt_find_fqn(c, "nope", &kind, &idx), CKPT_NOTFOUND);
    ckpt_free(c);
}

Test(dcp, relpath_rules)
{
    const char *ok[] = {"__0_0.distcp", "sub/__1_0.distcp", "a.b/c..d", "..x"};
    const char *bad[] = {"", "/etc/passwd", "../x", "a/../b", "a//b", "./a", "a/.", "a\\b", "a/"};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
        cr_assert_eq(ckpt_check_relpath(ok[i], strlen(ok[i]), NULL, 0), 0, "%s", ok[i]);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        cr_assert_eq(ckpt_check_relpath(bad[i], strlen(bad[i]), NULL, 0), CKPT_EINVALID, "%s",
                     bad[i]);
    cr_assert_eq(ckpt_check_relpath("a\0b", 3, NULL, 0), CKPT_EINVALID);
}

Test(dcp, rank_of)
{
    cr_assert_eq(ckpt_rank_of("__0_0.distcp"), 0);
    cr_assert_eq(ckpt_rank_of("__12_3.distcp"), 12);
    cr_assert_eq(ckpt_rank_of("dir/__7_0.distcp"), 7);
    cr_assert_eq(ckpt_rank_of("__0.metadata"), -1);
    cr_assert_eq(ckpt_rank_of("__a_0.distcp"), -1);
    cr_assert_eq(ckpt_rank_of("__1_.distcp"), -1);
    cr_assert_eq(ckpt_rank_of("model-00001-of-00002.safetensors"), -1);
}

Test(dcp, dtype_bits)
{
    cr_assert_eq(ckpt_torch_dtype_bits("bfloat16"), 16);
    cr_assert_eq(ckpt_torch_dtype_bits("float8_e4m3fn"), 8);
    cr_assert_eq(ckpt_torch_dtype_bits("not_a_dtype"), 0);
    cr_assert(dcp_global_allowed(NULL, "torch", "float32"));
    cr_assert(!dcp_global_allowed(NULL, "torch", "not_a_dtype"));
    cr_assert(!dcp_global_allowed(NULL, "os", "system"));
    cr_assert(!dcp_global_allowed(NULL, "builtins", "eval"));
    cr_assert(dcp_global_allowed(NULL, "torch.distributed.checkpoint.metadata", "Metadata"));
}

Test(dcp, not_metadata)
{
    struct ckpt *c;
    struct ckpt_err err;
    cr_assert_eq(dcp_parse("\x80\x02}.", 4, NULL, &c, &err), CKPT_EFORMAT);
    cr_assert_null(c);
    cr_assert_eq(err.pos, 2);
    /* a Metadata whose state is not a dict */
    const char m[] = "\x80\x02"
                     "ctorch.distributed.checkpoint.metadata\nMetadata\n)\x81K\x01"
                     "b.";
    cr_assert_eq(dcp_parse(m, sizeof(m) - 1, NULL, &c, &err), CKPT_EFORMAT);
}
