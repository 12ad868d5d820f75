/*
 * tools/admin/admin.h - shared pieces of ckptfs-admin: options, exit codes,
 * checkpoint sources, output helpers. Each cmd_*.c implements some verbs.
 */
#ifndef CKPTFS_ADMIN_H
#define CKPTFS_ADMIN_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>

#include "ckpt.h"
#include "load.h"

struct store;

/* Exit codes (documented in --help). */
#define EX_OK 0
#define EX_CHECK 1    /* verify found problems; rebuild: some checkpoints failed */
#define EX_USAGE 2    /* bad command line */
#define EX_PARSE 3    /* a .metadata / safetensors header is malformed or invalid */
#define EX_IO 4       /* cannot read, list or find the checkpoint */
#define EX_DB 5       /* index database error (incl. schema version mismatch) */
#define EX_NOTFOUND 6 /* the FQN / offset asked for is not in the checkpoint */

struct admin_opts {
    int json;
    const char *endpoint_url; /* s3:// options, as for the mount */
    const char *region;
    const char *profile;
    int force_path_style;
    int quiet;
    const char *cache_dir; /* NULL = default */
    long next;             /* index at: items to list after the hit */
    long lookups;          /* index bench: lookups to time */
    int hash;              /* dump: also SHA-256 of files and items */
    double watch;          /* stats: sample every this many seconds; 0 = once */
    long count;            /* stats --watch: stop after this many samples; 0 = never */
    int argc;              /* positional arguments after the verb */
    char **argv;
};

/* A checkpoint argument opened for reading: a local directory or file
 * (a path on the mount is one too), or an s3://BUCKET/PREFIX[/FILE] URL.
 * Everything reads through io. */
struct admin_src {
    struct ckpt_io io;
    char *root;          /* local directory or store URL the io is rooted at */
    char *file;          /* non-NULL if the argument named a file in root */
    char *url;           /* canonical name: absolute path or s3:// URL */
    struct store *store; /* s3:// only */
};

/* Open arg. Returns 0 or an exit code (error reported as by report()). */
int src_open(const struct admin_opts *o, const char *arg, struct admin_src *src);
void src_close(struct admin_src *src);

/* Load the checkpoint named by src (directory, .metadata file, safetensors
 * file or index json). 0 or an exit code; prints the error. */
int src_load(const struct admin_opts *o, struct admin_src *src, struct ckpt **out);

/* A bad command line: the message (printf-style) on stderr, prefixed with
 * "ckptfs-admin: " unless it starts with "usage:", and with --json also a
 * {"error": {"code": "EUSAGE", ...}} object on stdout. Returns EX_USAGE. */
int usage_error(const struct admin_opts *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* 0 if the verb got nargs positional arguments, else a usage_error()
 * "usage: ckptfs-admin SYNOPSIS" (EX_USAGE). */
int need_args(const struct admin_opts *o, int nargs, const char *synopsis);
/* need_args, then src_open and src_load of argv[0]. 0, or an exit code with
 * nothing left open; on 0 the caller frees *c and closes src. */
int admin_load_ckpt(const struct admin_opts *o, int nargs, const char *synopsis,
                    struct admin_src *src, struct ckpt **c);

/* Local-directory implementation of struct ckpt_io (ctx = root path). */
void io_local_init(struct ckpt_io *io, const char *root);
struct store_stat;
/* What the mount's local-directory store says of root/path (its ETag is
 * made of size and mtime): 0 or -errno. */
int io_local_store_stat(const char *root, const char *path, struct store_stat *st);
/* The fingerprint a mount records for the checkpoint in directory dir of
 * src (ckindex_fingerprint of its metadata files): 0 or -errno. */
int admin_fingerprint(const struct admin_src *src, const char *dir, char *out, size_t len);
/* Map a library error code to an exit code. */
int exit_for(int err);

/* Report an error: "ckptfs-admin: what: msg" on stderr, and with --json a
 * {"error": {...}} object on stdout. Returns ex. */
int report(const struct admin_opts *o, int ex, const char *what, const struct ckpt_err *e,
           int code);
/* report() of an error whose message is fmt, ... (no position). Returns ex. */
int report_msg(const struct admin_opts *o, int ex, const char *what, int code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* "dcp" or "safetensors" (enum ckpt_format). */
const char *format_name(int format);

/* JSON output (UTF-8, indent 1, key order kept); steals root. EX_OK, or
 * EX_IO with a message on stderr if root is NULL (a failed json_pack) or
 * cannot be written. */
int json_out(json_t *root);
/* A JSON string of the bytes s (a path, key, file name: any bytes): each
 * byte that is not part of well-formed UTF-8 (and NUL) becomes U+FFFD. NULL s
 * gives JSON null; NULL only when out of memory. For json_pack's "s:o". */
json_t *json_bytes(const char *s);
json_t *json_bytesn(const char *s, size_t n);
/* json_object_set_new(obj, key, value) with key made valid as by json_bytes. */
int json_object_set_bytes(json_t *obj, const char *key, json_t *value);
json_t *json_i64_array(const int64_t *v, uint32_t n);

/* Human tables: rows of cells, printed with aligned columns. */
struct table {
    int ncols;
    size_t nrows, cap;
    char **cells; /* nrows * ncols */
};
void table_init(struct table *t, int ncols, ...);
void table_row(struct table *t, ...); /* ncols strings (copied) */
void table_print(struct table *t, FILE *f);
void table_free(struct table *t);
/* "[3, 8]" into buf */
const char *fmt_shape(char *buf, size_t len, const int64_t *v, uint32_t n);
const char *fmt_u64(char *buf, size_t len, uint64_t v);

/* SHA-256 of bytes [off, off+len) of path, as 64 hex chars + NUL. */
int sha256_range(const struct ckpt_io *io, const char *path, uint64_t off, uint64_t len,
                 char hex[65]);

/* Verbs. */
int cmd_ls(struct admin_opts *o);
int cmd_where(struct admin_opts *o);
int cmd_dump(struct admin_opts *o);
int cmd_inspect(struct admin_opts *o);
int cmd_verify(struct admin_opts *o);
int cmd_index(struct admin_opts *o);
int cmd_stats(struct admin_opts *o);

#endif
