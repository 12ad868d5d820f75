/*
 * tests/unit/test_safetensors.c - safetensors headers and the Hugging Face
 * layout (index/safetensors.c): every fixture against its expected JSON,
 * header-length edge cases, index json, shard joining.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"
#include "test_util.h"

static struct st_header *load(const char *rel, int *rc, struct ckpt_err *err)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/safetensors/%s", CKPTFS_FIXTURES, rel);
    size_t n;
    char *b = slurp(path, &n);
    struct st_header *h = NULL;
    *rc = st_parse(b, n, n, &h, err);
    free(b);
    return h;
}

static void check_fixture(const char *rel)
{
    int rc;
    struct ckpt_err err;
    struct st_header *h = load(rel, &rc, &err);
    cr_assert_eq(rc, 0, "%s: %s", rel, err.msg);
    char jpath[512];
    snprintf(jpath, sizeof(jpath), "%s/safetensors/%.*s.expected.json", CKPTFS_FIXTURES,
             (int)(strlen(rel) - strlen(".safetensors")), rel);
    json_error_t je;
    json_t *exp = json_load_file(jpath, 0, &je);
    cr_assert_not_null(exp, "%s", jpath);
    cr_assert_eq(json_integer_value(json_object_get(exp, "header_len")), h->header_len);
    cr_assert_eq(json_integer_value(json_object_get(exp, "data_start")), h->data_start);
    cr_assert_eq(json_integer_value(json_object_get(exp, "file_size")), h->file_size);
    json_t *md = json_object_get(exp, "metadata");
    cr_assert_eq(!json_is_null(md), h->has_metadata);
    cr_assert_eq(json_is_null(md) ? 0 : json_object_size(md), h->nmeta);
    for (uint32_t k = 0; k < h->nmeta; k++)
        cr_assert_str_eq(json_string_value(json_object_get(md, h->meta_keys[k])), h->meta_values[k],
                         "%s: %s", rel, h->meta_keys[k]);
    json_t *ts = json_object_get(exp, "tensors");
    cr_assert_eq(json_array_size(ts), h->ntensors);
    for (uint32_t t = 0; t < h->ntensors; t++) {
        json_t *e = json_array_get(ts, t);
        const struct st_tensor *x = &h->tensors[t];
        cr_assert_str_eq(json_string_value(json_object_get(e, "name")), x->name);
        cr_assert_str_eq(json_string_value(json_object_get(e, "dtype")), x->dtype);
        json_t *sh = json_object_get(e, "shape");
        cr_assert_eq(json_array_size(sh), x->ndim);
        for (uint32_t d = 0; d < x->ndim; d++)
            cr_assert_eq(json_integer_value(json_array_get(sh, d)), x->shape[d]);
        json_t *off = json_object_get(e, "data_offsets");
        cr_assert_eq((uint64_t)json_integer_value(json_array_get(off, 0)), x->begin);
        cr_assert_eq((uint64_t)json_integer_value(json_array_get(off, 1)), x->end);
        cr_assert_eq((uint64_t)json_integer_value(json_object_get(e, "abs_begin")),
                     h->data_start + x->begin);
    }
    json_decref(exp);
    st_free(h);
}

Test(safetensors, fixtures)
{
    check_fixture("basic.safetensors");
    check_fixture("no_metadata_unaligned.safetensors");
    check_fixture("hf-dcp/model-00001-of-00002.safetensors");
    check_fixture("hf-dcp/model-00002-of-00002.safetensors");
    check_fixture("hf-dcp-sharded/shard-00001-model-00001-of-00001.safetensors");
    check_fixture("hf-dcp-sharded/shard-00002-model-00001-of-00001.safetensors");
}

Test(safetensors, header_len)
{
    unsigned char p[8] = {16, 0, 0, 0, 0, 0, 0, 0};
    uint64_t h;
    struct ckpt_err err;
    cr_assert_eq(st_header_len(p, 8, 24, &h, &err), 0);
    cr_assert_eq(h, 16);
    cr_assert_eq(st_header_len(p, 8, 23, &h, &err), CKPT_ETRUNC);
    cr_assert_eq(st_header_len(p, 7, 24, &h, &err), CKPT_ETRUNC);
    p[0] = 0;
    cr_assert_eq(st_header_len(p, 8, 24, &h, &err), CKPT_EFORMAT);
    memset(p, 0xff, 8);
    cr_assert_eq(st_header_len(p, 8, UINT64_MAX, &h, &err), CKPT_ELIMIT);
    uint64_t over = ST_MAX_HEADER + 1ull;
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(over >> (8 * i));
    cr_assert_eq(st_header_len(p, 8, over + 8, &h, &err), CKPT_ELIMIT);
}

static int parse_raw(const char *json, size_t data_len)
{
    size_t hl = strlen(json);
    size_t n = 8 + hl + data_len;
    unsigned char *b = calloc(1, n);
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, json, hl);
    struct st_header *h = NULL;
    struct ckpt_err err;
    int rc = st_parse(b, n, n, &h, &err);
    st_free(h);
    free(b);
    return rc;
}

Test(safetensors, rules)
{
    cr_assert_eq(parse_raw("{}", 0), 0); /* empty file of tensors */
    cr_assert_eq(parse_raw("{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}   ", 4),
                 0);
    cr_assert_eq(parse_raw("{\"a\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2),
                 CKPT_EINVALID); /* 12 bits is not whole bytes */
    cr_assert_eq(parse_raw("{\"a\":{\"dtype\":\"F4\",\"shape\":[4],\"data_offsets\":[0,2]}}", 2),
                 0);
    cr_assert_eq(parse_raw("{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]},"
                           "\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
                           1),
                 0); /* empty tensor sharing an offset */
    cr_assert_eq(parse_raw("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 2),
                 CKPT_EINVALID); /* trailing byte */
    cr_assert_eq(parse_raw("{\"a\":1}", 0), CKPT_EFORMAT);
    cr_assert_eq(parse_raw("{\"__metadata__\":[]}", 0), CKPT_EFORMAT);
    cr_assert_eq(parse_raw("{\"a\":{\"dtype\":\"U8\",\"shape\":\"x\",\"data_offsets\":[0,0]}}", 0),
                 CKPT_ETYPE);
}

Test(safetensors, hf_index_and_shards)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/safetensors/hf-dcp/model.safetensors.index.json",
             CKPTFS_FIXTURES);
    size_t n;
    char *b = slurp(path, &n);
    struct st_index *ix;
    struct ckpt_err err;
    cr_assert_eq(st_index_parse(b, n, &ix, &err), 0, "%s", err.msg);
    free(b);
    cr_assert_eq(ix->n, 4);
    cr_assert_eq(ix->total_size, 62);
    cr_assert_str_eq(ix->file[3], "model-00002-of-00002.safetensors");
    cr_assert_str_eq(ix->fqn[3], "model.\xc3\xbcn\xc3\xaf"
                                 "c\xc3\xb8"
                                 "d\xc3\xa9.\xce\xbb.weight");
    int rc;
    struct st_header *h[2];
    h[0] = load("hf-dcp/model-00001-of-00002.safetensors", &rc, &err);
    h[1] = load("hf-dcp/model-00002-of-00002.safetensors", &rc, &err);
    const char *names[] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
    struct ckpt *c;
    cr_assert_eq(st_build_ckpt(names, h, 2, ix, &c, &err), 0, "%s", err.msg);
    cr_assert_eq(c->ntensors, 4);
    cr_assert_eq(c->nitems, 4);
    ckpt_free(c);
    /* an index naming a tensor the files lack */
    const char bad[] = "{\"weight_map\":{\"nope\":\"model-00001-of-00002.safetensors\"}}";
    struct st_index *ix2;
    cr_assert_eq(st_index_parse(bad, sizeof(bad) - 1, &ix2, &err), 0);
    cr_assert_eq(st_build_ckpt(names, h, 2, ix2, &c, &err), CKPT_EINVALID);
    st_index_free(ix2);
    const char esc[] = "{\"weight_map\":{\"a\":\"../x.safetensors\"}}";
    cr_assert_eq(st_index_parse(esc, sizeof(esc) - 1, &ix2, &err), CKPT_EINVALID);
    st_index_free(ix);
    st_free(h[0]);
    st_free(h[1]);

    /* save_sharded: two files with the same fqn become two chunks */
    h[0] = load("hf-dcp-sharded/shard-00001-model-00001-of-00001.safetensors", &rc, &err);
    h[1] = load("hf-dcp-sharded/shard-00002-model-00001-of-00001.safetensors", &rc, &err);
    const char *sn[] = {"shard-00001-model-00001-of-00001.safetensors",
                        "shard-00002-model-00001-of-00001.safetensors"};
    cr_assert_eq(st_build_ckpt(sn, h, 2, NULL, &c, &err), 0, "%s", err.msg);
    cr_assert_eq(c->ntensors, 1);
    cr_assert_eq(c->tensors[0].nchunks, 2);
    cr_assert_eq(c->tensors[0].size[0], 6);
    cr_assert_eq(c->tensors[0].size[1], 3);
    cr_assert_eq(c->tensors[0].chunks[1].offsets[0], 3);
    ckpt_free(c);
    /* the same file twice without sharding info is refused */
    struct st_header *b2[2];
    b2[0] = load("basic.safetensors", &rc, &err);
    b2[1] = load("basic.safetensors", &rc, &err);
    const char *bn[] = {"a.safetensors", "b.safetensors"};
    cr_assert_eq(st_build_ckpt(bn, b2, 2, NULL, &c, &err), CKPT_EINVALID);
    st_free(b2[0]);
    st_free(b2[1]);
    st_free(h[0]);
    st_free(h[1]);
}

Test(safetensors, dtype_bits)
{
    cr_assert_eq(st_dtype_bits("BF16"), 16);
    cr_assert_eq(st_dtype_bits("F8_E4M3"), 8);
    cr_assert_eq(st_dtype_bits("F7"), 0);
}
