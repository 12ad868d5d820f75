/*
 * tools/admin/cmd_index.c - the persistent index (index/idxdb.h):
 *   index rebuild STORE[/PATH]          find, parse and index every checkpoint
 *   index ls                            checkpoints in the index
 *   index files CKPT                    files an indexed checkpoint names
 *   index at CKPT FILE OFFSET [--next N]  item at a byte offset (+ followers)
 *   index where CKPT FQN                chunks of FQN, answered from the index
 *   index bench CKPT [--lookups N]      time parse, index build and offset lookups
 *
 * The index lives in CACHE/index (LMDB). Checkpoints are keyed by their
 * canonical location: the absolute directory path for local stores (later
 * the s3:// URL). rebuild opens the database with IDXDB_RESET, so an index
 * of an older schema is replaced; the query verbs open it read-only.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "admin.h"
#include "dcp.h"
#include "idxdb.h"
#include "pickle.h"

/* mkdir -p */
static int mkdirs(const char *path)
{
    char *p = strdup(path);
    if (!p)
        return -ENOMEM;
    for (char *s = p + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = '\0';
        if (mkdir(p, 0755) && errno != EEXIST) {
            int e = -errno;
            free(p);
            return e;
        }
        *s = '/';
    }
    int rc = mkdir(p, 0755) && errno != EEXIST ? -errno : 0;
    free(p);
    return rc;
}

/* CACHE/index, malloc'd; creates CACHE when create is set. NULL with the
 * error reported. */
static char *index_dir(const struct admin_opts *o, int create)
{
    char buf[4096];
    const char *x = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (o->cache_dir)
        snprintf(buf, sizeof(buf), "%s", o->cache_dir);
    else if (x && *x)
        snprintf(buf, sizeof(buf), "%s/ckptfs", x);
    else
        snprintf(buf, sizeof(buf), "%s/.cache/ckptfs", home && *home ? home : ".");
    int rc = create ? mkdirs(buf) : 0;
    if (rc) {
        report_msg(o, EX_IO, buf, rc, "cannot create: %s", strerror(-rc));
        return NULL;
    }
    size_t n = strlen(buf);
    char *d = malloc(n + 8);
    if (d)
        snprintf(d, n + 8, "%s/index", buf);
    else
        report_msg(o, EX_IO, buf, -ENOMEM, "out of memory");
    return d;
}

static int open_db(const struct admin_opts *o, int write, struct idxdb **db)
{
    char *dir = index_dir(o, write);
    if (!dir)
        return EX_IO;
    struct idxdb_options opt;
    idxdb_options_default(&opt);
    opt.flags = write ? IDXDB_RESET : IDXDB_RDONLY;
    struct ckpt_err e;
    int rc = idxdb_open(dir, &opt, db, &e);
    int ex = 0;
    if (rc == -ENOENT && !write)
        ex = report_msg(o, EX_DB, dir, rc,
                        "no index here: build one with 'ckptfs-admin index rebuild STORE' "
                        "(or give the --cache-dir that holds one)");
    else if (rc)
        ex = report(o, EX_DB, dir, &e, rc);
    free(dir);
    return ex;
}

/* ---- rebuild ---------------------------------------------------------- */

struct found {
    char **dirs;
    size_t n, cap;
};

static int on_found(void *arg, const char *dir, int format)
{
    (void)format;
    struct found *f = arg;
    if (f->n == f->cap) {
        size_t ncap = f->cap ? f->cap * 2 : 16;
        char **d = realloc(f->dirs, ncap * sizeof(*d));
        if (!d)
            return -ENOMEM;
        f->dirs = d;
        f->cap = ncap;
    }
    if (!(f->dirs[f->n] = strdup(dir)))
        return -ENOMEM;
    f->n++;
    return 0;
}

static void found_free(struct found *f)
{
    for (size_t i = 0; i < f->n; i++)
        free(f->dirs[i]);
    free(f->dirs);
}

static char *ckpt_key(const char *url, const char *dir)
{
    return *dir ? ckpt_path_join(url, dir) : strdup(url);
}

struct stale {
    const char *prefix;
    size_t plen;
    struct found *found; /* keys seen in this rebuild */
    struct found drop;
};

static int on_listed(void *arg, const struct idxdb_ckpt *c)
{
    struct stale *s = arg;
    if (c->key_len < s->plen || memcmp(c->key, s->prefix, s->plen) != 0)
        return 0;
    if (c->key_len > s->plen && c->key[s->plen] != '/' && s->prefix[s->plen - 1] != '/')
        return 0;
    for (size_t i = 0; i < s->found->n; i++)
        if (strlen(s->found->dirs[i]) == c->key_len &&
            memcmp(s->found->dirs[i], c->key, c->key_len) == 0)
            return 0;
    char *k = strndup(c->key, c->key_len);
    if (!k || on_found(&s->drop, k, 0)) {
        free(k);
        return 1;
    }
    free(k);
    return 0;
}

static int index_rebuild(struct admin_opts *o)
{
    int ex = need_args(o, 2, "index rebuild STORE[/PATH] [--cache-dir DIR]");
    if (ex)
        return ex;
    struct admin_src src;
    if ((ex = src_open(o, o->argv[1], &src)))
        return ex;
    if (src.file) {
        ex = report_msg(o, EX_USAGE, src.url, -ENOTDIR, "not a directory");
        src_close(&src);
        return ex;
    }
    struct idxdb *db = NULL;
    struct found found = {0}, keys = {0};
    json_t *report_list = json_array();
    int nfail = 0, nok = 0, ndropped = 0;
    if ((ex = open_db(o, 1, &db)))
        goto out;
    int rc = ckpt_find(&src.io, "", 32, on_found, &found);
    if (rc) {
        ex = report_msg(o, EX_IO, src.url, rc, "cannot walk the store: %s", ckpt_strerror(rc));
        goto out;
    }
    if (!o->quiet)
        fprintf(stderr, "ckptfs-admin: %zu checkpoint(s) under %s\n", found.n, src.url);
    for (size_t i = 0; i < found.n; i++) {
        const char *dir = found.dirs[i];
        char *key = ckpt_key(src.url, dir);
        struct ckpt *c = NULL;
        struct ckpt_err e;
        ckpt_err_clear(&e);
        rc = key ? ckpt_load(&src.io, dir, NULL, &c, &e) : -ENOMEM;
        char fp[IDXDB_FP_MAX] = "";
        uint64_t id = 0;
        /* the mount's fingerprint, of every metadata file (one of several
         * __R.metadata or Hugging Face files would never match it) */
        if (!rc && admin_fingerprint(&src, dir, fp, sizeof(fp)) != 0)
            fp[0] = '\0';
        if (!rc) {
            rc = idxdb_put(db, key, fp, c, &id, &e);
            if (rc && exit_for(rc) == EX_DB) {
                ex = report(o, EX_DB, key, &e, rc);
                ckpt_free(c);
                free(key);
                goto out;
            }
        }
        int missing = 0;
        for (uint32_t f = 0; !rc && f < c->nfiles; f++)
            missing += c->files[f].present == 0;
        json_t *entry = json_pack("{s:o,s:s}", "key", json_bytes(key ? key : dir), "status",
                                  rc ? "failed" : "indexed");
        if (rc) {
            nfail++;
            /* still there, just unreadable now: not a stale entry to forget */
            if (key)
                on_found(&keys, key, 0);
            json_object_set_new(entry, "error", json_bytes(e.msg[0] ? e.msg : ckpt_strerror(rc)));
            json_object_set_new(entry, "exit", json_integer(exit_for(rc)));
            if (!o->quiet)
                fprintf(stderr, "[%zu/%zu] %s: FAILED: %s\n", i + 1, found.n, key ? key : dir,
                        e.msg[0] ? e.msg : ckpt_strerror(rc));
        } else {
            nok++;
            json_object_set_new(entry, "format", json_string(format_name(c->format)));
            json_object_set_new(entry, "items", json_integer(c->nitems));
            json_object_set_new(entry, "files", json_integer(c->nfiles));
            json_object_set_new(entry, "missing_files", json_integer(missing));
            if (!o->quiet)
                fprintf(stderr, "[%zu/%zu] %s: %u items, %u files%s\n", i + 1, found.n, key,
                        c->nitems, c->nfiles, missing ? " (some files missing)" : "");
            on_found(&keys, key, 0);
        }
        json_array_append_new(report_list, entry);
        ckpt_free(c);
        free(key);
    }
    /* forget checkpoints under this path that are gone */
    struct idxdb_txn *t;
    struct ckpt_err e;
    struct stale st = {src.url, strlen(src.url), &keys, {0}};
    if (idxdb_begin(db, &t, &e) == 0) {
        idxdb_ckpt_list(t, on_listed, &st);
        idxdb_end(t);
    }
    for (size_t i = 0; i < st.drop.n; i++)
        if (idxdb_drop(db, st.drop.dirs[i], &e) == 0)
            ndropped++;
    found_free(&st.drop);
    if (!o->quiet)
        fprintf(stderr, "ckptfs-admin: %d indexed, %d failed, %d stale entries removed\n", nok,
                nfail, ndropped);
    ex = nfail ? EX_CHECK : EX_OK;
    if (o->json) {
        int jex = json_out(json_pack("{s:o,s:i,s:i,s:i,s:O}", "store", json_bytes(src.url),
                                     "indexed", nok, "failed", nfail, "removed", ndropped,
                                     "checkpoints", report_list));
        ex = jex ? jex : ex;
    } else {
        for (size_t i = 0; i < json_array_size(report_list); i++) {
            json_t *en = json_array_get(report_list, i);
            printf("%-8s %s\n", json_string_value(json_object_get(en, "status")),
                   json_string_value(json_object_get(en, "key")));
        }
    }
out:
    json_decref(report_list);
    found_free(&found);
    found_free(&keys);
    idxdb_close(db);
    src_close(&src);
    return ex;
}

/* ---- queries ---------------------------------------------------------- */

static int on_ckpt(void *arg, const struct idxdb_ckpt *c)
{
    json_t *a = arg;
    json_array_append_new(a, json_pack("{s:o,s:I,s:s,s:i,s:i,s:i,s:i,s:I,s:o}", "key",
                                       json_bytesn(c->key, c->key_len), "id", (json_int_t)c->id,
                                       "format", format_name(c->format), "files", (int)c->nfiles,
                                       "tensors", (int)c->ntensors, "items", (int)c->nitems,
                                       "bytes", (int)c->nbytes, "built_at", (json_int_t)c->built_at,
                                       "fingerprint",
                                       json_bytesn(c->fingerprint, c->fingerprint_len)));
    return 0;
}

static int index_ls(struct admin_opts *o)
{
    struct idxdb *db;
    int ex = open_db(o, 0, &db);
    if (ex)
        return ex;
    struct idxdb_txn *t;
    struct ckpt_err e;
    int rc = idxdb_begin(db, &t, &e);
    if (rc) {
        idxdb_close(db);
        return report(o, EX_DB, "index", &e, rc);
    }
    json_t *a = json_array();
    rc = idxdb_ckpt_list(t, on_ckpt, a);
    idxdb_end(t);
    uint64_t used = 0, map = 0;
    idxdb_stat(db, &used, &map);
    idxdb_close(db);
    if (rc) {
        json_decref(a);
        return report(o, EX_DB, "index", NULL, rc);
    }
    if (o->json) {
        return json_out(json_pack("{s:o,s:I}", "checkpoints", a, "bytes_used", (json_int_t)used));
    }
    struct table tb;
    table_init(&tb, 5, "CHECKPOINT", "FORMAT", "FILES", "ITEMS", "FINGERPRINT");
    for (size_t i = 0; i < json_array_size(a); i++) {
        json_t *c = json_array_get(a, i);
        char f[16], it[16];
        snprintf(f, sizeof(f), "%d", (int)json_integer_value(json_object_get(c, "files")));
        snprintf(it, sizeof(it), "%d", (int)json_integer_value(json_object_get(c, "items")));
        table_row(&tb, json_string_value(json_object_get(c, "key")),
                  json_string_value(json_object_get(c, "format")), f, it,
                  json_string_value(json_object_get(c, "fingerprint")));
    }
    table_print(&tb, stdout);
    table_free(&tb);
    printf("%zu checkpoint(s), %" PRIu64 " bytes used\n", json_array_size(a), used);
    json_decref(a);
    return EX_OK;
}

/* A checkpoint found in the index, in an open read transaction. */
struct qctx {
    struct idxdb *db;
    struct idxdb_txn *t;
    struct idxdb_ckpt c;
    char *key;
};

static void query_close(struct qctx *q)
{
    idxdb_end(q->t);
    idxdb_close(q->db);
    free(q->key);
}

/* Open the index read-only and find the checkpoint named by arg. 0, or an
 * exit code (message printed) with nothing left open. */
static int query_open(struct admin_opts *o, const char *arg, struct qctx *q)
{
    memset(q, 0, sizeof(*q));
    struct admin_src src;
    int ex = src_open(o, arg, &src);
    if (ex)
        return ex;
    q->key = src.file ? strdup(src.root) : strdup(src.url);
    src_close(&src);
    if (!q->key)
        return EX_IO;
    if ((ex = open_db(o, 0, &q->db)))
        goto fail;
    struct ckpt_err e;
    int rc = idxdb_begin(q->db, &q->t, &e);
    if (rc) {
        ex = report(o, EX_DB, "index", &e, rc);
        goto fail;
    }
    rc = idxdb_ckpt_get(q->t, q->key, &q->c);
    if (rc) {
        ex = report_msg(o, rc == CKPT_NOTFOUND ? EX_NOTFOUND : EX_DB, q->key, rc,
                        "not in the index (run: ckptfs-admin index rebuild)");
        goto fail;
    }
    return 0;
fail:
    query_close(q);
    return ex;
}

static int on_file(void *arg, const struct idxdb_file *f)
{
    json_array_append_new(
        arg,
        json_pack("{s:o,s:o,s:o,s:i,s:i}", "name", json_bytesn(f->name, f->name_len), "size",
                  f->size == CKPT_SIZE_UNKNOWN ? json_null() : json_integer((json_int_t)f->size),
                  "present", f->present < 0 ? json_null() : json_boolean(f->present == 1), "rank",
                  f->rank, "items", (int)f->nitems));
    return 0;
}

static int index_files(struct admin_opts *o)
{
    struct qctx q;
    int ex = need_args(o, 2, "index files CKPT");
    if (ex || (ex = query_open(o, o->argv[1], &q)))
        return ex;
    json_t *a = json_array();
    idxdb_files(q.t, q.c.id, on_file, a);
    if (o->json) {
        ex = json_out(json_pack("{s:o,s:o}", "checkpoint", json_bytes(q.key), "files", a));
    } else {
        for (size_t i = 0; i < json_array_size(a); i++)
            printf("%s\n", json_string_value(json_object_get(json_array_get(a, i), "name")));
        json_decref(a);
    }
    query_close(&q);
    return ex;
}

static json_t *span_json(struct qctx *q, const struct idxdb_span *s)
{
    struct idxdb_item it;
    json_t *j = json_pack("{s:i,s:I,s:I}", "item", (int)s->item, "offset", (json_int_t)s->offset,
                          "length", (json_int_t)s->length);
    if (idxdb_item_get(q->t, q->c.id, s->item, &it) == 0) {
        json_object_set_new(j, "fqn", json_bytesn(it.fqn, it.fqn_len));
        json_object_set_new(j, "kind",
                            json_string(it.kind == CKPT_ITEM_BYTES ? "bytes" : "tensor"));
        if (it.kind == CKPT_ITEM_TENSOR) {
            json_t *co = json_array();
            for (uint32_t d = 0; d < it.ndim; d++)
                json_array_append_new(co, json_integer(idxdb_i64(it.chunk_offsets, d)));
            json_object_set_new(j, "chunk", json_integer(it.chunk));
            json_object_set_new(j, "chunk_offset", co);
        }
    }
    return j;
}

static int index_at(struct admin_opts *o)
{
    int ex = need_args(o, 4, "index at CKPT FILE OFFSET [--next N]");
    if (ex)
        return ex;
    char *end;
    const char *arg = o->argv[3];
    int hex = arg[0] == '0' && (arg[1] == 'x' || arg[1] == 'X'); /* decimal or 0x..., never octal */
    errno = 0;
    unsigned long long off = strtoull(arg, &end, hex ? 16 : 10);
    if (*end || !*arg || arg[0] == '-' || errno == ERANGE) {
        return usage_error(o, "bad offset '%s'", o->argv[3]);
    }
    struct qctx q;
    if ((ex = query_open(o, o->argv[1], &q)))
        return ex;
    uint32_t file;
    struct idxdb_span s;
    int rc = idxdb_file_find(q.t, q.c.id, o->argv[2], &file);
    if (rc) {
        ex = report_msg(o, EX_NOTFOUND, q.key, rc, "the checkpoint names no file '%s'", o->argv[2]);
    } else if ((rc = idxdb_item_at(q.t, q.c.id, file, off, &s))) {
        ex = report_msg(o, rc == CKPT_NOTFOUND ? EX_NOTFOUND : EX_DB, q.key, rc,
                        "no item holds byte %llu of %s", off, o->argv[2]);
    } else {
        json_t *hit = span_json(&q, &s), *next = json_array();
        for (long i = 0; i < o->next && idxdb_layout_next(q.t, &s) == 0; i++)
            json_array_append_new(next, span_json(&q, &s));
        if (o->json) {
            ex = json_out(json_pack("{s:o,s:o,s:I,s:o,s:o}", "checkpoint", json_bytes(q.key),
                                    "file", json_bytes(o->argv[2]), "at", (json_int_t)off, "item",
                                    hit, "next", next));
        } else {
            struct table tb;
            table_init(&tb, 5, "ITEM", "FQN", "KIND", "OFFSET", "LENGTH");
            for (size_t i = 0; i <= json_array_size(next); i++) {
                json_t *x = i ? json_array_get(next, i - 1) : hit;
                char a[16], b[32], c[32];
                snprintf(a, sizeof(a), "%d", (int)json_integer_value(json_object_get(x, "item")));
                table_row(&tb, a, json_string_value(json_object_get(x, "fqn")),
                          json_string_value(json_object_get(x, "kind")),
                          fmt_u64(b, sizeof(b),
                                  (uint64_t)json_integer_value(json_object_get(x, "offset"))),
                          fmt_u64(c, sizeof(c),
                                  (uint64_t)json_integer_value(json_object_get(x, "length"))));
            }
            table_print(&tb, stdout);
            table_free(&tb);
            json_decref(hit);
            json_decref(next);
        }
    }
    query_close(&q);
    return ex;
}

static int index_where(struct admin_opts *o)
{
    struct qctx q;
    int ex = need_args(o, 3, "index where CKPT FQN");
    if (ex || (ex = query_open(o, o->argv[1], &q)))
        return ex;
    enum ckpt_item_kind kind;
    uint32_t idx;
    int rc = idxdb_fqn_find(q.t, q.c.id, o->argv[2], &kind, &idx);
    if (rc) {
        ex = report_msg(o, EX_NOTFOUND, q.key, rc, "no tensor or bytes entry '%s'", o->argv[2]);
        query_close(&q);
        return ex;
    }
    json_t *chunks = json_array();
    json_t *j = json_pack("{s:o,s:s}", "fqn", json_bytes(o->argv[2]), "kind",
                          kind == CKPT_ITEM_BYTES ? "bytes" : "tensor");
    uint32_t nitems = 1;
    struct idxdb_tensor t;
    if (kind == CKPT_ITEM_TENSOR) {
        if (idxdb_tensor_get(q.t, q.c.id, idx, &t) == 0) {
            nitems = t.nchunks;
            json_object_set_new(j, "dtype", json_bytesn(t.dtype, t.dtype_len));
            json_t *sh = json_array();
            for (uint32_t d = 0; d < t.ndim; d++)
                json_array_append_new(sh, json_integer(idxdb_i64(t.size, d)));
            json_object_set_new(j, "shape", sh);
        } else {
            nitems = 0;
        }
    }
    for (uint32_t k = 0; k < nitems; k++) {
        uint32_t item = kind == CKPT_ITEM_TENSOR ? idxdb_u32(t.chunk_items, k) : idx;
        struct idxdb_item it;
        struct idxdb_file f;
        if (idxdb_item_get(q.t, q.c.id, item, &it) || idxdb_file_get(q.t, q.c.id, it.file, &f))
            continue;
        json_t *co = json_array();
        for (uint32_t d = 0; d < it.ndim; d++)
            json_array_append_new(co, json_integer(idxdb_i64(it.chunk_offsets, d)));
        json_array_append_new(chunks,
                              json_pack("{s:i,s:o,s:o,s:I,s:I}", "item", (int)item, "offsets", co,
                                        "file", json_bytesn(f.name, f.name_len), "offset",
                                        (json_int_t)it.offset, "length", (json_int_t)it.length));
    }
    json_object_set_new(j, "chunks", chunks);
    if (o->json) {
        ex = json_out(j);
    } else {
        for (size_t i = 0; i < json_array_size(chunks); i++) {
            json_t *c = json_array_get(chunks, i);
            printf("%s  offset %" PRId64 "  length %" PRId64 "\n",
                   json_string_value(json_object_get(c, "file")),
                   (int64_t)json_integer_value(json_object_get(c, "offset")),
                   (int64_t)json_integer_value(json_object_get(c, "length")));
        }
        json_decref(j);
    }
    query_close(&q);
    return ex;
}

/* ---- bench ------------------------------------------------------------ */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint64_t xorshift(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

#define BENCH_MAX_LOOKUPS 100000000L /* --lookups bound (16 bytes of target each) */

struct target {
    uint32_t file, item;
    uint64_t off;
};

/* *out: n lookup targets, random bytes inside random non-empty items of c,
 * with the item the model says holds each. 0, CKPT_NOTFOUND (no non-empty
 * item) or -ENOMEM. */
static int bench_targets(const struct ckpt *c, long n, struct target **out)
{
    uint32_t *nonempty = malloc(sizeof(uint32_t) * ((size_t)c->nitems + 1));
    size_t nn = 0;
    for (uint32_t i = 0; nonempty && i < c->nitems; i++)
        if (c->items[i].length)
            nonempty[nn++] = i;
    int rc = !nonempty ? -ENOMEM : !nn ? CKPT_NOTFOUND : 0;
    struct target *tg = rc ? NULL : malloc(sizeof(*tg) * (size_t)n);
    rc = rc ? rc : !tg ? -ENOMEM : 0;
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    for (long i = 0; tg && i < n; i++) {
        const struct ckpt_item *it = &c->items[nonempty[xorshift(&seed) % nn]];
        tg[i].file = it->file;
        tg[i].off = it->offset + xorshift(&seed) % it->length;
        tg[i].item = ckpt_item_at(c, it->file, tg[i].off);
    }
    free(nonempty);
    *out = tg;
    return rc;
}

/* Time n lookups of tg in the index of checkpoint id: all in one read
 * transaction (secs[0]), then the first nshort with a transaction per 1000
 * (secs[1]); wrong answers added to *wrong. 0 or idxdb_begin's error. */
static int bench_index(struct idxdb *db, uint64_t id, const struct target *tg, long n, long nshort,
                       double secs[2], long *wrong, struct ckpt_err *e)
{
    struct idxdb_txn *t = NULL;
    struct idxdb_span sp;
    int rc = idxdb_begin(db, &t, e);
    if (rc)
        return rc;
    double t0 = now();
    for (long i = 0; i < n; i++)
        if (idxdb_item_at(t, id, tg[i].file, tg[i].off, &sp) || sp.item != tg[i].item)
            (*wrong)++;
    secs[0] = now() - t0;
    idxdb_end(t);
    t = NULL;
    t0 = now();
    for (long i = 0; i < nshort; i++) {
        if (i % 1000 == 0) {
            idxdb_end(t);
            t = NULL;
            if ((rc = idxdb_begin(db, &t, e)))
                return rc;
        }
        if (idxdb_item_at(t, id, tg[i].file, tg[i].off, &sp) || sp.item != tg[i].item)
            (*wrong)++;
    }
    idxdb_end(t);
    secs[1] = now() - t0;
    return 0;
}

/* Times, for the checkpoint CKPT (a .metadata file or directory): reading
 * the metadata, the pickle parse alone, the full DCP extraction, building
 * the LMDB index, then N random "item at byte X of file F" lookups (X drawn
 * uniformly inside random non-empty items) in one read transaction, the
 * same with a transaction per 1000 lookups, and in memory (ckpt_item_at).
 * Every lookup's answer is checked against the model. The checkpoint is
 * indexed under "bench:..." and dropped again on every way out. */
static int index_bench(struct admin_opts *o)
{
    int ex = need_args(o, 2, "index bench CKPT [--lookups N] [--cache-dir DIR]");
    if (ex)
        return ex;
    if (o->lookups > BENCH_MAX_LOOKUPS) {
        return usage_error(o, "--lookups is at most %ld", BENCH_MAX_LOOKUPS);
    }
    long nlook = o->lookups > 0 ? o->lookups : 1000000;
    struct admin_src src;
    if ((ex = src_open(o, o->argv[1], &src)))
        return ex;
    struct ckpt_err e;
    ckpt_err_clear(&e);
    const char *meta = src.file ? src.file : ".metadata";
    void *buf = NULL;
    size_t len = 0;
    struct ckpt *c = NULL;
    struct idxdb *db = NULL;
    struct target *tg = NULL;
    char key[600];
    int put = 0; /* key is in the index: drop it on the way out */
    double t0 = now();
    int rc = ckpt_io_read_all(&src.io, meta, (size_t)1 << 32, &buf, &len);
    double t_read = now() - t0;
    if (rc) {
        ex = report(o, EX_IO, src.url, NULL, rc);
        goto out;
    }
    struct pkl_doc *doc;
    struct dcp_options dopt;
    dcp_options_default(&dopt);
    t0 = now();
    rc = pkl_parse(buf, len, &dopt.pkl, &doc, &e);
    double t_pickle = now() - t0;
    size_t nvalues = doc ? doc->nvalues : 0;
    pkl_free(doc);
    t0 = now();
    if (!rc)
        rc = dcp_parse(buf, len, &dopt, &c, &e);
    double t_parse = now() - t0;
    if (rc) {
        ex = report(o, exit_for(rc), src.url, &e, rc);
        goto out;
    }
    if ((ex = open_db(o, 1, &db)))
        goto out;
    snprintf(key, sizeof(key), "bench:%s/%s", src.root, meta);
    t0 = now();
    uint64_t id;
    rc = idxdb_put(db, key, "", c, &id, &e);
    double t_build = now() - t0;
    if (rc) {
        ex = report(o, EX_DB, key, &e, rc);
        goto out;
    }
    put = 1;
    uint64_t used = 0, map = 0;
    idxdb_stat(db, &used, &map);
    if ((rc = bench_targets(c, nlook, &tg))) {
        ex = report_msg(o, exit_for(rc), src.url, rc, "%s",
                        rc == CKPT_NOTFOUND ? "nothing to look up" : "out of memory");
        goto out;
    }
    long wrong = 0, nshort = nlook < 100000 ? nlook : 100000;
    double secs[2];
    if ((rc = bench_index(db, id, tg, nlook, nshort, secs, &wrong, &e))) {
        ex = report(o, EX_DB, "index", &e, rc);
        goto out;
    }
    t0 = now();
    for (long i = 0; i < nlook; i++)
        if (ckpt_item_at(c, tg[i].file, tg[i].off) != tg[i].item)
            wrong++;
    double t_mem = now() - t0;
    put = 0;
    if ((rc = idxdb_drop(db, key, &e))) {
        ex = report(o, EX_DB, key, &e, rc);
        goto out;
    }
    json_t *j =
        json_pack("{s:o,s:I,s:i,s:i,s:i,s:I,s:f,s:f,s:f,s:f,s:f,s:I,s:I,s:f,s:f,s:f,s:I}",
                  "metadata", json_bytes(src.url), "metadata_bytes", (json_int_t)len, "items",
                  (int)c->nitems, "tensors", (int)c->ntensors, "files", (int)c->nfiles,
                  "pickle_values", (json_int_t)nvalues, "read_s", t_read, "pickle_parse_s",
                  t_pickle, "parse_s", t_parse, "index_build_s", t_build, "parse_and_build_s",
                  t_parse + t_build, "index_bytes", (json_int_t)used, "lookups", (json_int_t)nlook,
                  "lookups_per_s", nlook / secs[0], "lookups_per_s_txn_per_1000", nshort / secs[1],
                  "lookups_per_s_in_memory", nlook / t_mem, "wrong_answers", (json_int_t)wrong);
    if (o->json) {
        ex = json_out(j);
    } else {
        printf("%s: %zu bytes, %u items, %u tensors, %u files\n", src.url, len, c->nitems,
               c->ntensors, c->nfiles);
        printf("read %.3f s, pickle parse %.3f s, DCP parse %.3f s, index build %.3f s\n", t_read,
               t_pickle, t_parse, t_build);
        printf("index size %" PRIu64 " bytes\n", used);
        printf("item-at-offset: %.0f lookups/s (one read txn), %.0f/s (txn per 1000), "
               "%.0f/s in memory; %ld wrong\n",
               nlook / secs[0], nshort / secs[1], nlook / t_mem, wrong);
        json_decref(j);
    }
    if (wrong && !ex)
        ex = EX_CHECK;
out:
    if (put)
        idxdb_drop(db, key, &e);
    free(tg);
    free(buf);
    ckpt_free(c);
    idxdb_close(db);
    src_close(&src);
    return ex;
}

int cmd_index(struct admin_opts *o)
{
    static const struct {
        const char *name;
        int (*fn)(struct admin_opts *);
    } subs[] = {{"rebuild", index_rebuild}, {"ls", index_ls},       {"files", index_files},
                {"at", index_at},           {"where", index_where}, {"bench", index_bench}};
    const char *sub = o->argc ? o->argv[0] : "";
    for (size_t i = 0; i < sizeof(subs) / sizeof(subs[0]); i++)
        if (strcmp(sub, subs[i].name) == 0)
            return subs[i].fn(o);
    return usage_error(o, "usage: ckptfs-admin index rebuild|ls|files|at|where ... (see --help)");
}
