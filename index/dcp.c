/*
 * index/dcp.c - DCP .metadata -> checkpoint model (see dcp.h).
 *
 * Three passes over the parsed pickle: state_dict_metadata (tensors, their
 * chunks and bytes entries, indexed by fqn and by tensor + chunk offsets in
 * hash maps), storage_data (one item per entry, matched to its chunk in O(1)),
 * then completeness checks. Then ckpt_finish() validates geometry and builds
 * the per-file layout order. Error messages carry the byte position of the
 * offending value in the .metadata.
 */
#include "dcp.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strmap.h"
#include "utf8.h"

#define BYTES_FLAG 0x80000000u
#define DCP_MAX_FIELDS 64

void dcp_options_default(struct dcp_options *o)
{
    pkl_options_default(&o->pkl);
    o->pkl.filter = dcp_global_allowed;
    o->pkl.fold = 1;
    o->max_memory = (size_t)4 << 30;
    o->no_refold = 0;
}

static int prefix(const char *s, const char *p)
{
    return strncmp(s, p, strlen(p)) == 0;
}

int dcp_global_allowed(void *arg, const char *module, const char *name)
{
    (void)arg;
    if (strcmp(module, "torch") == 0) {
        static const char *const extra[] = {
            "Size",           "strided",           "sparse_coo",    "sparse_csr",
            "sparse_csc",     "sparse_bsr",        "sparse_bsc",    "_mkldnn",
            "jagged",         "contiguous_format", "channels_last", "channels_last_3d",
            "preserve_format"};
        for (size_t i = 0; i < sizeof(extra) / sizeof(extra[0]); i++)
            if (strcmp(name, extra[i]) == 0)
                return 1;
        return ckpt_torch_dtype_bits(name) != 0;
    }
    if (strcmp(module, "torch.serialization") == 0)
        return strcmp(name, "_get_layout") == 0;
    if (prefix(module, "torch.distributed.checkpoint") ||
        prefix(module, "torch.distributed._shard"))
        return 1;
    if (strcmp(module, "pathlib") == 0 || strcmp(module, "pathlib._local") == 0)
        return strcmp(name, "PosixPath") == 0 || strcmp(name, "PurePosixPath") == 0 ||
               strcmp(name, "Path") == 0 || strcmp(name, "PurePath") == 0;
    if (strcmp(module, "builtins") == 0 || strcmp(module, "__builtin__") == 0)
        return strcmp(name, "getattr") == 0 || strcmp(name, "set") == 0 ||
               strcmp(name, "frozenset") == 0;
    if (strcmp(module, "collections") == 0)
        return strcmp(name, "OrderedDict") == 0;
    return 0;
}

/* ---- extraction context ------------------------------------------------ */

/* Converted copies of pickle values (strs, shapes), keyed by the value's
 * address, so a value shared through the memo is converted and stored in
 * the model once. Without it a 64 KiB pickle could reference one 32 KiB str
 * from every item's transform_descriptors and build a model of gigabytes. */
struct vcache {
    struct strmap map; /* value address (key bytes in scratch) -> slot */
    const void **out;
    uint32_t *aux; /* shapes: ndim */
    uint32_t n, cap;
};

struct ex {
    struct ckpt *c;
    struct pkl_doc *doc;
    struct ckpt_err *err;
    struct strmap files;   /* relative_path -> file index */
    struct strmap fqns;    /* fqn -> tensor index, or bytes index | BYTES_FLAG */
    struct strmap tchunks; /* one tensor's chunk offsets (raw int64s) -> chunk */
    struct strmap chunks;  /* tensor(le32) offsets(le64...) -> global chunk number; built
                            * on the first storage key whose index does not name its chunk */
    int chunks_built;
    uint32_t *chunk_tensor, *chunk_index;
    uint32_t nchunks;
    size_t chunk_cap;     /* entries of chunk_tensor and chunk_index */
    size_t entry_cap;     /* entries of c->tensors and c->bytes (state_dict_metadata) */
    size_t item_cap;      /* entries of c->items and c->files (storage_data) */
    struct arena scratch; /* chunk-map and vcache keys */
    struct vcache strs, shapes;
    char tbuf[4][160]; /* type_of() results (per parse: thread-safe) */
    int tnext;
};

static int vc_get(const struct vcache *vc, const struct pkl_value *v, const void **out,
                  uint32_t *aux)
{
    uint32_t i;
    if (!v || strmap_get(&vc->map, &v, sizeof(v), &i) != 0)
        return -1;
    *out = vc->out[i];
    *aux = vc->aux[i];
    return 0;
}

static int vc_put(struct ex *X, struct vcache *vc, const struct pkl_value *v, const void *out,
                  uint32_t aux)
{
    if (vc->n == vc->cap) {
        if (vc->cap >= UINT32_MAX / 2)
            return -ENOMEM;
        uint32_t ncap = vc->cap ? vc->cap * 2 : 64;
        const void **o = realloc(vc->out, ncap * sizeof(*o));
        if (!o)
            return -ENOMEM;
        vc->out = o;
        uint32_t *a = realloc(vc->aux, ncap * sizeof(*a));
        if (!a)
            return -ENOMEM;
        vc->aux = a;
        vc->cap = ncap;
    }
    const struct pkl_value **key = arena_alloc(&X->scratch, sizeof(*key));
    if (!key)
        return -ENOMEM;
    *key = v;
    if (strmap_put(&vc->map, key, sizeof(*key), vc->n, NULL) < 0)
        return -ENOMEM;
    vc->out[vc->n] = out;
    vc->aux[vc->n] = aux;
    vc->n++;
    return 0;
}

static void vc_free(struct vcache *vc)
{
    strmap_free(&vc->map);
    free(vc->out);
    free(vc->aux);
}

static int bad(struct ex *X, int code, const struct pkl_value *v, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int bad(struct ex *X, int code, const struct pkl_value *v, const char *fmt, ...)
{
    char detail[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof(detail), fmt, ap);
    va_end(ap);
    if (v)
        return ckpt_err_set(X->err, code, v->pos, "dcp: byte %" PRIu64 ": %s", v->pos, detail);
    return ckpt_err_set(X->err, code, CKPT_NOPOS, "dcp: %s", detail);
}

static int nomem(struct ex *X)
{
    return ckpt_err_set(X->err, -ENOMEM, CKPT_NOPOS, "dcp: out of memory (or model memory limit)");
}

/* "int", "str", "torch.Size object", ... for messages. */
static const char *type_of_x(struct ex *X, const struct pkl_value *v)
{
    if (!v)
        return "nothing";
    const struct pkl_value *cls = pkl_class_of(v);
    if (v->type == PKL_OBJECT && cls) {
        char *b = X->tbuf[X->tnext++ & 3];
        snprintf(b, sizeof(X->tbuf[0]), "%s.%s object", cls->u.global.module, cls->u.global.name);
        return b;
    }
    return pkl_type_name(v->type);
}
#define type_of(v) type_of_x(X, (v))

/* Is v an object of DCP class `name` (module under torch.distributed.)? */
static int is_cls(const struct pkl_value *v, const char *name)
{
    const struct pkl_value *cls = pkl_class_of(v);
    return v && v->type == PKL_OBJECT && cls && strcmp(cls->u.global.name, name) == 0 &&
           prefix(cls->u.global.module, "torch.distributed.");
}

/* The field dict of a dataclass-like object: BUILD state dict, or the dict
 * half of a (dict, slotstate) tuple. NULL if the object has no state. */
static const struct pkl_value *fields_of(const struct pkl_value *v)
{
    if (!v || v->type != PKL_OBJECT || !v->u.obj->state)
        return NULL;
    const struct pkl_value *s = v->u.obj->state;
    if (s->type == PKL_TUPLE && s->u.seq.len == 2 && s->u.seq.items[0]->type == PKL_DICT)
        s = s->u.seq.items[0];
    /* DCP dataclasses have a handful of fields; refusing huge field dicts
     * keeps field lookups O(1) even if one dict is shared (memo) by many
     * objects */
    if (s->type != PKL_DICT || s->u.seq.len > 2 * DCP_MAX_FIELDS)
        return NULL;
    return s;
}

static const struct pkl_value *field(const struct pkl_value *obj, const char *name)
{
    return pkl_dict_get(fields_of(obj), name);
}

static int is_none(const struct pkl_value *v)
{
    return !v || v->type == PKL_NONE;
}

static int get_i64(struct ex *X, const struct pkl_value *v, const char *what, const char *fqn,
                   int64_t *out)
{
    if (!v)
        return bad(X, CKPT_EFORMAT, NULL, "'%s': %s is missing", fqn, what);
    if (v->type == PKL_INT) {
        *out = v->u.i;
        return 0;
    }
    if (v->type == PKL_BIGINT)
        return bad(X, CKPT_EINVALID, v, "'%s': %s is an integer beyond 64 bits", fqn, what);
    return bad(X, CKPT_ETYPE, v, "'%s': %s is a %s, not an int", fqn, what, type_of(v));
}

static int get_bool(struct ex *X, const struct pkl_value *v, const char *what, const char *fqn,
                    int *out)
{
    if (v && v->type == PKL_BOOL) {
        *out = v->u.b;
        return 0;
    }
    if (v && v->type == PKL_INT && (v->u.i == 0 || v->u.i == 1)) {
        *out = (int)v->u.i;
        return 0;
    }
    return bad(X, CKPT_ETYPE, v, "'%s': %s is a %s, not a bool", fqn, what, type_of(v));
}

/* A str value as an arena copy (one per pickle value); rejects embedded
 * NUL. */
static int get_str(struct ex *X, const struct pkl_value *v, const char *what, const char *fqn,
                   const char **out)
{
    const void *hit;
    uint32_t unused;
    if (vc_get(&X->strs, v, &hit, &unused) == 0) {
        *out = hit;
        return 0;
    }
    if (!v || v->type != PKL_STR)
        return bad(X, CKPT_ETYPE, v, "'%s': %s is a %s, not a str", fqn, what, type_of(v));
    if (memchr(v->u.str.s, '\0', v->u.str.len))
        return bad(X, CKPT_EINVALID, v, "'%s': %s contains a NUL byte", fqn, what);
    char *s = arena_strndup(&X->c->arena, v->u.str.s, v->u.str.len);
    if (!s || vc_put(X, &X->strs, v, s, 0))
        return nomem(X);
    *out = s;
    return 0;
}

/* torch.Size(...) or a plain tuple/list of ints -> int64 array in the arena
 * (one per pickle value). */
static int get_shape(struct ex *X, const struct pkl_value *v, const char *what, const char *fqn,
                     uint32_t *ndim, const int64_t **out)
{
    const void *hit;
    if (vc_get(&X->shapes, v, &hit, ndim) == 0) {
        *out = hit;
        return 0;
    }
    const struct pkl_value *t = v;
    if (v && v->type == PKL_OBJECT && pkl_is_global(v->u.obj->cls, "torch", "Size")) {
        const struct pkl_value *args = v->u.obj->args;
        if (args->u.seq.len != 1)
            return bad(X, CKPT_ETYPE, v, "'%s': %s: torch.Size takes one argument", fqn, what);
        t = args->u.seq.items[0];
    }
    if (!t || (t->type != PKL_TUPLE && t->type != PKL_LIST))
        return bad(X, CKPT_ETYPE, v, "'%s': %s is a %s, not a torch.Size", fqn, what, type_of(v));
    size_t n = t->u.seq.len;
    if (n > 64)
        return bad(X, CKPT_EINVALID, v, "'%s': %s has %zu dimensions (limit 64)", fqn, what, n);
    int64_t *a = arena_alloc(&X->c->arena, (n ? n : 1) * sizeof(int64_t));
    if (!a)
        return nomem(X);
    for (size_t i = 0; i < n; i++) {
        int rc = get_i64(X, t->u.seq.items[i], what, fqn, &a[i]);
        if (rc)
            return rc;
    }
    if (vc_put(X, &X->shapes, v, a, (uint32_t)n))
        return nomem(X);
    *ndim = (uint32_t)n;
    *out = a;
    return 0;
}

/* ---- TensorProperties -------------------------------------------------- */

static const char *const mem_formats[] = {"torch.contiguous_format", "torch.channels_last",
                                          "torch.preserve_format"};
static const char *const mem_names[] = {"TORCH_CONTIGUOUS_FORMAT", "TORCH_CHANNELS_LAST",
                                        "TORCH_PRESERVE_FORMAT"};

static int is_enum_class(const struct pkl_value *g)
{
    return g && g->type == PKL_GLOBAL &&
           (strcmp(g->u.global.name, "MEM_FORMAT_ENCODING") == 0 ||
            strcmp(g->u.global.name, "_MEM_FORMAT_ENCODING") == 0);
}

static int get_memfmt(struct ex *X, const struct pkl_value *v, const char *fqn, const char **out)
{
    if (v && v->type == PKL_INT) {
        if (v->u.i >= 0 && v->u.i < 3) {
            *out = mem_formats[v->u.i];
            return 0;
        }
        return bad(X, CKPT_EINVALID, v, "'%s': unknown memory format %" PRId64, fqn, v->u.i);
    }
    if (v && v->type == PKL_OBJECT && v->u.obj->args) {
        const struct pkl_value *cls = v->u.obj->cls, *args = v->u.obj->args;
        if (is_enum_class(cls) && args->u.seq.len == 1 && args->u.seq.items[0]->type == PKL_INT) {
            int64_t e = args->u.seq.items[0]->u.i;
            if (e < 0 || e > 2)
                return bad(X, CKPT_EINVALID, v, "'%s': unknown memory format %" PRId64, fqn, e);
            if (!X->c->dcp.enum_style)
                X->c->dcp.enum_style = "value";
            *out = mem_formats[e];
            return 0;
        }
        if ((pkl_is_global(cls, "builtins", "getattr") ||
             pkl_is_global(cls, "__builtin__", "getattr")) &&
            args->u.seq.len == 2 && is_enum_class(args->u.seq.items[0]) &&
            args->u.seq.items[1]->type == PKL_STR) {
            const char *nm = args->u.seq.items[1]->u.str.s;
            for (int i = 0; i < 3; i++)
                if (strcmp(nm, mem_names[i]) == 0) {
                    if (!X->c->dcp.enum_style)
                        X->c->dcp.enum_style = "name";
                    *out = mem_formats[i];
                    return 0;
                }
            return bad(X, CKPT_EINVALID, v, "'%s': unknown memory format %s", fqn, nm);
        }
    }
    return bad(X, CKPT_ETYPE, v, "'%s': memory format is a %s, not a MEM_FORMAT_ENCODING", fqn,
               type_of(v));
}

static int get_dtype(struct ex *X, const struct pkl_value *v, const char *fqn,
                     struct ckpt_tensor *t)
{
    if (!v || v->type != PKL_GLOBAL || strcmp(v->u.global.module, "torch") != 0)
        return bad(X, CKPT_ETYPE, v, "'%s': dtype is a %s, not a torch dtype", fqn, type_of(v));
    uint32_t bits = ckpt_torch_dtype_bits(v->u.global.name);
    if (!bits)
        return bad(X, CKPT_EINVALID, v, "'%s': unknown dtype torch.%s", fqn, v->u.global.name);
    t->dtype = v->u.global.name; /* lives in the doc arena: copied below */
    t->elem_bits = bits;
    return 0;
}

static int get_layout(struct ex *X, const struct pkl_value *v, const char *fqn, const char **out)
{
    if (v && v->type == PKL_OBJECT &&
        pkl_is_global(v->u.obj->cls, "torch.serialization", "_get_layout") &&
        v->u.obj->args->u.seq.len == 1)
        return get_str(X, v->u.obj->args->u.seq.items[0], "layout", fqn, out);
    if (v && v->type == PKL_GLOBAL && strcmp(v->u.global.module, "torch") == 0) {
        char buf[160];
        snprintf(buf, sizeof(buf), "torch.%s", v->u.global.name);
        char *s = arena_strndup(&X->c->arena, buf, strlen(buf));
        if (!s)
            return nomem(X);
        *out = s;
        return 0;
    }
    return bad(X, CKPT_ETYPE, v, "'%s': layout is a %s, not a torch layout", fqn, type_of(v));
}

static int get_properties(struct ex *X, const struct pkl_value *v, const char *fqn,
                          struct ckpt_tensor *t)
{
    if (!is_cls(v, "TensorProperties"))
        return bad(X, CKPT_ETYPE, v, "'%s': properties is a %s, not TensorProperties", fqn,
                   type_of(v));
    const struct pkl_value *s = v->u.obj->state;
    const struct pkl_value *dtype, *layout, *rg, *mf, *pin;
    if (s && s->type == PKL_TUPLE && s->u.seq.len == 5) {
        dtype = s->u.seq.items[0];
        layout = s->u.seq.items[1];
        rg = s->u.seq.items[2];
        mf = s->u.seq.items[3];
        pin = s->u.seq.items[4];
    } else if (s && s->type == PKL_DICT) {
        /* five lookups per tensor: a huge dict shared by every tensor's
         * properties (memo) would make them quadratic */
        if (s->u.seq.len > 2 * DCP_MAX_FIELDS)
            return bad(X, CKPT_ELIMIT, s,
                       "'%s': TensorProperties state dict has %zu entries (limit %d)", fqn,
                       s->u.seq.len / 2, DCP_MAX_FIELDS);
        dtype = pkl_dict_get(s, "dtype");
        layout = pkl_dict_get(s, "layout");
        rg = pkl_dict_get(s, "requires_grad");
        mf = pkl_dict_get(s, "memory_format");
        pin = pkl_dict_get(s, "pin_memory");
    } else {
        return bad(X, CKPT_ETYPE, v, "'%s': TensorProperties state is a %s, not a 5-tuple", fqn,
                   s ? pkl_type_name(s->type) : "missing");
    }
    int rc = get_dtype(X, dtype, fqn, t);
    if (!rc)
        rc = get_layout(X, layout, fqn, &t->layout);
    if (!rc)
        rc = get_bool(X, rg, "requires_grad", fqn, &t->requires_grad);
    if (!rc)
        rc = get_memfmt(X, mf, fqn, &t->memory_format);
    if (!rc)
        rc = get_bool(X, pin, "pin_memory", fqn, &t->pin_memory);
    return rc;
}

/* ---- state_dict_metadata ------------------------------------------------ */

/* Chunk-map key: tensor index (le32) + chunk offsets (le64 each; at most 64,
 * see get_shape) into k[CHUNK_KEY_MAX]; returns its length. Keyed by tensor
 * index, not fqn, so a long fqn is not copied once per chunk. */
#define CHUNK_KEY_MAX (4 + 8 * 64)

static size_t chunk_key(char *k, uint32_t tensor, const int64_t *offs, uint32_t n)
{
    assert(n <= 64); /* get_shape and the parser's folds refuse more dimensions */
    for (int b = 0; b < 4; b++)
        k[b] = (char)(tensor >> (8 * b));
    for (uint32_t d = 0; d < n; d++) {
        uint64_t u = (uint64_t)offs[d];
        for (int b = 0; b < 8; b++)
            k[4 + 8 * d + b] = (char)(u >> (8 * b));
    }
    return 4 + 8 * (size_t)n;
}

static int add_tensor(struct ex *X, const struct pkl_value *v, const char *fqn,
                      const struct pkl_value *fqnv)
{
    struct ckpt *c = X->c;
    assert((size_t)c->ntensors + c->nbytes < X->entry_cap);
    struct ckpt_tensor *t = &c->tensors[c->ntensors];
    memset(t, 0, sizeof(*t));
    t->fqn = fqn;
    int rc = get_properties(X, field(v, "properties"), fqn, t);
    if (rc)
        return rc;
    t->dtype = arena_strndup(&c->arena, t->dtype, strlen(t->dtype));
    if (!t->dtype)
        return nomem(X);
    const struct pkl_value *size = field(v, "size");
    if ((rc = get_shape(X, size, "size", fqn, &t->ndim, &t->size)))
        return rc;
    for (uint32_t d = 0; d < t->ndim; d++)
        if (t->size[d] < 0)
            return bad(X, CKPT_EINVALID, size, "'%s': size[%u] = %" PRId64 " is negative", fqn, d,
                       t->size[d]);
    const struct pkl_value *chunks = field(v, "chunks");
    if (!chunks || (chunks->type != PKL_LIST && chunks->type != PKL_TUPLE))
        return bad(X, CKPT_ETYPE, chunks ? chunks : v, "'%s': chunks is a %s, not a list", fqn,
                   type_of(chunks));
    size_t n = chunks->u.seq.len;
    if (n > UINT32_MAX / 2)
        return bad(X, CKPT_ELIMIT, chunks, "'%s': too many chunks", fqn);
    t->nchunks = (uint32_t)n;
    t->chunks = arena_zalloc(&c->arena, (n ? n : 1) * sizeof(*t->chunks));
    if (!t->chunks)
        return nomem(X);
    if (strmap_reset(&X->tchunks, n))
        return nomem(X);
    for (size_t i = 0; i < n; i++) {
        const struct pkl_value *ch = chunks->u.seq.items[i];
        uint32_t no, ns;
        if (ch->type == PKL_FOLDED && ch->u.fold->kind == PKL_FOLD_CHUNK) {
            /* folded by the parser: the same fields, already converted */
            const struct pkl_fold *f = ch->u.fold;
            no = f->noffs;
            ns = f->nsizes;
            int64_t *a = arena_alloc(&c->arena, ((size_t)no + ns + 1) * sizeof(int64_t));
            if (!a)
                return nomem(X);
            memcpy(a, f->offs, no * sizeof(int64_t));
            memcpy(a + no, f->sizes, ns * sizeof(int64_t));
            t->chunks[i].offsets = a;
            t->chunks[i].sizes = a + no;
        } else {
            if (!is_cls(ch, "ChunkStorageMetadata"))
                return bad(X, CKPT_ETYPE, ch, "'%s': chunk %zu is a %s, not ChunkStorageMetadata",
                           fqn, i, type_of(ch));
            if ((rc = get_shape(X, field(ch, "offsets"), "chunk offsets", fqn, &no,
                                &t->chunks[i].offsets)) ||
                (rc = get_shape(X, field(ch, "sizes"), "chunk sizes", fqn, &ns,
                                &t->chunks[i].sizes)))
                return rc;
        }
        if (no != t->ndim || ns != t->ndim)
            return bad(X, CKPT_EINVALID, ch,
                       "'%s': chunk %zu has %u-dim offsets and %u-dim sizes, tensor has %u dims",
                       fqn, i, no, ns, t->ndim);
        t->chunks[i].item = CKPT_NONE;
        if (X->nchunks == UINT32_MAX)
            return bad(X, CKPT_ELIMIT, ch, "too many chunks");
        /* chunks of one tensor by their offsets: a small map, reset per tensor */
        rc = strmap_put(&X->tchunks, t->chunks[i].offsets, (size_t)no * sizeof(int64_t),
                        (uint32_t)i, NULL);
        if (rc < 0)
            return nomem(X);
        if (rc == 1)
            return bad(X, CKPT_EINVALID, ch, "'%s': two chunks start at the same offsets", fqn);
        assert(X->nchunks < X->chunk_cap); /* walk_sdm counted every chunk list */
        X->chunk_tensor[X->nchunks] = c->ntensors;
        X->chunk_index[X->nchunks] = (uint32_t)i;
        X->nchunks++;
    }
    (void)fqnv;
    c->ntensors++;
    return 0;
}

static int walk_sdm(struct ex *X, const struct pkl_value *sdm)
{
    struct ckpt *c = X->c;
    size_t total_chunks = 0;
    for (size_t i = 0; i + 1 < sdm->u.seq.len; i += 2) {
        const struct pkl_value *v = sdm->u.seq.items[i + 1];
        const struct pkl_value *ch = field(v, "chunks");
        if (is_cls(v, "TensorStorageMetadata") && ch &&
            (ch->type == PKL_LIST || ch->type == PKL_TUPLE))
            total_chunks += ch->u.seq.len;
    }
    /* every chunk costs many bytes of pickle unless chunk lists are shared
     * through the memo; more chunks than input bytes means sharing, which
     * would make the work quadratic */
    if (total_chunks >= UINT32_MAX || total_chunks > X->c->dcp.size)
        return bad(X, CKPT_ELIMIT, sdm, "%zu chunks in a %" PRIu64 "-byte metadata", total_chunks,
                   X->c->dcp.size);
    X->chunk_tensor = malloc((total_chunks + 1) * sizeof(uint32_t));
    X->chunk_index = malloc((total_chunks + 1) * sizeof(uint32_t));
    if (!X->chunk_tensor || !X->chunk_index)
        return nomem(X);
    X->chunk_cap = total_chunks;

    for (size_t i = 0; i + 1 < sdm->u.seq.len; i += 2) {
        const struct pkl_value *k = sdm->u.seq.items[i], *v = sdm->u.seq.items[i + 1];
        const char *fqn;
        int rc = get_str(X, k, "state_dict key", "?", &fqn);
        if (rc)
            return rc;
        uint32_t val;
        if (strmap_get(&X->fqns, fqn, strlen(fqn), &val) == 0)
            return bad(X, CKPT_EINVALID, k, "'%s' appears twice in state_dict_metadata", fqn);
        if (is_cls(v, "TensorStorageMetadata")) {
            val = c->ntensors;
            rc = add_tensor(X, v, fqn, k);
        } else if (is_cls(v, "BytesStorageMetadata")) {
            assert((size_t)c->ntensors + c->nbytes < X->entry_cap);
            val = c->nbytes | BYTES_FLAG;
            c->bytes[c->nbytes].fqn = fqn;
            c->bytes[c->nbytes].item = CKPT_NONE;
            c->nbytes++;
        } else {
            return bad(X, CKPT_ETYPE, v,
                       "'%s': a %s, not TensorStorageMetadata or BytesStorageMetadata", fqn,
                       type_of(v));
        }
        if (rc)
            return rc;
        if (strmap_put(&X->fqns, fqn, strlen(fqn), val, NULL) < 0)
            return nomem(X);
    }
    return 0;
}

/* ---- storage_data -------------------------------------------------------- */

/* The file named s[0..len) (a relative_path; pv for messages). */
static int file_named(struct ex *X, const struct pkl_value *pv, const char *s, size_t len,
                      const char *fqn, uint32_t *out)
{
    uint32_t f;
    if (strmap_get(&X->files, s, len, &f) == 0) {
        *out = f; /* checked when first seen */
        return 0;
    }
    char why[96];
    if (ckpt_check_relpath(s, len, why, sizeof(why)))
        return bad(X, CKPT_EINVALID, pv, "'%s': relative_path '%.*s': %s", fqn,
                   (int)(len > 80 ? 80 : len), s, why);
    struct ckpt *c = X->c;
    /* a file is added only by the item being added: at most one per item */
    assert(c->nfiles <= c->nitems && c->nitems < X->item_cap);
    struct ckpt_file *fi = &c->files[c->nfiles];
    memset(fi, 0, sizeof(*fi));
    fi->name = arena_strndup(&c->arena, s, len);
    if (!fi->name)
        return nomem(X);
    fi->rank = ckpt_rank_of(fi->name);
    fi->size = CKPT_SIZE_UNKNOWN;
    fi->present = -1;
    if (strmap_put(&X->files, fi->name, len, c->nfiles, NULL) < 0)
        return nomem(X);
    *out = c->nfiles++;
    return 0;
}

static int file_of(struct ex *X, const struct pkl_value *pv, const char *fqn, uint32_t *out)
{
    if (!pv || pv->type != PKL_STR)
        return bad(X, CKPT_ETYPE, pv, "'%s': relative_path is a %s, not a str", fqn, type_of(pv));
    return file_named(X, pv, pv->u.str.s, pv->u.str.len, fqn, out);
}

static int get_transforms(struct ex *X, const struct pkl_value *td, const char *fqn,
                          struct ckpt_item *it)
{
    if (is_none(td))
        return 0;
    if (td->type != PKL_LIST && td->type != PKL_TUPLE)
        return bad(X, CKPT_ETYPE, td, "'%s': transform_descriptors is a %s, not a list", fqn,
                   type_of(td));
    size_t n = td->u.seq.len;
    if (n > 16) /* DCP writes one or two; a shared huge list would be quadratic */
        return bad(X, CKPT_ELIMIT, td, "'%s': %zu transform descriptors (limit 16)", fqn, n);
    it->has_transforms = 1;
    it->ntransforms = (uint32_t)n;
    it->transforms = arena_alloc(&X->c->arena, (n ? n : 1) * sizeof(char *));
    if (!it->transforms)
        return nomem(X);
    for (size_t i = 0; i < n; i++) {
        int rc = get_str(X, td->u.seq.items[i], "transform descriptor", fqn, &it->transforms[i]);
        if (rc)
            return rc;
    }
    return 0;
}

/* The chunk map of every tensor's chunks, for storage keys whose index
 * does not name their chunk (torch's always do). 0 or -ENOMEM. */
static int build_chunk_map(struct ex *X)
{
    if (X->chunks_built)
        return 0;
    if (strmap_init(&X->chunks, X->nchunks))
        return -ENOMEM;
    for (uint32_t g = 0; g < X->nchunks; g++) {
        const struct ckpt_tensor *t = &X->c->tensors[X->chunk_tensor[g]];
        char kb[CHUNK_KEY_MAX];
        size_t klen =
            chunk_key(kb, X->chunk_tensor[g], t->chunks[X->chunk_index[g]].offsets, t->ndim);
        char *key = arena_alloc(&X->scratch, klen);
        if (!key)
            return -ENOMEM;
        memcpy(key, kb, klen);
        if (strmap_put(&X->chunks, key, klen, g, NULL) < 0)
            return -ENOMEM;
    }
    X->chunks_built = 1;
    return 0;
}

/* The chunk of tensor t starting at offs[0..n): its index hint if that
 * chunk starts there (chunk offsets are unique per tensor, so it is the
 * one), else through the chunk map. 0 and *chunk, CKPT_NOTFOUND or -ENOMEM. */
static int find_chunk(struct ex *X, uint32_t t, const int64_t *offs, uint32_t n, int64_t hint,
                      uint32_t *chunk)
{
    assert(t < X->c->ntensors);
    const struct ckpt_tensor *tt = &X->c->tensors[t];
    if (hint >= 0 && hint < (int64_t)tt->nchunks && n == tt->ndim &&
        memcmp(tt->chunks[hint].offsets, offs, (size_t)n * sizeof(int64_t)) == 0) {
        *chunk = (uint32_t)hint;
        return 0;
    }
    if (build_chunk_map(X))
        return -ENOMEM;
    char k[CHUNK_KEY_MAX];
    size_t klen = chunk_key(k, t, offs, n);
    uint32_t g;
    if (strmap_get(&X->chunks, k, klen, &g) != 0)
        return CKPT_NOTFOUND;
    /* the key holds the tensor: a chunk found is one of t's */
    assert(g < X->nchunks && X->chunk_tensor[g] == t && X->chunk_index[g] < tt->nchunks);
    *chunk = X->chunk_index[g];
    return 0;
}

static int add_item(struct ex *X, const struct pkl_value *key, const struct pkl_value *info)
{
    struct ckpt *c = X->c;
    const struct pkl_fold *fk = NULL, *fi = NULL; /* folded by the parser */
    if (key->type == PKL_FOLDED && key->u.fold->kind == PKL_FOLD_INDEX)
        fk = key->u.fold;
    else if (!is_cls(key, "MetadataIndex"))
        return bad(X, CKPT_ETYPE, key, "storage_data key is a %s, not MetadataIndex", type_of(key));
    if (info->type == PKL_FOLDED && info->u.fold->kind == PKL_FOLD_STORAGE)
        fi = info->u.fold;
    else if (!is_cls(info, "_StorageInfo"))
        return bad(X, CKPT_ETYPE, info, "storage_data value is a %s, not _StorageInfo",
                   type_of(info));
    const struct pkl_value *fqnv = NULL, *offv = NULL, *idxv = NULL;
    if (!fk) {
        fqnv = field(key, "fqn");
        offv = field(key, "offset");
        idxv = field(key, "index");
        if (!fields_of(key) && key->u.obj->args && key->u.obj->args->u.seq.len >= 1) {
            /* MetadataIndex(fqn, offset, index) passed positionally */
            const struct pkl_value *a = key->u.obj->args;
            fqnv = a->u.seq.items[0];
            offv = a->u.seq.len > 1 ? a->u.seq.items[1] : NULL;
            idxv = a->u.seq.len > 2 ? a->u.seq.items[2] : NULL;
        }
    }
    assert(c->nitems < X->item_cap);
    struct ckpt_item *it = &c->items[c->nitems];
    memset(it, 0, sizeof(*it));
    int rc;
    uint32_t val;
    const char *fqn;
    if (fk) {
        /* the item's fqn is the state_dict entry's string (same text) */
        if (memchr(fk->str, '\0', fk->len))
            return bad(X, CKPT_EINVALID, key, "MetadataIndex.fqn contains a NUL byte");
        if (strmap_get(&X->fqns, fk->str, fk->len, &val) != 0)
            return bad(X, CKPT_EINVALID, key,
                       "storage entry for '%.*s', which state_dict_metadata lacks",
                       (int)(fk->len > 200 ? 200 : fk->len), fk->str);
        it->fqn = val & BYTES_FLAG ? c->bytes[val & ~BYTES_FLAG].fqn : c->tensors[val].fqn;
        it->index_hint = fk->has_index ? fk->index : -1;
        fqn = it->fqn;
    } else {
        if ((rc = get_str(X, fqnv, "MetadataIndex.fqn", "?", &it->fqn)))
            return rc;
        fqn = it->fqn;
        it->index_hint = -1;
        if (!is_none(idxv) && (rc = get_i64(X, idxv, "MetadataIndex.index", fqn, &it->index_hint)))
            return rc;
        if (strmap_get(&X->fqns, fqn, strlen(fqn), &val) != 0)
            return bad(X, CKPT_EINVALID, key,
                       "storage entry for '%s', which state_dict_metadata lacks", fqn);
    }
    /* fqns maps to entries already added */
    assert(val & BYTES_FLAG ? (val & ~BYTES_FLAG) < c->nbytes : val < c->ntensors);
    int no_offset = fk ? fk->noffs == PKL_FOLD_NOSHAPE : is_none(offv);
    uint32_t item_no = c->nitems;
    if (val & BYTES_FLAG) {
        struct ckpt_bytes *b = &c->bytes[val & ~BYTES_FLAG];
        if (!no_offset)
            return bad(X, CKPT_EINVALID, fk ? key : offv,
                       "'%s' is a bytes entry but its key has an offset", fqn);
        if (b->item != CKPT_NONE)
            return bad(X, CKPT_EINVALID, key, "'%s' has two storage entries", fqn);
        b->item = item_no;
        it->kind = CKPT_ITEM_BYTES;
        it->tensor = it->chunk = CKPT_NONE;
        it->bytes = val & ~BYTES_FLAG;
    } else {
        uint32_t n;
        const int64_t *offs;
        if (no_offset)
            return bad(X, CKPT_EINVALID, key, "'%s' is a tensor but its key has no chunk offset",
                       fqn);
        if (fk) {
            n = fk->noffs;
            offs = fk->offs;
        } else if ((rc = get_shape(X, offv, "MetadataIndex.offset", fqn, &n, &offs))) {
            return rc;
        }
        uint32_t ci;
        rc = find_chunk(X, val, offs, n, it->index_hint, &ci);
        if (rc == -ENOMEM)
            return nomem(X);
        if (rc)
            return bad(X, CKPT_EINVALID, key, "storage entry for '%s' names no chunk of it", fqn);
        assert(ci < c->tensors[val].nchunks);
        struct ckpt_chunk *ch = &c->tensors[val].chunks[ci];
        if (ch->item != CKPT_NONE)
            return bad(X, CKPT_EINVALID, key,
                       "'%s' chunk %u has two storage entries (duplicate MetadataIndex)", fqn, ci);
        ch->item = item_no;
        it->kind = CKPT_ITEM_TENSOR;
        it->tensor = val;
        it->chunk = ci;
        it->bytes = CKPT_NONE;
    }
    int64_t off, len;
    if (fi) {
        if ((rc = file_named(X, info, fi->str, fi->len, fqn, &it->file)))
            return rc;
        off = fi->off;
        len = fi->size;
        if (off < 0 || len < 0 || len > INT64_MAX - off)
            return bad(X, CKPT_EINVALID, info,
                       "'%s': storage offset %" PRId64 " or length %" PRId64
                       " is negative or overflows",
                       fqn, off, len);
    } else {
        if ((rc = file_of(X, field(info, "relative_path"), fqn, &it->file)))
            return rc;
        const struct pkl_value *ov = field(info, "offset"), *lv = field(info, "length");
        if ((rc = get_i64(X, ov, "storage offset", fqn, &off)) ||
            (rc = get_i64(X, lv, "storage length", fqn, &len)))
            return rc;
        if (off < 0)
            return bad(X, CKPT_EINVALID, ov, "'%s': storage offset %" PRId64 " is negative", fqn,
                       off);
        if (len < 0)
            return bad(X, CKPT_EINVALID, lv, "'%s': storage length %" PRId64 " is negative", fqn,
                       len);
        if (len > INT64_MAX - off)
            return bad(X, CKPT_EINVALID, lv,
                       "'%s': offset %" PRId64 " + length %" PRId64 " overflows 64 bits", fqn, off,
                       len);
    }
    it->offset = (uint64_t)off;
    it->length = (uint64_t)len;
    if (!fi && (rc = get_transforms(X, field(info, "transform_descriptors"), fqn, it)))
        return rc;
    c->nitems++;
    return 0;
}

/* ---- storage_meta, planner_data ------------------------------------------- */

static int get_path(struct ex *X, const struct pkl_value *v, const char **out)
{
    struct ckpt_dcp_info *info = &X->c->dcp;
    if (is_none(v)) {
        *out = NULL;
        return 0;
    }
    if (v->type == PKL_STR) {
        info->path_style = "str";
        return get_str(X, v, "checkpoint_id", "storage_meta", out);
    }
    const struct pkl_value *cls = pkl_class_of(v);
    if (v->type != PKL_OBJECT || !cls ||
        (strcmp(cls->u.global.module, "pathlib") != 0 &&
         strcmp(cls->u.global.module, "pathlib._local") != 0))
        return bad(X, CKPT_ETYPE, v, "storage_meta.checkpoint_id is a %s, not a str or path",
                   type_of(v));
    const struct pkl_value *a = v->u.obj->args;
    size_t total = 2;
    for (size_t i = 0; i < a->u.seq.len; i++) {
        if (a->u.seq.items[i]->type != PKL_STR)
            return bad(X, CKPT_ETYPE, a->u.seq.items[i], "path part is a %s, not a str",
                       type_of(a->u.seq.items[i]));
        total += a->u.seq.items[i]->u.str.len + 1;
    }
    char *s = arena_alloc(&X->c->arena, total);
    if (!s)
        return nomem(X);
    size_t n = 0;
    for (size_t i = 0; i < a->u.seq.len; i++) {
        const struct pkl_value *p = a->u.seq.items[i];
        if (p->u.str.len == 0)
            continue;
        if (p->u.str.s[0] == '/')
            n = 0; /* an absolute part restarts the path, as pathlib does */
        else if (n && s[n - 1] != '/')
            s[n++] = '/';
        memcpy(s + n, p->u.str.s, p->u.str.len);
        n += p->u.str.len;
    }
    if (n == 0)
        s[n++] = '.';
    s[n] = '\0';
    if (memchr(s, '\0', n))
        return bad(X, CKPT_EINVALID, v, "checkpoint_id contains a NUL byte");
    info->path_style = strcmp(cls->u.global.module, "pathlib._local") == 0 ? "local" : "parts";
    *out = s;
    return 0;
}

static int get_opt_str(struct ex *X, const struct pkl_value *v, const char *what, const char **out)
{
    if (is_none(v)) {
        *out = NULL;
        return 0;
    }
    return get_str(X, v, what, "storage_meta", out);
}

static int walk_storage_meta(struct ex *X, const struct pkl_value *v)
{
    struct ckpt_dcp_info *info = &X->c->dcp;
    if (is_none(v))
        return 0;
    if (!is_cls(v, "StorageMeta"))
        return bad(X, CKPT_ETYPE, v, "storage_meta is a %s, not StorageMeta", type_of(v));
    info->storage_meta_set = 1;
    int rc = get_path(X, field(v, "checkpoint_id"), &info->checkpoint_id);
    if (!rc)
        rc = get_opt_str(X, field(v, "save_id"), "save_id", &info->save_id);
    if (!rc)
        rc = get_opt_str(X, field(v, "load_id"), "load_id", &info->load_id);
    if (rc)
        return rc;
    const struct pkl_value *m = field(v, "modules");
    if (is_none(m))
        return 0;
    if (m->type != PKL_LIST && m->type != PKL_TUPLE)
        return bad(X, CKPT_ETYPE, m, "storage_meta.modules is a %s, not a list", type_of(m));
    info->nmodules = (uint32_t)m->u.seq.len;
    info->modules = arena_alloc(&X->c->arena, (m->u.seq.len + 1) * sizeof(char *));
    if (!info->modules)
        return nomem(X);
    for (size_t i = 0; i < m->u.seq.len; i++)
        if ((rc = get_str(X, m->u.seq.items[i], "module name", "storage_meta", &info->modules[i])))
            return rc;
    return 0;
}

/* planner_data -> JSON. Memo sharing lets a small pickle describe a huge
 * tree (one long str referenced by thousands of DUPs), so the conversion is
 * bounded twice: values visited (nodes) and bytes of text copied into the
 * JSON (bytes: strs, dict keys, reprs). */
struct jctx {
    size_t nodes, bytes;
    int code;                   /* why to_json returned NULL */
    const char *why;            /* ... in words */
    const struct pkl_value *at; /* ... and where */
};

static json_t *jfail(struct jctx *J, int code, const char *why, const struct pkl_value *v)
{
    J->code = code;
    J->why = why;
    J->at = v;
    return NULL;
}

static int charge(struct jctx *J, size_t n, const struct pkl_value *v)
{
    if (n > J->bytes) {
        jfail(J, CKPT_ELIMIT, "expands to too much text (shared strings)", v);
        return -1;
    }
    J->bytes -= n;
    return 0;
}

/* A pkl_repr() rendering for JSON. Truncation may cut a UTF-8 sequence and
 * strs may hold surrogates, both of which jansson refuses: such a rendering
 * (lossy anyway) gets '?' for every non-ASCII byte. */
static void repr_for_json(const struct pkl_value *v, char *buf, size_t len, size_t depth,
                          size_t nodes)
{
    pkl_repr(v, buf, len, depth, nodes);
    json_t *probe = json_string(buf);
    if (probe) {
        json_decref(probe);
        return;
    }
    for (char *s = buf; *s; s++)
        if ((unsigned char)*s >= 0x80)
            *s = '?';
}

/* A JSON string of the str s[0..n): an encoded surrogate (Python's
 * surrogatepass) or NUL, which JSON text cannot carry as such, becomes
 * U+FFFD, as in the admin tool's output. NULL only when out of memory. */
static json_t *json_lossy(const char *s, size_t n)
{
    char *u = ckpt_utf8_lossy(s, n, &n);
    json_t *r = u ? json_stringn(u, n) : NULL;
    free(u);
    return r;
}

static json_t *to_json(struct jctx *J, const struct pkl_value *v, int depth)
{
    if (!v)
        return jfail(J, CKPT_EFORMAT, "holds no value", v);
    if (depth > 64)
        return jfail(J, CKPT_ELIMIT, "is nested more than 64 levels deep", v);
    if (J->nodes == 0)
        return jfail(J, CKPT_ELIMIT, "expands to too many values (shared containers)", v);
    J->nodes--;
    json_t *r;
    switch (v->type) {
    case PKL_NONE:
        r = json_null();
        break;
    case PKL_BOOL:
        r = json_boolean(v->u.b);
        break;
    case PKL_INT:
        r = json_integer(v->u.i);
        break;
    case PKL_FLOAT:
        if (isnan(v->u.f) || isinf(v->u.f))
            return jfail(J, CKPT_EINVALID, "holds a NaN or infinite float JSON cannot represent",
                         v);
        r = json_real(v->u.f);
        break;
    case PKL_STR:
        if (charge(J, v->u.str.len, v))
            return NULL;
        r = json_lossy(v->u.str.s, v->u.str.len);
        break;
    case PKL_TUPLE:
    case PKL_LIST:
    case PKL_SET:
    case PKL_FROZENSET: {
        json_t *a = json_array();
        for (size_t i = 0; a && i < v->u.seq.len; i++) {
            json_t *x = to_json(J, v->u.seq.items[i], depth + 1);
            if (!x) {
                json_decref(a);
                return NULL;
            }
            if (json_array_append_new(a, x)) {
                json_decref(a);
                a = NULL;
            }
        }
        r = a;
        break;
    }
    case PKL_DICT: {
        json_t *o = json_object();
        for (size_t i = 0; o && i + 1 < v->u.seq.len; i += 2) {
            const struct pkl_value *k = v->u.seq.items[i];
            char kb[64];
            const char *ks;
            size_t kl;
            if (k->type == PKL_STR) {
                ks = k->u.str.s;
                kl = k->u.str.len;
            } else {
                if (k->type == PKL_INT) {
                    snprintf(kb, sizeof(kb), "%" PRId64, k->u.i);
                } else {
                    repr_for_json(k, kb, sizeof(kb), 4, 32);
                }
                ks = kb;
                kl = strlen(kb);
            }
            if (charge(J, kl, k)) {
                json_decref(o);
                return NULL;
            }
            json_t *x = to_json(J, v->u.seq.items[i + 1], depth + 1);
            if (!x) {
                json_decref(o);
                return NULL;
            }
            char *key = ckpt_utf8_lossy(ks, kl, &kl);
            if (!key || json_object_setn_new(o, key, kl, x)) {
                if (!key)
                    json_decref(x);
                json_decref(o);
                o = NULL;
            }
            free(key);
        }
        r = o;
        break;
    }
    case PKL_FOLDED: /* dcp_parse reads the file again without folding */
        return jfail(J, CKPT_ETYPE, "holds a folded DCP record", v);
    default: {
        char buf[512];
        repr_for_json(v, buf, sizeof(buf), 8, 64);
        if (charge(J, strlen(buf), v))
            return NULL;
        r = json_string(buf);
        break;
    }
    }
    return r ? r : jfail(J, -ENOMEM, "cannot be converted: out of memory", v);
}

static int walk_planner_data(struct ex *X, const struct pkl_value *v)
{
    /* a tree visits each edge once and every edge costs an opcode byte, so
     * input bytes + values bounds an honest conversion's values; its text
     * (torch writes fqn -> path tuples, about 0.15 bytes per metadata byte)
     * gets 4 bytes per input byte + 16 MiB. Shared subtrees and strings (memo
     * DAGs) that would expand beyond that are refused. */
    uint64_t size = X->c->dcp.size;
    struct jctx J = {(size_t)size + X->doc->nvalues,
                     size > (SIZE_MAX - (16u << 20)) / 4 ? SIZE_MAX
                                                         : (size_t)size * 4 + (16u << 20),
                     0, NULL, NULL};
    json_t *j = is_none(v) ? json_null() : to_json(&J, v, 0);
    if (!j) {
        if (J.code == -ENOMEM)
            return nomem(X);
        return bad(X, J.code, J.at ? J.at : v, "planner_data %s", J.why);
    }
    char *s = json_dumps(j, JSON_COMPACT | JSON_ENCODE_ANY);
    json_decref(j);
    if (!s)
        return nomem(X);
    X->c->dcp.planner_data_json = arena_strndup(&X->c->arena, s, strlen(s));
    free(s);
    return X->c->dcp.planner_data_json ? 0 : nomem(X);
}

/* ---- top level ------------------------------------------------------------ */

static int walk(struct ex *X, const struct pkl_value *root)
{
    struct ckpt *c = X->c;
    struct ckpt_dcp_info *info = &c->dcp;
    if (!is_cls(root, "Metadata"))
        return bad(X, CKPT_EFORMAT, root, "the pickle holds a %s, not a DCP Metadata",
                   type_of(root));
    const struct pkl_value *cls = root->u.obj->cls;
    char name[600];
    snprintf(name, sizeof(name), "%s.%s", cls->u.global.module, cls->u.global.name);
    if (!(info->metadata_class = arena_strndup(&c->arena, name, strlen(name))))
        return nomem(X);
    const struct pkl_value *f = fields_of(root);
    if (!f)
        return bad(X, CKPT_EFORMAT, root, "Metadata has no field dict");
    info->fields = arena_alloc(&c->arena, (f->u.seq.len / 2 + 1) * sizeof(char *));
    if (!info->fields)
        return nomem(X);
    for (size_t i = 0; i + 1 < f->u.seq.len; i += 2) {
        int rc = get_str(X, f->u.seq.items[i], "Metadata field name", "Metadata",
                         &info->fields[info->nfields]);
        if (rc)
            return rc;
        if (strcmp(info->fields[info->nfields], "storage_meta") == 0)
            info->has_storage_meta = 1;
        if (strcmp(info->fields[info->nfields], "version") == 0)
            info->has_version = 1;
        info->nfields++;
    }
    const struct pkl_value *sdm = field(root, "state_dict_metadata");
    const struct pkl_value *sd = field(root, "storage_data");
    if (!sdm || sdm->type != PKL_DICT)
        return bad(X, CKPT_EFORMAT, sdm ? sdm : root,
                   "Metadata.state_dict_metadata is a %s, not a dict", type_of(sdm));
    if (sd && !is_none(sd) && sd->type != PKL_DICT)
        return bad(X, CKPT_ETYPE, sd, "Metadata.storage_data is a %s, not a dict", type_of(sd));
    size_t nsdm = sdm->u.seq.len / 2, nsd = is_none(sd) ? 0 : sd->u.seq.len / 2;
    if (nsdm >= UINT32_MAX / 2 || nsd >= UINT32_MAX / 2)
        return bad(X, CKPT_ELIMIT, root, "too many entries");
    c->tensors = arena_alloc(&c->arena, (nsdm + 1) * sizeof(*c->tensors));
    c->bytes = arena_alloc(&c->arena, (nsdm + 1) * sizeof(*c->bytes));
    c->items = arena_alloc(&c->arena, (nsd + 1) * sizeof(*c->items));
    c->files = arena_alloc(&c->arena, (nsd + 1) * sizeof(*c->files));
    if (!c->tensors || !c->bytes || !c->items || !c->files || strmap_init(&X->fqns, nsdm) ||
        strmap_init(&X->files, 16))
        return nomem(X);
    X->entry_cap = nsdm;
    X->item_cap = nsd;
    int rc = walk_sdm(X, sdm);
    if (rc)
        return rc;
    assert(c->ntensors + c->nbytes <= nsdm && X->nchunks <= X->chunk_cap);
    for (size_t i = 0; i < 2 * nsd; i += 2)
        if ((rc = add_item(X, sd->u.seq.items[i], sd->u.seq.items[i + 1])))
            return rc;
    assert(c->nitems == nsd && c->nfiles <= nsd);
    for (uint32_t t = 0; t < c->ntensors; t++)
        for (uint32_t k = 0; k < c->tensors[t].nchunks; k++)
            if (c->tensors[t].chunks[k].item == CKPT_NONE)
                return bad(X, CKPT_EINVALID, NULL, "'%s' chunk %u has no storage entry",
                           c->tensors[t].fqn, k);
    for (uint32_t b = 0; b < c->nbytes; b++)
        if (c->bytes[b].item == CKPT_NONE)
            return bad(X, CKPT_EINVALID, NULL, "bytes entry '%s' has no storage entry",
                       c->bytes[b].fqn);
    if (info->has_storage_meta && (rc = walk_storage_meta(X, field(root, "storage_meta"))))
        return rc;
    if (info->has_version &&
        (rc = get_opt_str(X, field(root, "version"), "version", &info->version)))
        return rc;
    return walk_planner_data(X, field(root, "planner_data"));
}

/* One parse and extraction, with the parser folding DCP records or not. */
static int parse_once(const void *buf, size_t len, const struct dcp_options *opt, int fold,
                      struct ckpt **out, struct ckpt_err *err)
{
    struct pkl_options popt = opt->pkl;
    popt.fold = fold;
    struct pkl_doc *doc;
    int rc = pkl_parse(buf, len, &popt, &doc, err);
    if (rc)
        return rc;
    struct ex X;
    memset(&X, 0, sizeof(X));
    X.err = err;
    X.doc = doc;
    arena_init(&X.scratch, 0);
    X.c = ckpt_new(CKPT_FORMAT_DCP, opt->max_memory);
    if (!X.c) {
        rc = nomem(&X);
        goto done;
    }
    struct ckpt_dcp_info *info = &X.c->dcp;
    info->protocol = doc->protocol;
    info->size = len;
    memcpy(info->opcodes, doc->opcodes, sizeof(info->opcodes));
    info->globals = arena_alloc(&X.c->arena, (doc->nglobals + 1) * sizeof(char *));
    if (!info->globals) {
        rc = nomem(&X);
        goto done;
    }
    for (size_t i = 0; i < doc->nglobals; i++) {
        size_t ml = strlen(doc->global_module[i]), nl = strlen(doc->global_name[i]);
        char *g = arena_alloc(&X.c->arena, ml + nl + 2);
        if (!g) {
            rc = nomem(&X);
            goto done;
        }
        memcpy(g, doc->global_module[i], ml);
        g[ml] = ' ';
        memcpy(g + ml + 1, doc->global_name[i], nl + 1);
        info->globals[info->nglobals++] = g;
    }
    rc = walk(&X, doc->root);
    if (!rc)
        rc = ckpt_finish(X.c, err);
done:
    pkl_free(doc);
    strmap_free(&X.files);
    strmap_free(&X.fqns);
    strmap_free(&X.chunks);
    strmap_free(&X.tchunks);
    free(X.chunk_tensor);
    free(X.chunk_index);
    vc_free(&X.strs);
    vc_free(&X.shapes);
    arena_release(&X.scratch);
    if (rc) {
        if (!rc || (err && !err->code))
            ckpt_err_set(err, rc, CKPT_NOPOS, "dcp: %s", ckpt_strerror(rc));
        ckpt_free(X.c);
        return rc;
    }
    *out = X.c;
    return 0;
}

int dcp_parse(const void *buf, size_t len, const struct dcp_options *opt, struct ckpt **out,
              struct ckpt_err *err)
{
    struct dcp_options defaults;
    if (!opt) {
        dcp_options_default(&defaults);
        opt = &defaults;
    }
    *out = NULL;
    ckpt_err_clear(err);
    if (opt->pkl.fold) {
        /* folded records are exactly what the extraction would take from
         * the objects; anything unusual fails here and is read again
         * without folding, which gives the error (or the model) with the
         * plain values' positions */
        int rc = parse_once(buf, len, opt, 1, out, err);
        if (rc == 0 || opt->no_refold)
            return rc;
        ckpt_err_clear(err);
    }
    return parse_once(buf, len, opt, 0, out, err);
}
