/* tests/unit/test_mem_store.c - the in-memory test store (mem_store.h) is
 * itself right: S3-like namespace and reads, multipart semantics, and the
 * fault injection, delays and hook that upload tests rely on. */
#include "mem_store.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define MiB (1u << 20)

static struct mem_store *m;
static struct store *s;

static void setup(void)
{
    m = mem_store_new();
    s = mem_store_base(m);
}

static void teardown(void)
{
    mem_store_free(m);
}

TestSuite(mem_store, .init = setup, .fini = teardown);

static unsigned char byte_at(uint64_t i)
{
    return (unsigned char)((i * 2654435761u) >> 13);
}

/* A memfd staging file of len pattern bytes. */
static int staging(uint64_t len)
{
    int fd = memfd_create("staging", MFD_CLOEXEC);
    cr_assert_geq(fd, 0);
    unsigned char *b = malloc(len + 1);
    for (uint64_t i = 0; i < len; i++)
        b[i] = byte_at(i);
    cr_assert_eq(pwrite(fd, b, len, 0), (ssize_t)len);
    free(b);
    return fd;
}

static void check_pattern(const char *path, uint64_t len)
{
    size_t n = 0;
    unsigned char *b = mem_store_get(m, path, &n);
    cr_assert_not_null(b, "%s missing", path);
    cr_assert_eq(n, len);
    for (uint64_t i = 0; i < len; i++)
        if (b[i] != byte_at(i))
            cr_assert_fail("%s: byte %llu differs", path, (unsigned long long)i);
    free(b);
}

static int count_entry(void *arg, const char *name, const struct store_stat *st)
{
    (void)st;
    (void)name;
    ++*(int *)arg;
    return 0;
}

static int count_id(void *arg, const char *id)
{
    (void)id;
    ++*(int *)arg;
    return 0;
}

Test(mem_store, namespace_and_reads_like_s3)
{
    char etag[STORE_ETAG_MAX];
    cr_assert_eq(mem_store_set(m, "a/b/c", "hello", 5, etag), 0);
    cr_assert_eq(mem_store_set(m, "a/x", "x", 1, NULL), 0);
    cr_assert_eq(mem_store_set(m, "empty/", "", 0, NULL), 0); /* a directory marker */
    struct store_stat st;
    cr_assert_eq(s->ops->stat(s, "a", &st), 0);
    cr_assert(st.is_dir);
    cr_assert_eq(s->ops->stat(s, "a/b/c", &st), 0);
    cr_assert(!st.is_dir && st.size == 5);
    cr_assert_str_eq(st.etag, etag);
    cr_assert_eq(s->ops->stat(s, "a/b/", &st), -EINVAL);
    cr_assert_eq(s->ops->stat(s, "nope", &st), -ENOENT);
    int n = 0;
    cr_assert_eq(s->ops->list(s, "a", count_entry, &n), 0);
    cr_assert_eq(n, 2, "b (a prefix, once) and x");
    n = 0;
    cr_assert_eq(s->ops->list(s, "empty", count_entry, &n), 0);
    cr_assert_eq(n, 0, "the marker is hidden");
    cr_assert_eq(s->ops->list(s, "nope", count_entry, &n), -ENOENT);
    cr_assert_eq(s->ops->list(s, "a/x", count_entry, &n), -ENOTDIR);
    char buf[8];
    size_t got;
    cr_assert_eq(s->ops->read(s, "a/b/c", etag, 1, 10, buf, &got), 0);
    cr_assert(got == 4 && memcmp(buf, "ello", 4) == 0);
    cr_assert_eq(s->ops->read(s, "a/b/c", "other", 0, 1, buf, &got), -ESTALE);
    cr_assert_eq(s->ops->read(s, "a", NULL, 0, 1, buf, &got), -ENOENT);
    cr_assert_null(s->ops->rename);
    cr_assert_null(s->ops->open_fd);
    cr_assert_eq(s->ops->remove(s, "a"), -EISDIR);
    cr_assert_eq(s->ops->rmdir(s, "a"), -ENOTEMPTY);
    cr_assert_eq(s->ops->rmdir(s, "empty"), 0);
    cr_assert_eq(s->ops->rmdir(s, "empty"), -ENOENT);
    cr_assert_eq(s->ops->mkdir(s, "made"), 0); /* a marker: listed as a directory */
    cr_assert_eq(s->ops->mkdir(s, "made"), -EEXIST);
    cr_assert_eq(s->ops->mkdir(s, "a"), -EEXIST);
    struct store_stat ms;
    cr_assert_eq(s->ops->stat(s, "made", &ms), 0);
    cr_assert(ms.is_dir);
    cr_assert_eq(s->ops->rmdir(s, "made"), 0);
    cr_assert_eq(s->ops->remove(s, "a/x"), 0);
    cr_assert_eq(s->ops->remove(s, "a/x"), -ENOENT);
    cr_assert_eq(atomic_load(&s->counters.head_requests), 5);
    cr_assert_eq(atomic_load(&s->counters.list_requests), 4);
    cr_assert_eq(atomic_load(&s->counters.get_requests), 3);
    cr_assert_eq(atomic_load(&s->counters.get_bytes), 4);
    cr_assert_eq(atomic_load(&s->counters.delete_requests), 7);
}

Test(mem_store, put_and_copy)
{
    int fd = staging(1000);
    char e1[STORE_ETAG_MAX], e2[STORE_ETAG_MAX];
    cr_assert_eq(s->ops->put(s, "p", fd, 1000, e1), 0);
    check_pattern("p", 1000);
    cr_assert_eq(s->ops->put(s, "short", fd, 2000, e2), -EIO, "staging file too short");
    cr_assert_null(mem_store_get(m, "short", &(size_t){0}));
    cr_assert_eq(s->ops->copy(s, "p", e1, 1000, "q", e2), 0);
    check_pattern("q", 1000);
    cr_assert_str_eq(e1, e2, "same bytes, same content etag");
    cr_assert_eq(s->ops->copy(s, "p", "stale", 1000, "r", e2), -ESTALE);
    cr_assert_eq(s->ops->copy(s, "missing", NULL, 1, "r", e2), -ENOENT);
    cr_assert_eq(atomic_load(&s->counters.put_requests), 2);
    cr_assert_eq(atomic_load(&s->counters.put_bytes), 1000);
    cr_assert_eq(atomic_load(&s->counters.copy_requests), 3);
    cr_assert_eq(atomic_load(&s->counters.errors), 3);
    close(fd);
}

Test(mem_store, multipart_semantics)
{
    uint64_t len = 2 * STORE_MIN_PART + 100;
    int fd = staging(len);
    char id[STORE_UPLOAD_ID_MAX], id2[STORE_UPLOAD_ID_MAX], etag[STORE_ETAG_MAX];
    struct store_part p[3] = {
        {.number = 1, .offset = 0, .length = STORE_MIN_PART},
        {.number = 2, .offset = STORE_MIN_PART, .length = STORE_MIN_PART},
        {.number = 3, .offset = 2 * STORE_MIN_PART, .length = 100},
    };
    cr_assert_eq(s->ops->mpu_begin(s, "o", id), 0);
    cr_assert_eq(s->ops->mpu_begin(s, "o", id2), 0);
    cr_assert_str_neq(id, id2);
    cr_assert_eq(mem_store_uploads_in_progress(m), 2);
    int n = 0;
    cr_assert_eq(s->ops->mpu_list(s, "o", count_id, &n), 0);
    cr_assert_eq(n, 2);
    cr_assert_eq(s->ops->mpu_part(s, "o", id, &p[2], fd), 0);
    cr_assert_eq(s->ops->mpu_part(s, "o", id, &p[0], fd), 0);
    cr_assert_eq(s->ops->mpu_complete(s, "o", id, p, 3, len, etag), -EINVAL, "part 2 missing");
    struct store_part wrong = p[1];
    wrong.offset = 0; /* sent with other bytes: a different etag */
    cr_assert_eq(s->ops->mpu_part(s, "o", id, &wrong, fd), 0);
    cr_assert_eq(s->ops->mpu_part(s, "o", id, &p[1], fd), 0); /* sent again: replaces */
    cr_assert_str_neq(wrong.etag, p[1].etag);
    cr_assert_null(mem_store_get(m, "o", &(size_t){0}), "nothing before complete");
    struct store_part swapped[3] = {p[1], p[0], p[2]};
    cr_assert_eq(s->ops->mpu_complete(s, "o", id, swapped, 3, len, etag), -EINVAL);
    cr_assert_eq(s->ops->mpu_complete(s, "o", id, p, 3, len - 1, etag), -EINVAL);
    cr_assert_eq(s->ops->mpu_complete(s, "o", id, p, 3, len, etag), 0);
    check_pattern("o", len);
    cr_assert_not_null(strstr(etag, "-3"), "%s", etag);
    cr_assert_eq(mem_store_uploads_in_progress(m), 1);
    char again[STORE_ETAG_MAX];
    cr_assert_eq(s->ops->mpu_complete(s, "o", id, p, 3, len, again), 0, "retried complete");
    cr_assert_str_eq(again, etag);
    cr_assert_eq(s->ops->mpu_part(s, "o", id, &p[0], fd), -ENOENT, "the upload is over");
    /* S3's EntityTooSmall: every part but the last is at least 5 MiB. */
    struct store_part small[2] = {{.number = 1, .offset = 0, .length = 100},
                                  {.number = 2, .offset = 100, .length = 100}};
    cr_assert_eq(s->ops->mpu_part(s, "o", id2, &small[0], fd), 0);
    cr_assert_eq(s->ops->mpu_part(s, "o", id2, &small[1], fd), 0);
    cr_assert_eq(s->ops->mpu_complete(s, "o", id2, small, 2, 200, etag), -EINVAL);
    mem_store_set_min_part(m, 0);
    cr_assert_eq(s->ops->mpu_abort(s, "o", id2), 0);
    cr_assert_eq(s->ops->mpu_abort(s, "o", id2), 0, "gone already: not an error");
    cr_assert_eq(mem_store_uploads_in_progress(m), 0);
    cr_assert_eq(s->ops->mpu_complete(s, "o", id2, small, 2, 200, etag), -ENOENT);
    check_pattern("o", len);
    cr_assert_eq(atomic_load(&s->counters.part_requests), 7);
    cr_assert_eq(atomic_load(&s->counters.complete_requests), 7);
    cr_assert_eq(atomic_load(&s->counters.abort_requests), 2);
    close(fd);
}

Test(mem_store, injected_failures)
{
    int fd = staging(100);
    char etag[STORE_ETAG_MAX];
    mem_store_fail(m, MEM_OP_PUT, -EIO, 2);
    cr_assert_eq(s->ops->put(s, "a", fd, 100, etag), -EIO);
    cr_assert_eq(s->ops->put(s, "a", fd, 100, etag), -EIO);
    cr_assert_null(mem_store_get(m, "a", &(size_t){0}), "a failed put writes nothing");
    cr_assert_eq(s->ops->put(s, "a", fd, 100, etag), 0, "only the next 2 fail");
    mem_store_fail(m, MEM_OP_ALL, -ETIMEDOUT, -1);
    struct store_stat st;
    for (int i = 0; i < 3; i++)
        cr_assert_eq(s->ops->stat(s, "a", &st), -ETIMEDOUT);
    mem_store_fail(m, MEM_OP_ALL, 0, 0);
    cr_assert_eq(s->ops->stat(s, "a", &st), 0);
    /* A completion whose answer is lost took effect; its retry succeeds. */
    mem_store_set_min_part(m, 0);
    char id[STORE_UPLOAD_ID_MAX];
    struct store_part p = {.number = 1, .offset = 0, .length = 100};
    cr_assert_eq(s->ops->mpu_begin(s, "b", id), 0);
    cr_assert_eq(s->ops->mpu_part(s, "b", id, &p, fd), 0);
    mem_store_lose_answer(m, MEM_OP_MPU_COMPLETE, -ECONNRESET, 1);
    cr_assert_eq(s->ops->mpu_complete(s, "b", id, &p, 1, 100, etag), -ECONNRESET);
    check_pattern("b", 100);
    cr_assert_eq(s->ops->mpu_complete(s, "b", id, &p, 1, 100, etag), 0);
    cr_assert_eq(mem_store_calls(m, MEM_OP_PUT), 3);
    cr_assert_eq(mem_store_calls(m, MEM_OP_STAT), 4);
    cr_assert_eq(mem_store_calls(m, MEM_OP_MPU_COMPLETE), 2);
    cr_assert_eq(atomic_load(&s->counters.errors), 6);
    close(fd);
}

/* The hook runs before each op, unlocked: it can look at the store. Here it
 * records, for each put of "meta", whether "data" was already complete. */
struct order {
    int calls;
    int data_before_meta;
    enum mem_op first;
};

static void hook(void *arg, const struct mem_call *c)
{
    struct order *o = arg;
    if (o->calls++ == 0)
        o->first = c->op;
    if (c->op == MEM_OP_PUT && strcmp(c->path, "meta") == 0) {
        size_t n;
        void *d = mem_store_get(m, "data", &n);
        o->data_before_meta = d != NULL;
        free(d);
    }
}

Test(mem_store, hook_sees_calls_in_order)
{
    int fd = staging(10);
    char etag[STORE_ETAG_MAX];
    struct order o = {0};
    mem_store_set_hook(m, hook, &o);
    cr_assert_eq(s->ops->put(s, "meta", fd, 10, etag), 0);
    cr_assert_eq(o.data_before_meta, 0);
    cr_assert_eq(s->ops->put(s, "data", fd, 10, etag), 0);
    cr_assert_eq(s->ops->put(s, "meta", fd, 10, etag), 0);
    cr_assert_eq(o.data_before_meta, 1);
    cr_assert_eq(o.first, MEM_OP_PUT);
    cr_assert_eq(o.calls, 3);
    mem_store_set_hook(m, NULL, NULL);
    cr_assert_eq(s->ops->remove(s, "meta"), 0);
    cr_assert_eq(o.calls, 3);
    close(fd);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void *stat_thread(void *arg)
{
    (void)arg;
    struct store_stat st;
    s->ops->stat(s, "", &st);
    return NULL;
}

Test(mem_store, delays_overlap)
{
    mem_store_delay(m, MEM_OP_STAT, 200 * 1000);
    double t0 = now();
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, stat_thread, NULL);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    double dt = now() - t0;
    cr_assert_geq(dt, 0.2, "delayed: %.3f s", dt);
    cr_assert_lt(dt, 0.6, "four delayed calls run in parallel: %.3f s", dt);
    mem_store_delay(m, MEM_OP_STAT, 0);
    t0 = now();
    stat_thread(NULL);
    cr_assert_lt(now() - t0, 0.1);
}
