/* tests/unit/test_store_dir.c - the local-directory store (fs/store/store_dir.c):
 * reads (stat, list, read, open_fd, refused paths) and writes with S3's
 * semantics (put, multipart, copy: byte-exact, never visible partially,
 * temporary files hidden and cleaned up; remove, mkdir, rmdir, rename and
 * their errors; etags and counters). A fresh directory per test. */
#include "store.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MiB (1u << 20)
#define TMP_PREFIX ".ckptfs-upload."

static char root[64];
static struct store *st;

static void open_store(void)
{
    char err[256];
    cr_assert_eq(store_dir_open(root, &st, err, sizeof err), 0, "%s", err);
}

static void setup(void)
{
    snprintf(root, sizeof root, "/tmp/ckptfs-test-store-dir-XXXXXX");
    cr_assert_not_null(mkdtemp(root));
    open_store();
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void teardown(void)
{
    store_destroy(st);
    nftw(root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

TestSuite(store_dir, .init = setup, .fini = teardown);

static unsigned char byte_at(uint64_t i, unsigned seed)
{
    return (unsigned char)(((i + seed * 7919u) * 2654435761u) >> 13);
}

/* A staging file of len pattern bytes: a file in /tmp (the store's
 * filesystem: copy_file_range works) or a memfd (tmpfs: it falls back). */
static int staging(uint64_t len, unsigned seed, int memfd)
{
    int fd = memfd ? memfd_create("staging", MFD_CLOEXEC) : open("/tmp", O_TMPFILE | O_RDWR, 0600);
    cr_assert_geq(fd, 0);
    unsigned char *buf = malloc(MiB);
    for (uint64_t off = 0; off < len;) {
        size_t n = len - off < MiB ? (size_t)(len - off) : MiB;
        for (size_t i = 0; i < n; i++)
            buf[i] = byte_at(off + i, seed);
        cr_assert_eq(pwrite(fd, buf, n, (off_t)off), (ssize_t)n);
        off += n;
    }
    free(buf);
    return fd;
}

/* The whole object at path read through the store (fails the test if it
 * cannot be read); *len its size. */
static unsigned char *get(const char *path, uint64_t *len)
{
    struct store_stat s;
    cr_assert_eq(st->ops->stat(st, path, &s), 0, "stat %s", path);
    unsigned char *b = malloc(s.size + 1);
    size_t n = 0;
    cr_assert_eq(st->ops->read(st, path, s.etag, 0, s.size, b, &n), 0, "read %s", path);
    cr_assert_eq(n, s.size);
    *len = s.size;
    return b;
}

/* Fails the test unless the object at path is len bytes of pattern seed. */
static void check_object(const char *path, uint64_t len, unsigned seed)
{
    uint64_t n;
    unsigned char *b = get(path, &n);
    cr_assert_eq(n, len, "%s: %llu bytes, want %llu", path, (unsigned long long)n,
                 (unsigned long long)len);
    for (uint64_t i = 0; i < len; i++)
        if (b[i] != byte_at(i, seed))
            cr_assert_fail("%s: byte %llu differs", path, (unsigned long long)i);
    free(b);
}

/* Entries of the real directory root/dir, hidden ones included. */
static int raw_entries(const char *dir)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", root, dir);
    DIR *d = opendir(p);
    cr_assert_not_null(d, "%s", p);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        n += strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0;
    closedir(d);
    return n;
}

static int raw_exists(const char *path)
{
    char p[512];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", root, path);
    return lstat(p, &sb) == 0;
}

static void raw_mkdir(const char *dir)
{
    char p[512];
    snprintf(p, sizeof p, "%s/%s", root, dir);
    cr_assert_eq(mkdir(p, 0755), 0, "%s", p);
}

static uint64_t counter(atomic_uint_fast64_t *c)
{
    return atomic_load(c);
}

struct names {
    char name[8][300];
    int is_dir[8];
    int n;
};

static int collect(void *arg, const char *name, const struct store_stat *s)
{
    struct names *l = arg;
    if (l->n < 8) {
        snprintf(l->name[l->n], sizeof l->name[0], "%s", name);
        l->is_dir[l->n] = s->is_dir;
    }
    l->n++;
    return 0;
}

static int stop_at_first(void *arg, const char *name, const struct store_stat *s)
{
    (void)name;
    (void)s;
    ++*(int *)arg;
    return 1;
}

static int has(const struct names *l, const char *name, int is_dir)
{
    for (int i = 0; i < l->n && i < 8; i++)
        if (strcmp(l->name[i], name) == 0)
            return l->is_dir[i] == is_dir;
    return 0;
}

struct ids {
    char id[4][STORE_UPLOAD_ID_MAX];
    int n;
};

static int collect_id(void *arg, const char *id)
{
    struct ids *l = arg;
    if (l->n < 4)
        snprintf(l->id[l->n], sizeof l->id[0], "%s", id);
    l->n++;
    return 0;
}

/* ---- reads ---- */

Test(store_dir, stat_files_dirs_and_missing)
{
    write_text(root, "a", "hello");
    raw_mkdir("d");
    struct store_stat s;
    cr_assert_eq(st->ops->stat(st, "a", &s), 0);
    cr_assert_eq(s.size, 5);
    cr_assert_eq(s.is_dir, 0);
    cr_assert_neq(s.etag[0], '\0');
    cr_assert_gt(s.mtime_ns, 0);
    cr_assert_eq(st->ops->stat(st, "d", &s), 0);
    cr_assert_eq(s.is_dir, 1);
    cr_assert_eq(s.size, 0);
    cr_assert_eq(st->ops->stat(st, "", &s), 0);
    cr_assert_eq(s.is_dir, 1);
    cr_assert_eq(st->ops->stat(st, "missing", &s), -ENOENT);
    cr_assert_eq(st->ops->stat(st, "a/b", &s), -ENOTDIR);
    char fifo[128];
    snprintf(fifo, sizeof fifo, "%s/fifo", root);
    cr_assert_eq(mkfifo(fifo, 0644), 0);
    cr_assert_eq(st->ops->stat(st, "fifo", &s), -ENOENT, "only files and directories");
    cr_assert_eq(counter(&st->counters.head_requests), 6);
}

/* What ckptfs-admin computes from stat(2) (store_dir_stat_of, then
 * store_fingerprint) is what the mount computes from the store's stat():
 * the two must agree or neither reuses the other's index. */
Test(store_dir, stat_of_and_fingerprint_agree_with_the_store)
{
    write_text(root, "m", "metadata v1");
    struct store_stat s, t;
    cr_assert_eq(st->ops->stat(st, "m", &s), 0);
    char path[128];
    snprintf(path, sizeof path, "%s/m", root);
    struct stat sb;
    cr_assert_eq(stat(path, &sb), 0);
    store_dir_stat_of(&sb, &t);
    cr_assert_str_eq(t.etag, s.etag);
    cr_assert_eq(t.size, s.size);
    cr_assert_eq(t.mtime_ns, s.mtime_ns);
    cr_assert_eq(t.is_dir, 0);
    char fp[256], want[256];
    store_fingerprint(&t, fp, sizeof fp);
    snprintf(want, sizeof want, "etag=%s size=11", s.etag);
    cr_assert_str_eq(fp, want);
    /* Rewritten in place: another fingerprint. */
    write_text(root, "m", "metadata v2!");
    cr_assert_eq(stat(path, &sb), 0);
    store_dir_stat_of(&sb, &t);
    char fp2[256];
    store_fingerprint(&t, fp2, sizeof fp2);
    cr_assert_str_neq(fp2, fp);
}

Test(store_dir, list_entries_once_and_errors)
{
    write_text(root, "a", "1");
    write_text(root, "b", "22");
    raw_mkdir("d");
    char fifo[128];
    snprintf(fifo, sizeof fifo, "%s/fifo", root);
    cr_assert_eq(mkfifo(fifo, 0644), 0);
    struct names l = {0};
    cr_assert_eq(st->ops->list(st, "", collect, &l), 0);
    cr_assert_eq(l.n, 3, "a, b, d (no fifo, no . or ..), got %d", l.n);
    cr_assert(has(&l, "a", 0) && has(&l, "b", 0) && has(&l, "d", 1));
    struct names e = {0};
    cr_assert_eq(st->ops->list(st, "d", collect, &e), 0);
    cr_assert_eq(e.n, 0);
    int calls = 0;
    cr_assert_eq(st->ops->list(st, "", stop_at_first, &calls), 0);
    cr_assert_eq(calls, 1, "a non-zero return stops the listing");
    cr_assert_eq(st->ops->list(st, "missing", collect, &e), -ENOENT);
    cr_assert_eq(st->ops->list(st, "a", collect, &e), -ENOTDIR);
    cr_assert_eq(counter(&st->counters.list_requests), 5);
}

Test(store_dir, read_exact_bytes_eof_and_stale_etag)
{
    int fd = staging(3 * MiB + 17, 1, 0);
    char etag[STORE_ETAG_MAX];
    cr_assert_eq(st->ops->put(st, "obj", fd, 3 * MiB + 17, etag), 0);
    close(fd);
    unsigned char buf[4096];
    size_t n;
    cr_assert_eq(st->ops->read(st, "obj", etag, MiB - 5, 100, buf, &n), 0);
    cr_assert_eq(n, 100);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(buf[i], byte_at(MiB - 5 + i, 1));
    cr_assert_eq(st->ops->read(st, "obj", NULL, 3 * MiB + 10, sizeof buf, buf, &n), 0);
    cr_assert_eq(n, 7, "short only at the end of the object");
    cr_assert_eq(st->ops->read(st, "obj", "", 3 * MiB + 17, sizeof buf, buf, &n), 0);
    cr_assert_eq(n, 0);
    cr_assert_eq(st->ops->read(st, "obj", "1-2.000000003-4", 0, 10, buf, &n), -ESTALE);
    cr_assert_eq(st->ops->read(st, "missing", NULL, 0, 10, buf, &n), -ENOENT);
    cr_assert_eq(counter(&st->counters.get_requests), 3);
    cr_assert_eq(counter(&st->counters.get_bytes), 107);
}

Test(store_dir, open_fd_pins_the_version)
{
    int src = staging(1000, 2, 0);
    char etag[STORE_ETAG_MAX];
    cr_assert_eq(st->ops->put(st, "f", src, 1000, etag), 0);
    int fd = st->ops->open_fd(st, "f", etag);
    cr_assert_geq(fd, 0);
    unsigned char b[10];
    cr_assert_eq(pread(fd, b, 10, 990), 10);
    cr_assert_eq(b[9], byte_at(999, 2));
    cr_assert_neq(fcntl(fd, F_GETFD) & FD_CLOEXEC, 0);
    close(fd);
    char etag2[STORE_ETAG_MAX];
    cr_assert_eq(st->ops->put(st, "f", src, 1000, etag2), 0);
    cr_assert_eq(st->ops->open_fd(st, "f", etag), -ESTALE, "replaced since the etag was taken");
    fd = st->ops->open_fd(st, "f", NULL);
    cr_assert_geq(fd, 0);
    close(fd);
    cr_assert_eq(st->ops->open_fd(st, "missing", NULL), -ENOENT);
    close(src);
}

Test(store_dir, refuses_paths_outside_the_tree)
{
    write_text(root, "a", "x");
    raw_mkdir("d");
    const char *bad[] = {"..", "../x", "d/../a", "/a", "a/", "d/", "d//a", "./a", ".", "d/."};
    int src = staging(10, 3, 0);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *p = bad[i];
        struct store_stat s;
        struct names l = {0};
        struct ids u = {0};
        char etag[STORE_ETAG_MAX], id[STORE_UPLOAD_ID_MAX];
        unsigned char b[4];
        size_t n;
        /* A trailing '/' is the one form reads do not refuse: "d/" is d. */
        if (p[strlen(p) - 1] != '/') {
            cr_assert_eq(st->ops->stat(st, p, &s), -EINVAL, "stat %s", p);
            cr_assert_eq(st->ops->list(st, p, collect, &l), -EINVAL, "list %s", p);
            cr_assert_eq(st->ops->read(st, p, NULL, 0, 4, b, &n), -EINVAL, "read %s", p);
            cr_assert_eq(st->ops->open_fd(st, p, NULL), -EINVAL, "open_fd %s", p);
        }
        cr_assert_eq(st->ops->put(st, p, src, 10, etag), -EINVAL, "put %s", p);
        cr_assert_eq(st->ops->mpu_begin(st, p, id), -EINVAL, "mpu_begin %s", p);
        cr_assert_eq(st->ops->mpu_list(st, p, collect_id, &u), -EINVAL, "mpu_list %s", p);
        cr_assert_eq(st->ops->copy(st, "a", NULL, 1, p, etag), -EINVAL, "copy to %s", p);
        cr_assert_eq(st->ops->copy(st, p, NULL, 1, "c", etag), -EINVAL, "copy from %s", p);
        cr_assert_eq(st->ops->remove(st, p), -EINVAL, "remove %s", p);
        cr_assert_eq(st->ops->mkdir(st, p), -EINVAL, "mkdir %s", p);
        cr_assert_eq(st->ops->rmdir(st, p), -EINVAL, "rmdir %s", p);
        cr_assert_eq(st->ops->rename(st, "a", p), -EINVAL, "rename to %s", p);
        cr_assert_eq(st->ops->rename(st, p, "c"), -EINVAL, "rename from %s", p);
    }
    close(src);
    cr_assert_eq(st->ops->remove(st, ""), -EINVAL);
    cr_assert_eq(st->ops->rmdir(st, ""), -EINVAL);
    cr_assert_eq(st->ops->put(st, "", -1, 0, (char[STORE_ETAG_MAX]){0}), -EINVAL);
    cr_assert_eq(raw_entries(""), 2, "nothing created or removed");
    cr_assert(raw_exists("a") && raw_exists("d"));
}

/* ---- put ---- */

Test(store_dir, put_round_trip_and_counters)
{
    raw_mkdir("d");
    uint64_t len = 3 * MiB + 17;
    int fd = staging(len + 100, 4, 0); /* only the first len bytes are the object */
    char etag[STORE_ETAG_MAX];
    cr_assert_eq(st->ops->put(st, "d/obj", fd, len, etag), 0);
    check_object("d/obj", len, 4);
    struct store_stat s;
    cr_assert_eq(st->ops->stat(st, "d/obj", &s), 0);
    cr_assert_str_eq(etag, s.etag, "put's etag is what stat reports");
    cr_assert_eq(st->ops->put(st, "empty", fd, 0, etag), 0);
    check_object("empty", 0, 4);
    cr_assert_eq(counter(&st->counters.put_requests), 2);
    cr_assert_eq(counter(&st->counters.put_bytes), len);
    cr_assert_eq(counter(&st->counters.errors), 0);
    cr_assert_eq(raw_entries("d"), 1, "no temporary file left");
    close(fd);
}

/* A staging file on another filesystem (tmpfs): copy_file_range refuses,
 * the pread/pwrite fallback copies. */
Test(store_dir, put_from_another_filesystem)
{
    uint64_t len = 2 * MiB + 3;
    int fd = staging(len, 5, 1);
    char etag[STORE_ETAG_MAX];
    cr_assert_eq(st->ops->put(st, "obj", fd, len, etag), 0);
    check_object("obj", len, 5);
    close(fd);
}

Test(store_dir, put_failures_leave_nothing)
{
    raw_mkdir("d");
    raw_mkdir("d/sub");
    int fd = staging(100, 6, 0);
    char etag[STORE_ETAG_MAX];
    cr_assert_eq(st->ops->put(st, "d/short", fd, 200, etag), -EIO, "staging file too short");
    cr_assert_eq(st->ops->put(st, "d/sub", fd, 100, etag), -EISDIR, "a directory is there");
    cr_assert_eq(st->ops->put(st, "nodir/x", fd, 100, etag), -ENOENT, "parents must exist");
    cr_assert_eq(st->ops->put(st, "d/x", -1, 100, etag), -EBADF);
    cr_assert_eq(raw_entries("d"), 1, "only sub: no temporary file, no partial object");
    cr_assert_eq(counter(&st->counters.errors), 4);
    cr_assert_eq(counter(&st->counters.put_bytes), 0);
    close(fd);
}

Test(store_dir, etag_changes_with_every_rewrite)
{
    int a = staging(4096, 7, 0), b = staging(4096, 8, 0);
    char e1[STORE_ETAG_MAX], e2[STORE_ETAG_MAX], e3[STORE_ETAG_MAX], e4[STORE_ETAG_MAX];
    cr_assert_eq(st->ops->put(st, "f", a, 4096, e1), 0);
    cr_assert_eq(st->ops->put(st, "f", b, 4096, e2), 0);
    cr_assert_eq(st->ops->put(st, "f", a, 4096, e3), 0);
    cr_assert_str_neq(e1, e2, "same size, rewritten at once: still a new version");
    cr_assert_str_neq(e2, e3);
    cr_assert_str_neq(e1, e3);
    check_object("f", 4096, 7);
    unsigned char buf[16];
    size_t n;
    cr_assert_eq(st->ops->read(st, "f", e2, 0, 16, buf, &n), -ESTALE);
    cr_assert_eq(st->ops->read(st, "f", e3, 0, 16, buf, &n), 0);
    /* A multipart rewrite and a copy over it are new versions too. */
    char id[STORE_UPLOAD_ID_MAX];
    struct store_part p = {.number = 1, .offset = 0, .length = 4096};
    cr_assert_eq(st->ops->mpu_begin(st, "f", id), 0);
    cr_assert_eq(st->ops->mpu_part(st, "f", id, &p, a), 0);
    cr_assert_eq(st->ops->mpu_complete(st, "f", id, &p, 1, 4096, e4), 0);
    cr_assert_str_neq(e3, e4);
    cr_assert_eq(st->ops->copy(st, "f", e4, 4096, "f", e1), 0);
    cr_assert_str_neq(e4, e1);
    close(a);
    close(b);
}

/* Rewrites of one size faster than the filesystem's timestamp tick (tmpfs:
 * fsync costs nothing) are still all different versions, even when the
 * filesystem reuses a freed inode for the next file. */
Test(store_dir, etags_differ_on_fast_rewrites)
{
    char shm[] = "/dev/shm/ckptfs-test-store-dir-XXXXXX";
    const char *dir = mkdtemp(shm) ? shm : root;
    struct store *fast;
    char err[256];
    cr_assert_eq(store_dir_open(dir, &fast, err, sizeof err), 0, "%s", err);
    int src[2] = {staging(512, 19, 1), staging(512, 20, 1)};
    enum { N = 40 };
    static char etags[N][STORE_ETAG_MAX];
    for (int i = 0; i < N; i++)
        cr_assert_eq(fast->ops->put(fast, "f", src[i % 2], 512, etags[i]), 0);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < i; j++)
            cr_assert_str_neq(etags[i], etags[j], "rewrites %d and %d: one etag %s", j, i,
                              etags[i]);
    store_destroy(fast);
    close(src[0]);
    close(src[1]);
    if (dir == shm)
        nftw(shm, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* A file replaced by another of the same size and mtime (cp -p, rsync -t)
 * is another version: the etag tells the files apart. */
Test(store_dir, etag_differs_for_a_replacement_with_same_size_and_mtime)
{
    char a[128], b[128];
    snprintf(a, sizeof a, "%s/f", root);
    snprintf(b, sizeof b, "%s/g", root);
    write_text(root, "f", "version 1");
    write_text(root, "g", "version 2");
    struct timespec t[2] = {{.tv_sec = 1700000000, .tv_nsec = 5},
                            {.tv_sec = 1700000000, .tv_nsec = 5}};
    cr_assert_eq(utimensat(AT_FDCWD, a, t, 0), 0);
    cr_assert_eq(utimensat(AT_FDCWD, b, t, 0), 0);
    struct store_stat s1, s2;
    cr_assert_eq(st->ops->stat(st, "f", &s1), 0);
    cr_assert_eq(rename(b, a), 0);
    cr_assert_eq(st->ops->stat(st, "f", &s2), 0);
    cr_assert_eq(s1.mtime_ns, s2.mtime_ns);
    cr_assert_str_neq(s1.etag, s2.etag);
    unsigned char buf[4];
    size_t n;
    cr_assert_eq(st->ops->read(st, "f", s1.etag, 0, 4, buf, &n), -ESTALE);
}

/* ---- multipart ---- */

/* Uploads len bytes of fd to path in parts of psize, sent in the order
 * given by order[] (indexes of parts), and completes it. */
static void multipart(const char *path, int fd, uint64_t len, uint64_t psize, const int *order,
                      char etag[STORE_ETAG_MAX])
{
    size_t n = (size_t)((len + psize - 1) / psize);
    struct store_part *parts = calloc(n, sizeof *parts);
    for (size_t i = 0; i < n; i++) {
        parts[i].number = (uint32_t)i + 1;
        parts[i].offset = i * psize;
        parts[i].length = len - parts[i].offset < psize ? len - parts[i].offset : psize;
    }
    char id[STORE_UPLOAD_ID_MAX];
    cr_assert_eq(st->ops->mpu_begin(st, path, id), 0);
    for (size_t i = 0; i < n; i++) {
        struct store_part *p = &parts[order ? order[i] : (int)i];
        cr_assert_eq(st->ops->mpu_part(st, path, id, p, fd), 0, "part %u", p->number);
        cr_assert_neq(p->etag[0], '\0');
    }
    struct store_stat s;
    cr_assert_eq(st->ops->stat(st, path, &s), -ENOENT, "nothing at %s before complete", path);
    cr_assert_eq(st->ops->mpu_complete(st, path, id, parts, n, len, etag), 0);
    free(parts);
}

Test(store_dir, multipart_round_trip_parts_out_of_order)
{
    raw_mkdir("d");
    uint64_t len = 4 * MiB + 12345;
    int fd = staging(len, 9, 0);
    const int order[] = {3, 0, 4, 2, 1};
    char etag[STORE_ETAG_MAX];
    multipart("d/big", fd, len, MiB, order, etag);
    check_object("d/big", len, 9);
    struct store_stat s;
    cr_assert_eq(st->ops->stat(st, "d/big", &s), 0);
    cr_assert_str_eq(etag, s.etag);
    cr_assert_eq(raw_entries("d"), 1, "the temporary file became the object");
    cr_assert_eq(counter(&st->counters.mpu_begin_requests), 1);
    cr_assert_eq(counter(&st->counters.part_requests), 5);
    cr_assert_eq(counter(&st->counters.complete_requests), 1);
    cr_assert_eq(counter(&st->counters.put_bytes), len);
    close(fd);
}

Test(store_dir, multipart_part_sent_again_replaces_it)
{
    int a = staging(3 * MiB, 10, 0), b = staging(3 * MiB, 11, 0);
    char id[STORE_UPLOAD_ID_MAX], etag[STORE_ETAG_MAX];
    struct store_part p[2] = {{.number = 1, .offset = 0, .length = 2 * MiB},
                              {.number = 2, .offset = 2 * MiB, .length = MiB}};
    cr_assert_eq(st->ops->mpu_begin(st, "o", id), 0);
    cr_assert_eq(st->ops->mpu_part(st, "o", id, &p[0], b), 0);
    cr_assert_eq(st->ops->mpu_part(st, "o", id, &p[1], a), 0);
    cr_assert_eq(st->ops->mpu_part(st, "o", id, &p[0], a), 0); /* again, from a */
    cr_assert_eq(st->ops->mpu_complete(st, "o", id, p, 2, 3 * MiB, etag), 0);
    check_object("o", 3 * MiB, 10);
    close(a);
    close(b);
}

Test(store_dir, multipart_complete_checks_the_parts)
{
    int fd = staging(3 * MiB, 12, 0);
    char id[STORE_UPLOAD_ID_MAX], etag[STORE_ETAG_MAX];
    struct store_part p[3] = {{.number = 1, .offset = 0, .length = MiB},
                              {.number = 2, .offset = MiB, .length = MiB},
                              {.number = 3, .offset = 2 * MiB, .length = MiB}};
    cr_assert_eq(st->ops->mpu_begin(st, "o", id), 0);
    cr_assert_eq(st->ops->mpu_part(st, "o", id, &p[0], fd), 0);
    cr_assert_eq(st->ops->mpu_part(st, "o", id, &p[2], fd), 0);
    cr_assert_eq(st->ops->mpu_complete(st, "o", id, p, 3, 3 * MiB, etag), -EINVAL,
                 "part 2 was never sent");
    cr_assert_eq(st->ops->mpu_part(st, "o", id, &p[1], fd), 0);
    struct store_part swapped[3] = {p[1], p[0], p[2]};
    cr_assert_eq(st->ops->mpu_complete(st, "o", id, swapped, 3, 3 * MiB, etag), -EINVAL,
                 "not ascending");
    struct store_part gap[2] = {p[0], p[2]};
    cr_assert_eq(st->ops->mpu_complete(st, "o", id, gap, 2, 2 * MiB, etag), -EINVAL, "a gap");
    struct store_part late[2] = {p[1], p[2]};
    cr_assert_eq(st->ops->mpu_complete(st, "o", id, late, 2, 2 * MiB, etag), -EINVAL,
                 "not from offset 0");
    cr_assert_eq(st->ops->mpu_complete(st, "o", id, p, 3, 3 * MiB - 1, etag), -EINVAL,
                 "sizes do not add up");
    cr_assert_eq(st->ops->mpu_complete(st, "o", id, p, 0, 0, etag), -EINVAL, "no parts");
    struct store_stat s;
    cr_assert_eq(st->ops->stat(st, "o", &s), -ENOENT);
    cr_assert_eq(st->ops->mpu_complete(st, "o", id, p, 3, 3 * MiB, etag), 0,
                 "the upload survives refused completions");
    check_object("o", 3 * MiB, 12);
    close(fd);
}

Test(store_dir, multipart_retried_complete_succeeds)
{
    int fd = staging(MiB, 13, 0);
    char id[STORE_UPLOAD_ID_MAX], e1[STORE_ETAG_MAX], e2[STORE_ETAG_MAX];
    struct store_part p = {.number = 1, .offset = 0, .length = MiB};
    cr_assert_eq(st->ops->mpu_begin(st, "o", id), 0);
    cr_assert_eq(st->ops->mpu_part(st, "o", id, &p, fd), 0);
    cr_assert_eq(st->ops->mpu_complete(st, "o", id, &p, 1, MiB, e1), 0);
    cr_assert_eq(st->ops->mpu_complete(st, "o", id, &p, 1, MiB, e2), 0, "answer lost, retried");
    cr_assert_str_eq(e1, e2);
    cr_assert_eq(st->ops->mpu_part(st, "o", id, &p, fd), -ENOENT, "the upload is over");
    close(fd);
}

Test(store_dir, multipart_abort_leaves_nothing)
{
    raw_mkdir("d");
    int fd = staging(2 * MiB, 14, 0);
    char id[STORE_UPLOAD_ID_MAX], etag[STORE_ETAG_MAX];
    struct store_part p = {.number = 1, .offset = 0, .length = 2 * MiB};
    cr_assert_eq(st->ops->mpu_begin(st, "d/o", id), 0);
    cr_assert_eq(st->ops->mpu_part(st, "d/o", id, &p, fd), 0);
    cr_assert_eq(raw_entries("d"), 1);
    cr_assert_eq(st->ops->mpu_abort(st, "d/o", id), 0);
    cr_assert_eq(raw_entries("d"), 0, "the temporary file is gone");
    cr_assert_eq(st->ops->mpu_abort(st, "d/o", id), 0, "aborting again is not an error");
    cr_assert_eq(st->ops->mpu_part(st, "d/o", id, &p, fd), -ENOENT);
    cr_assert_eq(st->ops->mpu_complete(st, "d/o", id, &p, 1, 2 * MiB, etag), -ENOENT);
    cr_assert_eq(raw_entries("d"), 0, "a part after abort does not bring it back");
    cr_assert_eq(counter(&st->counters.abort_requests), 2);
    close(fd);
}

/* An upload id names one temporary file of one path: a foreign id cannot
 * make the store write, rename or unlink anything else. */
Test(store_dir, multipart_refuses_foreign_upload_ids)
{
    write_text(root, "victim", "keep me");
    int fd = staging(MiB, 15, 0);
    char id[STORE_UPLOAD_ID_MAX], etag[STORE_ETAG_MAX];
    struct store_part p = {.number = 1, .offset = 0, .length = 7};
    cr_assert_eq(st->ops->mpu_begin(st, "o", id), 0);
    const char *bad[] = {"victim",
                         "../victim",
                         TMP_PREFIX "0123456789abcdef.other",
                         TMP_PREFIX "0123456789ABCDEF.o",
                         TMP_PREFIX "0123.o",
                         ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(st->ops->mpu_part(st, "o", bad[i], &p, fd), -EINVAL, "%s", bad[i]);
        cr_assert_eq(st->ops->mpu_complete(st, "o", bad[i], &p, 1, 7, etag), -EINVAL, "%s", bad[i]);
        cr_assert_eq(st->ops->mpu_abort(st, "o", bad[i]), -EINVAL, "%s", bad[i]);
    }
    cr_assert_eq(st->ops->mpu_abort(st, "other", id), -EINVAL, "o's upload, not other's");
    struct store_part p0 = {.number = 0, .offset = 0, .length = 7};
    cr_assert_eq(st->ops->mpu_part(st, "o", id, &p0, fd), -EINVAL, "part numbers start at 1");
    struct store_part p10001 = {.number = STORE_MAX_PARTS + 1, .offset = 0, .length = 7};
    cr_assert_eq(st->ops->mpu_part(st, "o", id, &p10001, fd), -EINVAL);
    uint64_t n;
    unsigned char *b = get("victim", &n);
    cr_assert(n == 7 && memcmp(b, "keep me", 7) == 0);
    free(b);
    cr_assert_eq(st->ops->mpu_abort(st, "o", id), 0);
    close(fd);
}

Test(store_dir, mpu_list_finds_an_abandoned_upload_after_remount)
{
    raw_mkdir("d");
    char id[STORE_UPLOAD_ID_MAX], other[STORE_UPLOAD_ID_MAX], x2[STORE_UPLOAD_ID_MAX];
    cr_assert_eq(st->ops->mpu_begin(st, "d/x", id), 0);
    cr_assert_eq(st->ops->mpu_begin(st, "d/x", x2), 0);
    cr_assert_eq(st->ops->mpu_begin(st, "d/ax", other), 0); /* same suffix, other name */
    store_destroy(st);                                      /* the mount goes away */
    open_store();
    struct ids u = {0};
    cr_assert_eq(st->ops->mpu_list(st, "d/x", collect_id, &u), 0);
    cr_assert_eq(u.n, 2);
    cr_assert((strcmp(u.id[0], id) == 0 && strcmp(u.id[1], x2) == 0) ||
              (strcmp(u.id[0], x2) == 0 && strcmp(u.id[1], id) == 0));
    struct ids none = {0};
    cr_assert_eq(st->ops->mpu_list(st, "d/y", collect_id, &none), 0);
    cr_assert_eq(st->ops->mpu_list(st, "x", collect_id, &none), 0);
    cr_assert_eq(st->ops->mpu_list(st, "nodir/x", collect_id, &none), 0);
    cr_assert_eq(none.n, 0);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(st->ops->mpu_abort(st, "d/x", u.id[i]), 0);
    struct ids after = {0};
    cr_assert_eq(st->ops->mpu_list(st, "d/x", collect_id, &after), 0);
    cr_assert_eq(after.n, 0);
    cr_assert_eq(raw_entries("d"), 1, "d/ax's upload stays");
    cr_assert_eq(counter(&st->counters.upload_list_requests), 5);
}

Test(store_dir, temporary_files_are_hidden)
{
    raw_mkdir("d");
    write_text(root, "d/visible", "v");
    char id[STORE_UPLOAD_ID_MAX], path[STORE_UPLOAD_ID_MAX + 8];
    cr_assert_eq(st->ops->mpu_begin(st, "d/o", id), 0);
    cr_assert_eq(strncmp(id, TMP_PREFIX, strlen(TMP_PREFIX)), 0, "%s", id);
    cr_assert_eq(raw_entries("d"), 2);
    struct names l = {0};
    cr_assert_eq(st->ops->list(st, "d", collect, &l), 0);
    cr_assert_eq(l.n, 1);
    cr_assert_str_eq(l.name[0], "visible");
    snprintf(path, sizeof path, "d/%s", id);
    struct store_stat s;
    unsigned char b[4];
    size_t n;
    char etag[STORE_ETAG_MAX];
    cr_assert_eq(st->ops->stat(st, path, &s), -ENOENT);
    cr_assert_eq(st->ops->read(st, path, NULL, 0, 4, b, &n), -ENOENT);
    cr_assert_eq(st->ops->open_fd(st, path, NULL), -ENOENT);
    cr_assert_eq(st->ops->remove(st, path), -ENOENT);
    cr_assert_eq(st->ops->rename(st, path, "d/stolen"), -ENOENT);
    cr_assert_eq(st->ops->copy(st, path, NULL, 0, "d/stolen", etag), -ENOENT);
    /* Nothing can be written under such a name either. */
    cr_assert_eq(st->ops->put(st, "d/" TMP_PREFIX "x", -1, 0, etag), -EINVAL);
    cr_assert_eq(st->ops->mkdir(st, TMP_PREFIX "dir"), -EINVAL);
    cr_assert_eq(st->ops->rename(st, "d/visible", "d/" TMP_PREFIX "x"), -EINVAL);
    cr_assert_eq(st->ops->mpu_abort(st, "d/o", id), 0);
}

/* Final names too long to keep whole in a temporary name get a hashed one;
 * names longer than NAME_MAX are refused. */
Test(store_dir, long_names)
{
    char name[300];
    memset(name, 'n', 240);
    name[240] = '\0';
    int fd = staging(MiB, 16, 0);
    char etag[STORE_ETAG_MAX], id[STORE_UPLOAD_ID_MAX];
    cr_assert_eq(st->ops->put(st, name, fd, MiB, etag), 0);
    check_object(name, MiB, 16);
    cr_assert_eq(st->ops->remove(st, name), 0);
    multipart(name, fd, MiB, 256 * 1024, NULL, etag);
    check_object(name, MiB, 16);
    cr_assert_eq(st->ops->mpu_begin(st, name, id), 0);
    cr_assert_leq(strlen(id), 255);
    struct ids u = {0};
    name[239] = 'm'; /* another long name: not its upload */
    cr_assert_eq(st->ops->mpu_list(st, name, collect_id, &u), 0);
    cr_assert_eq(u.n, 0);
    name[239] = 'n';
    cr_assert_eq(st->ops->mpu_list(st, name, collect_id, &u), 0);
    cr_assert_eq(u.n, 1);
    cr_assert_str_eq(u.id[0], id);
    struct names l = {0};
    cr_assert_eq(st->ops->list(st, "", collect, &l), 0);
    cr_assert_eq(l.n, 1, "the object only; its upload is hidden");
    cr_assert_eq(st->ops->mpu_abort(st, name, id), 0);
    memset(name, 'n', 256);
    name[256] = '\0';
    cr_assert_eq(st->ops->put(st, name, fd, MiB, etag), -ENAMETOOLONG);
    cr_assert_eq(st->ops->mpu_begin(st, name, id), -ENAMETOOLONG);
    cr_assert_eq(st->ops->mkdir(st, name), -ENAMETOOLONG);
    cr_assert_eq(raw_entries(""), 1);
    close(fd);
}

/* While a large multipart upload is sent and completed, another thread
 * polling the final name never sees it partial: absent, or all there. */
struct poll_arg {
    const char *path;
    uint64_t size;
    atomic_int stop;
    atomic_int partial, seen;
};

static void *poll_final_name(void *arg)
{
    struct poll_arg *a = arg;
    char p[512];
    snprintf(p, sizeof p, "%s/%s", root, a->path);
    while (!atomic_load(&a->stop)) {
        struct stat sb;
        if (stat(p, &sb) == 0) {
            atomic_store(&a->seen, 1);
            if ((uint64_t)sb.st_size != a->size)
                atomic_store(&a->partial, 1);
        }
    }
    return NULL;
}

Test(store_dir, final_name_never_partial)
{
    uint64_t len = 64 * MiB + 5;
    int fd = staging(len, 17, 0);
    struct poll_arg a = {.path = "big", .size = len};
    pthread_t t;
    pthread_create(&t, NULL, poll_final_name, &a);
    char etag[STORE_ETAG_MAX];
    multipart("big", fd, len, 8 * MiB, NULL, etag);
    cr_assert_eq(st->ops->put(st, "big", fd, len, etag), 0); /* a rewrite, too */
    usleep(20000);
    atomic_store(&a.stop, 1);
    pthread_join(t, NULL);
    cr_assert(atomic_load(&a.seen));
    cr_assert_not(atomic_load(&a.partial), "the final name was seen with a partial size");
    check_object("big", len, 17);
    close(fd);
}

/* ---- copy ---- */

Test(store_dir, copy_round_trip_and_version_checks)
{
    raw_mkdir("d");
    uint64_t len = 2 * MiB + 1;
    int fd = staging(len, 18, 0);
    char etag[STORE_ETAG_MAX], out[STORE_ETAG_MAX];
    cr_assert_eq(st->ops->put(st, "src", fd, len, etag), 0);
    close(fd);
    cr_assert_eq(st->ops->copy(st, "src", etag, len, "d/dst", out), 0);
    check_object("d/dst", len, 18);
    check_object("src", len, 18);
    struct store_stat s;
    cr_assert_eq(st->ops->stat(st, "d/dst", &s), 0);
    cr_assert_str_eq(out, s.etag);
    cr_assert_eq(st->ops->copy(st, "src", NULL, len, "d/dst2", out), 0, "no etag: any version");
    cr_assert_eq(st->ops->copy(st, "src", "0-0.000000000-0", len, "d/x", out), -ESTALE);
    cr_assert_eq(st->ops->copy(st, "src", etag, len - 1, "d/x", out), -ESTALE, "size changed");
    cr_assert_eq(st->ops->copy(st, "missing", NULL, 1, "d/x", out), -ENOENT);
    cr_assert_eq(st->ops->copy(st, "d", NULL, 0, "x", out), -EISDIR);
    cr_assert_eq(st->ops->copy(st, "src", NULL, len, "nodir/x", out), -ENOENT);
    cr_assert_eq(raw_entries("d"), 2, "dst and dst2, no temporary files");
    cr_assert_eq(counter(&st->counters.copy_requests), 7);
}

/* ---- namespace ---- */

Test(store_dir, remove_files_only)
{
    write_text(root, "a", "x");
    raw_mkdir("d");
    cr_assert_eq(st->ops->remove(st, "a"), 0);
    cr_assert_not(raw_exists("a"));
    cr_assert_eq(st->ops->remove(st, "a"), -ENOENT);
    cr_assert_eq(st->ops->remove(st, "d"), -EISDIR);
    cr_assert(raw_exists("d"));
    cr_assert_eq(counter(&st->counters.delete_requests), 3);
}

Test(store_dir, mkdir_and_its_errors)
{
    cr_assert_eq(st->ops->mkdir(st, "d"), 0);
    cr_assert_eq(st->ops->mkdir(st, "d/e"), 0);
    struct store_stat s;
    cr_assert_eq(st->ops->stat(st, "d/e", &s), 0);
    cr_assert(s.is_dir);
    cr_assert_eq(st->ops->mkdir(st, "d"), -EEXIST);
    cr_assert_eq(st->ops->mkdir(st, "x/y"), -ENOENT, "parents must exist");
    write_text(root, "f", "x");
    cr_assert_eq(st->ops->mkdir(st, "f"), -EEXIST);
    cr_assert_eq(st->ops->mkdir(st, "f/y"), -ENOTDIR);
    char p[128];
    snprintf(p, sizeof p, "%s/d", root);
    struct stat sb;
    cr_assert_eq(stat(p, &sb), 0);
    cr_assert_eq(sb.st_mode & 0777, 0755 & ~umask(022));
}

Test(store_dir, rmdir_and_abandoned_uploads)
{
    raw_mkdir("empty");
    raw_mkdir("full");
    raw_mkdir("abandoned");
    write_text(root, "full/f", "x");
    write_text(root, "file", "x");
    char id1[STORE_UPLOAD_ID_MAX], id2[STORE_UPLOAD_ID_MAX];
    cr_assert_eq(st->ops->mpu_begin(st, "abandoned/a", id1), 0);
    cr_assert_eq(st->ops->mpu_begin(st, "full/b", id2), 0);
    cr_assert_eq(st->ops->rmdir(st, "empty"), 0);
    cr_assert_not(raw_exists("empty"));
    cr_assert_eq(st->ops->rmdir(st, "full"), -ENOTEMPTY);
    cr_assert_eq(raw_entries("full"), 2, "a refused rmdir removes nothing");
    cr_assert_eq(st->ops->rmdir(st, "abandoned"), 0, "only an abandoned upload inside");
    cr_assert_not(raw_exists("abandoned"));
    cr_assert_eq(st->ops->rmdir(st, "missing"), -ENOENT);
    cr_assert_eq(st->ops->rmdir(st, "file"), -ENOTDIR);
    raw_mkdir("nested");
    raw_mkdir("nested/" TMP_PREFIX "notafile");
    cr_assert_eq(st->ops->rmdir(st, "nested"), -ENOTEMPTY, "only files count as uploads");
}

Test(store_dir, rename_files_and_directories)
{
    write_text(root, "a", "aaa");
    write_text(root, "b", "b");
    raw_mkdir("d");
    raw_mkdir("e");
    write_text(root, "e/f", "x");
    cr_assert_eq(st->ops->rename(st, "a", "b"), 0, "replaces an object");
    cr_assert_not(raw_exists("a"));
    uint64_t n;
    unsigned char *b = get("b", &n);
    cr_assert(n == 3 && memcmp(b, "aaa", 3) == 0);
    free(b);
    cr_assert_eq(st->ops->rename(st, "b", "d/b"), 0, "into another directory");
    cr_assert_eq(st->ops->rename(st, "d", "d2"), 0, "a directory");
    cr_assert(raw_exists("d2/b"));
    cr_assert_eq(st->ops->rename(st, "missing", "x"), -ENOENT);
    cr_assert_eq(st->ops->rename(st, "d2/b", "nodir/b"), -ENOENT);
    cr_assert_eq(st->ops->rename(st, "d2/b", "e"), -EISDIR);
    int rc = st->ops->rename(st, "d2", "e");
    cr_assert(rc == -ENOTEMPTY || rc == -EEXIST, "rc %d", rc);
    cr_assert_eq(st->ops->rename(st, "d2", "d2/sub"), -EINVAL);
}
