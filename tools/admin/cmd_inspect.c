/*
 * tools/admin/cmd_inspect.c - whole-checkpoint analyses:
 *   inspect CKPT   per file: size, items, bytes in items, save order; whole
 *                  (replicated) tensors and where they were saved; for a load
 *                  at the same world size, the files each rank must read,
 *                  flagging ranks that read files of ranks other than their
 *                  own and rank 0 (pytorch/pytorch#125740)
 *   verify CKPT    every named file present, every item inside its file, no
 *                  overlapping items, item lengths consistent with tensors
 *
 * Rank model (DCP shard names "__R_N.distcp"): a tensor with one chunk that
 * covers the whole tensor counts as replicated (every rank loads all of
 * it), as do bytes entries; any other chunk is loaded by the rank that
 * saved it. Without rank-named files (safetensors) the rank view is empty.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "admin.h"

static int is_whole(const struct ckpt_tensor *t)
{
    if (t->nchunks != 1)
        return 0;
    for (uint32_t d = 0; d < t->ndim; d++)
        if (t->chunks[0].offsets[d] != 0 || t->chunks[0].sizes[d] != t->size[d])
            return 0;
    return 1;
}

/* Does item i have to be read by every rank? */
static int read_by_all(const struct ckpt *c, uint32_t i)
{
    const struct ckpt_item *it = &c->items[i];
    return it->kind == CKPT_ITEM_BYTES || is_whole(&c->tensors[it->tensor]);
}

/* Ranks 0..w-1 as the file names number them; 0 (no per-rank view) when a
 * file has no rank or the numbering is far sparser than the files, so a
 * crafted name (__999999999_0.distcp) cannot make the view huge. */
static int world_size(const struct ckpt *c)
{
    int w = 0;
    for (uint32_t f = 0; f < c->nfiles; f++) {
        if (c->files[f].rank < 0)
            return 0;
        if (c->files[f].rank + 1 > w)
            w = c->files[f].rank + 1;
    }
    return (uint64_t)w > 4 * (uint64_t)c->nfiles + 64 ? 0 : w;
}

static uint64_t item_bytes(const struct ckpt *c, uint32_t f)
{
    uint64_t s = 0;
    for (uint32_t k = 0; k < c->files[f].nitems; k++)
        s += c->items[c->files[f].items[k]].length;
    return s;
}

int cmd_inspect(struct admin_opts *o)
{
    struct admin_src src;
    struct ckpt *c;
    int ex = admin_load_ckpt(o, 1, "inspect CKPT [--json]", &src, &c);
    if (ex)
        return ex;
    int w = world_size(c);
    /* needed[r * nfiles + f]: rank r reads file f */
    unsigned char *needed = w ? calloc((size_t)w * c->nfiles, 1) : NULL;
    if (w && !needed) {
        ex = EX_IO;
        goto out;
    }
    for (uint32_t i = 0; needed && i < c->nitems; i++) {
        const struct ckpt_item *it = &c->items[i];
        if (read_by_all(c, i)) {
            for (int r = 0; r < w; r++)
                needed[(size_t)r * c->nfiles + it->file] = 1;
        } else {
            int r = c->files[it->file].rank;
            needed[(size_t)r * c->nfiles + it->file] = 1;
        }
    }
    uint64_t total = 0;
    for (uint32_t f = 0; f < c->nfiles; f++)
        total += item_bytes(c, f);

    json_t *jfiles = json_array(), *jrep = json_array(), *jranks = json_array();
    struct table tf, tr, tk;
    table_init(&tf, 7, "FILE", "RANK", "SIZE", "ITEMS", "ITEM BYTES", "SAVE ORDER", "PRESENT");
    table_init(&tr, 5, "REPLICATED", "DTYPE", "FILE", "OFFSET", "LENGTH");
    table_init(&tk, 3, "RANK", "READS", "FLAG");
    for (uint32_t f = 0; f < c->nfiles; f++) {
        const struct ckpt_file *fi = &c->files[f];
        int order = ckpt_file_in_save_order(c, f);
        uint64_t ib = item_bytes(c, f);
        json_array_append_new(
            jfiles,
            json_pack("{s:o,s:o,s:b,s:o,s:i,s:I,s:b}", "name", json_bytes(fi->name), "rank",
                      fi->rank >= 0 ? json_integer(fi->rank) : json_null(), "present",
                      fi->present == 1, "size",
                      fi->present == 1 ? json_integer((json_int_t)fi->size) : json_null(), "items",
                      (int)fi->nitems, "item_bytes", (json_int_t)ib, "in_save_order", order));
        char rk[16], sz[32], ni[16], ibs[32];
        snprintf(rk, sizeof(rk), "%d", fi->rank);
        snprintf(ni, sizeof(ni), "%u", fi->nitems);
        table_row(&tf, fi->name, fi->rank >= 0 ? rk : "-",
                  fi->present == 1 ? fmt_u64(sz, sizeof(sz), fi->size) : "-", ni,
                  fmt_u64(ibs, sizeof(ibs), ib), order ? "yes" : "NO",
                  fi->present == 1 ? "yes" : "MISSING");
    }
    for (uint32_t t = 0; t < c->ntensors; t++) {
        const struct ckpt_tensor *tt = &c->tensors[t];
        if (!is_whole(tt) || c->nfiles < 2)
            continue;
        const struct ckpt_item *it = &c->items[tt->chunks[0].item];
        json_array_append_new(jrep,
                              json_pack("{s:o,s:o,s:I,s:I}", "fqn", json_bytes(tt->fqn), "file",
                                        json_bytes(c->files[it->file].name), "offset",
                                        (json_int_t)it->offset, "length", (json_int_t)it->length));
        char off[32], len[32];
        table_row(&tr, tt->fqn, tt->dtype, c->files[it->file].name,
                  fmt_u64(off, sizeof(off), it->offset), fmt_u64(len, sizeof(len), it->length));
    }
    int nflagged = 0;
    for (int r = 0; r < w; r++) {
        json_t *reads = json_array(), *foreign = json_array();
        char list[4096] = "";
        size_t ll = 0;
        for (uint32_t f = 0; f < c->nfiles; f++) {
            if (!needed[(size_t)r * c->nfiles + f])
                continue;
            const struct ckpt_file *fi = &c->files[f];
            json_array_append_new(reads, json_bytes(fi->name));
            if (fi->rank != r && fi->rank != 0)
                json_array_append_new(foreign, json_bytes(fi->name));
            if (ll < sizeof(list) - 1)
                ll +=
                    (size_t)snprintf(list + ll, sizeof(list) - ll, "%s%s", ll ? " " : "", fi->name);
        }
        int flagged = json_array_size(foreign) > 0;
        nflagged += flagged;
        json_array_append_new(jranks, json_pack("{s:i,s:o,s:o,s:b}", "rank", r, "reads", reads,
                                                "foreign", foreign, "flagged", flagged));
        char rk[16];
        snprintf(rk, sizeof(rk), "%d", r);
        table_row(&tk, rk, list, flagged ? "reads other ranks' files (pytorch#125740)" : "");
    }
    if (o->json) {
        ex = json_out(json_pack("{s:o,s:s,s:i,s:i,s:i,s:i,s:I,s:o,s:o,s:o,s:o,s:i}", "checkpoint",
                                json_bytes(src.url), "format", format_name(c->format), "tensors",
                                (int)c->ntensors, "bytes", (int)c->nbytes, "items", (int)c->nitems,
                                "nfiles", (int)c->nfiles, "item_bytes", (json_int_t)total,
                                "world_size", w ? json_integer(w) : json_null(), "files", jfiles,
                                "replicated", jrep, "ranks", jranks, "flagged_ranks", nflagged));
    } else {
        json_decref(jfiles);
        json_decref(jrep);
        json_decref(jranks);
        printf(
            "%s: %s, %u tensors, %u bytes entries, %u items, %u files, %" PRIu64 " bytes in items",
            src.url, format_name(c->format), c->ntensors, c->nbytes, c->nitems, c->nfiles, total);
        if (w)
            printf(", world size %d", w);
        printf("\n\n");
        table_print(&tf, stdout);
        if (tr.nrows > 1) {
            printf("\n");
            table_print(&tr, stdout);
        }
        if (w) {
            printf("\nload at world size %d: files each rank reads\n", w);
            table_print(&tk, stdout);
            if (nflagged)
                printf("%d rank(s) read files saved by ranks other than themselves and rank 0\n",
                       nflagged);
        }
    }
    table_free(&tf);
    table_free(&tr);
    table_free(&tk);
    free(needed);
out:
    ckpt_free(c);
    src_close(&src);
    return ex;
}

/* ---- verify ----------------------------------------------------------- */

struct problems {
    json_t *list;
    int n;
    int quiet_json;
};

static void problem(struct problems *p, const char *kind, const char *file, const char *fqn,
                    const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static void problem(struct problems *p, const char *kind, const char *file, const char *fqn,
                    const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    json_array_append_new(p->list,
                          json_pack("{s:s,s:o,s:o,s:o}", "kind", kind, "file", json_bytes(file),
                                    "fqn", json_bytes(fqn), "message", json_bytes(msg)));
    p->n++;
    if (!p->quiet_json)
        printf("%s: %s%s%s%s\n", kind, file ? file : "", file ? ": " : "", fqn ? fqn : "",
               fqn ? ": " : "");
    if (!p->quiet_json)
        printf("    %s\n", msg);
}

int cmd_verify(struct admin_opts *o)
{
    struct admin_src src;
    struct ckpt *c;
    int ex = admin_load_ckpt(o, 1, "verify CKPT [--json]", &src, &c);
    if (ex)
        return ex;
    struct problems p = {json_array(), 0, o->json};
    uint64_t gaps = 0;
    for (uint32_t f = 0; f < c->nfiles; f++) {
        const struct ckpt_file *fi = &c->files[f];
        if (fi->present != 1) {
            problem(&p, "missing", fi->name, NULL, "file named by %u item(s) does not exist",
                    fi->nitems);
            continue;
        }
        uint64_t end = 0;
        for (uint32_t k = 0; k < fi->nitems; k++) {
            const struct ckpt_item *it = &c->items[fi->items[k]];
            if (it->offset + it->length > fi->size)
                problem(&p, "out_of_range", fi->name, it->fqn,
                        "item [%" PRIu64 ", %" PRIu64 ") ends beyond the file size %" PRIu64,
                        it->offset, it->offset + it->length, fi->size);
            if (it->length && it->offset < end)
                problem(&p, "overlap", fi->name, it->fqn,
                        "item [%" PRIu64 ", %" PRIu64
                        ") overlaps the previous item ending at %" PRIu64,
                        it->offset, it->offset + it->length, end);
            if (it->offset > end)
                gaps += it->offset - end;
            if (it->offset + it->length > end)
                end = it->offset + it->length;
        }
        if (fi->size > end)
            gaps += fi->size - end;
    }
    for (uint32_t i = 0; i < c->nitems; i++) {
        const struct ckpt_item *it = &c->items[i];
        if (it->kind != CKPT_ITEM_TENSOR || it->has_transforms)
            continue;
        const struct ckpt_tensor *t = &c->tensors[it->tensor];
        unsigned __int128 nb = t->elem_bits;
        for (uint32_t d = 0; d < t->ndim; d++)
            nb *= (uint64_t)t->chunks[it->chunk].sizes[d];
        nb /= 8;
        /* DCP items are torch.save archives holding the raw bytes plus
         * headers; safetensors items are exactly the raw bytes */
        if (c->format == CKPT_FORMAT_SAFETENSORS ? nb != it->length : nb > it->length)
            problem(&p, "size", c->files[it->file].name, it->fqn,
                    "chunk %u holds %" PRIu64 " bytes of %s data but its item is %" PRIu64 " bytes",
                    it->chunk, (uint64_t)nb, t->dtype, it->length);
    }
    if (o->json) {
        ex = json_out(json_pack("{s:o,s:b,s:i,s:i,s:I,s:o}", "checkpoint", json_bytes(src.url),
                                "ok", p.n == 0, "items", (int)c->nitems, "files", (int)c->nfiles,
                                "unindexed_bytes", (json_int_t)gaps, "problems", p.list));
    } else {
        json_decref(p.list);
        if (p.n == 0)
            printf("OK: %u items in %u files; %" PRIu64 " file bytes outside any item\n", c->nitems,
                   c->nfiles, gaps);
        else
            printf("%d problem(s) in %s\n", p.n, src.url);
    }
    if (ex == EX_OK)
        ex = p.n ? EX_CHECK : EX_OK;
    ckpt_free(c);
    src_close(&src);
    return ex;
}
