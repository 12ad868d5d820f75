/*
 * fs/store_dir.c - the local-directory store (the embedded default).
 *
 * Maps store paths onto a directory tree with openat()/fstatat() relative to
 * a directory fd held open for the life of the store, so a mount keeps
 * working if the root is renamed, and ".." components cannot escape it
 * (paths come from the kernel, which never sends "..", but we still refuse
 * them). The "etag" of a file is its size and mtime in nanoseconds, which
 * changes whenever the file is rewritten.
 */
#include "store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct dir_store {
    struct store base;
    int root_fd;
};

static struct dir_store *to_dir(struct store *s)
{
    return (struct dir_store *)s;
}

/* Refuse "..", "." and empty components: the store namespace is a tree. */
static int path_ok(const char *path)
{
    const char *p = path;
    if (*p == '/')
        return 0;
    while (*p) {
        const char *slash = strchr(p, '/');
        size_t n = slash ? (size_t)(slash - p) : strlen(p);
        if (n == 0 || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.'))
            return 0;
        p += n;
        if (*p == '/')
            p++;
    }
    return 1;
}

static const char *rel(const char *path)
{
    return *path ? path : ".";
}

static void fill_stat(const struct stat *sb, struct store_stat *st)
{
    memset(st, 0, sizeof *st);
    st->is_dir = S_ISDIR(sb->st_mode);
    st->size = st->is_dir ? 0 : (uint64_t)sb->st_size;
    st->mtime = sb->st_mtim.tv_sec;
    if (!st->is_dir)
        snprintf(st->etag, sizeof st->etag, "%" PRIx64 "-%" PRIx64 ".%09ld", (uint64_t)sb->st_size,
                 (uint64_t)sb->st_mtim.tv_sec, sb->st_mtim.tv_nsec);
}

static int dir_stat(struct store *s, const char *path, struct store_stat *st)
{
    struct dir_store *ds = to_dir(s);
    if (!path_ok(path) && *path)
        return -EINVAL;
    atomic_fetch_add(&s->counters.head_requests, 1);
    struct stat sb;
    if (fstatat(ds->root_fd, rel(path), &sb, 0) < 0)
        return -errno;
    if (!S_ISDIR(sb.st_mode) && !S_ISREG(sb.st_mode))
        return -ENOENT; /* only files and directories are part of a store */
    fill_stat(&sb, st);
    return 0;
}

static int dir_list(struct store *s, const char *dir, store_list_fn fn, void *arg)
{
    struct dir_store *ds = to_dir(s);
    if (!path_ok(dir) && *dir)
        return -EINVAL;
    atomic_fetch_add(&s->counters.list_requests, 1);
    int fd = openat(ds->root_fd, rel(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    DIR *d = fdopendir(fd);
    if (!d) {
        int e = errno;
        close(fd);
        return -e;
    }
    int rc = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        struct stat sb;
        if (fstatat(dirfd(d), de->d_name, &sb, 0) < 0)
            continue; /* vanished between readdir and stat */
        if (!S_ISDIR(sb.st_mode) && !S_ISREG(sb.st_mode))
            continue;
        struct store_stat st;
        fill_stat(&sb, &st);
        if (fn(arg, de->d_name, &st) != 0)
            break;
    }
    closedir(d);
    return rc;
}

/* An fd for path, checked to still have etag (if given). */
static int dir_open_fd(struct store *s, const char *path, const char *etag)
{
    struct dir_store *ds = to_dir(s);
    if (!path_ok(path))
        return -EINVAL;
    int fd = openat(ds->root_fd, path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    if (etag && *etag) {
        struct stat sb;
        struct store_stat now;
        if (fstat(fd, &sb) < 0) {
            int e = errno;
            close(fd);
            return -e;
        }
        fill_stat(&sb, &now);
        if (strcmp(now.etag, etag) != 0) {
            close(fd);
            return -ESTALE;
        }
    }
    return fd;
}

static int dir_read(struct store *s, const char *path, const char *etag, uint64_t off, size_t len,
                    void *buf, size_t *nread)
{
    *nread = 0;
    int fd = dir_open_fd(s, path, etag);
    if (fd < 0)
        return fd;
    int rc = 0;
    atomic_fetch_add(&s->counters.get_requests, 1);
    size_t done = 0;
    while (done < len) {
        ssize_t n = pread(fd, (char *)buf + done, len - done, (off_t)(off + done));
        if (n < 0) {
            if (errno == EINTR)
                continue;
            rc = -errno;
            atomic_fetch_add(&s->counters.errors, 1);
            break;
        }
        if (n == 0)
            break;
        done += (size_t)n;
    }
    *nread = done;
    atomic_fetch_add(&s->counters.get_bytes, done);
    close(fd);
    return rc;
}

static void dir_destroy(struct store *s)
{
    struct dir_store *ds = to_dir(s);
    close(ds->root_fd);
    free(s->description);
    free(ds);
}

static const struct store_ops dir_ops = {
    .scheme = "dir",
    .stat = dir_stat,
    .list = dir_list,
    .read = dir_read,
    .open_fd = dir_open_fd,
    .destroy = dir_destroy,
};

int store_dir_open(const char *root, struct store **out, char *err, size_t errlen)
{
    int fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "cannot open store directory '%s': %s", root, strerror(e));
        return -e;
    }
    struct dir_store *ds = calloc(1, sizeof *ds);
    /* The canonical name (index keys, logs) is the absolute path. */
    if (!ds || !(ds->base.description = realpath(root, NULL))) {
        free(ds);
        close(fd);
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    ds->base.ops = &dir_ops;
    ds->root_fd = fd;
    *out = &ds->base;
    return 0;
}
