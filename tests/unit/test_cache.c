/* tests/unit/test_cache.c - block cache: exact bytes, hits, shared fetches,
 * eviction bounds, background prefetch and error propagation, against an
 * in-memory store that counts and can delay or fail reads. */
#include "cache.h"
#include "workq.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KiB 1024u
#define OBJ_SIZE (10 * 64 * KiB + 123) /* ten 64 KiB blocks and a short one */

struct mem_store {
    struct store base;
    unsigned char *data;
    size_t size;
    atomic_int fail_with; /* negative errno to return, 0 = succeed */
    atomic_int delay_ms;
    atomic_int max_len_seen;
};

static unsigned char byte_at(size_t i)
{
    return (unsigned char)((i * 2654435761u) >> 13);
}

static int mem_read(struct store *s, const char *path, const char *etag, uint64_t off, size_t len,
                    void *buf, size_t *nread)
{
    struct mem_store *m = (struct mem_store *)s;
    (void)path;
    (void)etag;
    atomic_fetch_add(&s->counters.get_requests, 1);
    if (atomic_load(&m->delay_ms))
        usleep(1000 * atomic_load(&m->delay_ms));
    if (atomic_load(&m->fail_with))
        return atomic_load(&m->fail_with);
    if ((int)len > atomic_load(&m->max_len_seen))
        atomic_store(&m->max_len_seen, (int)len);
    size_t n = off >= m->size ? 0 : (m->size - off < len ? m->size - off : len);
    memcpy(buf, m->data + off, n);
    *nread = n;
    atomic_fetch_add(&s->counters.get_bytes, n);
    return 0;
}

static const struct store_ops mem_ops = {.scheme = "mem", .read = mem_read};

static struct mem_store store;
static struct workq *wq;
static struct cache *cache;
static struct cache_obj *obj;

static void setup_with(uint64_t capacity)
{
    memset(&store, 0, sizeof store);
    store.base.ops = &mem_ops;
    store.size = OBJ_SIZE;
    store.data = malloc(OBJ_SIZE);
    for (size_t i = 0; i < OBJ_SIZE; i++)
        store.data[i] = byte_at(i);
    cr_assert_eq(workq_create(4, &wq), 0);
    struct cache_config cfg = {
        .capacity = capacity, .block_size = 64 * KiB, .request_size = 256 * KiB};
    cr_assert_eq(cache_create(&store.base, wq, &cfg, &cache), 0);
    obj = cache_obj_get(cache, "obj", "etag1", OBJ_SIZE, NULL);
    cr_assert_not_null(obj);
}

static void setup(void)
{
    setup_with(4096 * KiB);
}

static void teardown(void)
{
    cache_obj_put(cache, obj);
    workq_destroy(wq);
    cache_destroy(cache);
    free(store.data);
}

static uint64_t requests(void)
{
    return atomic_load(&store.base.counters.get_requests);
}

static void check_range(uint64_t off, size_t len)
{
    unsigned char *buf = malloc(len + 1);
    ssize_t n = cache_read(cache, obj, off, len, buf);
    size_t want = off >= OBJ_SIZE ? 0 : (OBJ_SIZE - off < len ? OBJ_SIZE - off : len);
    cr_assert_eq(n, (ssize_t)want, "read(%llu, %zu) returned %zd", (unsigned long long)off, len, n);
    for (size_t i = 0; i < want; i++)
        cr_assert_eq(buf[i], byte_at(off + i), "byte %llu differs", (unsigned long long)(off + i));
    free(buf);
}

static void wait_prefetch_idle(void)
{
    struct cache_stats st;
    for (int i = 0; i < 2000; i++) {
        cache_get_stats(cache, &st);
        if (workq_pending(wq) == 0 && requests() >= 1 && i > 5)
            break;
        usleep(1000);
    }
    usleep(20000);
}

Test(cache, exact_bytes_across_blocks_and_eof, .init = setup, .fini = teardown)
{
    check_range(0, 1);
    check_range(0, 64 * KiB);
    check_range(64 * KiB - 1, 2);
    check_range(100, 300 * KiB);
    check_range(OBJ_SIZE - 1, 1);
    check_range(OBJ_SIZE - 10, 100); /* clamped at EOF */
    check_range(OBJ_SIZE, 10);       /* at EOF: 0 bytes */
    check_range(OBJ_SIZE + 5000, 10);
    check_range(0, OBJ_SIZE);
}

Test(cache, second_read_is_served_from_memory, .init = setup, .fini = teardown)
{
    check_range(0, 200 * KiB);
    uint64_t before = requests();
    check_range(10, 150 * KiB);
    cr_assert_eq(requests(), before);
    struct cache_stats st;
    cache_get_stats(cache, &st);
    cr_assert_geq(st.hits, 3);
}

Test(cache, miss_fetches_one_request_per_run, .init = setup, .fini = teardown)
{
    check_range(0, 5 * 64 * KiB);
    cr_assert_eq(requests(), 1, "5 missing blocks should be one GET, not %llu",
                 (unsigned long long)requests());
}

static void *reader_thread(void *arg)
{
    (void)arg;
    check_range(64 * KiB, 64 * KiB);
    return NULL;
}

Test(cache, concurrent_readers_share_one_fetch, .init = setup, .fini = teardown)
{
    atomic_store(&store.delay_ms, 100);
    pthread_t t[8];
    for (int i = 0; i < 8; i++)
        pthread_create(&t[i], NULL, reader_thread, NULL);
    for (int i = 0; i < 8; i++)
        pthread_join(t[i], NULL);
    cr_assert_eq(requests(), 1, "8 readers of one block made %llu requests",
                 (unsigned long long)requests());
    struct cache_stats st;
    cache_get_stats(cache, &st);
    cr_assert_eq(st.shared + st.hits + st.misses, 8);
}

Test(cache, stays_within_capacity)
{
    setup_with(4 * 64 * KiB);
    for (int round = 0; round < 3; round++)
        for (uint64_t off = 0; off < OBJ_SIZE; off += 64 * KiB) {
            check_range(off, 64 * KiB);
            struct cache_stats st;
            cache_get_stats(cache, &st);
            cr_assert_leq(st.bytes_cached, 4 * 64 * KiB);
        }
    struct cache_stats st;
    cache_get_stats(cache, &st);
    cr_assert_gt(st.evictions, 0);
    teardown();
}

Test(cache, prefetch_fetches_ahead_in_request_sized_gets, .init = setup, .fini = teardown)
{
    uint64_t n = cache_prefetch(cache, obj, 0, OBJ_SIZE);
    cr_assert_eq(n, OBJ_SIZE);
    wait_prefetch_idle();
    cr_assert_eq(requests(), 3, "11 blocks in 4-block requests = 3 GETs, got %llu",
                 (unsigned long long)requests());
    cr_assert_eq(atomic_load(&store.max_len_seen), 256 * KiB);
    uint64_t before = requests();
    check_range(0, OBJ_SIZE);
    cr_assert_eq(requests(), before, "prefetched data was fetched again");
    /* Prefetching what is cached schedules nothing. */
    cr_assert_eq(cache_prefetch(cache, obj, 0, OBJ_SIZE), 0);
}

Test(cache, prefetch_respects_capacity)
{
    setup_with(4 * 64 * KiB);
    uint64_t n = cache_prefetch(cache, obj, 0, OBJ_SIZE);
    cr_assert_leq(n, 4 * 64 * KiB);
    wait_prefetch_idle();
    struct cache_stats st;
    cache_get_stats(cache, &st);
    cr_assert_leq(st.bytes_cached, 4 * 64 * KiB);
    teardown();
}

Test(cache, store_error_reaches_reader_and_is_not_cached, .init = setup, .fini = teardown)
{
    atomic_store(&store.fail_with, -EIO);
    char buf[16];
    cr_assert_eq(cache_read(cache, obj, 0, sizeof buf, buf), -EIO);
    atomic_store(&store.fail_with, -ESTALE);
    cr_assert_eq(cache_read(cache, obj, 0, sizeof buf, buf), -ESTALE);
    atomic_store(&store.fail_with, 0);
    check_range(0, sizeof buf);
    struct cache_stats st;
    cache_get_stats(cache, &st);
    cr_assert_eq(st.fetch_errors, 2);
    cr_assert_eq(st.bytes_cached, 64 * KiB);
}

Test(cache, failed_prefetch_lets_reader_retry, .init = setup, .fini = teardown)
{
    atomic_store(&store.fail_with, -EIO);
    cache_prefetch(cache, obj, 0, 256 * KiB);
    wait_prefetch_idle();
    atomic_store(&store.fail_with, 0);
    check_range(0, 256 * KiB);
}

Test(cache, objects_are_shared_by_version, .init = setup, .fini = teardown)
{
    int was;
    struct cache_obj *same = cache_obj_get(cache, "obj", "etag1", OBJ_SIZE, &was);
    cr_assert_eq(same, obj);
    cr_assert_eq(was, 1);
    struct cache_obj *other = cache_obj_get(cache, "obj", "etag2", OBJ_SIZE, &was);
    cr_assert_neq(other, obj);
    cr_assert_eq(was, 0);
    cache_obj_put(cache, same);
    cache_obj_put(cache, other);
}
