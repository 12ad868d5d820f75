/*
 * fs/fuse/ops.c - FUSE adapter (high-level, path-based API).
 *
 * Each callback unpacks the request, calls the core, and returns its
 * result; nothing here decides filesystem behaviour. The open file's
 * struct core_file travels in fi->fh, so calls on an open file never need
 * its path (which is gone after an unlink: hard_remove). Statistics are
 * served as the extended attribute user.ckptfs.stats of the mount root;
 * reading user.ckptfs.sync of a directory waits until everything written
 * below it is on the store (the kernel does not pass syncfs to FUSE).
 */
#include "ops.h"

#include "core.h"
#include "log.h"
#include "openmodes.h"
#include "passthrough.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <sys/statvfs.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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
    cfg->hard_remove = 1;  /* unlink means unlink: no .fuse_hidden renames */
    conn->max_readahead = c->max_readahead;
    conn->max_write = 1u << 20; /* also raises max_pages, so reads of 1 MiB */
    conn->max_background = 64;
    /* Let the kernel splice file-descriptor replies (local store) into the
     * reader's pages instead of copying them through us. */
    if (conn->capable & FUSE_CAP_SPLICE_WRITE)
        conn->want |= FUSE_CAP_SPLICE_WRITE;
    if (conn->capable & FUSE_CAP_SPLICE_MOVE)
        conn->want |= FUSE_CAP_SPLICE_MOVE;
    /* ... and hand written bytes to us in a pipe, to splice into staging.
     * (libfuse 3.14 does so only if its pipe can hold a whole request, over
     * 1 MiB: with fs.pipe-max-size raised or CAP_SYS_RESOURCE; otherwise it
     * reads requests into memory, and fuse_buf_copy writes them.) */
    if (conn->capable & FUSE_CAP_SPLICE_READ)
        conn->want |= FUSE_CAP_SPLICE_READ;
    conn->congestion_threshold = 48;
#ifdef FUSE_CAP_CACHE_SYMLINKS
    /* A link's target is kept in the kernel's page cache of the link, as a
     * file's bytes are: following a link costs no request each time. */
    if (conn->capable & FUSE_CAP_CACHE_SYMLINKS)
        conn->want |= FUSE_CAP_CACHE_SYMLINKS;
#endif
    return c;
}

static struct core_file *handle(const struct fuse_file_info *fi)
{
    return (struct core_file *)(uintptr_t)fi->fh;
}

static int op_getattr(const char *path, struct stat *st, struct fuse_file_info *fi)
{
    if (fi && fi->fh)
        return core_fgetattr(ctx()->core, handle(fi), st);
    return core_getattr(ctx()->core, path, st);
}

struct fill_ctx {
    void *buf;
    fuse_fill_dir_t filler;
};

/* With --attrs=exact a listing's attributes (which carry no modes, owners
 * or times of their own) are not handed to the kernel: it looks each name
 * up, and the lookup asks the store once per version. */
static int fill_one(void *arg, const char *name, const struct stat *st)
{
    struct fill_ctx *fc = arg;
    if (core_attrs_exact(ctx()->core) || !(st->st_mode & S_IFMT)) /* core.h: a link? */
        return fc->filler(fc->buf, name, st, 0, 0);
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

/* A write-only descriptor's bytes go to us without a copy into the kernel's
 * page cache for the file (direct_io): one copy less per written byte. Not
 * for read-write descriptors, which a shared mmap needs and which libfuse
 * 3.14 cannot map with direct_io (FUSE_DIRECT_IO_ALLOW_MMAP is newer). */
static void write_only_direct(struct fuse_file_info *fi)
{
    if ((fi->flags & O_ACCMODE) == O_WRONLY)
        fi->direct_io = 1;
}

/* A handle that may write remembers the thread that opened it: only a
 * close by that thread's process seals it (core_flush). */
static void note_opener(struct core_file *f, const struct fuse_file_info *fi)
{
    if ((fi->flags & O_ACCMODE) != O_RDONLY)
        core_file_set_opener(f, fuse_get_context()->pid);
}

/* The first read-only open of a version in a set of overlapping opens: a
 * backing id for the disk cache's checked copy, or 0 (read through us). */
static int decide_passthrough(void *arg)
{
    static int told;
    int fd;
    if (!passthrough_enabled() || !core_file_disk_copy(ctx()->core, arg, &fd))
        return 0;
    int id = passthrough_backing_open(fd);
    if (id > 0) {
        core_note_passthrough(ctx()->core);
        return id;
    }
    if (!__atomic_exchange_n(&told, 1, __ATOMIC_RELAXED))
        log_info("passthrough: the kernel refused a backing file (%s): disk cache reads go "
                 "through the daemon",
                 strerror(-id));
    return 0;
}

/* Register f, opened at path with fi's flags, in the table of open modes
 * (its entry is f's tag) and make fi->fh its handle: 0, or -errno (f is then
 * released). */
static int register_open(const char *path, struct core_file *f, struct fuse_file_info *fi)
{
    int id = 0;
    if (passthrough_enabled()) { /* known at INIT, before any open: the same for all */
        struct openmode *mode;
        struct openmode_want w = {
            .decide = decide_passthrough, .arg = f, .close_backing = passthrough_backing_close};
        if ((fi->flags & O_ACCMODE) == O_RDONLY)
            w.version = core_file_version(f, &w.size);
        int rc = openmodes_open(path, &w, &mode, &id);
        if (rc < 0) {
            if (rc == -ETXTBSY)
                log_info("open %s: refused, the file is open in passthrough (from the disk "
                         "cache) and this open cannot share it",
                         path);
            core_release(ctx()->core, f);
            return rc;
        }
        core_file_set_tag(f, mode);
    }
    fi->fh = (uint64_t)(uintptr_t)f;
    if (id > 0) {
        fi->keep_cache = 0; /* the kernel refuses them with passthrough */
        fi->direct_io = 0;
        passthrough_expect_open(fi->fh, id);
    }
    return 0;
}

static int op_open(const char *path, struct fuse_file_info *fi)
{
    struct core_file *f;
    int keep = 0;
    int rc = core_open(ctx()->core, path, fi->flags, &f, &keep);
    if (rc < 0)
        return rc;
    fi->keep_cache = keep;
    /* core_flush does nothing for a read-only handle: the kernel need not
     * send FLUSH at each close (a round trip a loader's close waited for). */
    if ((fi->flags & O_ACCMODE) == O_RDONLY && !(fi->flags & O_TRUNC))
        fi->noflush = 1;
    note_opener(f, fi);
    write_only_direct(fi);
    if (core_file_direct_reads(ctx()->core, f)) /* no kernel readahead past a partial load */
        fi->direct_io = 1;
    return register_open(path, f, fi);
}

/* The attributes a new file or directory gets besides the mount's
 * defaults (0644 files, 0755 directories, the mounting user): its mode (the
 * kernel applied the umask) and its creator, if they differ. */
static struct store_attrs creation_attrs(mode_t mode, mode_t def)
{
    struct fuse_context *fc = fuse_get_context();
    struct store_attrs a = {0};
    if ((mode & 07777) != def)
        a = (struct store_attrs){.set = STORE_ATTR_MODE, .mode = (uint32_t)mode};
    if (fc->uid != getuid() || fc->gid != getgid()) {
        a.set |= STORE_ATTR_UID | STORE_ATTR_GID;
        a.uid = (uint32_t)fc->uid;
        a.gid = (uint32_t)fc->gid;
    }
    return a;
}

static int op_create(const char *path, mode_t mode, struct fuse_file_info *fi)
{
    struct core_file *f;
    int rc = core_create_file(ctx()->core, path, fi->flags, &f);
    if (rc < 0)
        return rc;
    struct store_attrs a = creation_attrs(mode, 0644);
    if (a.set)
        core_setattr(ctx()->core, path, f, &a);
    note_opener(f, fi);
    write_only_direct(fi);
    return register_open(path, f, fi);
}

/* Writes come as a buffer vector: memory, or with splice a pipe holding the
 * bytes the kernel sent, which fuse_buf_copy splices into the staging file. */
static int op_write_buf(const char *path, struct fuse_bufvec *in, off_t off,
                        struct fuse_file_info *fi)
{
    (void)path;
    size_t len = fuse_buf_size(in);
    if (off < 0)
        return -EINVAL;
    if (len == 0)
        return 0;
    struct core_file *f = handle(fi);
    int fd = core_write_begin(ctx()->core, f, (uint64_t)off, len);
    if (fd < 0)
        return fd;
    struct fuse_bufvec dst = FUSE_BUFVEC_INIT(len);
    dst.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
    dst.buf[0].fd = fd;
    dst.buf[0].pos = off;
    ssize_t n = fuse_buf_copy(&dst, in, 0);
    core_write_end(ctx()->core, f, (uint64_t)off, len, n);
    return (int)n;
}

static int op_truncate(const char *path, off_t size, struct fuse_file_info *fi)
{
    if (size < 0)
        return -EINVAL;
    return core_truncate(ctx()->core, path, fi && fi->fh ? handle(fi) : NULL, (uint64_t)size);
}

static int op_flush(const char *path, struct fuse_file_info *fi)
{
    (void)path;
    return core_flush(ctx()->core, handle(fi), fuse_get_context()->pid);
}

static int op_fsync(const char *path, int datasync, struct fuse_file_info *fi)
{
    (void)path;
    (void)datasync; /* the staging file's metadata is ours: fdatasync either way */
    return core_fsync(ctx()->core, handle(fi));
}

static int op_fsyncdir(const char *path, int datasync, struct fuse_file_info *fi)
{
    (void)datasync;
    (void)fi;
    return core_sync(ctx()->core, path);
}

static int op_unlink(const char *path)
{
    int rc = core_unlink(ctx()->core, path);
    if (rc == 0 && passthrough_enabled())
        openmodes_forget(path);
    return rc;
}

static int op_mkdir(const char *path, mode_t mode)
{
    int rc = core_mkdir(ctx()->core, path);
    struct store_attrs a = creation_attrs(mode, 0755);
    if (rc == 0 && a.set)
        rc = core_setattr(ctx()->core, path, NULL, &a);
    return rc;
}

/* Special files (mkfifo, mknod of a device or socket) have no place on an
 * object store: EPERM, as on filesystems that cannot hold them. (A regular
 * file's mknod never comes here: libfuse makes it with create.) */
static int op_mknod(const char *path, mode_t mode, dev_t rdev)
{
    (void)path;
    (void)mode;
    (void)rdev;
    return -EPERM;
}

/* Symbolic links (docs/semantics.md, "Symbolic links"): the creator is
 * kept as for files (creation_attrs). */
static int op_symlink(const char *target, const char *path)
{
    struct store_attrs a = creation_attrs(0777, 0777);
    return core_symlink(ctx()->core, target, path, &a);
}

/* libfuse wants the target NUL-terminated, cut to size - 1 bytes. */
static int op_readlink(const char *path, char *buf, size_t size)
{
    if (size == 0)
        return -EINVAL;
    ssize_t n = core_readlink(ctx()->core, path, buf, size - 1);
    if (n < 0)
        return (int)n;
    buf[n] = '\0';
    return 0;
}

/* Hard links: an object has one name. EPERM (link(2): "the filesystem
 * does not support the creation of hard links"). */
static int op_link(const char *from, const char *to)
{
    (void)from;
    (void)to;
    return -EPERM;
}

static int op_rmdir(const char *path)
{
    return core_rmdir(ctx()->core, path);
}

static int op_rename(const char *from, const char *to, unsigned int flags)
{
    int rc = core_rename(ctx()->core, from, to, flags);
    if (rc == 0 && passthrough_enabled()) {
        openmodes_forget(to); /* replaced: its open handles keep the old inode */
        openmodes_rename(from, to);
    }
    return rc;
}

/* Modes, owners and times are stored (docs/semantics.md, "Modes, owners
 * and times"); the kernel checked who may set them (default_permissions)
 * or, without it, the owner of the mount is the only one who can reach us. */
static struct core_file *setattr_handle(struct fuse_file_info *fi)
{
    return fi && fi->fh ? handle(fi) : NULL;
}

static int op_chmod(const char *path, mode_t mode, struct fuse_file_info *fi)
{
    struct store_attrs a = {.set = STORE_ATTR_MODE, .mode = (uint32_t)mode};
    return core_setattr(ctx()->core, path, setattr_handle(fi), &a);
}

static int op_chown(const char *path, uid_t uid, gid_t gid, struct fuse_file_info *fi)
{
    struct store_attrs a = {.uid = (uint32_t)uid, .gid = (uint32_t)gid};
    if (uid != (uid_t)-1)
        a.set |= STORE_ATTR_UID;
    if (gid != (gid_t)-1)
        a.set |= STORE_ATTR_GID;
    if (!a.set) {
        struct stat st;
        return core_getattr(ctx()->core, path, &st);
    }
    return core_setattr(ctx()->core, path, setattr_handle(fi), &a);
}

/* Only the modification time is kept; the access time is not. */
static int op_utimens(const char *path, const struct timespec tv[2], struct fuse_file_info *fi)
{
    struct timespec m = tv[1];
    if (m.tv_nsec == UTIME_OMIT) {
        struct stat st;
        return fi && fi->fh ? 0 : core_getattr(ctx()->core, path, &st);
    }
    if (m.tv_nsec == UTIME_NOW)
        clock_gettime(CLOCK_REALTIME, &m);
    struct store_attrs a = {.set = STORE_ATTR_MTIME,
                            .mtime_ns = (int64_t)m.tv_sec * 1000000000 + m.tv_nsec};
    return core_setattr(ctx()->core, path, setattr_handle(fi), &a);
}

static int op_statfs(const char *path, struct statvfs *sv)
{
    (void)path;
    const unsigned long bsize = 1u << 20;
    uint64_t total, used;
    core_space(ctx()->core, &total, &used);
    memset(sv, 0, sizeof *sv);
    sv->f_bsize = sv->f_frsize = bsize;
    /* The store is as large as it is; what limits a writer is staging. */
    sv->f_blocks = total / bsize;
    sv->f_bfree = sv->f_bavail = total > used ? (total - used) / bsize : 0;
    sv->f_files = 1u << 30;
    sv->f_ffree = sv->f_favail = 1u << 30;
    sv->f_namemax = core_name_max(ctx()->core);
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
    struct core_file *f = handle(fi);
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
    struct core_file *f = handle(fi);
    struct openmode *mode = core_file_tag(f);
    if (mode)
        openmodes_close(mode, passthrough_backing_close);
    core_release(ctx()->core, f);
    return 0;
}

static int op_getxattr(const char *path, const char *name, char *value, size_t size)
{
    if (strcmp(name, CKPTFS_SYNC_XATTR) == 0) {
        struct stat st;
        int rc = core_getattr(ctx()->core, path, &st);
        if (rc == 0 && !S_ISDIR(st.st_mode))
            rc = -ENODATA;
        if (rc == 0)
            rc = core_sync(ctx()->core, path);
        if (rc < 0)
            return rc;
        if (size == 0)
            return 2;
        if (size < 2)
            return -ERANGE;
        memcpy(value, "ok", 2);
        return 2;
    }
    if (strcmp(path, "/") != 0 || strcmp(name, CKPTFS_STATS_XATTR) != 0)
        return -ENODATA;
    char tmp[8192];
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
    .create = op_create,
    .read_buf = op_read_buf,
    .write_buf = op_write_buf,
    .truncate = op_truncate,
    .flush = op_flush,
    .fsync = op_fsync,
    .fsyncdir = op_fsyncdir,
    .release = op_release,
    .unlink = op_unlink,
    .mkdir = op_mkdir,
    .rmdir = op_rmdir,
    .rename = op_rename,
    .mknod = op_mknod,
    .link = op_link,
    .symlink = op_symlink,
    .readlink = op_readlink,
    .chmod = op_chmod,
    .chown = op_chown,
    .utimens = op_utimens,
    .statfs = op_statfs,
    .getxattr = op_getxattr,
    .listxattr = op_listxattr,
};

const struct fuse_operations *ckptfs_fuse_operations(void)
{
    return &ckptfs_ops;
}
