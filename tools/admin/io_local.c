/*
 * tools/admin/io_local.c - struct ckpt_io over a local directory: stat,
 * pread and readdir below a root path; fingerprints as the mount computes
 * them. Paths come from the index library already validated as relative
 * (no "..", no leading '/').
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "admin.h"
#include "store.h"

/* stat(2) of root/path: 0 or -errno */
static int stat_below(const char *root, const char *path, struct stat *st)
{
    char *p = ckpt_path_join(root, path);
    if (!p)
        return -ENOMEM;
    int rc = stat(p, st) ? -errno : 0;
    free(p);
    return rc;
}

static int local_stat(void *ctx, const char *path, uint64_t *size, int *is_dir)
{
    struct stat st;
    int rc = stat_below(ctx, path, &st);
    if (rc)
        return rc;
    *size = S_ISDIR(st.st_mode) ? 0 : (uint64_t)st.st_size;
    *is_dir = S_ISDIR(st.st_mode);
    return 0;
}

static int local_read(void *ctx, const char *path, uint64_t off, void *buf, size_t len,
                      size_t *nread)
{
    char *p = ckpt_path_join(ctx, path);
    if (!p)
        return -ENOMEM;
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    free(p);
    if (fd < 0)
        return -errno;
    size_t got = 0;
    int rc = 0;
    while (got < len) {
        ssize_t n = pread(fd, (char *)buf + got, len - got, (off_t)(off + got));
        if (n < 0) {
            if (errno == EINTR)
                continue;
            rc = -errno;
            break;
        }
        if (n == 0)
            break;
        got += (size_t)n;
    }
    close(fd);
    *nread = got;
    return rc;
}

static int local_list(void *ctx, const char *dir, ckpt_io_list_fn fn, void *arg)
{
    char *p = ckpt_path_join(ctx, dir);
    if (!p)
        return -ENOMEM;
    DIR *d = opendir(p);
    free(p);
    if (!d)
        return -errno;
    int dfd = dirfd(d);
    struct dirent *e;
    int rc = 0;
    errno = 0;
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        struct stat st;
        if (fstatat(dfd, e->d_name, &st, 0))
            continue; /* dangling symlink or raced away */
        if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode))
            continue;
        if (fn(arg, e->d_name, S_ISDIR(st.st_mode), S_ISDIR(st.st_mode) ? 0 : (uint64_t)st.st_size))
            break;
    }
    closedir(d);
    return rc;
}

int io_local_store_stat(const char *root, const char *path, struct store_stat *st)
{
    struct stat sb;
    int rc = stat_below(root, path, &sb);
    if (rc)
        return rc;
    store_dir_stat_of(&sb, st);
    return 0;
}

/* The fingerprint the mount computes for the same file through its
 * local-directory store (store_fingerprint of store_dir_stat_of), so a mount
 * of this directory reuses what `index rebuild` built. */
static int local_fingerprint(void *ctx, const char *path, char *buf, size_t len)
{
    struct stat sb;
    int rc = stat_below(ctx, path, &sb);
    if (rc)
        return rc;
    struct store_stat st;
    store_dir_stat_of(&sb, &st);
    store_fingerprint(&st, buf, len);
    return 0;
}

void io_local_init(struct ckpt_io *io, const char *root)
{
    io->fingerprint = local_fingerprint;
    io->known = NULL;
    io->ctx = (void *)root;
    io->stat = local_stat;
    io->read = local_read;
    io->list = local_list;
}
