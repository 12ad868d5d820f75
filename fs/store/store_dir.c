/*
 * fs/store/store_dir.c - the local-directory store (the embedded default).
 *
 * Maps store paths onto a directory tree with *at() calls relative to a
 * directory fd held open for the life of the store, so a mount keeps working
 * if the root is renamed, and ".." components cannot escape it (paths come
 * from the kernel, which never sends "..", but we still refuse them). The
 * "etag" of a file is its size, mtime in nanoseconds and inode number, which
 * change whenever the file is rewritten in place or replaced.
 *
 * Writes give S3's semantics: an object appears under its final name only
 * complete. put, copy and multipart uploads write a temporary file in the
 * target's own directory, named ".ckptfs-upload.<16 hex>.<final name>" (or
 * ".ckptfs-upload.<16 hex>#<16 hex hash of the name>" when the name is too
 * long for that), fsync it, rename it over the final name and fsync the
 * directory. A multipart upload's id is its temporary file's name, so an
 * upload survives a crash and a later mount can find (mpu_list) and abort it.
 * This module owns those names: stat, list and reads hide every name that
 * starts with ".ckptfs-upload.", and writes refuse to create one. Parent
 * directories are never created implicitly (mkdir them first). Write
 * requests are counted in the store's counters the way the S3 backend counts
 * its requests; mkdir and rename, which S3 does not have, are not counted.
 */
#include "store.h"

#include "fdio.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define TMP_PREFIX ".ckptfs-upload."
#define TMP_PREFIX_LEN (sizeof TMP_PREFIX - 1)
#define TMP_HEX 16 /* hex digits of the random part, and of the name hash */
/* Longest final name kept whole in a temporary name: prefix, random, '.'. */
#define TMP_NAME_MAX (NAME_MAX - TMP_PREFIX_LEN - TMP_HEX - 1)
#define COPY_CHUNK (1u << 20) /* pread/pwrite buffer of the copy fallback */

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

/* 1 if name (one component) is a temporary upload file's. */
static int tmp_name(const char *name)
{
    return strncmp(name, TMP_PREFIX, TMP_PREFIX_LEN) == 0;
}

/* 1 if some component of path is a temporary upload file's: hidden. */
static int hidden(const char *path)
{
    for (const char *p = path; p; p = strchr(p, '/')) {
        if (*p == '/')
            p++;
        if (tmp_name(p))
            return 1;
    }
    return 0;
}

/* 0 if an object or directory may be created at path; -EINVAL for the root,
 * a path path_ok() refuses, a trailing '/' or a hidden name, -ENAMETOOLONG if
 * the last component is longer than NAME_MAX or the path PATH_MAX or more. */
static int check_target(const char *path)
{
    if (!*path || !path_ok(path) || path[strlen(path) - 1] == '/' || hidden(path))
        return -EINVAL;
    if (strlen(path) >= PATH_MAX) /* it is opened by its path below the root */
        return -ENAMETOOLONG;
    const char *slash = strrchr(path, '/');
    if (strlen(slash ? slash + 1 : path) > NAME_MAX)
        return -ENAMETOOLONG;
    return 0;
}

/* 0 if path may name an existing object or directory other than the root;
 * -EINVAL if it is the root, refused by path_ok() or ends in '/', -ENOENT if
 * hidden. */
static int check_existing(const char *path)
{
    if (!*path || !path_ok(path) || path[strlen(path) - 1] == '/')
        return -EINVAL;
    return hidden(path) ? -ENOENT : 0;
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
    st->mtime_ns = (int64_t)sb->st_mtim.tv_sec * 1000000000 + sb->st_mtim.tv_nsec;
    if (!st->is_dir)
        snprintf(st->etag, sizeof st->etag, "%" PRIx64 "-%" PRIx64 ".%09ld-%" PRIx64,
                 (uint64_t)sb->st_size, (uint64_t)sb->st_mtim.tv_sec, sb->st_mtim.tv_nsec,
                 (uint64_t)sb->st_ino);
    /* The file's own attributes (issue #18): what chmod, chown, utimensat
     * gave it through the mount or on the local disk. */
    st->attrs = (struct store_attrs){.set = STORE_ATTR_READ | STORE_ATTR_MODE | STORE_ATTR_UID |
                                            STORE_ATTR_GID | STORE_ATTR_MTIME,
                                     .mode = (uint32_t)sb->st_mode,
                                     .uid = (uint32_t)sb->st_uid,
                                     .gid = (uint32_t)sb->st_gid,
                                     .mtime_ns = st->mtime_ns};
}

void store_dir_stat_of(const struct stat *sb, struct store_stat *st)
{
    fill_stat(sb, st);
}

static int dir_stat(struct store *s, const char *path, struct store_stat *st)
{
    struct dir_store *ds = to_dir(s);
    if (!path_ok(path) && *path)
        return -EINVAL;
    if (hidden(path))
        return -ENOENT;
    atomic_fetch_add(&s->counters.head_requests, 1);
    struct stat sb;
    if (fstatat(ds->root_fd, rel(path), &sb, *path ? AT_SYMLINK_NOFOLLOW : 0) < 0)
        return -errno;
    if (!S_ISDIR(sb.st_mode) && !S_ISREG(sb.st_mode) && !S_ISLNK(sb.st_mode))
        return -ENOENT; /* only files, directories and links are part of a store */
    fill_stat(&sb, st);
    return 0;
}

static int dir_list(struct store *s, const char *dir, store_list_fn fn, void *arg)
{
    struct dir_store *ds = to_dir(s);
    if (!path_ok(dir) && *dir)
        return -EINVAL;
    if (hidden(dir))
        return -ENOENT;
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
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        if (tmp_name(de->d_name))
            continue; /* an upload in progress or abandoned: not an object yet */
        struct stat sb;
        if (fstatat(dirfd(d), de->d_name, &sb, AT_SYMLINK_NOFOLLOW) < 0)
            continue; /* vanished between readdir and stat */
        if (!S_ISDIR(sb.st_mode) && !S_ISREG(sb.st_mode) && !S_ISLNK(sb.st_mode))
            continue;
        struct store_stat st;
        fill_stat(&sb, &st);
        atomic_fetch_add(&s->counters.listed_keys, 1);
        if (fn(arg, de->d_name, &st) != 0)
            break;
    }
    closedir(d);
    return 0;
}

/* An fd for path, checked to still have etag (if given). */
static int dir_open_fd(struct store *s, const char *path, const char *etag)
{
    struct dir_store *ds = to_dir(s);
    if (!path_ok(path))
        return -EINVAL;
    if (hidden(path))
        return -ENOENT;
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
    atomic_fetch_add(&s->counters.get_requests, 1);
    size_t done;
    int rc = pread_full(fd, buf, len, off, &done);
    if (rc < 0)
        atomic_fetch_add(&s->counters.errors, 1);
    *nread = done;
    atomic_fetch_add(&s->counters.get_bytes, done);
    close(fd);
    return rc;
}

/* ---- writing ---- */

/* Counts a failed write request (one that reached the filesystem) in the
 * store's errors; returns rc. */
static int result(struct store *s, int rc)
{
    if (rc < 0)
        atomic_fetch_add(&s->counters.errors, 1);
    return rc;
}

/* Opens the directory holding path's last component (for *at() calls and
 * fsync) and points *name at that component; returns the fd or -errno. */
static int open_parent(struct dir_store *ds, const char *path, const char **name)
{
    const char *slash = strrchr(path, '/');
    char dir[PATH_MAX];
    size_t n = slash ? (size_t)(slash - path) : 0;
    if (n >= sizeof dir)
        return -ENAMETOOLONG;
    memcpy(dir, path, n);
    dir[n] = '\0';
    *name = slash ? slash + 1 : path;
    int fd = openat(ds->root_fd, rel(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    return fd < 0 ? -errno : fd;
}

/* 64 random bits for a temporary name (the clock if getrandom fails). */
static uint64_t random64(void)
{
    uint64_t r;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) == (ssize_t)sizeof r)
        return r;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ((uint64_t)ts.tv_sec * 1000000007u) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 32);
}

/* FNV-1a 64 of s: stands for a final name too long to keep in a temp name. */
static uint64_t name_hash(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

/* Writes a fresh temporary name for final name `name` into buf (NAME_MAX+1). */
static void make_tmp_name(const char *name, char *buf)
{
    if (strlen(name) <= TMP_NAME_MAX)
        snprintf(buf, NAME_MAX + 1, TMP_PREFIX "%016" PRIx64 ".%s", random64(), name);
    else
        snprintf(buf, NAME_MAX + 1, TMP_PREFIX "%016" PRIx64 "#%016" PRIx64, random64(),
                 name_hash(name));
}

/* 1 if id is a temporary name make_tmp_name() can give for final name
 * `name` (so a caller's upload id cannot name any other file). */
static int tmp_name_for(const char *id, const char *name)
{
    if (!tmp_name(id) || strchr(id, '/'))
        return 0;
    const char *p = id + TMP_PREFIX_LEN;
    for (int i = 0; i < TMP_HEX; i++)
        if (!((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f')))
            return 0;
    p += TMP_HEX;
    if (*p == '.')
        return strlen(name) <= TMP_NAME_MAX && strcmp(p + 1, name) == 0;
    char hash[TMP_HEX + 2];
    snprintf(hash, sizeof hash, "#%016" PRIx64, name_hash(name));
    return strlen(name) > TMP_NAME_MAX && strcmp(p, hash) == 0;
}

/* Creates a new temporary file for final name `name` in directory dfd
 * (O_EXCL, 0644); its name goes to tmp (NAME_MAX+1). Returns the fd or -errno. */
static int create_tmp(int dfd, const char *name, char *tmp)
{
    for (int attempt = 0; attempt < 8; attempt++) {
        make_tmp_name(name, tmp);
        int fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
        if (fd >= 0 || errno != EEXIST)
            return fd < 0 ? -errno : fd;
    }
    return -EEXIST;
}

/* One step of the pread/pwrite copy (at most COPY_CHUNK bytes through buf):
 * the bytes copied, 0 at the end of in, -1 with errno on failure. */
static ssize_t copy_chunk(int in, uint64_t in_off, int out, uint64_t out_off, size_t len, char *buf)
{
    ssize_t n = pread(in, buf, len < COPY_CHUNK ? len : COPY_CHUNK, (off_t)in_off);
    for (ssize_t put = 0; n > 0 && put < n;) {
        ssize_t w = pwrite(out, buf + put, (size_t)(n - put), (off_t)(out_off + (uint64_t)put));
        if (w < 0 && errno != EINTR)
            return -1;
        put += w > 0 ? w : 0;
    }
    return n;
}

/* Copies len bytes of in at in_off to out at out_off: copy_file_range (an
 * in-kernel copy or reflink), falling back to pread/pwrite where the files
 * do not allow it. -EIO if in ends before len bytes. */
static int copy_range(int in, uint64_t in_off, int out, uint64_t out_off, uint64_t len)
{
    char *buf = NULL; /* set once copy_file_range has been refused */
    int rc = 0;
    while (len > 0 && rc == 0) {
        size_t chunk = len > (1u << 30) ? (1u << 30) : (size_t)len;
        ssize_t n;
        if (buf) {
            n = copy_chunk(in, in_off, out, out_off, chunk, buf);
        } else {
            loff_t io = (loff_t)in_off, oo = (loff_t)out_off;
            n = copy_file_range(in, &io, out, &oo, chunk, 0);
            if (n < 0 &&
                (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP)) {
                if (!(buf = malloc(COPY_CHUNK)))
                    return -ENOMEM;
                continue;
            }
        }
        if (n < 0 && errno != EINTR)
            rc = -errno;
        else if (n == 0)
            rc = -EIO; /* the source is shorter than len */
        else if (n > 0) {
            in_off += (uint64_t)n;
            out_off += (uint64_t)n;
            len -= (uint64_t)n;
        }
    }
    free(buf);
    return rc;
}

/* Makes the written temporary file tmp (fd tfd) in dfd the object `name`:
 * stamps its mtime with the current time in nanoseconds (so back-to-back
 * rewrites of one size get different etags), fsyncs it, renames it over name
 * and fsyncs the directory; etag gets what stat() will report. */
static int publish(int dfd, int tfd, const char *tmp, const char *name, char etag[STORE_ETAG_MAX])
{
    struct timespec times[2] = {{.tv_nsec = UTIME_OMIT}};
    clock_gettime(CLOCK_REALTIME, &times[1]); /* UTIME_NOW would take the coarse clock */
    (void)futimens(tfd, times);               /* best effort: the inode tells versions apart too */
    struct stat sb;
    if (fsync(tfd) < 0 || fstat(tfd, &sb) < 0)
        return -errno;
    if (renameat(dfd, tmp, dfd, name) < 0 || fsync(dfd) < 0)
        return -errno;
    struct store_stat st;
    fill_stat(&sb, &st);
    memcpy(etag, st.etag, STORE_ETAG_MAX);
    return 0;
}

/* Writes the object at path from len bytes of src at offset 0 through a
 * temporary file (put and copy); on failure nothing is left behind. */
static int write_object(struct dir_store *ds, const char *path, int src, uint64_t len,
                        char etag[STORE_ETAG_MAX])
{
    const char *name;
    char tmp[NAME_MAX + 1];
    int dfd = open_parent(ds, path, &name);
    if (dfd < 0)
        return dfd;
    int tfd = create_tmp(dfd, name, tmp);
    if (tfd < 0) {
        close(dfd);
        return tfd;
    }
    int rc = copy_range(src, 0, tfd, 0, len);
    if (rc == 0)
        rc = publish(dfd, tfd, tmp, name, etag);
    if (rc < 0)
        unlinkat(dfd, tmp, 0);
    close(tfd);
    close(dfd);
    return rc;
}

/* put: the first len bytes of fd become the object at path (temp + rename). */
static int dir_put(struct store *s, const char *path, int fd, uint64_t len,
                   char etag[STORE_ETAG_MAX])
{
    int rc = check_target(path);
    if (rc < 0)
        return rc;
    atomic_fetch_add(&s->counters.put_requests, 1);
    rc = write_object(to_dir(s), path, fd, len, etag);
    if (rc == 0)
        atomic_fetch_add(&s->counters.put_bytes, len);
    return result(s, rc);
}

/* mpu_begin: creates the (empty) temporary file; its name is the upload id. */
static int dir_mpu_begin(struct store *s, const char *path, char upload_id[STORE_UPLOAD_ID_MAX])
{
    int rc = check_target(path);
    if (rc < 0)
        return rc;
    atomic_fetch_add(&s->counters.mpu_begin_requests, 1);
    const char *name;
    char tmp[NAME_MAX + 1];
    int dfd = open_parent(to_dir(s), path, &name);
    if (dfd < 0)
        return result(s, dfd);
    int tfd = create_tmp(dfd, name, tmp);
    if (tfd >= 0) {
        close(tfd);
        snprintf(upload_id, STORE_UPLOAD_ID_MAX, "%s", tmp);
    }
    close(dfd);
    return result(s, tfd < 0 ? tfd : 0);
}

/* Opens path's directory for an upload id, checking the id belongs to path:
 * returns the directory fd (or -EINVAL for a foreign id, -errno). */
static int open_upload_dir(struct dir_store *ds, const char *path, const char *upload_id,
                           const char **name)
{
    int rc = check_target(path);
    if (rc < 0)
        return rc;
    const char *slash = strrchr(path, '/');
    if (!tmp_name_for(upload_id, slash ? slash + 1 : path))
        return -EINVAL;
    return open_parent(ds, path, name);
}

/* The stable tag of a part: its number, offset and length. */
static void part_etag(const struct store_part *p, char etag[STORE_ETAG_MAX])
{
    snprintf(etag, STORE_ETAG_MAX, "part-%" PRIu32 "-%" PRIx64 "-%" PRIx64, p->number, p->offset,
             p->length);
}

/* mpu_part: copies the part's bytes of fd to the same offset of the
 * temporary file; -ENOENT if the upload no longer exists. */
static int dir_mpu_part(struct store *s, const char *path, const char *upload_id,
                        struct store_part *part, int fd)
{
    const char *name;
    if (part->number < 1 || part->number > STORE_MAX_PARTS || part->length > STORE_MAX_PART)
        return -EINVAL;
    int dfd = open_upload_dir(to_dir(s), path, upload_id, &name);
    if (dfd == -EINVAL || dfd == -ENAMETOOLONG)
        return dfd;
    atomic_fetch_add(&s->counters.part_requests, 1);
    if (dfd < 0)
        return result(s, dfd);
    int tfd = openat(dfd, upload_id, O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
    int rc = tfd < 0 ? -errno : copy_range(fd, part->offset, tfd, part->offset, part->length);
    if (tfd >= 0)
        close(tfd);
    close(dfd);
    if (rc == 0) {
        part_etag(part, part->etag);
        atomic_fetch_add(&s->counters.put_bytes, part->length);
    }
    return result(s, rc);
}

/* mpu_complete: checks the part list (ascending, contiguous from 0, etags
 * from mpu_part, size bytes), cuts the temporary file to size and publishes
 * it. A retried completion (temp gone, object there with size) succeeds. */
static int dir_mpu_complete(struct store *s, const char *path, const char *upload_id,
                            const struct store_part *parts, size_t n, uint64_t size,
                            char etag[STORE_ETAG_MAX])
{
    const char *name;
    int dfd = open_upload_dir(to_dir(s), path, upload_id, &name);
    if (dfd == -EINVAL || dfd == -ENAMETOOLONG)
        return dfd;
    atomic_fetch_add(&s->counters.complete_requests, 1);
    if (dfd < 0)
        return result(s, dfd);
    int rc = n ? 0 : -EINVAL;
    uint64_t end = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        char want[STORE_ETAG_MAX];
        part_etag(&parts[i], want);
        if ((i > 0 && parts[i].number <= parts[i - 1].number) || parts[i].offset != end ||
            strcmp(parts[i].etag, want) != 0)
            rc = -EINVAL;
        end += parts[i].length;
    }
    if (rc == 0 && end != size)
        rc = -EINVAL;
    int tfd = rc < 0 ? -1 : openat(dfd, upload_id, O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
    if (rc == 0 && tfd < 0) {
        rc = -errno;
        struct stat sb;
        if (rc == -ENOENT && fstatat(dfd, name, &sb, AT_SYMLINK_NOFOLLOW) == 0 &&
            S_ISREG(sb.st_mode) && (uint64_t)sb.st_size == size) {
            struct store_stat st; /* completed before; the answer was lost */
            fill_stat(&sb, &st);
            memcpy(etag, st.etag, STORE_ETAG_MAX);
            rc = 0;
        }
    } else if (rc == 0) {
        rc = ftruncate(tfd, (off_t)size) < 0 ? -errno : publish(dfd, tfd, upload_id, name, etag);
    }
    if (tfd >= 0)
        close(tfd);
    close(dfd);
    return result(s, rc);
}

/* mpu_abort: unlinks the temporary file; one already gone is success. */
static int dir_mpu_abort(struct store *s, const char *path, const char *upload_id)
{
    const char *name;
    int dfd = open_upload_dir(to_dir(s), path, upload_id, &name);
    if (dfd == -EINVAL || dfd == -ENAMETOOLONG)
        return dfd;
    atomic_fetch_add(&s->counters.abort_requests, 1);
    if (dfd == -ENOENT || dfd == -ENOTDIR)
        return 0; /* the directory went, and the upload with it */
    if (dfd < 0)
        return result(s, dfd);
    int rc = unlinkat(dfd, upload_id, 0) < 0 && errno != ENOENT ? -errno : 0;
    close(dfd);
    return result(s, rc);
}

/* mpu_list: the temporary files in path's directory that belong to path. */
static int dir_mpu_list(struct store *s, const char *path, store_upload_fn fn, void *arg)
{
    int rc = check_target(path);
    if (rc < 0)
        return rc;
    atomic_fetch_add(&s->counters.upload_list_requests, 1);
    const char *name;
    int dfd = open_parent(to_dir(s), path, &name);
    if (dfd == -ENOENT || dfd == -ENOTDIR)
        return 0; /* no directory, no uploads */
    if (dfd < 0)
        return result(s, dfd);
    DIR *d = fdopendir(dfd);
    if (!d) {
        rc = -errno;
        close(dfd);
        return result(s, rc);
    }
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if ((de->d_type == DT_REG || de->d_type == DT_UNKNOWN) && tmp_name_for(de->d_name, name) &&
            fn(arg, de->d_name) != 0)
            break;
    }
    closedir(d);
    return 0;
}

/* copy: the source (checked against etag and size: -ESTALE) written to `to`
 * through a temporary file, like put. */
static int dir_copy(struct store *s, const char *from, const char *etag, uint64_t size,
                    const char *to, char etag_out[STORE_ETAG_MAX])
{
    int rc = check_existing(from);
    if (rc == 0)
        rc = check_target(to);
    if (rc < 0)
        return rc;
    atomic_fetch_add(&s->counters.copy_requests, 1);
    int src = openat(to_dir(s)->root_fd, from, O_RDONLY | O_CLOEXEC);
    if (src < 0)
        return result(s, -errno);
    struct stat sb;
    struct store_stat st;
    if (fstat(src, &sb) < 0)
        rc = -errno;
    else if (S_ISDIR(sb.st_mode))
        rc = -EISDIR;
    else if (!S_ISREG(sb.st_mode))
        rc = -ENOENT;
    if (rc == 0) {
        fill_stat(&sb, &st);
        if ((etag && *etag && strcmp(etag, st.etag) != 0) || st.size != size)
            rc = -ESTALE;
    }
    if (rc == 0)
        rc = write_object(to_dir(s), to, src, size, etag_out);
    close(src);
    return result(s, rc);
}

/* remove: unlinks the file at path (-EISDIR for a directory). */
static int dir_remove(struct store *s, const char *path)
{
    int rc = check_existing(path);
    if (rc < 0)
        return rc;
    atomic_fetch_add(&s->counters.delete_requests, 1);
    rc = unlinkat(to_dir(s)->root_fd, path, 0) < 0 ? -errno : 0;
    return result(s, rc);
}

/* mkdir: creates directory path (0755); its parent must exist (-ENOENT). */
static int dir_mkdir(struct store *s, const char *path)
{
    int rc = check_target(path);
    if (rc < 0)
        return rc;
    return mkdirat(to_dir(s)->root_fd, path, 0755) < 0 ? -errno : 0;
}

/* Unlinks the temporary files of abandoned uploads in directory path if
 * they are all it holds; -ENOTEMPTY (changing nothing) if it holds more. */
static int clear_abandoned(struct dir_store *ds, const char *path)
{
    int dfd = openat(ds->root_fd, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return -errno;
    DIR *d = fdopendir(dfd);
    if (!d) {
        int e = errno;
        close(dfd);
        return -e;
    }
    int rc = 0;
    struct dirent *de;
    for (int pass = 0; pass < 2 && rc == 0; pass++) { /* check all, then unlink */
        rewinddir(d);
        while (rc == 0 && (de = readdir(d)) != NULL) {
            if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                continue;
            struct stat sb;
            if (!tmp_name(de->d_name) ||
                (fstatat(dfd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(sb.st_mode)))
                rc = -ENOTEMPTY;
            else if (pass == 1 && unlinkat(dfd, de->d_name, 0) < 0 && errno != ENOENT)
                rc = -errno;
        }
    }
    closedir(d);
    return rc;
}

/* rmdir: removes the empty directory path; one holding only abandoned
 * uploads' temporary files counts as empty (they are removed first). */
static int dir_rmdir(struct store *s, const char *path)
{
    struct dir_store *ds = to_dir(s);
    int rc = check_existing(path);
    if (rc < 0)
        return rc;
    atomic_fetch_add(&s->counters.delete_requests, 1);
    rc = unlinkat(ds->root_fd, path, AT_REMOVEDIR) < 0 ? -errno : 0;
    if (rc == -ENOTEMPTY || rc == -EEXIST) {
        rc = clear_abandoned(ds, path);
        if (rc == 0)
            rc = unlinkat(ds->root_fd, path, AT_REMOVEDIR) < 0 ? -errno : 0;
    }
    return result(s, rc);
}

/* fsync of the directory holding path's last component. */
static int sync_parent(struct dir_store *ds, const char *path)
{
    const char *name;
    int dfd = open_parent(ds, path, &name);
    if (dfd < 0)
        return dfd;
    int rc = fsync(dfd) < 0 ? -errno : 0;
    close(dfd);
    return rc;
}

/* rename: renameat of a file or directory, replacing a file at to; both
 * directories are fsynced. */
static int dir_rename(struct store *s, const char *from, const char *to)
{
    struct dir_store *ds = to_dir(s);
    int rc = check_existing(from);
    if (rc == 0)
        rc = check_target(to);
    if (rc < 0)
        return rc;
    rc = renameat(ds->root_fd, from, ds->root_fd, to) < 0 ? -errno : 0;
    if (rc == 0)
        rc = sync_parent(ds, to);
    const char *fs = strrchr(from, '/'), *ts = strrchr(to, '/');
    size_t fl = fs ? (size_t)(fs - from) : 0, tl = ts ? (size_t)(ts - to) : 0;
    if (rc == 0 && (fl != tl || memcmp(from, to, fl) != 0))
        rc = sync_parent(ds, from);
    return rc;
}

static void dir_destroy(struct store *s)
{
    struct dir_store *ds = to_dir(s);
    close(ds->root_fd);
    free(s->description);
    free(ds);
}

static int dir_check_name(struct store *s, const char *path)
{
    (void)s;
    return check_target(path);
}

/* readlink: the real link's target (docs/semantics.md, "Symbolic links"). */
static int dir_readlink(struct store *s, const char *path, char *buf, size_t len)
{
    if (!path_ok(path) || hidden(path))
        return -EINVAL;
    atomic_fetch_add(&s->counters.get_requests, 1);
    ssize_t n = readlinkat(to_dir(s)->root_fd, path, buf, len);
    return result(s, n < 0 ? -errno : (int)n);
}

/* The object at path, just written as a file holding a link's target (an
 * upload of a staged symlink), becomes a real link: made under a temporary
 * name and renamed over it. 0 or -errno. */
static int make_link(struct dir_store *ds, const char *path)
{
    const char *name;
    int dfd = open_parent(ds, path, &name);
    if (dfd < 0)
        return dfd;
    char target[STORE_LINK_MAX + 1], tmp[NAME_MAX + 1];
    int rc = 0;
    int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    ssize_t n = fd < 0 ? -1 : pread(fd, target, STORE_LINK_MAX, 0);
    if (n <= 0)
        rc = n == 0 ? -EINVAL : -errno;
    if (fd >= 0)
        close(fd);
    if (rc == 0) {
        target[n] = '\0';
        rc = -EEXIST;
        for (int attempt = 0; attempt < 8 && rc == -EEXIST; attempt++) {
            make_tmp_name(name, tmp);
            rc = symlinkat(target, dfd, tmp) < 0 ? -errno : 0;
        }
    }
    if (rc == 0 && (renameat(dfd, tmp, dfd, name) < 0 || fsync(dfd) < 0)) {
        rc = -errno;
        unlinkat(dfd, tmp, 0);
    }
    close(dfd);
    return rc;
}

/* set_attrs of a link: its owner and time (a link has no mode of its own). */
static int link_set_attrs(struct dir_store *ds, const char *path, const struct store_attrs *a,
                          char etag_out[STORE_ETAG_MAX])
{
    int rc = 0;
    if ((a->set & (STORE_ATTR_UID | STORE_ATTR_GID)) &&
        fchownat(ds->root_fd, path, a->set & STORE_ATTR_UID ? (uid_t)a->uid : (uid_t)-1,
                 a->set & STORE_ATTR_GID ? (gid_t)a->gid : (gid_t)-1, AT_SYMLINK_NOFOLLOW) < 0)
        rc = -errno;
    if (rc == 0 && (a->set & STORE_ATTR_MTIME)) {
        struct timespec t[2] = {{.tv_nsec = UTIME_OMIT},
                                {.tv_sec = (time_t)(a->mtime_ns / 1000000000),
                                 .tv_nsec = (long)(a->mtime_ns % 1000000000)}};
        if (utimensat(ds->root_fd, path, t, AT_SYMLINK_NOFOLLOW) < 0)
            rc = -errno;
    }
    struct stat sb;
    struct store_stat st;
    if (rc == 0 && fstatat(ds->root_fd, path, &sb, AT_SYMLINK_NOFOLLOW) == 0) {
        fill_stat(&sb, &st);
        memcpy(etag_out, st.etag, STORE_ETAG_MAX);
    }
    return rc;
}

/* set_attrs: chmod, chown, utimensat of the file or directory (issue #18). */
static int dir_set_attrs(struct store *s, const char *path, int is_dir, const char *etag,
                         uint64_t size, const struct store_attrs *a, char etag_out[STORE_ETAG_MAX])
{
    (void)is_dir;
    (void)size;
    etag_out[0] = '\0';
    if ((!path_ok(path) && *path) || hidden(path))
        return -EINVAL;
    struct stat lsb;
    if (*path && fstatat(to_dir(s)->root_fd, path, &lsb, AT_SYMLINK_NOFOLLOW) == 0 &&
        (S_ISLNK(lsb.st_mode) || (S_ISREG(lsb.st_mode) && store_attrs_is_link(a)))) {
        /* A link, or the file an upload of a staged link just wrote. */
        int rc = S_ISLNK(lsb.st_mode) ? 0 : make_link(to_dir(s), path);
        return result(s, rc < 0 ? rc : link_set_attrs(to_dir(s), path, a, etag_out));
    }
    int fd = openat(to_dir(s)->root_fd, rel(path), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return -errno;
    struct stat sb;
    struct store_stat st;
    int rc = fstat(fd, &sb) < 0 ? -errno : 0;
    if (rc == 0 && !S_ISDIR(sb.st_mode) && etag && *etag) {
        fill_stat(&sb, &st);
        if (strcmp(etag, st.etag) != 0)
            rc = -ESTALE;
    }
    if (rc == 0 && (a->set & (STORE_ATTR_UID | STORE_ATTR_GID)) &&
        fchown(fd, a->set & STORE_ATTR_UID ? (uid_t)a->uid : (uid_t)-1,
               a->set & STORE_ATTR_GID ? (gid_t)a->gid : (gid_t)-1) < 0)
        rc = -errno;
    if (rc == 0 && (a->set & STORE_ATTR_MODE) && fchmod(fd, (mode_t)(a->mode & 07777)) < 0)
        rc = -errno;
    if (rc == 0 && (a->set & STORE_ATTR_MTIME)) {
        struct timespec t[2] = {{.tv_nsec = UTIME_OMIT},
                                {.tv_sec = (time_t)(a->mtime_ns / 1000000000),
                                 .tv_nsec = (long)(a->mtime_ns % 1000000000)}};
        if (t[1].tv_nsec < 0) {
            t[1].tv_sec--;
            t[1].tv_nsec += 1000000000;
        }
        if (futimens(fd, t) < 0)
            rc = -errno;
    }
    if (rc == 0 && fstat(fd, &sb) == 0 && !S_ISDIR(sb.st_mode)) {
        fill_stat(&sb, &st);
        memcpy(etag_out, st.etag, STORE_ETAG_MAX);
    }
    close(fd);
    return result(s, rc);
}

static const struct store_ops dir_ops = {
    .set_attrs = dir_set_attrs,
    .readlink = dir_readlink,
    .scheme = "dir",
    .stat = dir_stat,
    .list = dir_list,
    .read = dir_read,
    .open_fd = dir_open_fd,
    .put = dir_put,
    .mpu_begin = dir_mpu_begin,
    .mpu_part = dir_mpu_part,
    .mpu_complete = dir_mpu_complete,
    .mpu_abort = dir_mpu_abort,
    .mpu_list = dir_mpu_list,
    .copy = dir_copy,
    .remove = dir_remove,
    .mkdir = dir_mkdir,
    .rmdir = dir_rmdir,
    .rename = dir_rename,
    .check_name = dir_check_name,
    .name_max = NAME_MAX,
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
