/*
 * index/ckpt.c - the common checkpoint model: error strings, construction
 * helpers, validation of item ranges and chunk geometry, layout-order
 * queries, relative-path and dtype checks. See ckpt.h.
 */
#include "ckpt.h"

#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *ckpt_strerror(int err)
{
    switch (err) {
    case 0:
        return "success";
    case CKPT_ETRUNC:
        return "input is truncated";
    case CKPT_EOPCODE:
        return "unknown or unsupported pickle opcode or protocol";
    case CKPT_ESTACK:
        return "pickle stack or mark misuse";
    case CKPT_EMEMO:
        return "pickle memo misuse";
    case CKPT_ELIMIT:
        return "a parser limit was exceeded";
    case CKPT_ETYPE:
        return "value of the wrong type";
    case CKPT_EGLOBAL:
        return "class or function reference not allowed";
    case CKPT_EENCODING:
        return "invalid UTF-8";
    case CKPT_EFORMAT:
        return "not the expected structure";
    case CKPT_EINVALID:
        return "checkpoint content is invalid";
    case CKPT_ENOTCKPT:
        return "no checkpoint found";
    case CKPT_NOTFOUND:
        return "not found";
    case CKPT_EVERSION:
        return "index database has another schema version";
    case CKPT_EDB:
        return "index database error";
    default:
        if (err < 0 && err > -4096)
            return strerror(-err);
        return "unknown error";
    }
}

int ckpt_err_set(struct ckpt_err *e, int code, uint64_t pos, const char *fmt, ...)
{
    if (!e || e->code)
        return code;
    e->code = code;
    e->pos = pos;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof(e->msg), fmt, ap);
    va_end(ap);
    return code;
}

void ckpt_err_clear(struct ckpt_err *e)
{
    if (!e)
        return;
    e->code = 0;
    e->pos = CKPT_NOPOS;
    e->msg[0] = '\0';
}

struct ckpt *ckpt_new(enum ckpt_format format, size_t arena_limit)
{
    struct ckpt *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->format = format;
    arena_init(&c->arena, arena_limit);
    return c;
}

void ckpt_free(struct ckpt *c)
{
    if (!c)
        return;
    arena_release(&c->arena);
    free(c);
}

struct layout_key {
    uint64_t offset, length;
    uint32_t item;
};

static int layout_cmp(const void *a, const void *b)
{
    const struct layout_key *x = a, *y = b;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    if (x->length != y->length)
        return x->length < y->length ? -1 : 1;
    return x->item < y->item ? -1 : (x->item > y->item);
}

/* Check tensor t's shape and that its chunks lie inside it: 0 or CKPT_EINVALID (err set). */
static int check_tensor(const struct ckpt *ck, uint32_t tensor, struct ckpt_err *err)
{
    const struct ckpt_tensor *t = &ck->tensors[tensor];
    for (uint32_t d = 0; d < t->ndim; d++)
        if (t->size[d] < 0)
            return ckpt_err_set(err, CKPT_EINVALID, CKPT_NOPOS,
                                "tensor '%s': dimension %u has negative size %lld", t->fqn, d,
                                (long long)t->size[d]);
    for (uint32_t c = 0; c < t->nchunks; c++) {
        const struct ckpt_chunk *ch = &t->chunks[c];
        assert(ch->item < ck->nitems); /* the parsers give every chunk its item */
        for (uint32_t d = 0; d < t->ndim; d++) {
            int64_t o = ch->offsets[d], s = ch->sizes[d];
            if (o < 0 || s < 0)
                return ckpt_err_set(err, CKPT_EINVALID, CKPT_NOPOS,
                                    "tensor '%s' chunk %u: negative offset or size in dim %u",
                                    t->fqn, c, d);
            if (o > t->size[d] || s > t->size[d] - o)
                return ckpt_err_set(err, CKPT_EINVALID, CKPT_NOPOS,
                                    "tensor '%s' chunk %u: [%lld:%lld] exceeds size %lld of dim %u",
                                    t->fqn, c, (long long)o, (long long)o + (long long)s,
                                    (long long)t->size[d], d);
        }
    }
    return 0;
}

int ckpt_finish(struct ckpt *c, struct ckpt_err *err)
{
    for (uint32_t t = 0; t < c->ntensors; t++) {
        int rc = check_tensor(c, t, err);
        if (rc)
            return rc;
    }
    for (uint32_t i = 0; i < c->nitems; i++) {
        const struct ckpt_item *it = &c->items[i];
        if (it->file >= c->nfiles)
            return ckpt_err_set(err, CKPT_EINVALID, CKPT_NOPOS, "item %u: no file", i);
        if (it->offset > (uint64_t)INT64_MAX || it->length > (uint64_t)INT64_MAX ||
            it->length > (uint64_t)INT64_MAX - it->offset)
            return ckpt_err_set(err, CKPT_EINVALID, CKPT_NOPOS,
                                "item '%s' in %s: offset %llu + length %llu overflows", it->fqn,
                                c->files[it->file].name, (unsigned long long)it->offset,
                                (unsigned long long)it->length);
        c->files[it->file].nitems++;
    }
    struct layout_key *keys = NULL;
    if (c->nitems) {
        keys = malloc(sizeof(*keys) * c->nitems);
        if (!keys)
            return ckpt_err_set(err, -ENOMEM, CKPT_NOPOS, "out of memory");
    }
    /* bucket items by file, then sort each bucket */
    uint32_t *start = calloc((size_t)c->nfiles + 1, sizeof(uint32_t));
    if (!start) {
        free(keys);
        return ckpt_err_set(err, -ENOMEM, CKPT_NOPOS, "out of memory");
    }
    for (uint32_t f = 0; f < c->nfiles; f++)
        start[f + 1] = start[f] + c->files[f].nitems;
    uint32_t *fill = calloc((size_t)c->nfiles + 1, sizeof(uint32_t));
    uint32_t *all = c->nitems ? arena_alloc(&c->arena, sizeof(uint32_t) * c->nitems) : NULL;
    if (!fill || (c->nitems && !all)) {
        free(keys);
        free(start);
        free(fill);
        return ckpt_err_set(err, -ENOMEM, CKPT_NOPOS, "out of memory");
    }
    for (uint32_t i = 0; i < c->nitems; i++) {
        const struct ckpt_item *it = &c->items[i];
        uint32_t k = start[it->file] + fill[it->file]++;
        keys[k].offset = it->offset;
        keys[k].length = it->length;
        keys[k].item = i;
    }
    for (uint32_t f = 0; f < c->nfiles; f++) {
        struct ckpt_file *fi = &c->files[f];
        assert(fill[f] == fi->nitems && start[f + 1] - start[f] == fi->nitems);
        fi->items = all ? all + start[f] : NULL;
        if (fi->nitems == 0)
            continue; /* keys is NULL when the checkpoint has no items */
        qsort(keys + start[f], fi->nitems, sizeof(*keys), layout_cmp);
        uint64_t end = 0;
        for (uint32_t k = 0; k < fi->nitems; k++) {
            const struct layout_key *lk = &keys[start[f] + k];
            assert(lk->item < c->nitems && c->items[lk->item].file == f);
            fi->items[k] = lk->item;
            if (lk->length && lk->offset < end)
                fi->overlapping = 1;
            if (lk->offset + lk->length > end)
                end = lk->offset + lk->length;
        }
    }
    free(keys);
    free(start);
    free(fill);
    return 0;
}

uint32_t ckpt_item_at(const struct ckpt *c, uint32_t file, uint64_t off)
{
    if (file >= c->nfiles)
        return CKPT_NONE;
    const struct ckpt_file *f = &c->files[file];
    /* first position whose offset is > off */
    uint32_t lo = 0, hi = f->nitems;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (c->items[f->items[mid]].offset <= off)
            lo = mid + 1;
        else
            hi = mid;
    }
    assert(lo <= f->nitems);
    while (lo > 0) {
        const struct ckpt_item *it = &c->items[f->items[lo - 1]];
        if (it->length && off - it->offset < it->length)
            return f->items[lo - 1];
        if (it->length && !f->overlapping)
            return CKPT_NONE; /* the closest item before off ends before it */
        lo--;
    }
    return CKPT_NONE;
}

uint32_t ckpt_file_index(const struct ckpt *c, const char *name)
{
    for (uint32_t f = 0; f < c->nfiles; f++)
        if (strcmp(c->files[f].name, name) == 0)
            return f;
    return CKPT_NONE;
}

int ckpt_find_fqn(const struct ckpt *c, const char *fqn, enum ckpt_item_kind *kind, uint32_t *index)
{
    for (uint32_t t = 0; t < c->ntensors; t++)
        if (strcmp(c->tensors[t].fqn, fqn) == 0) {
            *kind = CKPT_ITEM_TENSOR;
            *index = t;
            return 0;
        }
    for (uint32_t b = 0; b < c->nbytes; b++)
        if (strcmp(c->bytes[b].fqn, fqn) == 0) {
            *kind = CKPT_ITEM_BYTES;
            *index = b;
            return 0;
        }
    return CKPT_NOTFOUND;
}

int ckpt_file_in_save_order(const struct ckpt *c, uint32_t f)
{
    const struct ckpt_file *fi = &c->files[f];
    for (uint32_t k = 1; k < fi->nitems; k++)
        if (fi->items[k] < fi->items[k - 1])
            return 0;
    return 1;
}

static void why_set(char *why, size_t whylen, const char *s)
{
    if (why && whylen)
        snprintf(why, whylen, "%s", s);
}

int ckpt_check_relpath(const char *s, size_t len, char *why, size_t whylen)
{
    if (len == 0) {
        why_set(why, whylen, "path is empty");
        return CKPT_EINVALID;
    }
    if (len > 4095) {
        why_set(why, whylen, "path is longer than 4095 bytes");
        return CKPT_EINVALID;
    }
    if (memchr(s, '\0', len)) {
        why_set(why, whylen, "path contains a NUL byte");
        return CKPT_EINVALID;
    }
    if (s[0] == '/') {
        why_set(why, whylen, "path is absolute");
        return CKPT_EINVALID;
    }
    if (memchr(s, '\\', len)) {
        why_set(why, whylen, "path contains a backslash");
        return CKPT_EINVALID;
    }
    size_t i = 0;
    while (i <= len) {
        size_t j = i;
        while (j < len && s[j] != '/')
            j++;
        size_t n = j - i;
        if (n == 0) {
            why_set(why, whylen, "path has an empty component");
            return CKPT_EINVALID;
        }
        if ((n == 1 && s[i] == '.') || (n == 2 && s[i] == '.' && s[i + 1] == '.')) {
            why_set(why, whylen, "path has a '.' or '..' component (escapes the checkpoint)");
            return CKPT_EINVALID;
        }
        i = j + 1;
    }
    return 0;
}

int ckpt_rank_metadata_of(const char *name)
{
    if (name[0] != '_' || name[1] != '_')
        return -1;
    const char *p = name + 2;
    long rank = 0;
    int digits = 0;
    for (; *p >= '0' && *p <= '9'; p++, digits++) {
        rank = rank * 10 + (*p - '0');
        if (rank > 1000000000L)
            return -1;
    }
    return digits && strcmp(p, ".metadata") == 0 ? (int)rank : -1;
}

int ckpt_rank_of(const char *name)
{
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    if (base[0] != '_' || base[1] != '_')
        return -1;
    const char *p = base + 2;
    long rank = 0;
    int digits = 0;
    while (*p >= '0' && *p <= '9') {
        rank = rank * 10 + (*p - '0');
        if (rank > 1000000000L)
            return -1;
        p++;
        digits++;
    }
    if (!digits || *p != '_')
        return -1;
    p++;
    digits = 0;
    while (*p >= '0' && *p <= '9') {
        p++;
        digits++;
    }
    if (!digits || strcmp(p, ".distcp") != 0)
        return -1;
    return (int)rank;
}

static const struct {
    const char *name;
    uint32_t bits;
} torch_dtypes[] = {
    {"float64", 64},
    {"float32", 32},
    {"float16", 16},
    {"bfloat16", 16},
    {"complex32", 32},
    {"complex64", 64},
    {"complex128", 128},
    {"uint8", 8},
    {"int8", 8},
    {"int16", 16},
    {"int32", 32},
    {"int64", 64},
    {"uint16", 16},
    {"uint32", 32},
    {"uint64", 64},
    {"bool", 8},
    {"qint8", 8},
    {"quint8", 8},
    {"qint32", 32},
    {"quint4x2", 8},
    {"quint2x4", 8},
    {"float8_e4m3fn", 8},
    {"float8_e5m2", 8},
    {"float8_e4m3fnuz", 8},
    {"float8_e5m2fnuz", 8},
    {"float8_e8m0fnu", 8},
    {"float4_e2m1fn_x2", 8},
    {"bits1x8", 8},
    {"bits2x4", 8},
    {"bits4x2", 8},
    {"bits8", 8},
    {"bits16", 16},
    {"double", 64},
    {"float", 32},
    {"half", 16},
    {"cfloat", 64},
    {"cdouble", 128},
    {"chalf", 32},
    {"long", 64},
    {"int", 32},
    {"short", 16},
};

uint32_t ckpt_torch_dtype_bits(const char *name)
{
    for (size_t i = 0; i < sizeof(torch_dtypes) / sizeof(torch_dtypes[0]); i++)
        if (strcmp(torch_dtypes[i].name, name) == 0)
            return torch_dtypes[i].bits;
    return 0;
}
