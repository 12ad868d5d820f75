/*
 * tests/unit/test_store_contract.c - the store contract (fs/store/store.h),
 * one suite run against every store implementation.
 *
 * The store comes from the environment:
 *   CKPTFS_CONTRACT_STORE=mem            the in-memory test store (default),
 *                                        with S3's listings (mem_store_s3_listings)
 *   CKPTFS_CONTRACT_STORE=dir            a fresh temporary directory per test
 *   CKPTFS_CONTRACT_STORE=dir:/path      the local-directory store on /path
 *   CKPTFS_CONTRACT_STORE=s3://b/prefix  the S3 store; CKPTFS_CONTRACT_ENDPOINT is
 *                                        its endpoint (path-style), credentials and
 *                                        region from AWS_* as the S3 store takes them
 * Every test works in a directory of its own below the store's root, so runs
 * on one bucket or directory do not see each other.
 *
 * Where a store legitimately differs it says so through the interface (an
 * optional function left NULL, an errno such as -ENOSYS for a request the
 * server does not implement), and the test skips that part with the reason
 * (cr_skip_test); it never passes without checking.
 */
#include "mem_store.h"
#include "store.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static void teardown(void);

/* Skip the running test: criterion runs no .fini after cr_skip_test, so the
 * test's folder (and its store) are cleaned up first. */
#define skip_test(...)                                                                             \
    do {                                                                                           \
        teardown();                                                                                \
        cr_skip_test(__VA_ARGS__);                                                                 \
    } while (0)

static struct store *S;
static struct mem_store *M;
static char tmpdir[PATH_MAX]; /* CKPTFS_CONTRACT_STORE=dir: removed at teardown */
static char base[128];        /* this test's directory below the root */
static const char *kind = "mem";

/* ---- helpers ------------------------------------------------------------ */

/* path of name below this test's directory (a ring of buffers: several may be live) */
static const char *P(const char *name)
{
    static char ring[8][1024];
    static unsigned next;
    char *b = ring[next++ % 8];
    if (*name)
        snprintf(b, sizeof ring[0], "%s/%s", base, name);
    else
        snprintf(b, sizeof ring[0], "%s", base);
    return b;
}

/* deterministic bytes of a seed */
static void fill(unsigned char *buf, size_t len, unsigned seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        buf[i] = (unsigned char)x;
    }
}

/* a staging fd holding data (as the write path hands a store its staging file) */
static int staging_of(const void *data, size_t len)
{
    int fd = memfd_create("contract", MFD_CLOEXEC);
    cr_assert(fd >= 0);
    size_t done = 0;
    while (done < len) {
        ssize_t n = write(fd, (const char *)data + done, len - done);
        cr_assert(n > 0);
        done += (size_t)n;
    }
    return fd;
}

static int put_bytes(const char *path, const void *data, size_t len, char etag[STORE_ETAG_MAX])
{
    char dummy[STORE_ETAG_MAX];
    int fd = staging_of(data, len);
    int rc = S->ops->put(S, path, fd, len, etag ? etag : dummy);
    close(fd);
    return rc;
}

static void put_ok(const char *path, const void *data, size_t len, char etag[STORE_ETAG_MAX])
{
    int rc = put_bytes(path, data, len, etag);
    cr_assert_eq(rc, 0, "put %s: %d", path, rc);
}

static void put_str(const char *path, const char *s)
{
    put_ok(path, s, strlen(s), NULL);
}

/* a directory below the test's one: mkdir where the store has directories of
 * its own (the local directory never creates parents implicitly) */
static void make_dir(const char *path)
{
    if (S->ops->mkdir) {
        int rc = S->ops->mkdir(S, path);
        cr_assert(rc == 0, "mkdir %s: %d", path, rc);
    }
}

/* the whole object at path; asserts it reads */
static unsigned char *read_all(const char *path, size_t *len)
{
    struct store_stat st;
    int rc = S->ops->stat(S, path, &st);
    cr_assert_eq(rc, 0, "stat %s: %d", path, rc);
    unsigned char *buf = malloc(st.size + 1);
    size_t n = 0;
    rc = S->ops->read(S, path, st.etag, 0, st.size, buf, &n);
    cr_assert_eq(rc, 0, "read %s: %d", path, rc);
    cr_assert_eq(n, st.size);
    *len = n;
    return buf;
}

/* One listing gathered: names (malloc'd) and their stats, in listing order. */
struct listing {
    size_t n, cap;
    char **names;
    struct store_stat *st;
    size_t stop_after; /* fn returns 1 once this many were seen (0: never) */
};

static int gather(void *arg, const char *name, const struct store_stat *st)
{
    struct listing *l = arg;
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 16;
        l->names = realloc(l->names, l->cap * sizeof *l->names);
        l->st = realloc(l->st, l->cap * sizeof *l->st);
    }
    l->names[l->n] = strdup(name);
    l->st[l->n] = *st;
    l->n++;
    return l->stop_after && l->n >= l->stop_after;
}

static void listing_free(struct listing *l)
{
    for (size_t i = 0; i < l->n; i++)
        free(l->names[i]);
    free(l->names);
    free(l->st);
    memset(l, 0, sizeof *l);
}

/* the index of name in l, or -1; asserts it is there at most once */
static long find(const struct listing *l, const char *name)
{
    long at = -1;
    for (size_t i = 0; i < l->n; i++)
        if (strcmp(l->names[i], name) == 0) {
            cr_assert_eq(at, -1, "'%s' listed twice", name);
            at = (long)i;
        }
    return at;
}

static struct listing list_of(const char *dir)
{
    struct listing l = {0};
    int rc = S->ops->list(S, dir, gather, &l);
    cr_assert_eq(rc, 0, "list %s: %d", dir, rc);
    return l;
}

/* A check this server is known to fail, declared by whoever runs the suite
 * against it: CKPTFS_CONTRACT_SKIP="check=reason;check=reason" (the
 * integration driver lists each server's). The test skips there, saying
 * which check and why; a check not declared is asserted. */
static void skip_if_declared(const char *check)
{
    const char *list = getenv("CKPTFS_CONTRACT_SKIP");
    size_t len = strlen(check);
    for (const char *p = list; p && *p;) {
        const char *end = strchr(p, ';');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n > len && strncmp(p, check, len) == 0 && p[len] == '=')
            skip_test("%s on this %s server: %.*s", check, kind, (int)(n - len - 1), p + len + 1);
        p += n + (end != NULL);
    }
}

/* ---- setup: the store named by the environment -------------------------- */

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

static void setup(void)
{
    const char *url = getenv("CKPTFS_CONTRACT_STORE");
    char err[512] = "";
    int rc;
    if (!url || !*url || strcmp(url, "mem") == 0) {
        M = mem_store_new();
        mem_store_s3_listings(M);
        S = mem_store_base(M);
    } else if (strcmp(url, "dir") == 0) {
        kind = "dir";
        const char *t = getenv("TMPDIR");
        snprintf(tmpdir, sizeof tmpdir, "%s/ckptfs-contract-XXXXXX", t && *t ? t : "/tmp");
        cr_assert_not_null(mkdtemp(tmpdir));
        rc = store_open(tmpdir, NULL, &S, err, sizeof err);
        cr_assert_eq(rc, 0, "open %s: %s", tmpdir, err);
    } else if (strncmp(url, "dir:", 4) == 0) {
        kind = "dir";
        rc = store_open(url + 4, NULL, &S, err, sizeof err);
        cr_assert_eq(rc, 0, "open %s: %s", url + 4, err);
    } else {
        kind = "s3";
        struct store_options opt = {0};
        opt.endpoint_url = getenv("CKPTFS_CONTRACT_ENDPOINT");
        opt.force_path_style = opt.endpoint_url != NULL;
        rc = store_open(url, &opt, &S, err, sizeof err);
        cr_assert_eq(rc, 0, "open %s: %s", url, err);
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(base, sizeof base, "contract-%s-%d-%lx", criterion_current_test->name, (int)getpid(),
             (unsigned long)(ts.tv_nsec ^ ts.tv_sec));
    make_dir(base);
}

static void teardown(void)
{
    if (S)
        store_destroy(S);
    S = NULL;
    M = NULL;
    if (tmpdir[0])
        nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    tmpdir[0] = '\0';
}

TestSuite(contract, .init = setup, .fini = teardown, .timeout = 300);

/* ---- stat, read --------------------------------------------------------- */

/* stat and read of a path that holds nothing answer -ENOENT */
Test(contract, missing_is_enoent)
{
    struct store_stat st;
    char buf[16];
    size_t n = 99;
    cr_assert_eq(S->ops->stat(S, P("nothing"), &st), -ENOENT);
    cr_assert_eq(S->ops->read(S, P("nothing"), NULL, 0, sizeof buf, buf, &n), -ENOENT);
}

/* put writes an object whole: stat gives its size and the etag put returned */
Test(contract, put_then_stat)
{
    unsigned char data[3000];
    fill(data, sizeof data, 1);
    char etag[STORE_ETAG_MAX];
    put_ok(P("obj"), data, sizeof data, etag);
    struct store_stat st;
    cr_assert_eq(S->ops->stat(S, P("obj"), &st), 0);
    cr_assert_eq(st.size, sizeof data);
    cr_assert_eq(st.is_dir, 0);
    cr_assert_str_eq(st.etag, etag);
    size_t n;
    unsigned char *got = read_all(P("obj"), &n);
    cr_assert_arr_eq(got, data, sizeof data);
    free(got);
}

/* an empty object exists with size 0 and reads 0 bytes */
Test(contract, empty_object)
{
    put_ok(P("empty"), "", 0, NULL);
    struct store_stat st;
    cr_assert_eq(S->ops->stat(S, P("empty"), &st), 0);
    cr_assert_eq(st.size, 0);
    cr_assert_eq(st.is_dir, 0);
    char buf[8];
    size_t n = 99;
    int rc = S->ops->read(S, P("empty"), st.etag, 0, sizeof buf, buf, &n);
    cr_assert_eq(rc, 0, "read: %d", rc);
    cr_assert_eq(n, 0);
}

/* put replaces an object: new size, new bytes, another etag */
Test(contract, put_replaces)
{
    char e1[STORE_ETAG_MAX], e2[STORE_ETAG_MAX];
    put_ok(P("obj"), "first version", 13, e1);
    put_ok(P("obj"), "second", 6, e2);
    cr_assert_str_neq(e1, e2);
    struct store_stat st;
    cr_assert_eq(S->ops->stat(S, P("obj"), &st), 0);
    cr_assert_eq(st.size, 6);
    cr_assert_str_eq(st.etag, e2);
    size_t n;
    char *got = (char *)read_all(P("obj"), &n);
    cr_assert_eq(memcmp(got, "second", 6), 0);
    free(got);
}

/* ranged reads give exactly the asked bytes, short only at the end of the object */
Test(contract, ranged_reads)
{
    enum { SIZE = 100000 };
    unsigned char *data = malloc(SIZE), *buf = malloc(SIZE + 100);
    fill(data, SIZE, 2);
    char etag[STORE_ETAG_MAX];
    put_ok(P("obj"), data, SIZE, etag);
    uint64_t gets = S->counters.get_requests;
    static const struct {
        uint64_t off;
        size_t len, want;
    } r[] = {{1, 1, 1},
             {0, 4096, 4096},
             {12345, 777, 777},
             {SIZE - 10, 10, 10},
             {SIZE - 10, 100, 10},
             {0, SIZE, SIZE},
             {0, SIZE + 100, SIZE},
             {SIZE - 1, 1, 1}};
    for (size_t i = 0; i < sizeof r / sizeof r[0]; i++) {
        size_t n = 0;
        memset(buf, 0xEE, SIZE + 100);
        int rc = S->ops->read(S, P("obj"), etag, r[i].off, r[i].len, buf, &n);
        cr_assert_eq(rc, 0, "read %lu+%zu: %d", (unsigned long)r[i].off, r[i].len, rc);
        cr_assert_eq(n, r[i].want, "read %lu+%zu: %zu bytes", (unsigned long)r[i].off, r[i].len, n);
        cr_assert_eq(memcmp(buf, data + r[i].off, n), 0, "read %lu+%zu: wrong bytes",
                     (unsigned long)r[i].off, r[i].len);
    }
    /* no etag: any version */
    size_t n = 0;
    cr_assert_eq(S->ops->read(S, P("obj"), NULL, 5, 5, buf, &n), 0);
    cr_assert_eq(n, 5);
    cr_assert_eq(memcmp(buf, data + 5, 5), 0);
    cr_assert_geq(S->counters.get_requests, gets + 9, "every read is a counted GET");
    free(data);
    free(buf);
}

/* a read of the first byte alone (Range: bytes=0-0) gives that byte */
Test(contract, read_first_byte)
{
    put_ok(P("obj"), "xyz", 3, NULL);
    skip_if_declared("read_first_byte");
    char buf[4] = "";
    size_t n = 0;
    int rc = S->ops->read(S, P("obj"), NULL, 0, 1, buf, &n);
    cr_assert_eq(rc, 0, "read 0+1: %d", rc);
    cr_assert_eq(n, 1);
    cr_assert_eq(buf[0], 'x');
}

/* a read that names an etag the object no longer has fails with -ESTALE */
Test(contract, read_stale_etag)
{
    char e1[STORE_ETAG_MAX], e2[STORE_ETAG_MAX];
    put_ok(P("obj"), "old bytes here", 14, e1);
    put_ok(P("obj"), "new bytes, longer", 17, e2);
    char buf[32];
    size_t n;
    cr_assert_eq(S->ops->read(S, P("obj"), e1, 0, sizeof buf, buf, &n), -ESTALE);
    cr_assert_eq(S->ops->read(S, P("obj"), e2, 0, sizeof buf, buf, &n), 0);
    cr_assert_eq(n, 17);
}

struct progress {
    size_t last, calls;
    int went_back;
};

static void on_progress(void *arg, size_t ready)
{
    struct progress *p = arg;
    if (ready < p->last)
        p->went_back = 1;
    p->last = ready;
    p->calls++;
}

/* read_progressive: the bytes of a ranged read, with progress that only grows to at most nread */
Test(contract, read_progressive)
{
    if (!S->ops->read_progressive)
        skip_test("%s store has no read_progressive (optional: reads complete at once)", kind);
    enum { SIZE = 300000 };
    unsigned char *data = malloc(SIZE), *buf = malloc(SIZE);
    fill(data, SIZE, 3);
    char etag[STORE_ETAG_MAX];
    put_ok(P("obj"), data, SIZE, etag);
    struct progress p = {0};
    size_t n = 0;
    int rc = S->ops->read_progressive(S, P("obj"), etag, 1000, SIZE, buf, &n, on_progress, &p);
    cr_assert_eq(rc, 0, "read_progressive: %d", rc);
    cr_assert_eq(n, SIZE - 1000);
    cr_assert_eq(memcmp(buf, data + 1000, n), 0);
    cr_assert_eq(p.went_back, 0, "progress went back");
    cr_assert_leq(p.last, n);
    char e0[STORE_ETAG_MAX];
    put_ok(P("obj"), "x", 1, e0);
    cr_assert_eq(S->ops->read_progressive(S, P("obj"), etag, 0, 10, buf, &n, on_progress, &p),
                 -ESTALE);
    free(data);
    free(buf);
}

/* open_fd: an fd reading the object's bytes, -ESTALE for another version */
Test(contract, open_fd)
{
    if (!S->ops->open_fd)
        skip_test("%s store has no open_fd (optional: no file descriptors)", kind);
    char etag[STORE_ETAG_MAX], e2[STORE_ETAG_MAX];
    put_ok(P("obj"), "fd bytes", 8, etag);
    int fd = S->ops->open_fd(S, P("obj"), etag);
    cr_assert_geq(fd, 0, "open_fd: %d", fd);
    char buf[16];
    cr_assert_eq(pread(fd, buf, sizeof buf, 0), 8);
    cr_assert_eq(memcmp(buf, "fd bytes", 8), 0);
    close(fd);
    put_ok(P("obj"), "other", 5, e2);
    cr_assert_eq(S->ops->open_fd(S, P("obj"), etag), -ESTALE);
}

/* ---- directories and listings ------------------------------------------- */

/* list gives each entry directly below a directory once: objects with their sizes, subdirectories
 * as is_dir */
Test(contract, list_entries)
{
    put_str(P("a"), "aaaa");
    put_str(P("b"), "bb");
    make_dir(P("sub"));
    put_str(P("sub/inner"), "deeper");
    struct listing l = list_of(P(""));
    cr_assert_eq(l.n, 3, "%zu entries", l.n);
    long a = find(&l, "a"), b = find(&l, "b"), sub = find(&l, "sub");
    cr_assert(a >= 0 && b >= 0 && sub >= 0);
    cr_assert_eq(l.st[a].size, 4);
    cr_assert_eq(l.st[a].is_dir, 0);
    cr_assert_eq(l.st[b].size, 2);
    cr_assert_eq(l.st[sub].is_dir, 1);
    listing_free(&l);
    l = list_of(P("sub"));
    cr_assert_eq(l.n, 1);
    cr_assert_str_eq(l.names[0], "inner");
    listing_free(&l);
}

/* list of a missing directory is -ENOENT, of an object -ENOTDIR */
Test(contract, list_errors)
{
    put_str(P("file"), "x");
    struct listing l = {0};
    cr_assert_eq(S->ops->list(S, P("nodir"), gather, &l), -ENOENT);
    cr_assert_eq(S->ops->list(S, P("file"), gather, &l), -ENOTDIR);
    cr_assert_eq(l.n, 0);
}

/* a listing stops when its function returns non-zero, and list() then returns 0 */
Test(contract, list_stops_early)
{
    for (int i = 0; i < 5; i++) {
        char name[16];
        snprintf(name, sizeof name, "f%d", i);
        put_str(P(name), "x");
    }
    struct listing l = {.stop_after = 2};
    cr_assert_eq(S->ops->list(S, P(""), gather, &l), 0);
    cr_assert_eq(l.n, 2);
    listing_free(&l);
}

/* a directory is stat-able: is_dir, size 0; so is the root "" */
Test(contract, stat_directory)
{
    make_dir(P("d"));
    put_str(P("d/f"), "content");
    struct store_stat st;
    cr_assert_eq(S->ops->stat(S, P("d"), &st), 0);
    cr_assert_eq(st.is_dir, 1);
    cr_assert_eq(st.size, 0);
    cr_assert_eq(S->ops->stat(S, "", &st), 0);
    cr_assert_eq(st.is_dir, 1);
}

enum { MANY = 1100 }; /* past S3's 1000 keys a page: a listing of more than one page */

static void put_many(void)
{
    for (int i = 0; i < MANY; i++) {
        char name[32];
        snprintf(name, sizeof name, "f%04d", i);
        put_ok(P(name), name, strlen(name), NULL);
    }
}

/* a listing longer than a page (pagination, markers) gives every entry once */
Test(contract, list_pages)
{
    put_many();
    uint64_t pages = S->counters.list_requests;
    struct listing l = list_of(P(""));
    cr_assert_eq(l.n, MANY, "%zu entries", l.n);
    for (int i = 0; i < MANY; i++) {
        char name[32];
        snprintf(name, sizeof name, "f%04d", i);
        long at = find(&l, name);
        cr_assert_geq(at, 0, "%s not listed", name);
        cr_assert_eq(l.st[at].size, 5);
    }
    cr_assert_gt(S->counters.list_requests, pages, "a listing is a counted LIST");
    listing_free(&l);
}

/* list_after gives only the entries after a name (byte order), across pages, and no -ENOENT */
Test(contract, list_after)
{
    if (!S->ops->list_after)
        skip_test("%s store has no list_after (optional: callers use list())", kind);
    put_many();
    struct listing l = {0};
    cr_assert_eq(S->ops->list_after(S, P(""), "f0099", gather, &l), 0);
    cr_assert_eq(l.n, MANY - 100, "%zu entries", l.n);
    for (size_t i = 0; i < l.n; i++)
        cr_assert_gt(strcmp(l.names[i], "f0099"), 0, "%s listed", l.names[i]);
    cr_assert_geq(find(&l, "f0100"), 0);
    cr_assert_geq(find(&l, "f1099"), 0);
    listing_free(&l);
    cr_assert_eq(S->ops->list_after(S, P("nodir"), "", gather, &l), 0);
    cr_assert_eq(l.n, 0);
}

/* list_below: every object at any depth in key order, markers as "sub/" and "" */
Test(contract, list_below)
{
    if (!S->ops->list_below)
        skip_test("%s store has no list_below (optional: lookups use list())", kind);
    make_dir(P("d"));
    make_dir(P("d/sub"));
    put_str(P("d/b"), "b");
    put_str(P("d/sub/z"), "zz");
    put_str(P("d/a"), "a");
    struct listing l = {0};
    cr_assert_eq(S->ops->list_below(S, P("d"), gather, &l), 0);
    for (size_t i = 1; i < l.n; i++)
        cr_assert_lt(strcmp(l.names[i - 1], l.names[i]), 0, "not in key order: %s, %s",
                     l.names[i - 1], l.names[i]);
    long a = find(&l, "a"), b = find(&l, "b"), z = find(&l, "sub/z");
    cr_assert(a >= 0 && b >= 0 && z >= 0, "a %ld b %ld sub/z %ld", a, b, z);
    cr_assert_eq(l.st[z].size, 2);
    /* markers where the store writes them (mkdir), nothing else */
    size_t want = 3 + (S->ops->mkdir ? 2 : 0);
    if (S->ops->mkdir)
        cr_assert(find(&l, "") >= 0 && find(&l, "sub/") >= 0, "markers not listed");
    cr_assert_eq(l.n, want, "%zu entries", l.n);
    listing_free(&l);
    cr_assert_eq(S->ops->list_below(S, P("nodir"), gather, &l), 0);
    cr_assert_eq(l.n, 0);
}

/* names that need encoding (space, +, %, &, =, ?, #, UTF-8) are stored and listed exactly */
Test(contract, names_need_encoding)
{
    static const char *names[] = {"a b",   "plus+sign", "100%",   "x&y=z",     "what?",
                                  "hash#", "é ü 漢字",  "tilde~", "semi;colon"};
    size_t count = sizeof names / sizeof names[0];
    for (size_t i = 0; i < count; i++)
        put_ok(P(names[i]), names[i], strlen(names[i]), NULL);
    struct listing l = list_of(P(""));
    cr_assert_eq(l.n, count, "%zu entries", l.n);
    for (size_t i = 0; i < count; i++) {
        long at = find(&l, names[i]);
        cr_assert_geq(at, 0, "'%s' not listed", names[i]);
        cr_assert_eq(l.st[at].size, strlen(names[i]));
        size_t n;
        char *got = (char *)read_all(P(names[i]), &n);
        cr_assert_eq(n, strlen(names[i]));
        cr_assert_eq(memcmp(got, names[i], n), 0);
        free(got);
    }
    listing_free(&l);
}

/* mkdir makes an empty directory that stat and its parent's listing show; rmdir removes it only
 * when empty */
Test(contract, mkdir_rmdir)
{
    if (!S->ops->mkdir || !S->ops->rmdir)
        skip_test("%s store has no mkdir/rmdir (optional: directories are key prefixes)", kind);
    cr_assert_eq(S->ops->mkdir(S, P("d")), 0);
    struct store_stat st;
    cr_assert_eq(S->ops->stat(S, P("d"), &st), 0);
    cr_assert_eq(st.is_dir, 1);
    struct listing l = list_of(P(""));
    cr_assert_eq(l.n, 1);
    cr_assert_str_eq(l.names[0], "d");
    cr_assert_eq(l.st[0].is_dir, 1);
    listing_free(&l);
    l = list_of(P("d"));
    cr_assert_eq(l.n, 0, "the marker is listed");
    listing_free(&l);
    put_str(P("d/f"), "x");
    cr_assert_eq(S->ops->rmdir(S, P("d")), -ENOTEMPTY);
    cr_assert_eq(S->ops->remove(S, P("d/f")), 0);
    cr_assert_eq(S->ops->rmdir(S, P("d")), 0);
    cr_assert_eq(S->ops->stat(S, P("d"), &st), -ENOENT);
}

/* ---- remove, copy, rename ----------------------------------------------- */

/* remove deletes an object: stat and read then answer -ENOENT */
Test(contract, remove_object)
{
    put_str(P("gone"), "soon");
    put_str(P("kept"), "stays");
    cr_assert_eq(S->ops->remove(S, P("gone")), 0);
    struct store_stat st;
    cr_assert_eq(S->ops->stat(S, P("gone"), &st), -ENOENT);
    cr_assert_eq(S->ops->stat(S, P("kept"), &st), 0);
    struct listing l = list_of(P(""));
    cr_assert_eq(l.n, 1);
    cr_assert_str_eq(l.names[0], "kept");
    listing_free(&l);
}

/* remove of a missing object is -ENOENT (where the server tells) */
Test(contract, remove_missing)
{
    int rc = S->ops->remove(S, P("never"));
    if (rc == 0 && strcmp(S->ops->scheme, "s3") == 0)
        skip_test("this S3 server answers 204 to DeleteObject of a missing key, as AWS does: "
                  "the store cannot tell (store_s3_write.c delete_object)");
    cr_assert_eq(rc, -ENOENT, "remove of a missing object: %d", rc);
}

/* copy makes a whole copy with the etag it returns; replaces the destination */
Test(contract, copy_object)
{
    unsigned char data[5000];
    fill(data, sizeof data, 4);
    char etag[STORE_ETAG_MAX], out[STORE_ETAG_MAX];
    put_ok(P("src"), data, sizeof data, etag);
    put_str(P("dst"), "to be replaced");
    int rc = S->ops->copy(S, P("src"), etag, sizeof data, P("dst"), out);
    cr_assert_eq(rc, 0, "copy: %d", rc);
    struct store_stat st;
    cr_assert_eq(S->ops->stat(S, P("dst"), &st), 0);
    cr_assert_eq(st.size, sizeof data);
    skip_if_declared("copy_etag");
    cr_assert_str_eq(st.etag, out, "copy's etag is not what stat reports");
    size_t n;
    unsigned char *got = read_all(P("dst"), &n);
    cr_assert_arr_eq(got, data, sizeof data);
    free(got);
    cr_assert_eq(S->ops->stat(S, P("src"), &st), 0, "the source is kept");
}

/* copy of a version the source no longer has is -ESTALE and writes nothing */
Test(contract, copy_stale_etag)
{
    char e1[STORE_ETAG_MAX], e2[STORE_ETAG_MAX], out[STORE_ETAG_MAX];
    put_ok(P("src"), "version one", 11, e1);
    put_ok(P("src"), "version two", 11, e2);
    skip_if_declared("copy_stale_etag");
    int rc = S->ops->copy(S, P("src"), e1, 11, P("dst"), out);
    cr_assert_eq(rc, -ESTALE, "copy of a stale version: %d", rc);
    struct store_stat st;
    cr_assert_eq(S->ops->stat(S, P("dst"), &st), -ENOENT);
}

/* rename moves an object atomically, replacing one at the destination, and a directory with its
 * contents */
Test(contract, rename)
{
    if (!S->ops->rename)
        skip_test("%s store has no rename (optional: the core copies then removes)", kind);
    char etag[STORE_ETAG_MAX];
    put_ok(P("from"), "moving", 6, etag);
    put_str(P("to"), "old");
    cr_assert_eq(S->ops->rename(S, P("from"), P("to")), 0);
    struct store_stat st;
    cr_assert_eq(S->ops->stat(S, P("from"), &st), -ENOENT);
    cr_assert_eq(S->ops->stat(S, P("to"), &st), 0);
    cr_assert_eq(st.size, 6);
    make_dir(P("d"));
    put_str(P("d/f"), "in d");
    cr_assert_eq(S->ops->rename(S, P("d"), P("e")), 0);
    cr_assert_eq(S->ops->stat(S, P("d"), &st), -ENOENT);
    cr_assert_eq(S->ops->stat(S, P("e/f"), &st), 0);
    cr_assert_eq(st.size, 4);
}

/* check_name: an ordinary name may be created, a component longer than any store holds may not */
Test(contract, check_name)
{
    if (!S->ops->check_name)
        skip_test("%s store has no check_name (optional: any name)", kind);
    cr_assert_eq(S->ops->check_name(S, P("ordinary.bin")), 0);
    char long_name[5000];
    memset(long_name, 'n', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = '\0';
    cr_assert_eq(S->ops->check_name(S, P(long_name)), -ENAMETOOLONG);
}

/* ---- multipart uploads -------------------------------------------------- */

#define PART1 STORE_MIN_PART
#define TAIL 4096u

/* a multipart object appears only at completion, assembled from parts sent in any order (a part
 * sent again replaces it) */
Test(contract, multipart_complete)
{
    size_t size = PART1 + TAIL;
    unsigned char *data = malloc(size), *wrong = malloc(size);
    fill(data, size, 5);
    fill(wrong, size, 6);
    int fd = staging_of(data, size), fd_wrong = staging_of(wrong, size);
    char id[STORE_UPLOAD_ID_MAX], etag[STORE_ETAG_MAX];
    int rc = S->ops->mpu_begin(S, P("big"), id);
    cr_assert(rc == 0 || rc == 1, "mpu_begin: %d", rc);
    struct store_part parts[2] = {{.number = 1, .offset = 0, .length = PART1},
                                  {.number = 2, .offset = PART1, .length = TAIL}};
    cr_assert_eq(S->ops->mpu_part(S, P("big"), id, &parts[1], fd), 0);
    cr_assert_eq(S->ops->mpu_part(S, P("big"), id, &parts[0], fd_wrong), 0);
    cr_assert_eq(S->ops->mpu_part(S, P("big"), id, &parts[0], fd), 0, "sent again");
    close(fd_wrong);
    free(wrong);
    struct store_stat st;
    cr_assert_eq(S->ops->stat(S, P("big"), &st), -ENOENT, "visible before completion");
    rc = S->ops->mpu_complete(S, P("big"), id, parts, 2, size, etag);
    cr_assert_eq(rc, 0, "mpu_complete: %d", rc);
    cr_assert_eq(S->ops->stat(S, P("big"), &st), 0);
    cr_assert_eq(st.size, size);
    cr_assert_str_eq(st.etag, etag);
    size_t n;
    unsigned char *got = read_all(P("big"), &n);
    cr_assert_eq(memcmp(got, data, size), 0, "wrong bytes");
    free(got);
    /* a completion retried after its answer was lost is recognised */
    skip_if_declared("multipart_complete_retried");
    char etag2[STORE_ETAG_MAX];
    rc = S->ops->mpu_complete(S, P("big"), id, parts, 2, size, etag2);
    cr_assert_eq(rc, 0, "retried mpu_complete: %d", rc);
    close(fd);
    free(data);
}

/* a multipart upload replaces an existing object only at completion */
Test(contract, multipart_replaces)
{
    put_str(P("obj"), "small old object");
    size_t size = PART1 + TAIL;
    unsigned char *data = malloc(size);
    fill(data, size, 7);
    int fd = staging_of(data, size);
    char id[STORE_UPLOAD_ID_MAX], etag[STORE_ETAG_MAX];
    int rc = S->ops->mpu_begin(S, P("obj"), id);
    cr_assert(rc == 0 || rc == 1, "mpu_begin: %d", rc);
    struct store_part parts[2] = {{.number = 1, .offset = 0, .length = PART1},
                                  {.number = 2, .offset = PART1, .length = TAIL}};
    for (int i = 0; i < 2; i++)
        cr_assert_eq(S->ops->mpu_part(S, P("obj"), id, &parts[i], fd), 0);
    struct store_stat st;
    cr_assert_eq(S->ops->stat(S, P("obj"), &st), 0);
    cr_assert_eq(st.size, 16, "the old object is there until completion");
    cr_assert_eq(S->ops->mpu_complete(S, P("obj"), id, parts, 2, size, etag), 0);
    cr_assert_eq(S->ops->stat(S, P("obj"), &st), 0);
    cr_assert_eq(st.size, size);
    close(fd);
    free(data);
}

/* a completion whose part list does not match the parts sent fails and makes no object */
Test(contract, multipart_bad_parts)
{
    size_t size = PART1 + TAIL;
    unsigned char *data = malloc(size);
    fill(data, size, 8);
    int fd = staging_of(data, size);
    char id[STORE_UPLOAD_ID_MAX], etag[STORE_ETAG_MAX];
    int rc = S->ops->mpu_begin(S, P("obj"), id);
    cr_assert(rc == 0 || rc == 1, "mpu_begin: %d", rc);
    struct store_part parts[2] = {{.number = 1, .offset = 0, .length = PART1},
                                  {.number = 2, .offset = PART1, .length = TAIL}};
    for (int i = 0; i < 2; i++)
        cr_assert_eq(S->ops->mpu_part(S, P("obj"), id, &parts[i], fd), 0);
    /* part 2's etag as part 1's: a part list the server never saw */
    struct store_part bad[2] = {parts[0], parts[1]};
    snprintf(bad[1].etag, sizeof bad[1].etag, "%s", parts[0].etag);
    skip_if_declared("multipart_bad_parts");
    rc = S->ops->mpu_complete(S, P("obj"), id, bad, 2, size, etag);
    cr_assert_lt(rc, 0, "completion with a wrong part etag: %d", rc);
    struct store_stat st;
    cr_assert_eq(S->ops->stat(S, P("obj"), &st), -ENOENT);
    S->ops->mpu_abort(S, P("obj"), id); /* clean-up: multipart_abort checks abort */
    close(fd);
    free(data);
}

struct ids {
    char id[4][STORE_UPLOAD_ID_MAX];
    size_t n;
};

static int gather_id(void *arg, const char *upload_id)
{
    struct ids *ids = arg;
    cr_assert_lt(ids->n, 4, "too many uploads listed");
    snprintf(ids->id[ids->n++], STORE_UPLOAD_ID_MAX, "%s", upload_id);
    return 0;
}

static int has_id(const struct ids *ids, const char *id)
{
    for (size_t i = 0; i < ids->n; i++)
        if (strcmp(ids->id[i], id) == 0)
            return 1;
    return 0;
}

/* mpu_list: finds every upload in progress of exactly a path (not another path's) */
Test(contract, multipart_list)
{
    char a1[STORE_UPLOAD_ID_MAX], a2[STORE_UPLOAD_ID_MAX], b[STORE_UPLOAD_ID_MAX];
    cr_assert_geq(S->ops->mpu_begin(S, P("a"), a1), 0);
    cr_assert_geq(S->ops->mpu_begin(S, P("a"), a2), 0);
    cr_assert_geq(S->ops->mpu_begin(S, P("ab"), b), 0);
    struct ids ids = {0};
    int rc = S->ops->mpu_list(S, P("a"), gather_id, &ids);
    if (rc == -ENOSYS)
        skip_test("this %s server does not implement ListMultipartUploads (mpu_list: -ENOSYS; "
                  "s3rver answers NotImplemented)",
                  kind);
    cr_assert_eq(rc, 0, "mpu_list: %d", rc);
    cr_assert_eq(ids.n, 2, "%zu uploads", ids.n);
    cr_assert(has_id(&ids, a1) && has_id(&ids, a2));
    cr_assert_not(has_id(&ids, b));
    for (size_t i = 0; i < 3; i++)
        cr_assert_eq(S->ops->mpu_abort(S, i == 2 ? P("ab") : P("a"),
                                       i == 0   ? a1
                                       : i == 1 ? a2
                                                : b),
                     0);
    ids.n = 0;
    cr_assert_eq(S->ops->mpu_list(S, P("a"), gather_id, &ids), 0);
    cr_assert_eq(ids.n, 0, "aborted uploads listed");
}

/* mpu_abort drops an upload (nothing appears; its id is not listed), and aborting it again is not
 * an error */
Test(contract, multipart_abort)
{
    unsigned char data[TAIL];
    fill(data, sizeof data, 9);
    int fd = staging_of(data, sizeof data);
    char id[STORE_UPLOAD_ID_MAX];
    int rc = S->ops->mpu_begin(S, P("obj"), id);
    cr_assert(rc == 0 || rc == 1, "mpu_begin: %d", rc);
    struct store_part part = {.number = 1, .offset = 0, .length = TAIL};
    cr_assert_eq(S->ops->mpu_part(S, P("obj"), id, &part, fd), 0);
    close(fd);
    skip_if_declared("multipart_abort");
    rc = S->ops->mpu_abort(S, P("obj"), id);
    cr_assert_eq(rc, 0, "abort: %d", rc);
    struct store_stat st;
    cr_assert_eq(S->ops->stat(S, P("obj"), &st), -ENOENT);
    struct listing l = list_of(P(""));
    cr_assert_eq(l.n, 0, "an aborted upload left '%s'", l.n ? l.names[0] : "");
    listing_free(&l);
    struct ids ids = {0};
    rc = S->ops->mpu_list(S, P("obj"), gather_id, &ids);
    if (rc != -ENOSYS) { /* s3rver cannot list uploads (multipart_list says so) */
        cr_assert_eq(rc, 0);
        cr_assert_not(has_id(&ids, id));
    }
    rc = S->ops->mpu_abort(S, P("obj"), id);
    cr_assert_eq(rc, 0, "abort again: %d", rc);
}

/* ---- counters ----------------------------------------------------------- */

#define COUNTED(field, call)                                                                       \
    do {                                                                                           \
        uint64_t before_ = S->counters.field;                                                      \
        call;                                                                                      \
        cr_assert_gt(S->counters.field, before_, #call " did not count " #field);                  \
    } while (0)

/* every request is counted in the store's counters, under its kind */
Test(contract, counters)
{
    char etag[STORE_ETAG_MAX], out[STORE_ETAG_MAX], id[STORE_UPLOAD_ID_MAX];
    struct store_stat st;
    char buf[8];
    size_t n;
    COUNTED(put_requests, put_ok(P("obj"), "counted", 7, etag));
    COUNTED(put_bytes, put_ok(P("obj2"), "counted", 7, NULL));
    COUNTED(head_requests, cr_assert_eq(S->ops->stat(S, P("obj"), &st), 0));
    COUNTED(get_requests, cr_assert_eq(S->ops->read(S, P("obj"), etag, 0, 7, buf, &n), 0));
    COUNTED(get_bytes, cr_assert_eq(S->ops->read(S, P("obj"), etag, 0, 7, buf, &n), 0));
    struct listing l = {0};
    COUNTED(list_requests, cr_assert_eq(S->ops->list(S, P(""), gather, &l), 0));
    listing_free(&l);
    COUNTED(copy_requests, cr_assert_eq(S->ops->copy(S, P("obj"), etag, 7, P("cp"), out), 0));
    COUNTED(delete_requests, cr_assert_eq(S->ops->remove(S, P("cp")), 0));
    COUNTED(mpu_begin_requests, cr_assert_geq(S->ops->mpu_begin(S, P("mp"), id), 0));
    int fd = staging_of("part", 4);
    struct store_part part = {.number = 1, .offset = 0, .length = 4};
    COUNTED(part_requests, cr_assert_eq(S->ops->mpu_part(S, P("mp"), id, &part, fd), 0));
    close(fd);
    COUNTED(complete_requests,
            cr_assert_eq(S->ops->mpu_complete(S, P("mp"), id, &part, 1, 4, out), 0));
    cr_assert_geq(S->ops->mpu_begin(S, P("mp2"), id), 0);
    struct ids ids = {0};
    COUNTED(upload_list_requests, S->ops->mpu_list(S, P("mp2"), gather_id, &ids));
    skip_if_declared("multipart_abort");
    COUNTED(abort_requests, cr_assert_eq(S->ops->mpu_abort(S, P("mp2"), id), 0));
}
