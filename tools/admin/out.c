/*
 * tools/admin/out.c - output and plumbing shared by the verbs: argument
 * count checks, opening and loading a checkpoint argument, error reports and
 * exit codes, JSON and table output, SHA-256 of file ranges.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <openssl/evp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "admin.h"
#include "ckey.h"
#include "ckpt_io_store.h"
#include "store.h"
#include "utf8.h"

int exit_for(int err)
{
    switch (err) {
    case 0:
        return EX_OK;
    case CKPT_ETRUNC:
    case CKPT_EOPCODE:
    case CKPT_ESTACK:
    case CKPT_EMEMO:
    case CKPT_ELIMIT:
    case CKPT_ETYPE:
    case CKPT_EGLOBAL:
    case CKPT_EENCODING:
    case CKPT_EFORMAT:
    case CKPT_EINVALID:
        return EX_PARSE;
    case CKPT_EVERSION:
    case CKPT_EDB:
        return EX_DB;
    case CKPT_NOTFOUND:
        return EX_NOTFOUND;
    default:
        return EX_IO;
    }
}

static const char *code_name(int code)
{
    switch (code) {
    case CKPT_ETRUNC:
        return "ETRUNC";
    case CKPT_EOPCODE:
        return "EOPCODE";
    case CKPT_ESTACK:
        return "ESTACK";
    case CKPT_EMEMO:
        return "EMEMO";
    case CKPT_ELIMIT:
        return "ELIMIT";
    case CKPT_ETYPE:
        return "ETYPE";
    case CKPT_EGLOBAL:
        return "EGLOBAL";
    case CKPT_EENCODING:
        return "EENCODING";
    case CKPT_EFORMAT:
        return "EFORMAT";
    case CKPT_EINVALID:
        return "EINVALID";
    case CKPT_ENOTCKPT:
        return "ENOTCKPT";
    case CKPT_NOTFOUND:
        return "NOTFOUND";
    case CKPT_EVERSION:
        return "EVERSION";
    case CKPT_EDB:
        return "EDB";
    default:
        return "ESYS";
    }
}

/* The {"error": {...}} document of --json on stdout: code's name, errno,
 * what failed, the message, the position in the input (CKPT_NOPOS: none)
 * and, for a system errno, its text. */
static void json_error(const char *name, int code, const char *what, const char *msg, uint64_t pos)
{
    json_t *j = json_pack("{s:{s:s,s:i,s:o,s:o}}", "error", "code", name, "errno", code, "what",
                          json_bytes(what), "message", json_bytes(msg));
    if (j && pos != CKPT_NOPOS)
        json_object_set_new(json_object_get(j, "error"), "pos", json_integer((json_int_t)pos));
    if (j && code > -4096 && code < 0)
        json_object_set_new(json_object_get(j, "error"), "strerror",
                            json_string(ckpt_strerror(code)));
    json_out(j);
}

int report(const struct admin_opts *o, int ex, const char *what, const struct ckpt_err *e, int code)
{
    const char *msg = e && e->code && e->msg[0] ? e->msg : ckpt_strerror(code);
    fprintf(stderr, "ckptfs-admin: %s: %s\n", what, msg);
    if (o && o->json)
        json_error(code_name(code), code, what, msg, e ? e->pos : CKPT_NOPOS);
    return ex;
}

int report_msg(const struct admin_opts *o, int ex, const char *what, int code, const char *fmt, ...)
{
    struct ckpt_err e;
    ckpt_err_clear(&e);
    e.code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.msg, sizeof(e.msg), fmt, ap);
    va_end(ap);
    return report(o, ex, what, &e, code);
}

const char *format_name(int format)
{
    return format == CKPT_FORMAT_DCP ? "dcp" : "safetensors";
}

int json_out(json_t *root)
{
    if (!root || json_dumpf(root, stdout, JSON_INDENT(1) | JSON_ENCODE_ANY)) {
        json_decref(root);
        fprintf(stderr, "ckptfs-admin: cannot build the JSON output\n");
        return EX_IO;
    }
    fputc('\n', stdout);
    json_decref(root);
    return EX_OK;
}

json_t *json_bytesn(const char *s, size_t n)
{
    if (!s)
        return json_null();
    size_t len;
    char *buf = ckpt_utf8_lossy(s, n, &len);
    json_t *j = buf ? json_stringn(buf, len) : NULL;
    free(buf);
    return j;
}

json_t *json_bytes(const char *s)
{
    return json_bytesn(s, s ? strlen(s) : 0);
}

int json_object_set_bytes(json_t *obj, const char *key, json_t *value)
{
    json_t *k = json_bytes(key);
    int rc = k ? json_object_set_new(obj, json_string_value(k), value) : -1;
    if (!k)
        json_decref(value);
    json_decref(k);
    return rc;
}

json_t *json_i64_array(const int64_t *v, uint32_t n)
{
    json_t *a = json_array();
    for (uint32_t i = 0; i < n; i++)
        json_array_append_new(a, json_integer(v[i]));
    return a;
}

/* ---- sources ---------------------------------------------------------- */

static int src_open_s3(const struct admin_opts *o, const char *arg, struct admin_src *src)
{
    struct store_options so;
    memset(&so, 0, sizeof(so));
    so.endpoint_url = o->endpoint_url;
    so.region = o->region;
    so.profile = o->profile;
    so.force_path_style = o->force_path_style;
    /* the name the mount's index knows it by: "s3://b//x/./y/" is s3://b/x/y */
    char *url = ckpt_store_key(arg);
    if (!url)
        return report_msg(o, EX_IO, arg, -ENOMEM, "out of memory");
    char err[512] = "";
    struct store *s = NULL;
    struct store_stat st;
    int rc = 0;
    /* an object (a .metadata, a safetensors file)? open its parent prefix; a
     * store's root always looks like a directory, so ask the parent first */
    char *slash = strrchr(url + 5, '/');
    if (slash && slash[1]) {
        *slash = '\0';
        if (store_open(url, &so, &s, err, sizeof(err)) == 0 &&
            s->ops->stat(s, slash + 1, &st) == 0 && !st.is_dir) {
            src->root = strdup(url);
            src->file = strdup(slash + 1);
        } else {
            store_destroy(s);
            s = NULL;
        }
        *slash = '/';
        err[0] = '\0';
    }
    if (!s) {
        rc = store_open(url, &so, &s, err, sizeof(err));
        if (!rc)
            src->root = strdup(url);
    }
    if (rc) {
        report_msg(o, EX_IO, url, rc, "%s", err[0] ? err : ckpt_strerror(rc));
        store_destroy(s);
        free(url);
        src_close(src);
        return EX_IO;
    }
    src->url = url;
    src->store = s;
    ckpt_io_from_store(&src->io, s);
    return 0;
}

int src_open(const struct admin_opts *o, const char *arg, struct admin_src *src)
{
    memset(src, 0, sizeof(*src));
    if (strncmp(arg, "s3://", 5) == 0)
        return src_open_s3(o, arg, src);
    if (strncmp(arg, "file://", 7) == 0)
        arg += 7;
    char real[PATH_MAX];
    struct stat st;
    if (!realpath(arg, real) || stat(real, &st)) {
        int e = errno;
        return report_msg(o, EX_IO, arg, -e, "%s", strerror(e));
    }
    if (S_ISDIR(st.st_mode)) {
        src->root = strdup(real);
    } else {
        char *slash = strrchr(real, '/');
        src->file = strdup(slash + 1);
        *slash = '\0';
        src->root = strdup(real[0] ? real : "/");
        *slash = '/';
    }
    src->url = strdup(real);
    if (!src->root || !src->url || (!S_ISDIR(st.st_mode) && !src->file)) {
        src_close(src);
        return report_msg(o, EX_IO, arg, -ENOMEM, "out of memory");
    }
    io_local_init(&src->io, src->root);
    return 0;
}

void src_close(struct admin_src *src)
{
    store_destroy(src->store);
    free(src->root);
    free(src->file);
    free(src->url);
    memset(src, 0, sizeof(*src));
}

int src_load(const struct admin_opts *o, struct admin_src *src, struct ckpt **out)
{
    struct ckpt_err e;
    ckpt_err_clear(&e);
    int rc = src->file ? ckpt_load_file(&src->io, "", src->file, NULL, out, &e)
                       : ckpt_load(&src->io, "", NULL, out, &e);
    if (rc)
        return report(o, exit_for(rc), src->url, &e, rc);
    return 0;
}

int usage_error(const struct admin_opts *o, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s%s\n", strncmp(msg, "usage:", 6) == 0 ? "" : "ckptfs-admin: ", msg);
    if (o && o->json)
        json_error("EUSAGE", -EINVAL, "usage", msg, CKPT_NOPOS);
    return EX_USAGE;
}

int need_args(const struct admin_opts *o, int nargs, const char *synopsis)
{
    if (o->argc == nargs)
        return 0;
    return usage_error(o, "usage: ckptfs-admin %s", synopsis);
}

int admin_load_ckpt(const struct admin_opts *o, int nargs, const char *synopsis,
                    struct admin_src *src, struct ckpt **c)
{
    *c = NULL;
    memset(src, 0, sizeof(*src));
    int ex = need_args(o, nargs, synopsis);
    if (!ex)
        ex = src_open(o, o->argv[0], src);
    if (!ex && (ex = src_load(o, src, c))) {
        ckpt_free(*c);
        *c = NULL;
        src_close(src);
    }
    return ex;
}

/* ---- tables ----------------------------------------------------------- */

void table_init(struct table *t, int ncols, ...)
{
    memset(t, 0, sizeof(*t));
    t->ncols = ncols;
    va_list ap;
    va_start(ap, ncols);
    char *hdr[16];
    for (int i = 0; i < ncols && i < 16; i++)
        hdr[i] = va_arg(ap, char *);
    va_end(ap);
    t->cap = 16;
    t->cells = calloc(t->cap * (size_t)ncols, sizeof(char *));
    if (!t->cells)
        return;
    for (int i = 0; i < ncols; i++)
        t->cells[i] = strdup(hdr[i]);
    t->nrows = 1;
}

void table_row(struct table *t, ...)
{
    if (!t->cells)
        return;
    if (t->nrows == t->cap) {
        char **c = realloc(t->cells, t->cap * 2 * (size_t)t->ncols * sizeof(char *));
        if (!c)
            return;
        t->cells = c;
        t->cap *= 2;
    }
    va_list ap;
    va_start(ap, t);
    for (int i = 0; i < t->ncols; i++) {
        const char *s = va_arg(ap, const char *);
        t->cells[t->nrows * (size_t)t->ncols + (size_t)i] = strdup(s ? s : "");
    }
    va_end(ap);
    t->nrows++;
}

/* display width of UTF-8 text, counting code points */
static size_t width(const char *s)
{
    size_t w = 0;
    for (; s && *s; s++)
        if (((unsigned char)*s & 0xc0) != 0x80)
            w++;
    return w;
}

void table_print(struct table *t, FILE *f)
{
    if (!t->cells)
        return;
    size_t w[16] = {0};
    for (size_t r = 0; r < t->nrows; r++)
        for (int c = 0; c < t->ncols && c < 16; c++) {
            size_t x = width(t->cells[r * (size_t)t->ncols + (size_t)c]);
            if (x > w[c])
                w[c] = x;
        }
    for (size_t r = 0; r < t->nrows; r++) {
        for (int c = 0; c < t->ncols; c++) {
            const char *s = t->cells[r * (size_t)t->ncols + (size_t)c];
            s = s ? s : "";
            fputs(s, f);
            if (c + 1 < t->ncols)
                for (size_t k = width(s); k < w[c] + 2; k++)
                    fputc(' ', f);
        }
        fputc('\n', f);
    }
}

void table_free(struct table *t)
{
    if (t->cells)
        for (size_t i = 0; i < t->nrows * (size_t)t->ncols; i++)
            free(t->cells[i]);
    free(t->cells);
    memset(t, 0, sizeof(*t));
}

const char *fmt_shape(char *buf, size_t len, const int64_t *v, uint32_t n)
{
    size_t o = 0;
    o += (size_t)snprintf(buf + o, len - o, "[");
    for (uint32_t i = 0; i < n && o < len; i++)
        o += (size_t)snprintf(buf + o, len - o, "%s%" PRId64, i ? ", " : "", v[i]);
    if (o < len)
        snprintf(buf + o, len - o, "]");
    return buf;
}

const char *fmt_u64(char *buf, size_t len, uint64_t v)
{
    snprintf(buf, len, "%" PRIu64, v);
    return buf;
}

int sha256_range(const struct ckpt_io *io, const char *path, uint64_t off, uint64_t len,
                 char hex[65])
{
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    size_t bufsz = 1 << 20;
    unsigned char *buf = malloc(bufsz);
    int rc = 0;
    if (!ctx || !buf || !EVP_DigestInit_ex(ctx, EVP_sha256(), NULL)) {
        rc = -ENOMEM;
        goto out;
    }
    while (len) {
        size_t want = len < bufsz ? (size_t)len : bufsz, got = 0;
        rc = io->read(io->ctx, path, off, buf, want, &got);
        if (rc)
            goto out;
        if (got == 0) {
            rc = -EIO;
            goto out;
        }
        EVP_DigestUpdate(ctx, buf, got);
        off += got;
        len -= got;
    }
    unsigned char md[32];
    unsigned int mdlen = 0;
    EVP_DigestFinal_ex(ctx, md, &mdlen);
    for (unsigned i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", md[i]);
out:
    free(buf);
    EVP_MD_CTX_free(ctx);
    return rc;
}
