/*
 * fs/read/ckpt_io_store.c - struct ckpt_io (index/load.h) over a ckptfs store
 * (fs/store/store.h): how the mount builds checkpoint indexes from its store
 * and how ckptfs-admin reads s3:// checkpoints. stat -> ops->stat, read ->
 * ops->read, list -> ops->list, fingerprint -> store_fingerprint (the
 * object's ETag and size); the pinned-set io (a checkpoint directory's
 * metadata files, listed from memory and read at the versions noticed);
 * and the snapshot io, which answers for a checkpoint this mount just
 * published from what the mount already has.
 */
#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_io_store.h"

static int st_stat(void *ctx, const char *path, uint64_t *size, int *is_dir)
{
    struct store *s = ctx;
    struct store_stat st;
    int rc = s->ops->stat(s, path, &st);
    if (rc)
        return rc;
    *size = st.size;
    *is_dir = st.is_dir;
    return 0;
}

static int st_read(void *ctx, const char *path, uint64_t off, void *buf, size_t len, size_t *nread)
{
    struct store *s = ctx;
    return s->ops->read(s, path, NULL, off, len, buf, nread);
}

struct list_adapter {
    ckpt_io_list_fn fn;
    void *arg;
};

static int on_entry(void *arg, const char *name, const struct store_stat *st)
{
    struct list_adapter *a = arg;
    return a->fn(a->arg, name, st->is_dir, st->size);
}

static int st_list(void *ctx, const char *dir, ckpt_io_list_fn fn, void *arg)
{
    struct store *s = ctx;
    struct list_adapter a = {fn, arg};
    return s->ops->list(s, dir, on_entry, &a);
}

static int st_fingerprint(void *ctx, const char *path, char *buf, size_t len)
{
    struct store *s = ctx;
    struct store_stat st;
    int rc = s->ops->stat(s, path, &st);
    if (rc)
        return rc;
    store_fingerprint(&st, buf, len);
    return 0;
}

void ckpt_io_from_store(struct ckpt_io *io, struct store *s)
{
    io->ctx = s;
    io->stat = st_stat;
    io->read = st_read;
    io->list = st_list;
    io->fingerprint = st_fingerprint;
    io->known = NULL;
}

/* The pinned-set io: ctx is a struct ckpt_io_pinset. */

#define PINSET_HEAD (64u << 10) /* bytes fetched by a read from a pinned file's start */

/* What follows "dir/" in store path path (all of it when dir is "", the
 * root), or NULL when path is not below dir. */
static const char *name_in_dir(const char *dir, const char *path)
{
    size_t dl = strlen(dir);
    if (dl && (strncmp(path, dir, dl) != 0 || path[dl] != '/'))
        return NULL;
    return dl ? path + dl + 1 : path;
}

/* The pinned file at store path path, or NULL. */
static const struct ckpt_io_pinned_file *pinned_file(const struct ckpt_io_pinset *s,
                                                     const char *path)
{
    const char *name = name_in_dir(s->dir, path);
    for (size_t i = 0; name && i < s->nfiles; i++)
        if (strcmp(s->files[i].name, name) == 0)
            return &s->files[i];
    return NULL;
}

static int set_stat(void *ctx, const char *path, uint64_t *size, int *is_dir)
{
    struct ckpt_io_pinset *s = ctx;
    const struct ckpt_io_pinned_file *f = pinned_file(s, path);
    int k = f || !s->known ? 1 : s->known(s->known_arg, path, size);
    if (f)
        *size = f->size;
    if (f || k == 0) {
        *is_dir = 0;
        return 0;
    }
    return k == -ENOENT ? -ENOENT : st_stat(s->store, path, size, is_dir);
}

static int set_read(void *ctx, const char *path, uint64_t off, void *buf, size_t len, size_t *nread)
{
    struct ckpt_io_pinset *s = ctx;
    const struct ckpt_io_pinned_file *f = pinned_file(s, path);
    if (!f)
        return st_read(s->store, path, off, buf, len, nread);
    if (off == 0 && len < PINSET_HEAD && (!s->head_path || strcmp(s->head_path, path) != 0)) {
        size_t want = f->size < PINSET_HEAD ? (size_t)f->size : PINSET_HEAD, got = 0;
        void *head = malloc(want ? want : 1);
        char *hp = strdup(path);
        int rc = head && hp ? s->store->ops->read(s->store, path, f->etag, 0, want, head, &got)
                            : -ENOMEM;
        if (rc) {
            free(head);
            free(hp);
            return rc;
        }
        ckpt_io_pinset_done(s);
        s->head = head;
        s->head_path = hp;
        s->head_len = got;
    }
    if (s->head_path && strcmp(s->head_path, path) == 0 && off + len <= s->head_len) {
        memcpy(buf, (const char *)s->head + off, len);
        *nread = len;
        return 0;
    }
    return s->store->ops->read(s->store, path, f->etag, off, len, buf, nread);
}

static int set_list(void *ctx, const char *dir, ckpt_io_list_fn fn, void *arg)
{
    struct ckpt_io_pinset *s = ctx;
    if (strcmp(dir, s->dir) != 0)
        return st_list(s->store, dir, fn, arg);
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < s->nfiles; i++)
        rc = fn(arg, s->files[i].name, 0, s->files[i].size);
    return rc;
}

static int set_fingerprint(void *ctx, const char *path, char *buf, size_t len)
{
    struct ckpt_io_pinset *s = ctx;
    return st_fingerprint(s->store, path, buf, len);
}

static int set_known(void *ctx, const char *path, uint64_t *size)
{
    struct ckpt_io_pinset *s = ctx;
    const struct ckpt_io_pinned_file *f = pinned_file(s, path);
    if (f) {
        *size = f->size;
        return 0;
    }
    return s->known ? s->known(s->known_arg, path, size) : 1;
}

void ckpt_io_from_pinset(struct ckpt_io *io, struct ckpt_io_pinset *set)
{
    assert(set && set->store && set->dir && (set->files || !set->nfiles));
    io->ctx = set;
    io->stat = set_stat;
    io->read = set_read;
    io->list = set_list;
    io->fingerprint = set_fingerprint;
    io->known = set_known;
}

void ckpt_io_pinset_done(struct ckpt_io_pinset *set)
{
    free(set->head);
    free(set->head_path);
    set->head = NULL;
    set->head_path = NULL;
    set->head_len = 0;
}

/* The snapshot io: ctx is a struct ckpt_io_snapshot. */

/* The known file at path (dir/name), or NULL. */
static const struct store_file_size *known_file(const struct ckpt_io_snapshot *s, const char *path)
{
    const char *name = name_in_dir(s->dir, path);
    for (size_t i = 0; name && i < s->nfiles; i++)
        if (strcmp(s->files[i].name, name) == 0)
            return &s->files[i];
    return NULL;
}

static int snap_stat(void *ctx, const char *path, uint64_t *size, int *is_dir)
{
    const struct ckpt_io_snapshot *s = ctx;
    const struct store_file_size *f = known_file(s, path);
    if (strcmp(path, s->mpath) == 0 || f) {
        *size = f ? f->size : s->len;
        *is_dir = 0;
        return 0;
    }
    return st_stat(s->store, path, size, is_dir);
}

static int snap_read(void *ctx, const char *path, uint64_t off, void *buf, size_t len,
                     size_t *nread)
{
    const struct ckpt_io_snapshot *s = ctx;
    if (strcmp(path, s->mpath) != 0)
        return st_read(s->store, path, off, buf, len, nread);
    size_t n = off >= s->len ? 0 : s->len - (size_t)off;
    if (n > len)
        n = len;
    memcpy(buf, (const char *)s->bytes + off, n);
    *nread = n;
    return 0;
}

static int snap_list(void *ctx, const char *dir, ckpt_io_list_fn fn, void *arg)
{
    const struct ckpt_io_snapshot *s = ctx;
    if (strcmp(dir, s->dir) != 0)
        return st_list(s->store, dir, fn, arg);
    int rc = fn(arg, ".metadata", 0, s->len);
    for (size_t i = 0; rc == 0 && i < s->nfiles; i++)
        if (!strchr(s->files[i].name, '/'))
            rc = fn(arg, s->files[i].name, 0, s->files[i].size);
    return rc;
}

static int snap_fingerprint(void *ctx, const char *path, char *buf, size_t len)
{
    const struct ckpt_io_snapshot *s = ctx;
    return st_fingerprint(s->store, path, buf, len);
}

void ckpt_io_from_snapshot(struct ckpt_io *io, const struct ckpt_io_snapshot *snap)
{
    assert(snap && snap->store && snap->dir && snap->mpath && (snap->bytes || !snap->len));
    io->ctx = (void *)snap;
    io->stat = snap_stat;
    io->read = snap_read;
    io->list = snap_list;
    io->fingerprint = snap_fingerprint;
    io->known = NULL; /* its listing answers from memory (CKPT_FILES_LIST) */
}
