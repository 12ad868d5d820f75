/*
 * tests/unit/test_torch2_formats.c - the index against every format real
 * torch 2.6 / 2.14 writes (tests/fixtures/torch2, made by its
 * make_fixtures.py; expected JSON from torch's own readers): DCP with
 * storage_meta/version, zstd items (transform_descriptors; the stored
 * bytes, fetched whole), per-rank __R.metadata merged into one checkpoint,
 * DCP's SAFETENSORS serialization format (items placed on their tensor's
 * bytes), Hugging Face shards and index json. Each checkpoint is loaded
 * from its directory (ckpt_load), written to an LMDB index, and every item
 * torch reads is looked up at its first and last byte. Also the
 * model.safetensors.index.json parser on malformed input.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt.h"
#include "idxdb.h"
#include "load.h"
#include "safetensors.h"
#include "test_util.h"

#define FIX CKPTFS_TORCH2_FIXTURES

/* ---- a ckpt_io over a local directory ---- */

static int l_stat(void *ctx, const char *path, uint64_t *size, int *is_dir)
{
    char p[4096];
    struct stat s;
    snprintf(p, sizeof p, "%s/%s", (const char *)ctx, path);
    if (stat(p, &s))
        return -errno;
    *size = (uint64_t)s.st_size;
    *is_dir = S_ISDIR(s.st_mode);
    return 0;
}

static int l_read(void *ctx, const char *path, uint64_t off, void *buf, size_t len, size_t *got)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", (const char *)ctx, path);
    int fd = open(p, O_RDONLY);
    if (fd < 0)
        return -errno;
    ssize_t n = pread(fd, buf, len, (off_t)off);
    close(fd);
    if (n < 0)
        return -EIO;
    *got = (size_t)n;
    return 0;
}

static int l_list(void *ctx, const char *dir, ckpt_io_list_fn fn, void *arg)
{
    char p[4096];
    snprintf(p, sizeof p, "%s/%s", (const char *)ctx, dir);
    DIR *d = opendir(p);
    if (!d)
        return -errno;
    struct dirent *e;
    int rc = 0;
    while (!rc && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char q[4096 + 256 + 2];
        struct stat s;
        snprintf(q, sizeof q, "%s/%s", p, e->d_name);
        if (stat(q, &s) == 0)
            rc = fn(arg, e->d_name, S_ISDIR(s.st_mode), (uint64_t)s.st_size);
    }
    closedir(d);
    return rc > 0 ? 0 : rc;
}

static struct ckpt *load(const char *name)
{
    char root[4096];
    snprintf(root, sizeof root, "%s/%s", FIX, name);
    struct ckpt_io io = {.ctx = root, .stat = l_stat, .read = l_read, .list = l_list};
    struct ckpt *c = NULL;
    struct ckpt_err e = {0};
    int rc = ckpt_load(&io, "", NULL, &c, &e);
    cr_assert_eq(rc, 0, "%s: %s", name, e.msg);
    return c;
}

static json_t *expected(const char *name)
{
    char p[4096];
    json_error_t je;
    snprintf(p, sizeof p, "%s/%s.expected.json", FIX, name);
    json_t *j = json_load_file(p, 0, &je);
    cr_assert(j, "%s: %s", p, je.text);
    return j;
}

/* The expected item (fqn, file, offset, length, transforms) is one of c's. */
static uint32_t find_item(const struct ckpt *c, const char *fqn, const char *file, uint64_t off,
                          uint64_t len, json_t *td)
{
    for (uint32_t i = 0; i < c->nitems; i++) {
        const struct ckpt_item *it = &c->items[i];
        if (strcmp(it->fqn, fqn) || strcmp(c->files[it->file].name, file) || it->offset != off ||
            it->length != len)
            continue;
        cr_assert_eq(it->ntransforms, td ? json_array_size(td) : 0, "%s: transforms", fqn);
        for (uint32_t k = 0; k < it->ntransforms; k++)
            cr_assert_str_eq(it->transforms[k], json_string_value(json_array_get(td, k)));
        return i;
    }
    cr_assert_fail("no item %s in %s at [%llu, +%llu)", fqn, file, (unsigned long long)off,
                   (unsigned long long)len);
    return CKPT_NONE;
}

/* Every item of one storage list of the expected JSON is in c. */
static size_t check_storage(const struct ckpt *c, json_t *storage, int hf)
{
    size_t i;
    json_t *s;
    json_array_foreach(storage, i, s)
    {
        uint64_t off = json_integer_value(json_object_get(s, "offset"));
        uint64_t len = json_integer_value(json_object_get(s, "length"));
        json_t *tb = json_object_get(s, "tensor_bytes");
        if (tb) { /* SAFETENSORS format: where the tensor's bytes are */
            off = json_integer_value(json_object_get(tb, "begin"));
            len = json_integer_value(json_object_get(tb, "end")) - off;
        }
        find_item(c, json_string_value(json_object_get(s, "fqn")),
                  json_string_value(json_object_get(s, "relative_path")), off, len,
                  hf ? NULL : json_object_get(s, "transform_descriptors"));
    }
    return json_array_size(storage);
}

/* Every expected tensor, with its shape, element size and chunk offsets. */
static void check_tensors(const struct ckpt *c, json_t *tensors, int hf)
{
    size_t i;
    json_t *t;
    json_array_foreach(tensors, i, t)
    {
        const char *fqn = json_string_value(json_object_get(t, "fqn"));
        enum ckpt_item_kind kind;
        uint32_t k;
        cr_assert_eq(ckpt_find_fqn(c, fqn, &kind, &k), 0, "tensor %s missing", fqn);
        const struct ckpt_tensor *ct = &c->tensors[k];
        const char *dt = json_string_value(json_object_get(t, "dtype"));
        if (!hf)
            cr_assert_str_eq(ct->dtype, dt, "%s", fqn);
        cr_assert_eq(ct->elem_bits, ckpt_torch_dtype_bits(dt), "%s: %s", fqn, dt);
        json_t *size = json_object_get(t, "size");
        cr_assert_eq(ct->ndim, json_array_size(size), "%s", fqn);
        for (uint32_t d = 0; d < ct->ndim; d++)
            cr_assert_eq(ct->size[d], json_integer_value(json_array_get(size, d)), "%s", fqn);
        size_t j;
        json_t *ch;
        json_array_foreach(json_object_get(t, "chunks"), j, ch)
        {
            json_t *o = json_object_get(ch, "offsets");
            int hit = 0;
            for (uint32_t n = 0; n < ct->nchunks && !hit; n++) {
                hit = 1;
                for (uint32_t d = 0; d < ct->ndim; d++)
                    hit &= ct->chunks[n].offsets[d] == json_integer_value(json_array_get(o, d));
            }
            cr_assert(hit, "%s: chunk %zu missing", fqn, j);
        }
    }
}

/* Every item, at its first and last byte, in an LMDB index of c and in memory. */
static void check_lookups(const struct ckpt *c)
{
    char dir[] = "/tmp/ckptfs-t2idx-XXXXXX";
    cr_assert(mkdtemp(dir));
    struct idxdb *db;
    struct idxdb_txn *t;
    struct ckpt_err e = {0};
    uint64_t id;
    cr_assert_eq(idxdb_open(dir, NULL, &db, &e), 0, "%s", e.msg);
    cr_assert_eq(idxdb_put(db, "k", "fp", c, &id, &e), 0, "%s", e.msg);
    cr_assert_eq(idxdb_begin(db, &t, &e), 0);
    for (uint32_t i = 0; i < c->nitems; i++) {
        const struct ckpt_item *it = &c->items[i];
        if (!it->length)
            continue;
        uint64_t at[2] = {it->offset, it->offset + it->length - 1};
        for (int k = 0; k < 2; k++) {
            struct idxdb_span sp;
            uint32_t f;
            cr_assert_eq(idxdb_file_find(t, id, c->files[it->file].name, &f), 0);
            cr_assert_eq(idxdb_item_at(t, id, f, at[k], &sp), 0, "%s", it->fqn);
            cr_assert_eq(sp.item, i, "%s: byte %llu is item %u's", it->fqn,
                         (unsigned long long)at[k], sp.item);
            cr_assert(sp.offset == it->offset && sp.length == it->length);
            cr_assert_eq(ckpt_item_at(c, it->file, at[k]), i);
        }
    }
    idxdb_end(t);
    idxdb_close(db);
    rm_tree(dir);
}

static void check_fixture(const char *name, const char *sub)
{
    char path[512];
    snprintf(path, sizeof path, "%s%s%s", name, sub ? "/" : "", sub ? sub : "");
    struct ckpt *c = load(path);
    json_t *all = expected(name), *exp = sub ? json_object_get(all, sub) : all;
    cr_assert(exp, "%s: no '%s' in its expected JSON", name, sub);
    int hf = sub || strcmp(json_string_value(json_object_get(exp, "format")), "safetensors") == 0;
    size_t n = 0;
    json_t *parts = json_object_get(exp, "metadata_files");
    if (parts) {
        const char *k;
        json_t *md;
        json_object_foreach(parts, k, md)
        {
            n += check_storage(c, json_object_get(md, "storage"), 0);
            check_tensors(c, json_object_get(md, "tensors"), 0);
        }
    } else {
        n = check_storage(c, json_object_get(exp, "storage"), hf);
        check_tensors(c, json_object_get(exp, "tensors"), hf);
    }
    cr_assert_eq(c->nitems, n, "%s: %u items, torch reads %zu", name, c->nitems, n);
    for (uint32_t f = 0; f < c->nfiles; f++) /* torch writes no overlapping items */
        cr_assert_not(c->files[f].overlapping, "%s: items of %s overlap", name, c->files[f].name);
    check_lookups(c);
    json_decref(all);
    ckpt_free(c);
}

Test(torch2, dcp_2_6)
{
    check_fixture("t2.6/dtensor", NULL);
}
Test(torch2, dcp_2_14)
{
    check_fixture("t2.14/dtensor", NULL);
}
Test(torch2, zstd_items_are_their_stored_bytes)
{
    check_fixture("t2.14/zstd", NULL);
}
Test(torch2, per_rank_metadata_is_one_checkpoint)
{
    check_fixture("t2.14/per_rank_meta", NULL);
}
Test(torch2, safetensors_format_items_are_their_tensor_bytes)
{
    check_fixture("t2.14/st_format", NULL);
}
Test(torch2, hf_index_json)
{
    check_fixture("t2.14/hf", NULL);
}
Test(torch2, hf_consolidated)
{
    check_fixture("t2.14/hf_dist", NULL);
}
Test(torch2, hf_sharded_with_dcp_sharding_info)
{
    check_fixture("t2.14/hf_dist", "sharded");
}

Test(torch2, per_rank_storage_meta_and_version)
{
    struct ckpt *c = load("t2.14/per_rank_meta");
    cr_assert(c->dcp.has_version && c->dcp.version);
    cr_assert_str_eq(c->dcp.version, "1.0.0");
    cr_assert(c->dcp.storage_meta_set);
    cr_assert_eq(c->ntensors, 7);
    cr_assert_eq(c->nbytes, 2);
    cr_assert_eq(c->dcp.nmetadata_files, 2);
    cr_assert_str_eq(c->dcp.metadata_files[0], "__0.metadata");
    cr_assert_str_eq(c->dcp.metadata_files[1], "__1.metadata");
    ckpt_free(c);
}

/* ---- model.safetensors.index.json parser ---- */

static int index_parse(const char *json, struct ckpt_err *e)
{
    struct st_index *ix = NULL;
    int rc = st_index_parse(json, strlen(json), &ix, e);
    cr_assert(rc == 0 ? ix != NULL : ix == NULL);
    st_index_free(ix);
    return rc;
}

Test(torch2, index_json_from_torch)
{
    size_t n;
    char *b = slurp(FIX "/t2.14/hf/model.safetensors.index.json", &n);
    struct st_index *ix;
    struct ckpt_err e = {0};
    cr_assert_eq(st_index_parse(b, n, &ix, &e), 0, "%s", e.msg);
    cr_assert_eq(ix->n, 7);
    cr_assert_eq(ix->total_size, 10268);
    cr_assert_str_eq(ix->fqn[6], "model.\xc3\xbcn\xc3\xaf"
                                 "c\xc3\xb8"
                                 "d\xc3\xa9.\xce\xbb.weight");
    cr_assert_str_eq(ix->file[6], "model-00002-of-00002.safetensors");
    st_index_free(ix);
    free(b);
}

Test(torch2, index_json_malformed)
{
    static const struct {
        const char *json;
        int code;
        const char *msg;
    } cases[] = {
        {"", CKPT_EFORMAT, "safetensors index:"},
        {"{\"weight_map\": {\"a\": \"x.safetensors\"", CKPT_EFORMAT, "at byte"},
        {"[]", CKPT_EFORMAT, "no \"weight_map\""},
        {"{\"metadata\": {}}", CKPT_EFORMAT, "no \"weight_map\""},
        {"{\"weight_map\": []}", CKPT_EFORMAT, "no \"weight_map\""},
        {"{\"weight_map\": {\"a\": 1}}", CKPT_EFORMAT, "is not a string"},
        {"{\"weight_map\": {\"a\": \"../x.safetensors\"}}", CKPT_EINVALID, "'..'"},
        {"{\"weight_map\": {\"a\": \"/etc/passwd\"}}", CKPT_EINVALID, "weight_map['a']"},
        {"{\"weight_map\": {\"a\": \"\"}}", CKPT_EINVALID, "weight_map['a']"},
        {"{\"weight_map\": {\"a\": \"x\", \"a\": \"y\"}}", CKPT_EFORMAT, "duplicate"},
        {"{\"weight_map\": {\"a\": \"x\\u0000y\"}}", CKPT_EFORMAT, "safetensors index:"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        struct ckpt_err e = {0};
        int rc = index_parse(cases[i].json, &e);
        cr_assert_eq(rc, cases[i].code, "case %zu: %d (%s)", i, rc, e.msg);
        cr_assert(strstr(e.msg, cases[i].msg), "case %zu: '%s'", i, e.msg);
        cr_assert_eq(e.code, rc);
    }
    struct ckpt_err e = {0};
    cr_assert_eq(index_parse("{\"weight_map\": {}}", &e), 0); /* names nothing: valid */
    /* nesting is bounded (jansson's depth limit), not a stack overflow */
    size_t depth = 100000;
    char *deep = malloc(2 * depth + 64);
    strcpy(deep, "{\"weight_map\": {}, \"x\": ");
    size_t p = strlen(deep);
    memset(deep + p, '[', depth);
    memset(deep + p + depth, ']', depth);
    strcpy(deep + p + 2 * depth, "}");
    cr_assert_eq(index_parse(deep, &e), CKPT_EFORMAT, "%s", e.msg);
    free(deep);
    /* size is bounded before parsing (the reference's header limit) */
    size_t big = (size_t)ST_MAX_HEADER + 1;
    char *b = malloc(big);
    memset(b, ' ', big);
    struct st_index *ix = NULL;
    cr_assert_eq(st_index_parse(b, big, &ix, &e), CKPT_ELIMIT);
    cr_assert(strstr(e.msg, "limit"), "%s", e.msg);
    cr_assert_null(ix);
    free(b);
}
