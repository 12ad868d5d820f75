/*
 * index/safetensors.c - safetensors header + HF index parsing (see
 * safetensors.h). jansson does the JSON (UTF-8 checks, duplicate keys,
 * depth limit of 2048); this file checks the safetensors rules.
 */
#include "safetensors.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strmap.h"

static const struct {
    const char *name;
    uint32_t bits;
} st_dtypes[] = {
    {"BOOL", 8},    {"U8", 8},   {"I8", 8},   {"F8_E5M2", 8}, {"F8_E4M3", 8},
    {"F8_E8M0", 8}, {"I16", 16}, {"U16", 16}, {"F16", 16},    {"BF16", 16},
    {"I32", 32},    {"U32", 32}, {"F32", 32}, {"F64", 64},    {"I64", 64},
    {"U64", 64},    {"C64", 64}, {"F4", 4},   {"F6_E2M3", 6}, {"F6_E3M2", 6},
};

uint32_t st_dtype_bits(const char *name)
{
    for (size_t i = 0; i < sizeof(st_dtypes) / sizeof(st_dtypes[0]); i++)
        if (strcmp(st_dtypes[i].name, name) == 0)
            return st_dtypes[i].bits;
    return 0;
}

#define FAIL(code, pos, ...) ckpt_err_set(err, (code), (pos), "safetensors: " __VA_ARGS__)

int st_header_len(const void *prefix, size_t n, uint64_t file_size, uint64_t *hlen,
                  struct ckpt_err *err)
{
    if (n < ST_PREFIX_LEN || file_size < ST_PREFIX_LEN)
        return FAIL(CKPT_ETRUNC, 0, "file of %" PRIu64 " bytes is shorter than the 8-byte prefix",
                    file_size < n ? file_size : (uint64_t)n);
    const uint8_t *p = prefix;
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    if (v == 0)
        return FAIL(CKPT_EFORMAT, 0, "header length is 0");
    if (v > ST_MAX_HEADER)
        return FAIL(CKPT_ELIMIT, 0, "header length %" PRIu64 " exceeds the limit of %u bytes", v,
                    ST_MAX_HEADER);
    if (v > file_size - ST_PREFIX_LEN)
        return FAIL(CKPT_ETRUNC, 0,
                    "header length %" PRIu64 " exceeds the %" PRIu64 " bytes after the prefix", v,
                    file_size - ST_PREFIX_LEN);
    *hlen = v;
    return 0;
}

void st_free(struct st_header *h)
{
    if (!h)
        return;
    arena_release(&h->arena);
    free(h);
}

struct span {
    uint64_t begin, end;
    uint32_t t;
};

static int span_cmp(const void *a, const void *b)
{
    const struct span *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return x->t < y->t ? -1 : (x->t > y->t);
}

static int get_u64(const json_t *j, uint64_t *out)
{
    if (!json_is_integer(j) || json_integer_value(j) < 0)
        return -1;
    *out = (uint64_t)json_integer_value(j);
    return 0;
}

/* DCP_SHARDING_INFO: JSON text {fqn: {"saved_offsets": [...]}} */
static int apply_sharding(struct st_header *h, const char *text, struct ckpt_err *err)
{
    json_error_t je;
    json_t *j = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    if (!j || !json_is_object(j)) {
        json_decref(j);
        return FAIL(CKPT_EFORMAT, CKPT_NOPOS, "DCP_SHARDING_INFO is not a JSON object");
    }
    int rc = 0;
    for (uint32_t t = 0; t < h->ntensors && !rc; t++) {
        struct st_tensor *ts = &h->tensors[t];
        json_t *e = json_object_get(j, ts->name);
        if (!e)
            continue;
        json_t *so = json_object_get(e, "saved_offsets");
        if (!json_is_array(so) || json_array_size(so) != ts->ndim) {
            rc = FAIL(CKPT_EINVALID, CKPT_NOPOS, "'%s': saved_offsets is not a list of %u integers",
                      ts->name, ts->ndim);
            break;
        }
        int64_t *o = arena_alloc(&h->arena, (ts->ndim + 1) * sizeof(int64_t));
        if (!o) {
            rc = FAIL(-ENOMEM, CKPT_NOPOS, "out of memory");
            break;
        }
        for (uint32_t d = 0; d < ts->ndim; d++) {
            uint64_t u;
            if (get_u64(json_array_get(so, d), &u) || u > (uint64_t)INT64_MAX) {
                rc = FAIL(CKPT_EINVALID, CKPT_NOPOS, "'%s': bad saved_offsets[%u]", ts->name, d);
                break;
            }
            o[d] = (int64_t)u;
        }
        ts->saved_offsets = o;
    }
    json_decref(j);
    return rc;
}

static int parse_tensor(struct st_header *h, struct st_tensor *ts, const char *name, json_t *v,
                        struct ckpt_err *err)
{
    if (!json_is_object(v))
        return FAIL(CKPT_EFORMAT, 8, "'%s' is not a JSON object", name);
    json_t *dt = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape"),
           *offs = json_object_get(v, "data_offsets");
    if (!dt || !shape || !offs)
        return FAIL(CKPT_EFORMAT, 8, "'%s' lacks %s", name,
                    !dt      ? "dtype"
                    : !shape ? "shape"
                             : "data_offsets");
    if (!json_is_string(dt))
        return FAIL(CKPT_ETYPE, 8, "'%s': dtype is not a string", name);
    ts->elem_bits = st_dtype_bits(json_string_value(dt));
    if (!ts->elem_bits)
        return FAIL(CKPT_EINVALID, 8, "'%s': unknown dtype '%s'", name, json_string_value(dt));
    ts->name = arena_strndup(&h->arena, name, strlen(name));
    ts->dtype = arena_strndup(&h->arena, json_string_value(dt), strlen(json_string_value(dt)));
    if (!json_is_array(shape) || json_array_size(shape) > 64)
        return FAIL(CKPT_ETYPE, 8, "'%s': shape is not a list of at most 64 integers", name);
    ts->ndim = (uint32_t)json_array_size(shape);
    int64_t *sh = arena_alloc(&h->arena, (ts->ndim + 1) * sizeof(int64_t));
    if (!ts->name || !ts->dtype || !sh)
        return FAIL(-ENOMEM, CKPT_NOPOS, "out of memory");
    unsigned __int128 bits = ts->elem_bits;
    for (uint32_t d = 0; d < ts->ndim; d++) {
        uint64_t u;
        if (get_u64(json_array_get(shape, d), &u))
            return FAIL(CKPT_EINVALID, 8, "'%s': shape[%u] is not a non-negative integer", name, d);
        sh[d] = (int64_t)u;
        /* checked before multiplying: bits <= 2^67 and u < 2^63, so the
         * product itself could wrap 128 bits and pass a check made after */
        if (u && bits > ((unsigned __int128)UINT64_MAX * 8) / u)
            return FAIL(CKPT_EINVALID, 8, "'%s': numel * itemsize overflows 64 bits", name);
        bits *= u;
    }
    ts->shape = sh;
    if (!json_is_array(offs) || json_array_size(offs) != 2 ||
        get_u64(json_array_get(offs, 0), &ts->begin) || get_u64(json_array_get(offs, 1), &ts->end))
        return FAIL(CKPT_EINVALID, 8, "'%s': data_offsets is not two non-negative integers", name);
    if (ts->begin > ts->end)
        return FAIL(CKPT_EINVALID, 8, "'%s': data_offsets [%" PRIu64 ", %" PRIu64 ") reversed",
                    name, ts->begin, ts->end);
    uint64_t buf = h->file_size - h->data_start;
    if (ts->end > buf)
        return FAIL(CKPT_EINVALID, 8,
                    "'%s': data_offsets end %" PRIu64 " is beyond the %" PRIu64 "-byte data buffer",
                    name, ts->end, buf);
    if (bits % 8)
        return FAIL(CKPT_EINVALID, 8, "'%s': %u-bit elements do not fill whole bytes", name,
                    ts->elem_bits);
    uint64_t nbytes = (uint64_t)(bits / 8);
    if (ts->end - ts->begin != nbytes)
        return FAIL(CKPT_EINVALID, 8,
                    "'%s': shape needs %" PRIu64 " bytes, data_offsets give %" PRIu64, name, nbytes,
                    ts->end - ts->begin);
    assert(ts->begin <= ts->end && ts->end <= h->file_size - h->data_start);
    return 0;
}

int st_parse_header(const void *json, size_t hlen, uint64_t file_size, struct st_header **out,
                    struct ckpt_err *err)
{
    *out = NULL;
    ckpt_err_clear(err);
    if (hlen == 0 || hlen > ST_MAX_HEADER || hlen > file_size - ST_PREFIX_LEN ||
        file_size < ST_PREFIX_LEN)
        return FAIL(CKPT_EFORMAT, 0, "bad header length %zu", hlen);
    const char *s = json;
    if (s[0] != '{')
        return FAIL(CKPT_EFORMAT, 8, "header does not start with '{'");
    json_error_t je;
    json_t *root = json_loadb(s, hlen, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return FAIL(CKPT_EFORMAT, 8 + (uint64_t)(je.position > 0 ? je.position : 0),
                    "header JSON: %s (at header byte %d)", je.text, je.position);
    if (!json_is_object(root)) {
        json_decref(root);
        return FAIL(CKPT_EFORMAT, 8, "header is not a JSON object");
    }
    struct st_header *h = calloc(1, sizeof(*h));
    if (!h) {
        json_decref(root);
        return FAIL(-ENOMEM, CKPT_NOPOS, "out of memory");
    }
    arena_init(&h->arena, 0);
    h->header_len = hlen;
    h->data_start = ST_PREFIX_LEN + hlen;
    h->file_size = file_size;
    assert(h->data_start <= file_size);
    size_t n = json_object_size(root);
    h->tensors = arena_zalloc(&h->arena, (n + 1) * sizeof(*h->tensors));
    struct span *spans = malloc((n + 1) * sizeof(*spans));
    int rc = 0;
    const char *sharding = NULL;
    if (!h->tensors || !spans) {
        rc = FAIL(-ENOMEM, CKPT_NOPOS, "out of memory");
        goto done;
    }
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val)
    {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(val)) {
                rc = FAIL(CKPT_EFORMAT, 8, "__metadata__ is not an object");
                goto done;
            }
            h->has_metadata = 1;
            size_t m = json_object_size(val);
            h->meta_keys = arena_alloc(&h->arena, (m + 1) * sizeof(char *));
            h->meta_values = arena_alloc(&h->arena, (m + 1) * sizeof(char *));
            if (!h->meta_keys || !h->meta_values) {
                rc = FAIL(-ENOMEM, CKPT_NOPOS, "out of memory");
                goto done;
            }
            const char *mk;
            json_t *mv;
            json_object_foreach(val, mk, mv)
            {
                if (!json_is_string(mv)) {
                    rc = FAIL(CKPT_EFORMAT, 8, "__metadata__['%s'] is not a string", mk);
                    goto done;
                }
                const char *k2 = arena_strndup(&h->arena, mk, strlen(mk));
                const char *v2 =
                    arena_strndup(&h->arena, json_string_value(mv), json_string_length(mv));
                if (!k2 || !v2) {
                    rc = FAIL(-ENOMEM, CKPT_NOPOS, "out of memory");
                    goto done;
                }
                if (strcmp(mk, "DCP_SHARDING_INFO") == 0)
                    sharding = v2;
                assert(h->nmeta < m);
                h->meta_keys[h->nmeta] = k2;
                h->meta_values[h->nmeta++] = v2;
            }
            continue;
        }
        assert(h->ntensors < n);
        struct st_tensor *ts = &h->tensors[h->ntensors];
        if ((rc = parse_tensor(h, ts, key, val, err)))
            goto done;
        spans[h->ntensors].begin = ts->begin;
        spans[h->ntensors].end = ts->end;
        spans[h->ntensors].t = h->ntensors;
        h->ntensors++;
    }
    qsort(spans, h->ntensors, sizeof(*spans), span_cmp);
    uint64_t at = 0;
    for (uint32_t i = 0; i < h->ntensors; i++) {
        assert(spans[i].t < h->ntensors);
        const struct st_tensor *ts = &h->tensors[spans[i].t];
        if (spans[i].begin < at) {
            rc = FAIL(CKPT_EINVALID, 8, "'%s' [%" PRIu64 ", %" PRIu64 ") overlaps another tensor",
                      ts->name, ts->begin, ts->end);
            goto done;
        }
        if (spans[i].begin > at) {
            rc = FAIL(CKPT_EINVALID, 8, "hole in the data buffer at [%" PRIu64 ", %" PRIu64 ")", at,
                      spans[i].begin);
            goto done;
        }
        at = spans[i].end;
    }
    if (at != file_size - h->data_start) {
        rc = FAIL(CKPT_EINVALID, h->data_start + at,
                  "%" PRIu64 " bytes after the last tensor (buffer is %" PRIu64 " bytes)",
                  file_size - h->data_start - at, file_size - h->data_start);
        goto done;
    }
    if (sharding)
        rc = apply_sharding(h, sharding, err);
done:
    free(spans);
    json_decref(root);
    if (rc) {
        st_free(h);
        return rc;
    }
    *out = h;
    return 0;
}

int st_parse(const void *buf, size_t len, uint64_t file_size, struct st_header **out,
             struct ckpt_err *err)
{
    uint64_t hlen = 0;
    *out = NULL;
    ckpt_err_clear(err);
    int rc = st_header_len(buf, len, file_size, &hlen, err);
    if (rc)
        return rc;
    if (len - ST_PREFIX_LEN < hlen)
        return FAIL(CKPT_ETRUNC, len, "buffer holds %zu of the %" PRIu64 " header bytes",
                    len - ST_PREFIX_LEN, hlen);
    return st_parse_header((const char *)buf + ST_PREFIX_LEN, (size_t)hlen, file_size, out, err);
}

/* ---- model.safetensors.index.json -------------------------------------- */

void st_index_free(struct st_index *ix)
{
    if (!ix)
        return;
    arena_release(&ix->arena);
    free(ix);
}

int st_index_parse(const void *json, size_t len, struct st_index **out, struct ckpt_err *err)
{
    *out = NULL;
    ckpt_err_clear(err);
    if (len > ST_MAX_HEADER) /* as a header: transformers writes a few MB at most */
        return ckpt_err_set(err, CKPT_ELIMIT, CKPT_NOPOS, "safetensors index: %zu bytes (limit %u)",
                            len, ST_MAX_HEADER);
    json_error_t je;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return ckpt_err_set(err, CKPT_EFORMAT, (uint64_t)(je.position > 0 ? je.position : 0),
                            "safetensors index: %s (at byte %d)", je.text, je.position);
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(root) || !json_is_object(wm)) {
        json_decref(root);
        return ckpt_err_set(err, CKPT_EFORMAT, CKPT_NOPOS,
                            "safetensors index: no \"weight_map\" object");
    }
    struct st_index *ix = calloc(1, sizeof(*ix));
    if (!ix) {
        json_decref(root);
        return ckpt_err_set(err, -ENOMEM, CKPT_NOPOS, "out of memory");
    }
    arena_init(&ix->arena, 0);
    ix->total_size = UINT64_MAX;
    json_t *ts = json_object_get(json_object_get(root, "metadata"), "total_size");
    if (ts)
        get_u64(ts, &ix->total_size);
    size_t n = json_object_size(wm);
    ix->fqn = arena_alloc(&ix->arena, (n + 1) * sizeof(char *));
    ix->file = arena_alloc(&ix->arena, (n + 1) * sizeof(char *));
    int rc = 0;
    if (!ix->fqn || !ix->file)
        rc = ckpt_err_set(err, -ENOMEM, CKPT_NOPOS, "out of memory");
    const char *k;
    json_t *v;
    json_object_foreach(wm, k, v)
    {
        if (rc)
            break;
        char why[96];
        if (!json_is_string(v)) {
            rc = ckpt_err_set(err, CKPT_EFORMAT, CKPT_NOPOS,
                              "safetensors index: weight_map['%s'] is not a string", k);
            break;
        }
        if (ckpt_check_relpath(json_string_value(v), json_string_length(v), why, sizeof(why))) {
            rc = ckpt_err_set(err, CKPT_EINVALID, CKPT_NOPOS,
                              "safetensors index: weight_map['%s']: %s", k, why);
            break;
        }
        ix->fqn[ix->n] = arena_strndup(&ix->arena, k, strlen(k));
        ix->file[ix->n] = arena_strndup(&ix->arena, json_string_value(v), json_string_length(v));
        if (!ix->fqn[ix->n] || !ix->file[ix->n]) {
            rc = ckpt_err_set(err, -ENOMEM, CKPT_NOPOS, "out of memory");
            break;
        }
        ix->n++;
    }
    json_decref(root);
    if (rc) {
        st_index_free(ix);
        return rc;
    }
    *out = ix;
    return 0;
}

/* ---- checkpoint model ---------------------------------------------------- */

/* What st_build_ckpt builds: the checkpoint, its tensors by fqn, chunks per tensor and the
 * tensor of each item. */
struct st_build {
    struct ckpt *c;
    struct strmap fq;
    size_t cap;     /* entries of c->items and c->tensors: the tensors of every header */
    uint32_t *nch;  /* chunks per tensor */
    uint32_t *tidx; /* item -> tensor */
    struct ckpt_err *err;
};

/* Record out of memory in err: -ENOMEM. */
static int out_of_memory(struct ckpt_err *err)
{
    return ckpt_err_set(err, -ENOMEM, CKPT_NOPOS, "out of memory");
}

/* Add the item of tensor entry ts of file f (header h), and its tensor if ts is the first
 * shard of its name: 0, -ENOMEM or CKPT_EINVALID (shards that disagree). */
static int add_st_item(struct st_build *B, uint32_t f, const struct st_header *h,
                       const struct st_tensor *ts)
{
    struct ckpt *c = B->c;
    struct ckpt_err *err = B->err;
    assert(c->nitems < B->cap && c->ntensors <= c->nitems);
    /* st_parse_header keeps every tensor inside its file */
    assert(ts->begin <= ts->end && h->data_start + ts->end <= h->file_size);
    struct ckpt_item *it = &c->items[c->nitems];
    it->fqn = arena_strndup(&c->arena, ts->name, strlen(ts->name));
    if (!it->fqn)
        return out_of_memory(err);
    it->kind = CKPT_ITEM_TENSOR;
    it->file = f;
    it->offset = h->data_start + ts->begin;
    it->length = ts->end - ts->begin;
    it->index_hint = -1;
    it->bytes = CKPT_NONE;
    uint32_t t;
    if (strmap_get(&B->fq, it->fqn, strlen(it->fqn), &t) != 0) {
        t = c->ntensors++;
        struct ckpt_tensor *tt = &c->tensors[t];
        tt->fqn = it->fqn;
        tt->dtype = arena_strndup(&c->arena, ts->dtype, strlen(ts->dtype));
        tt->elem_bits = ts->elem_bits;
        tt->ndim = ts->ndim;
        if (!tt->dtype || strmap_put(&B->fq, it->fqn, strlen(it->fqn), t, NULL) < 0)
            return out_of_memory(err);
    } else {
        const struct ckpt_tensor *tt = &c->tensors[t];
        if (!ts->saved_offsets)
            return ckpt_err_set(err, CKPT_EINVALID, CKPT_NOPOS,
                                "safetensors: '%s' is in several files without "
                                "DCP_SHARDING_INFO",
                                it->fqn);
        if (strcmp(tt->dtype, ts->dtype) != 0 || tt->ndim != ts->ndim)
            return ckpt_err_set(err, CKPT_EINVALID, CKPT_NOPOS,
                                "safetensors: shards of '%s' disagree on dtype or rank", it->fqn);
    }
    it->tensor = t;
    it->chunk = B->nch[t]++;
    B->tidx[c->nitems] = t;
    c->nitems++;
    return 0;
}

/* Add file f (named name, header h): its file record, its __metadata__ and its tensor
 * entries as items: 0, -ENOMEM or CKPT_EINVALID. */
static int add_st_file(struct st_build *B, uint32_t f, const char *name, const struct st_header *h)
{
    struct ckpt *c = B->c;
    struct arena *A = &c->arena;
    char why[96];
    if (ckpt_check_relpath(name, strlen(name), why, sizeof(why)))
        return ckpt_err_set(B->err, CKPT_EINVALID, CKPT_NOPOS, "safetensors: '%s': %s", name, why);
    struct ckpt_file *fi = &c->files[c->nfiles++];
    fi->name = arena_strndup(A, name, strlen(name));
    fi->rank = -1;
    fi->size = h->file_size;
    fi->present = 1;
    fi->data_start = h->data_start;
    struct ckpt_st_info *si = &c->st[f];
    si->header_len = h->header_len;
    si->has_metadata = h->has_metadata;
    si->nmeta = h->nmeta;
    si->meta_keys = arena_alloc(A, (h->nmeta + 1) * sizeof(char *));
    si->meta_values = arena_alloc(A, (h->nmeta + 1) * sizeof(char *));
    if (!fi->name || !si->meta_keys || !si->meta_values)
        return out_of_memory(B->err);
    for (uint32_t m = 0; m < h->nmeta; m++) {
        si->meta_keys[m] = arena_strndup(A, h->meta_keys[m], strlen(h->meta_keys[m]));
        si->meta_values[m] = arena_strndup(A, h->meta_values[m], strlen(h->meta_values[m]));
        if (!si->meta_keys[m] || !si->meta_values[m])
            return out_of_memory(B->err);
    }
    for (uint32_t k = 0; k < h->ntensors; k++) {
        int rc = add_st_item(B, f, h, &h->tensors[k]);
        if (rc)
            return rc;
    }
    return 0;
}

/* Give every tensor its chunks (one per item, in item order, offsets from
 * DCP_SHARDING_INFO) and its global shape (the extent of its chunks): 0, -ENOMEM or
 * CKPT_EINVALID (an extent that overflows). */
static int place_chunks(struct st_build *B, struct st_header *const *hdrs, uint32_t nfiles)
{
    struct ckpt *c = B->c;
    struct arena *A = &c->arena;
    for (uint32_t t = 0; t < c->ntensors; t++) {
        struct ckpt_tensor *tt = &c->tensors[t];
        tt->chunks = arena_zalloc(A, (B->nch[t] + 1) * sizeof(*tt->chunks));
        int64_t *size = arena_zalloc(A, (tt->ndim + 1) * sizeof(int64_t));
        if (!tt->chunks || !size)
            return out_of_memory(B->err);
        tt->size = size;
    }
    uint32_t i = 0;
    for (uint32_t f = 0; f < nfiles; f++) {
        for (uint32_t k = 0; k < hdrs[f]->ntensors; k++, i++) {
            const struct st_tensor *ts = &hdrs[f]->tensors[k];
            assert(i < c->nitems && B->tidx[i] < c->ntensors);
            struct ckpt_tensor *tt = &c->tensors[B->tidx[i]];
            assert(tt->nchunks < B->nch[B->tidx[i]]); /* counted by add_st_item */
            struct ckpt_chunk *ch = &tt->chunks[tt->nchunks++];
            int64_t *offs = arena_zalloc(A, (ts->ndim + 1) * sizeof(int64_t));
            if (!offs)
                return out_of_memory(B->err);
            if (ts->saved_offsets)
                memcpy(offs, ts->saved_offsets, ts->ndim * sizeof(int64_t));
            ch->offsets = offs;
            ch->sizes = ts->shape;
            ch->item = i;
            int64_t *size = (int64_t *)tt->size;
            for (uint32_t d = 0; d < ts->ndim; d++) {
                if (ts->shape[d] > INT64_MAX - offs[d])
                    return ckpt_err_set(B->err, CKPT_EINVALID, CKPT_NOPOS,
                                        "safetensors: '%s' shard extent overflows", ts->name);
                if (offs[d] + ts->shape[d] > size[d])
                    size[d] = offs[d] + ts->shape[d];
            }
        }
    }
    return 0;
}

/* Copy the chunks' shapes, which point into the header arenas, into the checkpoint's arena:
 * 0 or -ENOMEM. */
static int copy_chunk_shapes(struct st_build *B)
{
    struct ckpt *c = B->c;
    for (uint32_t t = 0; t < c->ntensors; t++) {
        struct ckpt_tensor *tt = &c->tensors[t];
        for (uint32_t k = 0; k < tt->nchunks; k++) {
            int64_t *s = arena_alloc(&c->arena, (tt->ndim + 1) * sizeof(int64_t));
            if (!s)
                return out_of_memory(B->err);
            memcpy(s, tt->chunks[k].sizes, tt->ndim * sizeof(int64_t));
            tt->chunks[k].sizes = s;
        }
    }
    return 0;
}

/* Check that every tensor the HF index ix names is in the file it names: 0 or
 * CKPT_EINVALID. */
static int check_st_index(struct st_build *B, const struct st_index *ix)
{
    const struct ckpt *c = B->c;
    for (uint32_t k = 0; k < ix->n; k++) {
        uint32_t t;
        if (strmap_get(&B->fq, ix->fqn[k], strlen(ix->fqn[k]), &t) != 0)
            return ckpt_err_set(B->err, CKPT_EINVALID, CKPT_NOPOS,
                                "safetensors index: '%s' is in no file", ix->fqn[k]);
        const struct ckpt_tensor *tt = &c->tensors[t];
        int found = 0;
        for (uint32_t q = 0; q < tt->nchunks; q++)
            if (strcmp(c->files[c->items[tt->chunks[q].item].file].name, ix->file[k]) == 0)
                found = 1;
        if (!found)
            return ckpt_err_set(B->err, CKPT_EINVALID, CKPT_NOPOS,
                                "safetensors index: '%s' is not in %s", ix->fqn[k], ix->file[k]);
    }
    return 0;
}

int st_build_ckpt(const char *const *names, struct st_header *const *hdrs, uint32_t nfiles,
                  const struct st_index *ix, struct ckpt **out, struct ckpt_err *err)
{
    *out = NULL;
    ckpt_err_clear(err);
    size_t nt = 0;
    for (uint32_t f = 0; f < nfiles; f++)
        nt += hdrs[f]->ntensors;
    if (nt >= UINT32_MAX / 2)
        return ckpt_err_set(err, CKPT_ELIMIT, CKPT_NOPOS, "safetensors: too many tensors");
    struct st_build B = {.c = ckpt_new(CKPT_FORMAT_SAFETENSORS, 0), .err = err};
    struct ckpt *c = B.c;
    int rc = 0;
    if (!c || strmap_init(&B.fq, nt)) {
        ckpt_free(c);
        return out_of_memory(err);
    }
    struct arena *A = &c->arena;
    c->files = arena_zalloc(A, (nfiles + 1) * sizeof(*c->files));
    c->st = arena_zalloc(A, (nfiles + 1) * sizeof(*c->st));
    c->items = arena_zalloc(A, (nt + 1) * sizeof(*c->items));
    c->tensors = arena_zalloc(A, (nt + 1) * sizeof(*c->tensors));
    B.cap = nt;
    B.nch = calloc(nt + 1, sizeof(uint32_t));
    B.tidx = calloc(nt + 1, sizeof(uint32_t));
    if (!c->files || !c->st || !c->items || !c->tensors || !B.nch || !B.tidx) {
        rc = out_of_memory(err);
        goto done;
    }
    for (uint32_t f = 0; f < nfiles && !rc; f++)
        rc = add_st_file(&B, f, names[f], hdrs[f]);
    if (rc || (rc = place_chunks(&B, hdrs, nfiles)) || (rc = copy_chunk_shapes(&B)) ||
        (ix && (rc = check_st_index(&B, ix))))
        goto done;
    rc = ckpt_finish(c, err);
done:
    strmap_free(&B.fq);
    free(B.nch);
    free(B.tidx);
    if (rc) {
        ckpt_free(c);
        return rc;
    }
    *out = c;
    return 0;
}
