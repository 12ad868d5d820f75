/*
 * fs/read/ckpt_io_store.c - struct ckpt_io (index/load.h) over a ckptfs store
 * (fs/store/store.h): how the mount builds checkpoint indexes from its store and
 * how ckptfs-admin reads s3:// checkpoints. stat -> ops->stat, read ->
 * ops->read (unpinned, or pinned to one ETag for one path), list ->
 * ops->list, fingerprint -> store_fingerprint (the object's ETag and size),
 * known -> the mount's metadata cache (pinned io only); and the snapshot io,
 * which answers for a checkpoint this mount just published from what the
 * mount already has.
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

/* The pinned io: ctx is a struct ckpt_io_pin. */
static int pin_stat(void *ctx, const char *path, uint64_t *size, int *is_dir)
{
    const struct ckpt_io_pin *p = ctx;
    if (*p->etag && strcmp(path, p->path) == 0) { /* the pinned version's size */
        *size = p->size;
        *is_dir = 0;
        return 0;
    }
    return st_stat(p->store, path, size, is_dir);
}

static int pin_read(void *ctx, const char *path, uint64_t off, void *buf, size_t len, size_t *nread)
{
    const struct ckpt_io_pin *p = ctx;
    const char *etag = strcmp(path, p->path) == 0 ? p->etag : NULL;
    return p->store->ops->read(p->store, path, etag, off, len, buf, nread);
}

static int pin_list(void *ctx, const char *dir, ckpt_io_list_fn fn, void *arg)
{
    const struct ckpt_io_pin *p = ctx;
    return st_list(p->store, dir, fn, arg);
}

static int pin_fingerprint(void *ctx, const char *path, char *buf, size_t len)
{
    const struct ckpt_io_pin *p = ctx;
    return st_fingerprint(p->store, path, buf, len);
}

static int pin_known(void *ctx, const char *path, uint64_t *size)
{
    const struct ckpt_io_pin *p = ctx;
    return p->known ? p->known(p->known_arg, path, size) : 1;
}

void ckpt_io_from_store_pinned(struct ckpt_io *io, const struct ckpt_io_pin *pin)
{
    assert(pin && pin->store && pin->path && pin->etag);
    io->ctx = (void *)pin;
    io->stat = pin_stat;
    io->read = pin_read;
    io->list = pin_list;
    io->fingerprint = pin_fingerprint;
    io->known = pin_known;
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

/* The snapshot io: ctx is a struct ckpt_io_snapshot. */

/* The known file at path (dir/name), or NULL. */
static const struct store_file_size *known_file(const struct ckpt_io_snapshot *s, const char *path)
{
    size_t dl = strlen(s->dir);
    if (dl && (strncmp(path, s->dir, dl) != 0 || path[dl] != '/'))
        return NULL;
    const char *name = dl ? path + dl + 1 : path;
    for (size_t i = 0; i < s->nfiles; i++)
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
