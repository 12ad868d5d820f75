/*
 * tools/admin/cmd_query.c - read-only views of one checkpoint:
 *   ls CKPT          tensors (fqn, dtype, shape, chunks) and bytes entries
 *   where CKPT FQN   file, offset, length of every chunk of one entry
 *   dump FILE|DIR    everything parsed, as JSON in the fixtures' schema
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "admin.h"
#include "pickle.h"

static uint64_t tensor_nbytes(const struct ckpt_tensor *t)
{
    unsigned __int128 n = t->elem_bits;
    for (uint32_t d = 0; d < t->ndim; d++)
        n *= (uint64_t)t->size[d];
    n /= 8;
    return n > UINT64_MAX ? UINT64_MAX : (uint64_t)n;
}

/* [{"offsets": [...], "sizes": [...]}, ...]: the chunks of t */
static json_t *chunks_json(const struct ckpt_tensor *t)
{
    json_t *a = json_array();
    for (uint32_t k = 0; k < t->nchunks; k++)
        json_array_append_new(a, json_pack("{s:o,s:o}", "offsets",
                                           json_i64_array(t->chunks[k].offsets, t->ndim), "sizes",
                                           json_i64_array(t->chunks[k].sizes, t->ndim)));
    return a;
}

/* [{"fqn": ...}, ...]: the bytes entries of c */
static json_t *bytes_json(const struct ckpt *c)
{
    json_t *a = json_array();
    for (uint32_t b = 0; b < c->nbytes; b++)
        json_array_append_new(a, json_pack("{s:o}", "fqn", json_bytes(c->bytes[b].fqn)));
    return a;
}

/* j["transform_descriptors"] = [...] if the item has any */
static void add_transforms(json_t *j, const struct ckpt_item *it)
{
    if (!it->has_transforms)
        return;
    json_t *td = json_array();
    for (uint32_t k = 0; k < it->ntransforms; k++)
        json_array_append_new(td, json_bytes(it->transforms[k]));
    json_object_set_new(j, "transform_descriptors", td);
}

/* ---- ls --------------------------------------------------------------- */

int cmd_ls(struct admin_opts *o)
{
    struct admin_src src;
    struct ckpt *c;
    int ex = admin_load_ckpt(o, 1, "ls CKPT [--json]", &src, &c);
    if (ex)
        return ex;
    if (o->json) {
        json_t *ts = json_array();
        for (uint32_t t = 0; t < c->ntensors; t++) {
            const struct ckpt_tensor *tt = &c->tensors[t];
            json_array_append_new(
                ts, json_pack("{s:o,s:o,s:o,s:I,s:o}", "fqn", json_bytes(tt->fqn), "dtype",
                              json_bytes(tt->dtype), "shape", json_i64_array(tt->size, tt->ndim),
                              "nbytes", (json_int_t)tensor_nbytes(tt), "chunks", chunks_json(tt)));
        }
        ex = json_out(json_pack("{s:o,s:s,s:o,s:o}", "checkpoint", json_bytes(src.url), "format",
                                format_name(c->format), "tensors", ts, "bytes", bytes_json(c)));
    } else {
        struct table tb;
        table_init(&tb, 5, "FQN", "DTYPE", "SHAPE", "CHUNKS", "BYTES");
        for (uint32_t t = 0; t < c->ntensors; t++) {
            const struct ckpt_tensor *tt = &c->tensors[t];
            char shape[512], nch[32], nb[32];
            snprintf(nch, sizeof(nch), "%u", tt->nchunks);
            table_row(&tb, tt->fqn, tt->dtype, fmt_shape(shape, sizeof(shape), tt->size, tt->ndim),
                      nch, fmt_u64(nb, sizeof(nb), tensor_nbytes(tt)));
        }
        for (uint32_t b = 0; b < c->nbytes; b++)
            table_row(&tb, c->bytes[b].fqn, "(bytes)", "", "1", "");
        table_print(&tb, stdout);
        table_free(&tb);
        printf("%u tensors, %u bytes entries, %u items in %u files (%s)\n", c->ntensors, c->nbytes,
               c->nitems, c->nfiles, format_name(c->format));
    }
    ckpt_free(c);
    src_close(&src);
    return ex;
}

/* ---- where ------------------------------------------------------------ */

static json_t *item_json(const struct ckpt *c, const struct ckpt_item *it)
{
    json_t *j = json_pack("{s:o,s:I,s:I}", "file", json_bytes(c->files[it->file].name), "offset",
                          (json_int_t)it->offset, "length", (json_int_t)it->length);
    add_transforms(j, it);
    return j;
}

int cmd_where(struct admin_opts *o)
{
    struct admin_src src;
    struct ckpt *c;
    int ex = admin_load_ckpt(o, 2, "where CKPT FQN [--json]", &src, &c);
    if (ex)
        return ex;
    enum ckpt_item_kind kind;
    uint32_t idx;
    if (ckpt_find_fqn(c, o->argv[1], &kind, &idx)) {
        ex = report_msg(o, EX_NOTFOUND, src.url, CKPT_NOTFOUND, "no tensor or bytes entry '%s'",
                        o->argv[1]);
        goto out;
    }
    if (kind == CKPT_ITEM_BYTES) {
        const struct ckpt_item *it = &c->items[c->bytes[idx].item];
        if (o->json) {
            json_t *j = json_pack("{s:o,s:s}", "fqn", json_bytes(it->fqn), "kind", "bytes");
            json_t *ij = item_json(c, it);
            if (json_object_update(j, ij)) {
                json_decref(j);
                j = NULL;
            }
            json_decref(ij);
            ex = json_out(j);
        } else {
            printf("%s (bytes)\n", it->fqn);
            printf("%s  offset %" PRIu64 "  length %" PRIu64 "\n", c->files[it->file].name,
                   it->offset, it->length);
        }
        goto out;
    }
    const struct ckpt_tensor *t = &c->tensors[idx];
    char shape[512];
    if (o->json) {
        json_t *chunks = json_array();
        for (uint32_t k = 0; k < t->nchunks; k++) {
            const struct ckpt_item *it = &c->items[t->chunks[k].item];
            json_t *j = json_pack("{s:i,s:o,s:o}", "chunk", (int)k, "offsets",
                                  json_i64_array(t->chunks[k].offsets, t->ndim), "sizes",
                                  json_i64_array(t->chunks[k].sizes, t->ndim));
            json_t *ij = item_json(c, it);
            json_object_update(j, ij);
            json_decref(ij);
            json_array_append_new(chunks, j);
        }
        ex = json_out(json_pack("{s:o,s:s,s:o,s:o,s:o}", "fqn", json_bytes(t->fqn), "kind",
                                "tensor", "dtype", json_bytes(t->dtype), "shape",
                                json_i64_array(t->size, t->ndim), "chunks", chunks));
    } else {
        printf("%s  %s %s\n", t->fqn, t->dtype, fmt_shape(shape, sizeof(shape), t->size, t->ndim));
        struct table tb;
        table_init(&tb, 6, "CHUNK", "OFFSETS", "SIZES", "FILE", "OFFSET", "LENGTH");
        for (uint32_t k = 0; k < t->nchunks; k++) {
            const struct ckpt_item *it = &c->items[t->chunks[k].item];
            char a[512], b[512], n[32], off[32], len[32];
            snprintf(n, sizeof(n), "%u", k);
            table_row(&tb, n, fmt_shape(a, sizeof(a), t->chunks[k].offsets, t->ndim),
                      fmt_shape(b, sizeof(b), t->chunks[k].sizes, t->ndim), c->files[it->file].name,
                      fmt_u64(off, sizeof(off), it->offset), fmt_u64(len, sizeof(len), it->length));
        }
        table_print(&tb, stdout);
        table_free(&tb);
    }
out:
    ckpt_free(c);
    src_close(&src);
    return ex;
}

/* ---- dump ------------------------------------------------------------- */

static int cmp_cstr(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static json_t *dump_dcp(const struct admin_opts *o, struct admin_src *src, const struct ckpt *c)
{
    const struct ckpt_dcp_info *d = &c->dcp;
    json_t *j = json_object();
    json_object_set_new(j, "format", json_string("dcp"));
    json_object_set_new(j, "source", json_bytes(c->source));
    if (d->nmetadata_files) { /* one checkpoint from per-rank __R.metadata files */
        json_t *mf = json_array();
        for (uint32_t i = 0; i < d->nmetadata_files; i++)
            json_array_append_new(mf, json_bytes(d->metadata_files[i]));
        json_object_set_new(j, "metadata_files", mf);
    }
    json_object_set_new(j, "pickle_protocol", json_integer(d->protocol));
    json_object_set_new(j, "writer_style",
                        json_pack("{s:o,s:o}", "enum", json_bytes(d->enum_style), "path",
                                  json_bytes(d->path_style)));
    json_object_set_new(j, "metadata_class", json_bytes(d->metadata_class));
    json_t *a = json_array();
    for (uint32_t i = 0; i < d->nfields; i++)
        json_array_append_new(a, json_bytes(d->fields[i]));
    json_object_set_new(j, "metadata_fields", a);
    a = json_array();
    for (uint32_t i = 0; i < d->nglobals; i++)
        json_array_append_new(a, json_bytes(d->globals[i]));
    json_object_set_new(j, "globals", a);
    const char *names[256];
    size_t n = 0;
    for (unsigned op = 0; op < 256; op++)
        if ((d->opcodes[op >> 6] >> (op & 63)) & 1)
            if (pkl_opcode_name(op))
                names[n++] = pkl_opcode_name(op);
    qsort(names, n, sizeof(names[0]), cmp_cstr);
    a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_string(names[i]));
    json_object_set_new(j, "opcodes", a);
    json_object_set_new(j, "size", json_integer((json_int_t)d->size));
    char hex[65];
    const char *mpath = src->file ? src->file : ".metadata";
    if (sha256_range(&src->io, mpath, 0, d->size, hex) == 0)
        json_object_set_new(j, "sha256", json_string(hex));

    json_t *ts = json_array();
    for (uint32_t t = 0; t < c->ntensors; t++) {
        const struct ckpt_tensor *tt = &c->tensors[t];
        json_array_append_new(
            ts,
            json_pack("{s:o,s:o,s:i,s:o,s:{s:o,s:o,s:b,s:o,s:b},s:o}", "fqn", json_bytes(tt->fqn),
                      "dtype", json_bytes(tt->dtype), "element_size", (int)(tt->elem_bits / 8),
                      "size", json_i64_array(tt->size, tt->ndim), "properties", "dtype",
                      json_bytes(tt->dtype), "layout", json_bytes(tt->layout), "requires_grad",
                      tt->requires_grad, "memory_format", json_bytes(tt->memory_format),
                      "pin_memory", tt->pin_memory, "chunks", chunks_json(tt)));
    }
    json_object_set_new(j, "tensors", ts);
    json_object_set_new(j, "bytes", bytes_json(c));
    json_t *st = json_array();
    for (uint32_t i = 0; i < c->nitems; i++) {
        const struct ckpt_item *it = &c->items[i];
        json_t *e = json_object();
        json_object_set_new(e, "fqn", json_bytes(it->fqn));
        if (it->kind == CKPT_ITEM_TENSOR) {
            const struct ckpt_tensor *tt = &c->tensors[it->tensor];
            json_object_set_new(e, "chunk_offset",
                                json_i64_array(tt->chunks[it->chunk].offsets, tt->ndim));
        } else {
            json_object_set_new(e, "chunk_offset", json_null());
        }
        json_object_set_new(e, "index_hint",
                            it->index_hint < 0 ? json_null() : json_integer(it->index_hint));
        json_object_set_new(e, "relative_path", json_bytes(c->files[it->file].name));
        json_object_set_new(e, "offset", json_integer((json_int_t)it->offset));
        json_object_set_new(e, "length", json_integer((json_int_t)it->length));
        if (it->has_transforms) {
            json_t *td = json_array();
            for (uint32_t k = 0; k < it->ntransforms; k++)
                json_array_append_new(td, json_bytes(it->transforms[k]));
            json_object_set_new(e, "transform_descriptors", td);
        }
        if (o->hash && c->files[it->file].present == 1) {
            char *p = ckpt_path_join("", c->files[it->file].name);
            if (p && sha256_range(&src->io, p, it->offset, it->length, hex) == 0)
                json_object_set_new(e, "item_sha256", json_string(hex));
            free(p);
        }
        json_array_append_new(st, e);
    }
    json_object_set_new(j, "storage", st);
    json_error_t je;
    json_t *pd = json_loads(d->planner_data_json, JSON_DECODE_ANY, &je);
    json_object_set_new(j, "planner_data", pd ? pd : json_null());
    if (d->has_storage_meta) {
        if (!d->storage_meta_set) {
            json_object_set_new(j, "storage_meta", json_null());
        } else {
            json_t *mods = json_array();
            for (uint32_t i = 0; i < d->nmodules; i++)
                json_array_append_new(mods, json_bytes(d->modules[i]));
            json_object_set_new(j, "storage_meta",
                                json_pack("{s:o,s:o,s:o,s:o}", "checkpoint_id",
                                          json_bytes(d->checkpoint_id), "save_id",
                                          json_bytes(d->save_id), "load_id", json_bytes(d->load_id),
                                          "modules", mods));
        }
    }
    if (d->has_version)
        json_object_set_new(j, "version", json_bytes(d->version));
    if (!src->file) {
        json_t *files = json_object();
        for (uint32_t f = 0; f < c->nfiles; f++) {
            const struct ckpt_file *fi = &c->files[f];
            json_t *fj = json_pack("{s:b}", "present", fi->present == 1);
            if (fi->present == 1) {
                json_object_set_new(fj, "size", json_integer((json_int_t)fi->size));
                if (o->hash && sha256_range(&src->io, fi->name, 0, fi->size, hex) == 0)
                    json_object_set_new(fj, "sha256", json_string(hex));
            }
            json_object_set_bytes(files, fi->name, fj);
        }
        json_object_set_new(j, "files", files);
    }
    return j;
}

/* One safetensors file of c, in the fixtures' per-file schema. */
static json_t *dump_st_file(struct admin_src *src, const struct ckpt *c, uint32_t f)
{
    const struct ckpt_file *fi = &c->files[f];
    const struct ckpt_st_info *si = &c->st[f];
    json_t *j = json_object();
    json_object_set_new(j, "header_len", json_integer((json_int_t)si->header_len));
    json_object_set_new(j, "data_start", json_integer((json_int_t)fi->data_start));
    json_object_set_new(j, "file_size", json_integer((json_int_t)fi->size));
    json_t *m = si->has_metadata ? json_object() : json_null();
    for (uint32_t k = 0; k < si->nmeta; k++)
        json_object_set_bytes(m, si->meta_keys[k], json_bytes(si->meta_values[k]));
    json_object_set_new(j, "metadata", m);
    json_t *ts = json_array();
    for (uint32_t i = 0; i < c->nitems; i++) {
        const struct ckpt_item *it = &c->items[i];
        if (it->file != f)
            continue;
        const struct ckpt_tensor *tt = &c->tensors[it->tensor];
        const struct ckpt_chunk *ch = &tt->chunks[it->chunk];
        json_t *e =
            json_pack("{s:o,s:o,s:o,s:[I,I],s:I,s:I,s:I}", "name", json_bytes(it->fqn), "dtype",
                      json_bytes(tt->dtype), "shape", json_i64_array(ch->sizes, tt->ndim),
                      "data_offsets", (json_int_t)(it->offset - fi->data_start),
                      (json_int_t)(it->offset + it->length - fi->data_start), "abs_begin",
                      (json_int_t)it->offset, "abs_end", (json_int_t)(it->offset + it->length),
                      "nbytes", (json_int_t)it->length);
        char hex[65];
        if (sha256_range(&src->io, fi->name, it->offset, it->length, hex) == 0)
            json_object_set_new(e, "sha256", json_string(hex));
        if (it->length <= 64) {
            unsigned char raw[64];
            size_t got = 0;
            if (src->io.read(src->io.ctx, fi->name, it->offset, raw, (size_t)it->length, &got) ==
                    0 &&
                got == it->length) {
                char h[129];
                for (size_t k = 0; k < got; k++)
                    snprintf(h + 2 * k, 3, "%02x", raw[k]);
                h[2 * got] = '\0';
                json_object_set_new(e, "hex", json_string(h));
            }
        }
        json_array_append_new(ts, e);
    }
    json_object_set_new(j, "tensors", ts);
    return j;
}

static json_t *dump_st(struct admin_src *src, const struct ckpt *c)
{
    if (c->nfiles == 1 && src->file && strcmp(src->file, c->files[0].name) == 0) {
        json_t *j = json_pack("{s:s}", "format", "safetensors");
        json_t *f = dump_st_file(src, c, 0);
        json_object_update(j, f);
        json_decref(f);
        return j;
    }
    json_t *files = json_object();
    for (uint32_t f = 0; f < c->nfiles; f++)
        json_object_set_bytes(files, c->files[f].name, dump_st_file(src, c, f));
    json_t *gs = json_object();
    for (uint32_t t = 0; t < c->ntensors; t++)
        json_object_set_bytes(gs, c->tensors[t].fqn,
                              json_i64_array(c->tensors[t].size, c->tensors[t].ndim));
    return json_pack("{s:s,s:o,s:o,s:o}", "format", "safetensors", "source", json_bytes(c->source),
                     "files", files, "global_shape", gs);
}

int cmd_dump(struct admin_opts *o)
{
    struct admin_src src;
    struct ckpt *c;
    int ex = admin_load_ckpt(o, 1, "dump FILE|DIR [--json] [--hash]", &src, &c);
    if (ex)
        return ex;
    ex = json_out(c->format == CKPT_FORMAT_DCP ? dump_dcp(o, &src, c) : dump_st(&src, c));
    ckpt_free(c);
    src_close(&src);
    return ex;
}
