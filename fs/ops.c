/*
 * fs/ops.c - FUSE adapter (high-level, path-based API).
 *
 * Each callback unpacks the request, calls the core, and returns its
 * result; nothing here decides filesystem behaviour. The open file's
 * struct core_file travels in fi->fh. Statistics are served as the
 * extended attribute user.ckptfs.stats of the mount root.
 */
#include "ops.h"

#include "core.h"

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static struct ops_context *ctx(void)
{
    return fuse_get_context()->private_data;
}

static void *op_init(struct fuse_conn_info *conn, struct fuse_config *cfg)
{
    struct ops_context *c = ctx();
    cfg->entry_timeout = c->attr_timeout;
    cfg->attr_timeout = c->attr_timeout;
    cfg->negative_timeout = c->attr_timeout;
    cfg->use_ino = 0;
    cfg->kernel_cache = 0; /* decided per open from the object's version */
    conn->max_readahead = c->max_readahead;
    conn->max_write = 1u << 20; /* also raises max_pages, so reads of 1 MiB */
    conn->max_background = 64;
    /* Let the kernel splice file-descriptor replies (local store) into the
     * reader's pages instead of copying them through us. */
    if (conn->capable & FUSE_CAP_SPLICE_WRITE)
        conn->want |= FUSE_CAP_SPLICE_WRITE;
    if (conn->capable & FUSE_CAP_SPLICE_MOVE)
        conn->want |= FUSE_CAP_SPLICE_MOVE;
    conn->congestion_threshold = 48;
    return c;
}

static int op_getattr(const char *path, struct stat *st, struct fuse_file_info *fi)
{
    (void)fi;
    return core_getattr(ctx()->core, path, st);
}

struct fill_ctx {
    void *buf;
    fuse_fill_dir_t filler;
};

static int fill_one(void *arg, const char *name, const struct stat *st)
{
    struct fill_ctx *fc = arg;
    return fc->filler(fc->buf, name, st, 0, FUSE_FILL_DIR_PLUS);
}

static int op_readdir(const char *path, void *buf, fuse_fill_dir_t filler, off_t off,
                      struct fuse_file_info *fi, enum fuse_readdir_flags flags)
{
    (void)off;
    (void)fi;
    (void)flags;
    struct stat dot;
    int rc = core_getattr(ctx()->core, path, &dot);
    if (rc < 0)
        return rc;
    filler(buf, ".", &dot, 0, 0);
    filler(buf, "..", NULL, 0, 0);
    struct fill_ctx fc = {.buf = buf, .filler = filler};
    return core_readdir(ctx()->core, path, fill_one, &fc);
}

static int op_open(const char *path, struct fuse_file_info *fi)
{
    struct core_file *f;
    int keep = 0;
    int rc = core_open(ctx()->core, path, fi->flags, &f, &keep);
    if (rc < 0)
        return rc;
    fi->fh = (uint64_t)(uintptr_t)f;
    fi->keep_cache = keep;
    return 0;
}

/* Reads come back as a buffer vector: a file descriptor of the store (the
 * kernel splices from it, no copy through us) when the store has one, else
 * memory filled from the cache. libfuse frees the vector and its memory. */
static int op_read_buf(const char *path, struct fuse_bufvec **bufp, size_t size, off_t off,
                       struct fuse_file_info *fi)
{
    (void)path;
    if (off < 0)
        return -EINVAL;
    struct core_file *f = (struct core_file *)(uintptr_t)fi->fh;
    struct fuse_bufvec *bv = malloc(sizeof *bv);
    if (!bv)
        return -ENOMEM;
    int fd;
    size_t n;
    if (core_read_direct(ctx()->core, f, (uint64_t)off, size, &fd, &n)) {
        *bv = (struct fuse_bufvec)FUSE_BUFVEC_INIT(n);
        bv->buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
        bv->buf[0].fd = fd;
        bv->buf[0].pos = off;
        *bufp = bv;
        return 0;
    }
    char *mem = malloc(size ? size : 1);
    if (!mem) {
        free(bv);
        return -ENOMEM;
    }
    ssize_t got = core_read(ctx()->core, f, mem, size, (uint64_t)off);
    if (got < 0) {
        free(mem);
        free(bv);
        return (int)got;
    }
    *bv = (struct fuse_bufvec)FUSE_BUFVEC_INIT((size_t)got);
    bv->buf[0].mem = mem;
    *bufp = bv;
    return 0;
}

static int op_release(const char *path, struct fuse_file_info *fi)
{
    (void)path;
    core_release(ctx()->core, (struct core_file *)(uintptr_t)fi->fh);
    return 0;
}

static int op_getxattr(const char *path, const char *name, char *value, size_t size)
{
    if (strcmp(path, "/") != 0 || strcmp(name, CKPTFS_STATS_XATTR) != 0)
        return -ENODATA;
    char tmp[4096];
    int n = core_stats_json(ctx()->core, tmp, sizeof tmp);
    if (n < 0 || (size_t)n >= sizeof tmp)
        return -EIO;
    if (size == 0)
        return n;
    if ((size_t)n > size)
        return -ERANGE;
    memcpy(value, tmp, (size_t)n);
    return n;
}

static int op_listxattr(const char *path, char *list, size_t size)
{
    if (strcmp(path, "/") != 0)
        return 0;
    size_t n = sizeof CKPTFS_STATS_XATTR;
    if (size == 0)
        return (int)n;
    if (n > size)
        return -ERANGE;
    memcpy(list, CKPTFS_STATS_XATTR, n);
    return (int)n;
}

static const struct fuse_operations ckptfs_ops = {
    .init = op_init,
    .getattr = op_getattr,
    .readdir = op_readdir,
    .open = op_open,
    .read_buf = op_read_buf,
    .release = op_release,
    .getxattr = op_getxattr,
    .listxattr = op_listxattr,
};

const struct fuse_operations *ckptfs_fuse_operations(void)
{
    return &ckptfs_ops;
}
