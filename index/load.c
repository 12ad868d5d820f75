/*
 * index/load.c - checkpoint discovery and loading over struct ckpt_io
 * (see load.h).
 */
#include "load.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"
#include "strmap.h"

#define INDEX_JSON "model.safetensors.index.json"

void ckpt_load_options_default(struct ckpt_load_options *o)
{
    memset(o, 0, sizeof(*o));
    o->max_metadata = (size_t)1 << 30;
    o->stat_files = CKPT_FILES_LIST;
    dcp_options_default(&o->dcp);
}

char *ckpt_path_join(const char *dir, const char *name)
{
    size_t dl = strlen(dir), nl = strlen(name);
    char *p = malloc(dl + nl + 2);
    if (!p)
        return NULL;
    if (dl) {
        memcpy(p, dir, dl);
        p[dl] = '/';
        memcpy(p + dl + 1, name, nl + 1);
    } else {
        memcpy(p, name, nl + 1);
    }
    return p;
}

static int read_exact(const struct ckpt_io *io, const char *path, uint64_t off, void *buf,
                      size_t len)
{
    size_t got = 0;
    while (got < len) {
        size_t n = 0;
        int rc = io->read(io->ctx, path, off + got, (char *)buf + got, len - got, &n);
        if (rc)
            return rc;
        if (n == 0)
            return -EIO;        /* shorter than its stat said */
        assert(n <= len - got); /* io->read fills at most what it is asked for */
        got += n;
    }
    return 0;
}

int ckpt_io_read_all(const struct ckpt_io *io, const char *path, size_t max, void **buf,
                     size_t *len)
{
    uint64_t size;
    int is_dir;
    *buf = NULL;
    *len = 0;
    int rc = io->stat(io->ctx, path, &size, &is_dir);
    if (rc)
        return rc;
    if (is_dir)
        return -EISDIR;
    if (size > max)
        return -EFBIG;
    void *b = malloc(size ? (size_t)size : 1);
    if (!b)
        return -ENOMEM;
    rc = read_exact(io, path, 0, b, (size_t)size);
    if (rc) {
        free(b);
        return rc;
    }
    *buf = b;
    *len = (size_t)size;
    return 0;
}

/* ---- directory listing into a name -> size table -------------------- */

struct listing {
    size_t n, cap;
    char **names;
    uint64_t *sizes;
    int *dirs;
    int oom;
};

static int listing_add(void *arg, const char *name, int is_dir, uint64_t size)
{
    struct listing *l = arg;
    if (l->n == l->cap) {
        size_t ncap = l->cap ? l->cap * 2 : 64;
        char **nn = realloc(l->names, ncap * sizeof(*nn));
        if (nn)
            l->names = nn;
        uint64_t *ns = realloc(l->sizes, ncap * sizeof(*ns));
        if (ns)
            l->sizes = ns;
        int *nd = realloc(l->dirs, ncap * sizeof(*nd));
        if (nd)
            l->dirs = nd;
        if (!nn || !ns || !nd) {
            l->oom = 1;
            return 1;
        }
        l->cap = ncap;
    }
    assert(l->n < l->cap);
    l->names[l->n] = strdup(name);
    if (!l->names[l->n]) {
        l->oom = 1;
        return 1;
    }
    l->sizes[l->n] = size;
    l->dirs[l->n] = is_dir;
    l->n++;
    return 0;
}

static void listing_free(struct listing *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->names[i]);
    free(l->names);
    free(l->sizes);
    free(l->dirs);
    memset(l, 0, sizeof(*l));
}

/* The entries of dir into *l: 0 or a negative errno, said in err ("cannot
 * list ...") unless err is NULL. */
static int list_dir(const struct ckpt_io *io, const char *dir, struct listing *l,
                    struct ckpt_err *err)
{
    memset(l, 0, sizeof(*l));
    int rc = io->list(io->ctx, dir, listing_add, l);
    if (!rc && l->oom)
        rc = -ENOMEM;
    if (rc) {
        listing_free(l);
        ckpt_err_set(err, rc, CKPT_NOPOS, "cannot list '%s': %s", *dir ? dir : ".",
                     ckpt_strerror(rc));
    }
    return rc;
}

static int has_suffix(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* ---- loaders ---------------------------------------------------------- */

static int fill_file_info(const struct ckpt_io *io, const char *dir, struct ckpt *c,
                          struct ckpt_err *err)
{
    struct listing l;
    int rc = list_dir(io, dir, &l, err);
    if (rc)
        return rc;
    struct strmap m;
    if (strmap_init(&m, l.n)) {
        listing_free(&l);
        return ckpt_err_set(err, -ENOMEM, CKPT_NOPOS, "out of memory");
    }
    for (size_t i = 0; i < l.n; i++)
        if (!l.dirs[i] && strmap_put(&m, l.names[i], strlen(l.names[i]), (uint32_t)i, NULL) < 0) {
            rc = ckpt_err_set(err, -ENOMEM, CKPT_NOPOS, "out of memory");
            goto out;
        }
    for (uint32_t f = 0; f < c->nfiles; f++) {
        struct ckpt_file *fi = &c->files[f];
        uint32_t k;
        if (!strchr(fi->name, '/')) {
            if (strmap_get(&m, fi->name, strlen(fi->name), &k) == 0) {
                fi->present = 1;
                fi->size = l.sizes[k];
            } else {
                fi->present = 0;
            }
            continue;
        }
        char *p = ckpt_path_join(dir, fi->name);
        if (!p) {
            rc = ckpt_err_set(err, -ENOMEM, CKPT_NOPOS, "out of memory");
            goto out;
        }
        uint64_t size;
        int is_dir;
        int src = io->stat(io->ctx, p, &size, &is_dir);
        free(p);
        if (src == -ENOENT || (!src && is_dir)) {
            fi->present = 0;
        } else if (src) {
            rc = ckpt_err_set(err, src, CKPT_NOPOS, "cannot stat '%s': %s", fi->name,
                              ckpt_strerror(src));
            goto out;
        } else {
            fi->present = 1;
            fi->size = size;
        }
    }
out:
    strmap_free(&m);
    listing_free(&l);
    return rc;
}

/* Presence and size of every file c names from io->known alone: no listing,
 * no stat. A file the io does not know stays "not looked up". */
static void fill_known_file_info(const struct ckpt_io *io, const char *dir, struct ckpt *c)
{
    for (uint32_t f = 0; io->known && f < c->nfiles; f++) {
        struct ckpt_file *fi = &c->files[f];
        char *p = ckpt_path_join(dir, fi->name);
        uint64_t size;
        int k = p ? io->known(io->ctx, p, &size) : 1;
        free(p);
        if (k == 0) {
            fi->present = 1;
            fi->size = size;
        } else if (k == -ENOENT) {
            fi->present = 0;
        }
    }
}

/* Read and parse the DCP metadata file dir/name into *out (source set). */
static int parse_dcp_file(const struct ckpt_io *io, const char *dir, const char *name,
                          const struct ckpt_load_options *o, struct ckpt **out,
                          struct ckpt_err *err)
{
    char *path = ckpt_path_join(dir, name);
    if (!path)
        return ckpt_err_set(err, -ENOMEM, CKPT_NOPOS, "out of memory");
    void *buf;
    size_t len;
    int rc = ckpt_io_read_all(io, path, o->max_metadata, &buf, &len);
    if (rc) {
        ckpt_err_set(err, rc, CKPT_NOPOS, "cannot read '%s': %s", path, ckpt_strerror(rc));
        free(path);
        return rc;
    }
    rc = dcp_parse(buf, len, &o->dcp, out, err);
    free(buf);
    if (!rc) {
        (*out)->source = arena_strndup(&(*out)->arena, path, strlen(path));
        if (!(*out)->source) {
            ckpt_free(*out);
            *out = NULL;
            rc = ckpt_err_set(err, -ENOMEM, CKPT_NOPOS, "out of memory");
        }
    }
    free(path);
    return rc;
}

static int read_st_header_at(const struct ckpt_io *io, const char *path, uint64_t base,
                             uint64_t size, struct st_header **out, struct ckpt_err *err);

/* 1 if item it holds exactly its chunk's raw bytes by its recorded length:
 * what DCP's SAFETENSORS serialization format (torch >= 2.8) records, where
 * a torch.save item is always longer than the bytes it holds. */
static int item_is_raw(const struct ckpt *c, const struct ckpt_item *it)
{
    if (it->kind != CKPT_ITEM_TENSOR || it->has_transforms)
        return 0;
    const struct ckpt_tensor *t = &c->tensors[it->tensor];
    if (!t->elem_bits)
        return 0;
    unsigned __int128 nb = t->elem_bits;
    for (uint32_t d = 0; d < t->ndim; d++)
        nb *= (uint64_t)t->chunks[it->chunk].sizes[d];
    return nb % 8 == 0 && nb / 8 == it->length;
}

/* DCP's SAFETENSORS format writes a file's bytes items, then one
 * safetensors blob holding all of its tensors, and records for each tensor
 * the write position before the blob (the same for all) and numel *
 * itemsize: not where its bytes are. For every file whose tensor items look
 * like that, read the blob's header at the smallest such offset and point
 * each item at its tensor's bytes (by name). A file whose blob cannot be
 * read is left as recorded. 0, or an error reading the store. */
static int locate_raw_items(const struct ckpt_io *io, const char *dir, struct ckpt *c,
                            struct ckpt_err *err)
{
    int moved = 0;
    for (uint32_t f = 0; f < c->nfiles; f++) {
        struct ckpt_file *fi = &c->files[f];
        uint64_t base = UINT64_MAX;
        uint32_t nraw = 0, nshared = 0;
        for (uint32_t k = 0; k < fi->nitems; k++) {
            const struct ckpt_item *it = &c->items[fi->items[k]];
            if (!item_is_raw(c, it))
                continue;
            nraw++;
            if (it->offset < base) {
                base = it->offset;
                nshared = 0;
            }
            nshared += it->offset == base;
        }
        /* The format's mark: its tensors share one recorded offset; a file
         * with one tensor is probed only when the .metadata has a version
         * (torch >= 2.9), so raw items of older layouts cost no read. */
        int looks_like_blob = nshared >= 2 || (nraw == 1 && c->dcp.has_version);
        if (!looks_like_blob || fi->present != 1)
            continue;
        char *p = ckpt_path_join(dir, fi->name);
        if (!p)
            return ckpt_err_set(err, -ENOMEM, CKPT_NOPOS, "out of memory");
        struct st_header *h = NULL;
        struct ckpt_err e2 = {0};
        int rc = read_st_header_at(io, p, base, fi->size, &h, &e2);
        free(p);
        if (rc) {
            if (rc > CKPT_ETRUNC || rc < CKPT_EDB) /* -errno: the store failed */
                return ckpt_err_set(err, rc, CKPT_NOPOS, "%s", e2.msg);
            continue; /* no safetensors blob there: leave the items as recorded */
        }
        for (uint32_t k = 0; k < fi->nitems; k++) {
            struct ckpt_item *it = &c->items[fi->items[k]];
            if (!item_is_raw(c, it))
                continue;
            for (uint32_t s = 0; s < h->ntensors; s++) {
                const struct st_tensor *t = &h->tensors[s];
                if (strcmp(t->name, it->fqn) == 0 && t->end - t->begin == it->length) {
                    it->offset = base + h->data_start + t->begin;
                    moved = 1;
                    break;
                }
            }
        }
        st_free(h);
    }
    if (!moved)
        return 0;
    for (uint32_t f = 0; f < c->nfiles; f++) { /* layout order anew */
        c->files[f].nitems = 0;
        c->files[f].overlapping = 0;
    }
    return ckpt_finish(c, err);
}

/* File presence/sizes and raw item places for a parsed DCP model. */
static int finish_dcp(const struct ckpt_io *io, const char *dir, const struct ckpt_load_options *o,
                      struct ckpt *c, struct ckpt_err *err)
{
    int rc = 0;
    if (o->stat_files == CKPT_FILES_LIST)
        rc = fill_file_info(io, dir, c, err);
    else if (o->stat_files == CKPT_FILES_KNOWN)
        fill_known_file_info(io, dir, c);
    if (!rc && o->stat_files != CKPT_FILES_NONE)
        rc = locate_raw_items(io, dir, c, err);
    return rc;
}

static int load_dcp(const struct ckpt_io *io, const char *dir, const char *name,
                    const struct ckpt_load_options *o, struct ckpt **out, struct ckpt_err *err)
{
    int rc = parse_dcp_file(io, dir, name, o, out, err);
    if (!rc && (rc = finish_dcp(io, dir, o, *out, err))) {
        ckpt_free(*out);
        *out = NULL;
    }
    return rc;
}

struct rank_name {
    int rank;
    const char *name;
};

static int cmp_rank_name(const void *a, const void *b)
{
    const struct rank_name *x = a, *y = b;
    return (x->rank > y->rank) - (x->rank < y->rank);
}

/* A checkpoint saved with use_collectives=False: every __R.metadata in dir,
 * in rank order, parsed and merged (ckpt_merge). */
static int load_dcp_ranks(const struct ckpt_io *io, const char *dir,
                          const struct ckpt_load_options *o, struct ckpt **out,
                          struct ckpt_err *err)
{
    struct listing l;
    int rc = list_dir(io, dir, &l, err);
    if (rc)
        return rc;
    struct rank_name *rn = calloc(l.n + 1, sizeof(*rn));
    struct ckpt **parts = calloc(l.n + 1, sizeof(*parts));
    uint32_t n = 0;
    if (!rn || !parts)
        rc = ckpt_err_set(err, -ENOMEM, CKPT_NOPOS, "out of memory");
    for (size_t i = 0; !rc && i < l.n; i++) {
        int r = l.dirs[i] ? -1 : ckpt_rank_metadata_of(l.names[i]);
        if (r >= 0)
            rn[n++] = (struct rank_name){r, l.names[i]};
    }
    if (!rc && !n)
        rc = *dir ? ckpt_err_set(err, CKPT_ENOTCKPT, CKPT_NOPOS, "'%s' holds no .metadata", dir)
                  : ckpt_err_set(err, CKPT_ENOTCKPT, CKPT_NOPOS,
                                 "holds no .metadata: not a checkpoint directory");
    if (!rc)
        qsort(rn, n, sizeof(*rn), cmp_rank_name);
    uint32_t got = 0;
    for (; !rc && got < n; got++)
        rc = parse_dcp_file(io, dir, rn[got].name, o, &parts[got], err);
    if (!rc)
        rc = ckpt_merge(parts, n, out, err);
    else
        for (uint32_t i = 0; i < got; i++)
            ckpt_free(parts[i]);
    if (!rc && (rc = finish_dcp(io, dir, o, *out, err))) {
        ckpt_free(*out);
        *out = NULL;
    }
    free(parts);
    free(rn);
    listing_free(&l);
    return rc;
}

/* The safetensors header of the blob at byte base of path (size bytes in
 * all; the blob runs to the end of the file). */
static int read_st_header_at(const struct ckpt_io *io, const char *path, uint64_t base,
                             uint64_t size, struct st_header **out, struct ckpt_err *err)
{
    uint64_t hlen;
    unsigned char prefix[ST_PREFIX_LEN];
    if (base > size)
        return ckpt_err_set(err, CKPT_ETRUNC, CKPT_NOPOS, "%s: no data at byte %llu", path,
                            (unsigned long long)base);
    size -= base;
    size_t n = size < ST_PREFIX_LEN ? (size_t)size : ST_PREFIX_LEN;
    int rc = read_exact(io, path, base, prefix, n);
    if (rc)
        return ckpt_err_set(err, rc, CKPT_NOPOS, "%s: %s", path, ckpt_strerror(rc));
    if ((rc = st_header_len(prefix, n, size, &hlen, err)))
        return rc;
    assert(size >= ST_PREFIX_LEN && hlen <= size - ST_PREFIX_LEN); /* the header is in the file */
    char *json = malloc((size_t)hlen);
    if (!json)
        return ckpt_err_set(err, -ENOMEM, CKPT_NOPOS, "out of memory");
    rc = read_exact(io, path, base + ST_PREFIX_LEN, json, (size_t)hlen);
    if (rc)
        ckpt_err_set(err, rc, CKPT_NOPOS, "%s: %s", path, ckpt_strerror(rc));
    else
        rc = st_parse_header(json, (size_t)hlen, size, out, err);
    free(json);
    return rc;
}

static int read_st_header(const struct ckpt_io *io, const char *path, struct st_header **out,
                          struct ckpt_err *err)
{
    uint64_t size;
    int is_dir;
    int rc = io->stat(io->ctx, path, &size, &is_dir);
    if (!rc && is_dir)
        rc = -EISDIR;
    if (rc)
        return ckpt_err_set(err, rc, CKPT_NOPOS, "%s: %s", path, ckpt_strerror(rc));
    return read_st_header_at(io, path, 0, size, out, err);
}

/* index_name: the HF index json to use (missing is fine only if it is the
 * default name); single: load just this one safetensors file. */
static int load_st(const struct ckpt_io *io, const char *dir, const char *index_name,
                   const char *single, const struct ckpt_load_options *o, struct ckpt **out,
                   struct ckpt_err *err)
{
    struct st_index *ix = NULL;
    char **names = NULL;
    struct st_header **hdrs = NULL;
    size_t nnames = 0;
    struct listing l = {0};
    int rc;
    char *ipath = ckpt_path_join(dir, index_name ? index_name : INDEX_JSON);
    if (!ipath)
        return ckpt_err_set(err, -ENOMEM, CKPT_NOPOS, "out of memory");
    void *buf;
    size_t len;
    rc = single ? -ENOENT : ckpt_io_read_all(io, ipath, o->max_metadata, &buf, &len);
    if (single) {
        names = calloc(2, sizeof(char *));
        if (!names) {
            rc = ckpt_err_set(err, -ENOMEM, CKPT_NOPOS, "out of memory");
            goto out;
        }
        names[nnames++] = (char *)single;
    } else if (rc == 0) {
        rc = st_index_parse(buf, len, &ix, err);
        free(buf);
        if (rc)
            goto out;
        names = calloc(ix->n + 1, sizeof(char *));
        if (!names) {
            rc = ckpt_err_set(err, -ENOMEM, CKPT_NOPOS, "out of memory");
            goto out;
        }
        /* distinct files (a hash set: weight_map may have many entries) */
        struct strmap seen;
        if (strmap_init(&seen, 16)) {
            rc = ckpt_err_set(err, -ENOMEM, CKPT_NOPOS, "out of memory");
            goto out;
        }
        for (uint32_t i = 0; i < ix->n && !rc; i++) {
            int r = strmap_put(&seen, ix->file[i], strlen(ix->file[i]), 0, NULL);
            if (r < 0)
                rc = ckpt_err_set(err, -ENOMEM, CKPT_NOPOS, "out of memory");
            else if (r == 0) {
                assert(nnames < ix->n);
                names[nnames++] = (char *)ix->file[i];
            }
        }
        strmap_free(&seen);
        if (rc)
            goto out;
    } else if (rc == -ENOENT && !index_name) {
        rc = list_dir(io, dir, &l, err);
        if (rc)
            goto out;
        names = calloc(l.n + 1, sizeof(char *));
        if (!names) {
            rc = ckpt_err_set(err, -ENOMEM, CKPT_NOPOS, "out of memory");
            goto out;
        }
        for (size_t i = 0; i < l.n; i++)
            if (!l.dirs[i] && has_suffix(l.names[i], ".safetensors")) {
                assert(nnames < l.n);
                names[nnames++] = l.names[i];
            }
    } else {
        ckpt_err_set(err, rc, CKPT_NOPOS, "cannot read '%s': %s", ipath, ckpt_strerror(rc));
        goto out;
    }
    if (!nnames) {
        rc = ckpt_err_set(err, CKPT_ENOTCKPT, CKPT_NOPOS, "no safetensors files in '%s'", dir);
        goto out;
    }
    qsort(names, nnames, sizeof(char *), cmp_str);
    hdrs = calloc(nnames, sizeof(*hdrs));
    if (!hdrs) {
        rc = ckpt_err_set(err, -ENOMEM, CKPT_NOPOS, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < nnames; i++) {
        char *p = ckpt_path_join(dir, names[i]);
        if (!p) {
            rc = ckpt_err_set(err, -ENOMEM, CKPT_NOPOS, "out of memory");
            goto out;
        }
        rc = read_st_header(io, p, &hdrs[i], err);
        if (rc && err && err->code && !strstr(err->msg, p)) {
            char tmp[2 * sizeof(err->msg)];
            snprintf(tmp, sizeof(tmp), "%s: %s", p, err->msg);
            size_t tl = strlen(tmp);
            if (tl >= sizeof(err->msg))
                tl = sizeof(err->msg) - 1;
            memcpy(err->msg, tmp, tl);
            err->msg[tl] = '\0';
        }
        free(p);
        if (rc)
            goto out;
    }
    rc = st_build_ckpt((const char *const *)names, hdrs, (uint32_t)nnames, ix, out, err);
    if (!rc)
        (*out)->source = arena_strndup(&(*out)->arena, ix ? ipath : dir, strlen(ix ? ipath : dir));
out:
    if (hdrs)
        for (size_t i = 0; i < nnames; i++)
            st_free(hdrs[i]);
    free(hdrs);
    free(names);
    listing_free(&l);
    st_index_free(ix);
    free(ipath);
    return rc;
}

/* ckpt_detect; *global: 1 if dir holds a global .metadata */
static int detect(const struct ckpt_io *io, const char *dir, int *global)
{
    struct listing l;
    *global = 0;
    int rc = list_dir(io, dir, &l, NULL);
    if (rc)
        return rc;
    int fmt = 0;
    for (size_t i = 0; i < l.n; i++) {
        if (l.dirs[i])
            continue;
        if (strcmp(l.names[i], ".metadata") == 0) {
            fmt = CKPT_FORMAT_DCP;
            *global = 1;
            break;
        }
        if (ckpt_rank_metadata_of(l.names[i]) >= 0)
            fmt = CKPT_FORMAT_DCP;
        else if (fmt != CKPT_FORMAT_DCP &&
                 (strcmp(l.names[i], INDEX_JSON) == 0 || has_suffix(l.names[i], ".safetensors")))
            fmt = CKPT_FORMAT_SAFETENSORS;
    }
    listing_free(&l);
    return fmt;
}

int ckpt_detect(const struct ckpt_io *io, const char *dir)
{
    int global;
    return detect(io, dir, &global);
}

int ckpt_load(const struct ckpt_io *io, const char *dir, const struct ckpt_load_options *opt,
              struct ckpt **out, struct ckpt_err *err)
{
    struct ckpt_load_options defaults;
    if (!opt) {
        ckpt_load_options_default(&defaults);
        opt = &defaults;
    }
    *out = NULL;
    ckpt_err_clear(err);
    int global;
    int fmt = detect(io, dir, &global);
    if (fmt < 0)
        return ckpt_err_set(err, fmt, CKPT_NOPOS, "cannot list '%s': %s", *dir ? dir : ".",
                            ckpt_strerror(fmt));
    if (fmt == CKPT_FORMAT_DCP)
        return global ? load_dcp(io, dir, ".metadata", opt, out, err)
                      : load_dcp_ranks(io, dir, opt, out, err);
    if (fmt == CKPT_FORMAT_SAFETENSORS)
        return load_st(io, dir, NULL, NULL, opt, out, err);
    if (!*dir) /* the source's own root: its caller names it */
        return ckpt_err_set(err, CKPT_ENOTCKPT, CKPT_NOPOS,
                            "holds no .metadata, " INDEX_JSON
                            " or *.safetensors: not a checkpoint directory");
    return ckpt_err_set(err, CKPT_ENOTCKPT, CKPT_NOPOS,
                        "'%s' holds no .metadata, " INDEX_JSON " or *.safetensors", dir);
}

int ckpt_load_file(const struct ckpt_io *io, const char *dir, const char *name,
                   const struct ckpt_load_options *opt, struct ckpt **out, struct ckpt_err *err)
{
    struct ckpt_load_options defaults;
    if (!opt) {
        ckpt_load_options_default(&defaults);
        opt = &defaults;
    }
    *out = NULL;
    ckpt_err_clear(err);
    if (has_suffix(name, ".safetensors"))
        return load_st(io, dir, NULL, name, opt, out, err);
    if (has_suffix(name, ".json"))
        return load_st(io, dir, name, NULL, opt, out, err);
    return load_dcp(io, dir, name, opt, out, err);
}

/* ---- discovery -------------------------------------------------------- */

struct walk_frame {
    char *dir;
    int depth;
};

int ckpt_find(const struct ckpt_io *io, const char *root, int max_depth, ckpt_found_fn fn,
              void *arg)
{
    size_t cap = 16, n = 0;
    struct walk_frame *st = malloc(cap * sizeof(*st));
    if (!st)
        return -ENOMEM;
    int rc = 0;
    st[n].dir = strdup(root);
    st[n].depth = 0;
    if (!st[n].dir) {
        free(st);
        return -ENOMEM;
    }
    n++;
    while (n && !rc) {
        struct walk_frame fr = st[--n];
        struct listing l;
        rc = list_dir(io, fr.dir, &l, NULL);
        if (rc) {
            free(fr.dir);
            if (fr.depth > 0 && (rc == -EACCES || rc == -EPERM || rc == -ENOENT)) {
                rc = 0; /* a private or vanished subdirectory holds nothing for us */
                continue;
            }
            break;
        }
        int fmt = 0;
        for (size_t i = 0; i < l.n; i++) {
            if (l.dirs[i])
                continue;
            if (strcmp(l.names[i], ".metadata") == 0 || ckpt_rank_metadata_of(l.names[i]) >= 0)
                fmt = CKPT_FORMAT_DCP;
            else if (!fmt && (strcmp(l.names[i], INDEX_JSON) == 0 ||
                              has_suffix(l.names[i], ".safetensors")))
                fmt = CKPT_FORMAT_SAFETENSORS;
        }
        if (fmt)
            rc = fn(arg, fr.dir, fmt);
        if (!rc && fr.depth < max_depth) {
            /* push subdirectories in reverse name order so they pop sorted */
            char **sub = malloc((l.n + 1) * sizeof(char *));
            size_t ns = 0;
            if (!sub)
                rc = -ENOMEM;
            for (size_t i = 0; !rc && i < l.n; i++)
                if (l.dirs[i])
                    sub[ns++] = l.names[i];
            if (!rc)
                qsort(sub, ns, sizeof(char *), cmp_str);
            for (size_t i = ns; !rc && i-- > 0;) {
                if (n == cap) {
                    struct walk_frame *s2 = realloc(st, cap * 2 * sizeof(*st));
                    if (!s2) {
                        rc = -ENOMEM;
                        break;
                    }
                    st = s2;
                    cap *= 2;
                }
                assert(n < cap);
                st[n].dir = ckpt_path_join(fr.dir, sub[i]);
                if (!st[n].dir) {
                    rc = -ENOMEM;
                    break;
                }
                st[n].depth = fr.depth + 1;
                n++;
            }
            free(sub);
        }
        listing_free(&l);
        free(fr.dir);
    }
    while (n)
        free(st[--n].dir);
    free(st);
    return rc;
}
