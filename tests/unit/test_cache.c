/* tests/unit/test_cache.c - block cache: exact bytes, hits, shared fetches,
 * eviction bounds, background prefetch and error propagation, against the
 * in-memory test store (mem_store.h), with its reads delayed or failed. */
#include "cache.h"
#include "mem_store.h"
#include "workq.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KiB 1024u
#define OBJ_SIZE (10 * 64 * KiB + 123) /* ten 64 KiB blocks and a short one */

static unsigned char byte_at(size_t i)
{
    return (unsigned char)((i * 2654435761u) >> 13);
}

static struct mem_store *store;
static char etag[STORE_ETAG_MAX]; /* the object's version in the store */
static atomic_int max_len_seen;   /* longest read the cache asked for */
static struct workq *wq;
static struct cache *cache;
static struct cache_obj *obj;

static void note_read_len(void *arg, const struct mem_call *c)
{
    (void)arg;
    if (c->op == MEM_OP_READ && (int)c->len > atomic_load(&max_len_seen))
        atomic_store(&max_len_seen, (int)c->len);
}

static void setup_cfg(uint64_t capacity, uint32_t request, uint64_t working_set);

/* A cache whose working set is all of it: eviction by capacity alone. */
static void setup_with(uint64_t capacity)
{
    setup_cfg(capacity, 256 * KiB, capacity);
}

static void setup_with_request(uint64_t capacity, uint32_t request)
{
    setup_cfg(capacity, request, capacity);
}

static void setup_cfg(uint64_t capacity, uint32_t request, uint64_t working_set)
{
    store = mem_store_new();
    unsigned char *data = malloc(OBJ_SIZE);
    cr_assert_not_null(data);
    for (size_t i = 0; i < OBJ_SIZE; i++)
        data[i] = byte_at(i);
    cr_assert_eq(mem_store_set(store, "obj", data, OBJ_SIZE, etag), 0);
    free(data);
    atomic_store(&max_len_seen, 0);
    mem_store_set_hook(store, note_read_len, NULL);
    cr_assert_eq(workq_create(4, &wq), 0);
    struct cache_config cfg = {.capacity = capacity,
                               .block_size = 64 * KiB,
                               .request_size = request,
                               .working_set = working_set};
    cr_assert_eq(cache_create(mem_store_base(store), wq, &cfg, &cache), 0);
    obj = cache_obj_get(cache, "obj", etag, OBJ_SIZE, NULL);
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
    mem_store_free(store);
}

static uint64_t requests(void)
{
    return atomic_load(&mem_store_base(store)->counters.get_requests);
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

Test(cache, a_version_only_prefetched_is_not_reported_cached, .init = setup, .fini = teardown)
{
    /* The kernel may keep its pages of an object only if a handle opened that
     * version before: a background reference does not count as one. */
    static unsigned char other[64 * KiB];
    char e1[STORE_ETAG_MAX];
    cr_assert_eq(mem_store_set(store, "other", other, sizeof other, e1), 0);
    int opened = -1, was_cached = -1;
    struct cache_obj *ref = cache_obj_ref(cache, "other", e1, sizeof other, &opened);
    cr_assert_not_null(ref);
    cr_assert_eq(opened, 0);
    cr_assert_eq(cache_prefetch(cache, ref, 0, 64 * KiB), 64 * KiB);
    struct cache_obj *o = cache_obj_get(cache, "other", e1, sizeof other, &was_cached);
    cr_assert_eq(o, ref, "one object per version");
    cr_assert_eq(was_cached, 0, "only prefetched so far");
    cache_obj_unref(cache, ref);
    cache_obj_put(cache, o);
    ref = cache_obj_ref(cache, "other", e1, sizeof other, &opened);
    cr_assert_eq(opened, 1, "opened once now (its prefetched blocks keep it)");
    cache_obj_unref(cache, ref);
    o = cache_obj_get(cache, "other", e1, sizeof other, &was_cached);
    cr_assert_eq(was_cached, 1);
    cache_obj_put(cache, o);
    wait_prefetch_idle();
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
    mem_store_delay(store, MEM_OP_READ, 100 * 1000);
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
    cr_assert_eq(atomic_load(&max_len_seen), 256 * KiB);
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

Test(cache, prefetched_bytes_never_read_are_counted_when_dropped)
{
    setup_with(4 * 64 * KiB);
    cr_assert_eq(cache_prefetch(cache, obj, 0, 4 * 64 * KiB), 4 * 64 * KiB);
    wait_prefetch_idle();
    check_range(0, 1); /* touches block 0 only */
    struct cache_stats st;
    cache_get_stats(cache, &st);
    cr_assert_eq(st.prefetched_bytes, 4 * 64 * KiB);
    cr_assert_eq(st.prefetch_unread_bytes, 3 * 64 * KiB);
    cr_assert_eq(st.prefetch_unused_bytes, 0);
    /* Its reader closes it, and reading another object evicts all four:
     * three of them were never read. */
    cache_obj_put(cache, obj);
    unsigned char other[4 * 64 * KiB];
    memset(other, 1, sizeof other);
    char other_etag[STORE_ETAG_MAX];
    cr_assert_eq(mem_store_set(store, "other", other, sizeof other, other_etag), 0);
    obj = cache_obj_get(cache, "other", other_etag, sizeof other, NULL);
    cr_assert_eq(cache_read(cache, obj, 0, sizeof other, other), (ssize_t)sizeof other);
    cache_get_stats(cache, &st);
    cr_assert_eq(st.prefetch_unused_bytes, 3 * 64 * KiB, "unused %llu",
                 (unsigned long long)st.prefetch_unused_bytes);
    cr_assert_eq(st.prefetch_unread_bytes, 0);
    teardown();
}

Test(cache, store_error_reaches_reader_and_is_not_cached, .init = setup, .fini = teardown)
{
    mem_store_fail(store, MEM_OP_READ, -EIO, -1);
    char buf[16];
    cr_assert_eq(cache_read(cache, obj, 0, sizeof buf, buf), -EIO);
    mem_store_fail(store, MEM_OP_READ, -ESTALE, -1);
    cr_assert_eq(cache_read(cache, obj, 0, sizeof buf, buf), -ESTALE);
    mem_store_fail(store, MEM_OP_READ, 0, 0);
    check_range(0, sizeof buf);
    struct cache_stats st;
    cache_get_stats(cache, &st);
    cr_assert_eq(st.fetch_errors, 2);
    cr_assert_eq(st.bytes_cached, 64 * KiB);
}

/* Waits (up to 5 s) until n fetches have failed: done, not just dequeued. */
static void wait_fetch_errors(uint64_t n)
{
    struct cache_stats st;
    for (int i = 0; i < 5000; i++) {
        cache_get_stats(cache, &st);
        if (st.fetch_errors >= n)
            return;
        usleep(1000);
    }
    cr_assert_fail("%llu fetch errors after 5 s, want %llu", (unsigned long long)st.fetch_errors,
                   (unsigned long long)n);
}

Test(cache, failed_prefetch_lets_reader_retry, .init = setup, .fini = teardown)
{
    mem_store_fail(store, MEM_OP_READ, -EIO, -1);
    cr_assert_eq(cache_prefetch(cache, obj, 0, 256 * KiB), 256 * KiB);
    wait_fetch_errors(1); /* one 4-block request, failed */
    cr_assert_eq(mem_store_calls(store, MEM_OP_READ), 1);
    struct cache_stats st;
    cache_get_stats(cache, &st);
    cr_assert_eq(st.fetch_errors, 1);
    cr_assert_eq(st.bytes_cached, 0, "a failed fetch leaves no blocks");
    /* The store answers again: the reader fetches the blocks itself, exactly. */
    mem_store_fail(store, MEM_OP_READ, 0, 0);
    check_range(0, 256 * KiB);
    cr_assert_eq(mem_store_calls(store, MEM_OP_READ), 2);
    cache_get_stats(cache, &st);
    cr_assert_eq(st.fetch_errors, 1);
    cr_assert_eq(st.misses, 4);
}

Test(cache, timed_out_blocks_fail_at_once_for_a_while, .init = setup, .fini = teardown)
{
    mem_store_fail(store, MEM_OP_READ, -ETIMEDOUT, -1);
    char buf[16];
    cr_assert_eq(cache_read(cache, obj, 0, sizeof buf, buf), -ETIMEDOUT);
    cr_assert_eq(mem_store_calls(store, MEM_OP_READ), 1);
    /* As the kernel does after a failed readahead: read again at once. */
    mem_store_fail(store, MEM_OP_READ, 0, 0);
    cr_assert_eq(cache_read(cache, obj, 0, sizeof buf, buf), -ETIMEDOUT);
    cr_assert_eq(cache_prefetch(cache, obj, 0, 64 * KiB), 0, "no prefetch of a timed-out block");
    cr_assert_eq(mem_store_calls(store, MEM_OP_READ), 1, "no second request within the linger");
    struct cache_stats st;
    cache_get_stats(cache, &st);
    cr_assert_eq(st.failed_fast, 1);
    /* The linger lapses: the block is fetched again. */
    usleep((CACHE_TIMEOUT_LINGER_MS + 100) * 1000);
    check_range(0, sizeof buf);
}

Test(cache, an_answer_forgets_the_objects_timeouts, .init = setup, .fini = teardown)
{
    mem_store_fail(store, MEM_OP_READ, -ETIMEDOUT, 1);
    char buf[16];
    cr_assert_eq(cache_read(cache, obj, 0, sizeof buf, buf), -ETIMEDOUT);
    check_range(128 * KiB, sizeof buf); /* the store answers for this object */
    check_range(0, sizeof buf);         /* so block 0 is fetched again at once */
    cr_assert_eq(mem_store_calls(store, MEM_OP_READ), 3);
}

Test(cache, other_errors_are_not_remembered, .init = setup, .fini = teardown)
{
    mem_store_fail(store, MEM_OP_READ, -EIO, 1);
    char buf[16];
    cr_assert_eq(cache_read(cache, obj, 0, sizeof buf, buf), -EIO);
    check_range(0, sizeof buf);
    cr_assert_eq(mem_store_calls(store, MEM_OP_READ), 2);
}

Test(cache, blocks_are_ready_as_their_bytes_arrive, .init = setup, .fini = teardown)
{
    /* a block every 500 ms: the reader of the first has 1.5 s to wake before the GET
     * ends, also on a loaded 2-core CI machine (200 ms failed there once) */
    mem_store_stream(store, 64 * KiB, 500 * 1000, 0, 0);
    cr_assert_eq(cache_prefetch(cache, obj, 0, 256 * KiB), 256 * KiB); /* one 4-block GET */
    check_range(0, 64 * KiB);
    struct cache_stats st;
    cache_get_stats(cache, &st);
    cr_assert_lt(st.prefetched_bytes, 256 * KiB, "the reader waited for the whole GET");
    check_range(0, 256 * KiB);
    cr_assert_eq(mem_store_calls(store, MEM_OP_READ), 1);
}

Test(cache, a_fetch_failing_midway_keeps_the_blocks_that_arrived, .init = setup, .fini = teardown)
{
    mem_store_stream(store, 64 * KiB, 0, 128 * KiB + 100, -EIO);
    cr_assert_eq(cache_prefetch(cache, obj, 0, 256 * KiB), 256 * KiB);
    wait_fetch_errors(1);
    struct cache_stats st;
    cache_get_stats(cache, &st);
    cr_assert_eq(st.bytes_cached, 128 * KiB, "the two whole blocks stay, the rest fails");
    mem_store_stream(store, 0, 0, 0, 0);
    check_range(0, 128 * KiB);
    cr_assert_eq(mem_store_calls(store, MEM_OP_READ), 1, "kept blocks are not fetched again");
    check_range(128 * KiB, 128 * KiB);
    cr_assert_eq(mem_store_calls(store, MEM_OP_READ), 2);
}

Test(cache, objects_are_shared_by_version, .init = setup, .fini = teardown)
{
    int was;
    struct cache_obj *same = cache_obj_get(cache, "obj", etag, OBJ_SIZE, &was);
    cr_assert_eq(same, obj);
    cr_assert_eq(was, 1);
    struct cache_obj *other = cache_obj_get(cache, "obj", "etag2", OBJ_SIZE, &was);
    cr_assert_neq(other, obj);
    cr_assert_eq(was, 0);
    cache_obj_put(cache, same);
    cache_obj_put(cache, other);
}

Test(cache, prefetch_does_not_evict_unread_prefetched_blocks)
{
    setup_with(4 * 64 * KiB);
    cr_assert_eq(cache_prefetch(cache, obj, 0, 4 * 64 * KiB), 4 * 64 * KiB);
    wait_prefetch_idle();
    /* The cache is full of prefetched blocks nobody read yet: prefetching
     * more would throw them away before their reader comes. */
    cr_assert_eq(cache_prefetch(cache, obj, 4 * 64 * KiB, 4 * 64 * KiB), 0);
    uint64_t before = requests();
    check_range(0, 4 * 64 * KiB);
    cr_assert_eq(requests(), before, "prefetched blocks were evicted before use");
    struct cache_stats st;
    cache_get_stats(cache, &st);
    cr_assert_eq(st.evictions, 0);
    cr_assert_gt(st.prefetch_skipped, 0);
    /* Once read, they may go to make room for the next prefetch. */
    cr_assert_eq(cache_prefetch(cache, obj, 4 * 64 * KiB, 4 * 64 * KiB), 4 * 64 * KiB);
    wait_prefetch_idle();
    check_range(4 * 64 * KiB, 4 * 64 * KiB);
    teardown();
}

Test(cache, a_demand_read_does_not_evict_prefetched_blocks_awaiting_their_reader)
{
    /* Two streams under pressure: the first's prefetched blocks fill the
     * cache, the second reads on demand (its own prefetch was skipped). */
    setup_with(4 * 64 * KiB);
    cr_assert_eq(cache_prefetch(cache, obj, 0, 4 * 64 * KiB), 4 * 64 * KiB);
    wait_prefetch_idle();
    unsigned char data[4 * 64 * KiB];
    memset(data, 2, sizeof data);
    char e[STORE_ETAG_MAX];
    cr_assert_eq(mem_store_set(store, "second", data, sizeof data, e), 0);
    struct cache_obj *second = cache_obj_get(cache, "second", e, sizeof data, NULL);
    for (uint64_t off = 0; off < sizeof data; off += 64 * KiB)
        cr_assert_eq(cache_read(cache, second, off, 64 * KiB, data), 64 * KiB);
    /* The first stream still finds every block it was promised. */
    uint64_t before = requests();
    check_range(0, 4 * 64 * KiB);
    cr_assert_eq(requests(), before, "a demand read evicted blocks another stream was to read");
    struct cache_stats st;
    cache_get_stats(cache, &st);
    cr_assert_eq(st.evicted_unread, 0);
    cr_assert_eq(st.prefetch_unused_bytes, 0);
    /* The second stream's blocks went over the capacity by one block at a
     * time: each read evicted the one before it, which was read. */
    cr_assert_leq(st.bytes_cached, 5 * 64 * KiB);
    cr_assert_geq(st.evictions, 3);
    cache_obj_put(cache, second);
    teardown();
}

Test(cache, blocks_are_not_evicted_when_their_buffer_stays, .timeout = 30)
{
    /* One 4-block GET: once its first block is read, evicting it frees no
     * memory (the three unread blocks keep the buffer), so a prefetch that
     * cannot fit anyway must not throw it away. */
    setup_with(4 * 64 * KiB);
    cr_assert_eq(cache_prefetch(cache, obj, 0, 4 * 64 * KiB), 4 * 64 * KiB);
    wait_prefetch_idle();
    check_range(0, 64 * KiB);
    cr_assert_eq(cache_prefetch(cache, obj, 4 * 64 * KiB, 64 * KiB), 0);
    struct cache_stats st;
    cache_get_stats(cache, &st);
    cr_assert_eq(st.evictions, 0, "evicted a block whose buffer stayed");
    uint64_t before = requests();
    check_range(0, 64 * KiB); /* a re-read right behind the reader */
    cr_assert_eq(requests(), before);
    /* Read whole, the buffer can go, and the prefetch gets its room. */
    check_range(64 * KiB, 3 * 64 * KiB);
    cr_assert_eq(cache_prefetch(cache, obj, 4 * 64 * KiB, 64 * KiB), 64 * KiB);
    wait_prefetch_idle();
    cache_get_stats(cache, &st);
    cr_assert_eq(st.evictions, 4);
    cr_assert_leq(st.buffer_bytes, 4 * 64 * KiB);
    teardown();
}

Test(cache, unread_prefetched_blocks_of_a_closed_version_make_room)
{
    setup_with(4 * 64 * KiB);
    cr_assert_eq(cache_prefetch(cache, obj, 0, 4 * 64 * KiB), 4 * 64 * KiB);
    wait_prefetch_idle();
    /* Its reader closed it (or it was replaced): nobody reads those blocks
     * any more, and they must not hold the next prefetch off. */
    cache_obj_put(cache, obj);
    char other_etag[STORE_ETAG_MAX];
    cr_assert_eq(mem_store_set(store, "other", "0123456789", 10, other_etag), 0);
    obj = cache_obj_get(cache, "other", other_etag, 10, NULL);
    cr_assert_not_null(obj);
    cr_assert_eq(cache_prefetch(cache, obj, 0, 10), 10,
                 "a closed version's unread blocks starved the prefetch");
    wait_prefetch_idle();
    teardown();
}

Test(cache, unread_prefetched_blocks_of_a_version_not_opened_yet_wait_for_it)
{
    setup_with(4 * 64 * KiB);
    /* A sibling chunk for a rank that has not opened its file yet. */
    unsigned char *data = malloc(8 * 64 * KiB);
    memset(data, 7, 8 * 64 * KiB);
    char sib_etag[STORE_ETAG_MAX];
    cr_assert_eq(mem_store_set(store, "sibling", data, 8 * 64 * KiB, sib_etag), 0);
    free(data);
    int opened = -1;
    struct cache_obj *sib = cache_obj_ref(cache, "sibling", sib_etag, 8 * 64 * KiB, &opened);
    cr_assert_not_null(sib);
    cr_assert_eq(opened, 0);
    cr_assert_eq(cache_prefetch(cache, sib, 0, 4 * 64 * KiB), 4 * 64 * KiB);
    wait_prefetch_idle();
    cr_assert_eq(cache_prefetch(cache, sib, 4 * 64 * KiB, 4 * 64 * KiB), 0,
                 "evicted what a rank about to open the file will read");
    cache_obj_unref(cache, sib);
    teardown();
}

Test(cache, blocks_kept_hot_do_not_keep_their_whole_fetch_buffers, .timeout = 60)
{
    /* A block keeps the buffer of the GET that fetched it: a small hot set
     * spread over many GETs must not hold capacity x (request / block). */
    const uint64_t region = 8u << 20, size = 8 * region;
    struct mem_store *m = mem_store_new();
    unsigned char *data = calloc(1, size);
    char e[STORE_ETAG_MAX];
    cr_assert_eq(mem_store_set(m, "big", data, size, e), 0);
    struct workq *q;
    struct cache *c;
    cr_assert_eq(workq_create(2, &q), 0);
    struct cache_config cfg = {
        .capacity = 16u << 20, .block_size = 64 * KiB, .request_size = (uint32_t)region};
    cr_assert_eq(cache_create(mem_store_base(m), q, &cfg, &c), 0);
    struct cache_obj *o = cache_obj_get(c, "big", e, size, NULL);
    uint64_t most = 0;
    for (uint64_t k = 0; k < 8; k++) {
        cr_assert_eq(cache_read(c, o, k * region, region, data), (ssize_t)region);
        for (uint64_t j = 0; j <= k; j++) /* the first block of each region stays hot */
            cr_assert_eq(cache_read(c, o, j * region, 4096, data), 4096);
        struct cache_stats st;
        cache_get_stats(c, &st);
        if (st.buffer_bytes > most)
            most = st.buffer_bytes;
    }
    cr_assert_leq(most, cfg.capacity + region, "fetch buffers held %llu MiB for a %llu MiB cache",
                  (unsigned long long)(most >> 20), (unsigned long long)(cfg.capacity >> 20));
    cache_obj_put(c, o);
    workq_destroy(q);
    cache_destroy(c);
    mem_store_free(m);
    free(data);
}

Test(cache, prefetch_split_uses_smaller_requests, .init = setup, .fini = teardown)
{
    cr_assert_eq(cache_prefetch_split(cache, obj, 0, 4 * 64 * KiB, 64 * KiB), 4 * 64 * KiB);
    wait_prefetch_idle();
    cr_assert_eq(requests(), 4, "4 blocks in 1-block requests = 4 GETs, got %llu",
                 (unsigned long long)requests());
    cr_assert_eq(atomic_load(&max_len_seen), 64 * KiB);
    /* Never larger than request_size. */
    cr_assert_eq(cache_prefetch_split(cache, obj, 4 * 64 * KiB, OBJ_SIZE, 1u << 30),
                 OBJ_SIZE - 4 * 64 * KiB);
    wait_prefetch_idle();
    cr_assert_eq(atomic_load(&max_len_seen), 256 * KiB);
}

Test(cache, a_range_an_eighth_over_the_request_is_one_get)
{
    /* 8-block requests: a 9-block range (an item a little over the request
     * size) is one GET of 9 blocks, not 8 and a tail of 1. */
    setup_with_request(4096 * KiB, 8 * 64 * KiB);
    cr_assert_eq(cache_prefetch(cache, obj, 0, 9 * 64 * KiB), 9 * 64 * KiB);
    wait_prefetch_idle();
    cr_assert_eq(requests(), 1, "9 blocks: %llu GETs", (unsigned long long)requests());
    cr_assert_eq(atomic_load(&max_len_seen), 9 * 64 * KiB);
    check_range(0, 9 * 64 * KiB);
    teardown();
}

Test(cache, a_longer_tail_is_a_get_of_its_own)
{
    setup_with_request(4096 * KiB, 8 * 64 * KiB);
    cr_assert_eq(cache_prefetch(cache, obj, 0, 10 * 64 * KiB), 10 * 64 * KiB);
    for (int i = 0; i < 2000 && (requests() < 2 || workq_pending(wq)); i++)
        usleep(1000);
    usleep(20000);
    cr_assert_eq(requests(), 2, "10 blocks: %llu GETs", (unsigned long long)requests());
    cr_assert_eq(atomic_load(&max_len_seen), 8 * 64 * KiB);
    check_range(0, 10 * 64 * KiB);
    teardown();
}

/* Wait (at most 5 s) until background fetches have brought bytes in all. */
static void wait_prefetched(uint64_t bytes)
{
    struct cache_stats st;
    cache_get_stats(cache, &st);
    for (int i = 0; i < 5000 && st.prefetched_bytes < bytes; i++) {
        usleep(1000);
        cache_get_stats(cache, &st);
    }
    cr_assert_geq(st.prefetched_bytes, bytes, "background fetches did not land");
}

/* A store object of n 64 KiB blocks, opened in the cache. */
static struct cache_obj *big_obj(const char *name, size_t n)
{
    unsigned char *data = calloc(n, 64 * KiB);
    char e[STORE_ETAG_MAX];
    cr_assert_eq(mem_store_set(store, name, data, n * 64 * KiB, e), 0);
    free(data);
    struct cache_obj *o = cache_obj_get(cache, name, e, n * 64 * KiB, NULL);
    cr_assert_not_null(o);
    return o;
}

Test(cache, reads_beyond_the_working_set_reuse_the_buffers_of_read_blocks)
{
    /* 4 MiB cache, 1 MiB working set: a 3 MiB read in 256 KiB GETs keeps about
     * the working set and refills its buffers instead of mapping fresh ones. */
    setup_cfg(4096 * KiB, 256 * KiB, 1024 * KiB);
    struct cache_obj *o = big_obj("big", 48);
    unsigned char *buf = malloc(256 * KiB);
    for (uint64_t off = 0; off < 48 * 64 * KiB; off += 256 * KiB)
        cr_assert_eq(cache_read(cache, o, off, 256 * KiB, buf), (ssize_t)(256 * KiB));
    free(buf);
    struct cache_stats st;
    cache_get_stats(cache, &st);
    cr_assert_gt(st.recycled, 0);
    cr_assert_eq(st.evictions, 0, "nothing had to go for the capacity");
    cr_assert_leq(st.bytes_cached, 1024 * KiB + 256 * KiB, "held %llu KiB",
                  (unsigned long long)(st.bytes_cached / KiB));
    cr_assert_geq(st.buffers_reused, 6, "mapped %llu, reused %llu",
                  (unsigned long long)st.buffers_mapped, (unsigned long long)st.buffers_reused);
    cache_obj_put(cache, o);
    teardown();
}

Test(cache, unread_prefetched_blocks_are_not_recycled)
{
    setup_cfg(4096 * KiB, 256 * KiB, 1024 * KiB);
    struct cache_obj *a = big_obj("a", 16), *b = big_obj("b", 32);
    cr_assert_eq(cache_prefetch(cache, a, 0, 16 * 64 * KiB), 16 * 64 * KiB);
    wait_prefetched(16 * 64 * KiB);
    unsigned char *buf = malloc(256 * KiB);
    for (uint64_t off = 0; off < 32 * 64 * KiB; off += 256 * KiB)
        cr_assert_eq(cache_read(cache, b, off, 256 * KiB, buf), (ssize_t)(256 * KiB));
    uint64_t before = requests();
    for (uint64_t off = 0; off < 16 * 64 * KiB; off += 256 * KiB)
        cr_assert_eq(cache_read(cache, a, off, 256 * KiB, buf), (ssize_t)(256 * KiB));
    cr_assert_eq(requests(), before, "a prefetched block was recycled before its reader came");
    free(buf);
    cache_obj_put(cache, a);
    cache_obj_put(cache, b);
    teardown();
}

Test(cache, read_ahead_waits_while_the_working_set_is_ahead_of_readers)
{
    setup_cfg(4096 * KiB, 256 * KiB, 1024 * KiB);
    struct cache_obj *a = big_obj("a", 16), *b = big_obj("b", 16);
    /* 1 MiB fetched and not read: as far ahead as the working set allows. */
    cr_assert_eq(cache_prefetch_ahead(cache, a, 0, 16 * 64 * KiB), 16 * 64 * KiB);
    cr_assert_eq(cache_prefetch_ahead(cache, b, 0, 64 * KiB), 0, "ran ahead past the working set");
    /* The item a reader is in is fetched whatever is ahead. */
    cr_assert_eq(cache_prefetch(cache, b, 0, 64 * KiB), 64 * KiB);
    wait_prefetched(17 * 64 * KiB);
    struct cache_stats st;
    cache_get_stats(cache, &st);
    cr_assert_eq(st.ahead_deferred, 1);
    /* Once a reader has had a's blocks, read-ahead goes on. */
    unsigned char *buf = malloc(16 * 64 * KiB);
    cr_assert_eq(cache_read(cache, a, 0, 16 * 64 * KiB, buf), (ssize_t)(16 * 64 * KiB));
    free(buf);
    cr_assert_eq(cache_prefetch_ahead(cache, b, 64 * KiB, 64 * KiB), 64 * KiB);
    wait_prefetched(18 * 64 * KiB);
    cache_obj_put(cache, a);
    cache_obj_put(cache, b);
    teardown();
}

static atomic_int gate_open, worker_free;

/* A job that holds its worker until the gate opens (or 5 s pass). */
static void hold_worker(void *arg)
{
    (void)arg;
    for (int i = 0; i < 5000 && !atomic_load(&gate_open); i++)
        usleep(1000);
    atomic_store(&worker_free, 1);
}

Test(cache, a_reader_runs_the_queued_prefetch_it_waits_for, .timeout = 30)
{
    /* One worker, busy with another job: the prefetch of the block a
     * reader needs sits in the queue. The reader runs it itself instead of
     * waiting for the queue to reach it. */
    store = mem_store_new();
    unsigned char *data = malloc(OBJ_SIZE);
    for (size_t i = 0; i < OBJ_SIZE; i++)
        data[i] = byte_at(i);
    cr_assert_eq(mem_store_set(store, "obj", data, OBJ_SIZE, etag), 0);
    cr_assert_eq(workq_create(1, &wq), 0);
    struct cache_config cfg = {
        .capacity = 4096 * KiB, .block_size = 64 * KiB, .request_size = 256 * KiB};
    cr_assert_eq(cache_create(mem_store_base(store), wq, &cfg, &cache), 0);
    obj = cache_obj_get(cache, "obj", etag, OBJ_SIZE, NULL);
    atomic_store(&gate_open, 0);
    atomic_store(&worker_free, 0);
    cr_assert_eq(workq_submit(wq, hold_worker, NULL), 0);
    while (workq_pending(wq) > 0) /* the worker holds it */
        usleep(1000);
    cr_assert_eq(cache_prefetch(cache, obj, 0, 4 * 64 * KiB), 4 * 64 * KiB);
    cr_assert_eq(workq_pending(wq), 1);
    check_range(100, 1000);
    cr_assert_not(atomic_load(&worker_free), "the reader waited for the worker");
    cr_assert_eq(workq_pending(wq), 0, "the job stayed queued");
    struct cache_stats st;
    cache_get_stats(cache, &st);
    cr_assert_eq(st.taken_over, 1);
    cr_assert_eq(st.misses, 0, "the reader fetched again instead of running the job");
    cr_assert_eq(requests(), 1);
    check_range(3 * 64 * KiB, 64 * KiB); /* the rest of the job's run is there */
    cr_assert_eq(requests(), 1);
    atomic_store(&gate_open, 1);
    free(data);
    teardown();
}

/* Every munmap of the code under test comes here (-Wl,--wrap=munmap in
 * CMakeLists.txt): giving a multi-MiB buffer back to the kernel takes long,
 * and must not stall every reader by happening under the cache lock. */
int __real_munmap(void *addr, size_t len);
int __wrap_munmap(void *addr, size_t len);

static struct cache *watched; /* whose lock munmap is checked against */
static atomic_int unmaps, unmaps_locked;
static void (*at_unmap)(void); /* run at each unmap done outside the lock */

int __wrap_munmap(void *addr, size_t len)
{
    static _Thread_local int inside; /* at_unmap may unmap too */
    if (watched && !inside) {
        atomic_fetch_add(&unmaps, 1);
        if (cache_lock_held(watched)) {
            atomic_fetch_add(&unmaps_locked, 1);
        } else if (at_unmap) {
            inside = 1;
            at_unmap();
            inside = 0;
        }
    }
    return __real_munmap(addr, len);
}

static void watch(struct cache *c, void (*fn)(void))
{
    atomic_store(&unmaps, 0);
    atomic_store(&unmaps_locked, 0);
    at_unmap = fn;
    watched = c;
}

Test(cache, fetch_buffers_are_unmapped_outside_the_lock)
{
    /* Buffers of more than request_size (a reader's long miss) are never
     * pooled: each one freed is unmapped. */
    setup_with(4 * 64 * KiB);
    watch(cache, NULL);
    check_range(0, 8 * 64 * KiB); /* one 8-block GET, over the capacity */
    check_range(8 * 64 * KiB, 1); /* evicts those 8: their buffer goes */
    cr_assert_eq(atomic_load(&unmaps), 1, "eviction: %d unmaps", atomic_load(&unmaps));
    mem_store_fail(store, MEM_OP_READ, -EIO, 1);
    char *buf = malloc(8 * 64 * KiB);
    cr_assert_eq(cache_read(cache, obj, 0, 8 * 64 * KiB, buf), -EIO); /* its buffer goes */
    free(buf);
    cr_assert_eq(atomic_load(&unmaps), 2, "failed fetch: %d unmaps", atomic_load(&unmaps));
    check_range(0, 8 * 64 * KiB);
    cache_release_behind(cache, obj, 0, 8 * 64 * KiB);
    cr_assert_eq(atomic_load(&unmaps), 3, "release-behind: %d unmaps", atomic_load(&unmaps));
    cr_assert_eq(atomic_load(&unmaps_locked), 0, "%d of %d unmaps under the cache lock",
                 atomic_load(&unmaps_locked), atomic_load(&unmaps));
    watched = NULL;
    teardown();
}

#define LONG_BLOCKS 200 /* blocks of the object "long" (64 KiB each) */

/* A cache of 16 MiB, request_size 256 KiB, over the default object and
 * "long" (opened as *lo); workers: the work queue's threads. */
static void setup_long(int workers, struct cache_obj **lo)
{
    store = mem_store_new();
    size_t size = LONG_BLOCKS * 64 * KiB;
    unsigned char *data = malloc(size);
    cr_assert_not_null(data);
    for (size_t i = 0; i < size; i++)
        data[i] = byte_at(i);
    cr_assert_eq(mem_store_set(store, "obj", data, OBJ_SIZE, etag), 0);
    char long_etag[STORE_ETAG_MAX];
    cr_assert_eq(mem_store_set(store, "long", data, size, long_etag), 0);
    free(data);
    cr_assert_eq(workq_create(workers, &wq), 0);
    struct cache_config cfg = {.capacity = 16u << 20,
                               .block_size = 64 * KiB,
                               .request_size = 256 * KiB,
                               .working_set = 16u << 20}; /* release-behind alone */
    cr_assert_eq(cache_create(mem_store_base(store), wq, &cfg, &cache), 0);
    obj = cache_obj_get(cache, "obj", etag, OBJ_SIZE, NULL);
    *lo = cache_obj_get(cache, "long", long_etag, size, NULL);
    cr_assert(obj && *lo);
}

/* Reads [first, end) blocks of o in runs of run blocks (one GET each). */
static void read_blocks(struct cache_obj *o, uint64_t first, uint64_t end, uint64_t run)
{
    char *buf = malloc(run * 64 * KiB);
    for (uint64_t i = first; i < end; i += run) {
        uint64_t n = end - i < run ? end - i : run;
        cr_assert_eq(cache_read(cache, o, i * 64 * KiB, n * 64 * KiB, buf),
                     (ssize_t)(n * 64 * KiB));
    }
    free(buf);
}

/* Whether block idx of o is still cached: reading it is no miss. */
static int cached(struct cache_obj *o, uint64_t idx)
{
    struct cache_stats before, after;
    char byte;
    cache_get_stats(cache, &before);
    cr_assert_eq(cache_read(cache, o, idx * 64 * KiB, 1, &byte), 1);
    cr_assert_eq((unsigned char)byte, byte_at(idx * 64 * KiB));
    cache_get_stats(cache, &after);
    return after.misses == before.misses;
}

static struct cache_obj *long_obj;
static atomic_int first_unmap_seen;
static uint64_t released_at_first_unmap, hits_at_first_unmap;

/* At the first unmap outside the lock (release-behind has dropped some
 * blocks and given their buffers back): how far has it got, and can a
 * reader of a block it has not reached yet go on? */
static void probe_release(void)
{
    if (atomic_exchange(&first_unmap_seen, 1))
        return;
    struct cache_stats st;
    cache_get_stats(cache, &st);
    released_at_first_unmap = st.released;
    char byte;
    cr_assert_eq(cache_read(cache, long_obj, (LONG_BLOCKS - 1) * 64 * KiB, 1, &byte), 1);
    cache_get_stats(cache, &st);
    hits_at_first_unmap = st.hits;
}

Test(cache, release_behind_gives_the_lock_up_along_a_long_range, .timeout = 60)
{
    setup_long(2, &long_obj);
    read_blocks(long_obj, 0, LONG_BLOCKS, 8); /* 512 KiB buffers: never pooled */
    uint64_t gets = requests();
    struct cache_stats before, st;
    cache_get_stats(cache, &before);
    atomic_store(&first_unmap_seen, 0);
    watch(cache, probe_release);
    cache_release_behind(cache, long_obj, 0, LONG_BLOCKS * 64 * KiB);
    watched = NULL;
    cache_get_stats(cache, &st);
    cr_assert_eq(st.released, LONG_BLOCKS);
    cr_assert(atomic_load(&first_unmap_seen));
    cr_assert_eq(atomic_load(&unmaps_locked), 0);
    cr_assert_lt(released_at_first_unmap, LONG_BLOCKS,
                 "the whole range was walked in one hold of the lock");
    cr_assert_eq(hits_at_first_unmap, before.hits + 1, "a reader was not served mid-walk");
    cr_assert_eq(requests(), gets);
    cache_obj_put(cache, long_obj);
    teardown();
}

Test(cache, release_behind_drops_exactly_the_whole_ready_blocks_in_range, .timeout = 60)
{
    setup_long(1, &long_obj);
    check_range(0, OBJ_SIZE); /* another object's blocks */
    read_blocks(long_obj, 0, 100, 8);
    read_blocks(long_obj, 104, LONG_BLOCKS, 8);
    /* Blocks 100-103 FETCHING: their prefetch waits behind a busy worker. */
    atomic_store(&gate_open, 0);
    atomic_store(&worker_free, 0);
    cr_assert_eq(workq_submit(wq, hold_worker, NULL), 0);
    while (workq_pending(wq) > 0)
        usleep(1000);
    cr_assert_eq(cache_prefetch(cache, long_obj, 100 * 64 * KiB, 4 * 64 * KiB), 4 * 64 * KiB);
    /* A second open shares the blocks: nothing goes. */
    struct cache_obj *again =
        cache_obj_get(cache, "long", cache_obj_etag(long_obj), cache_obj_size(long_obj), NULL);
    cr_assert_eq(again, long_obj);
    cache_release_behind(cache, long_obj, 0, LONG_BLOCKS * 64 * KiB);
    struct cache_stats st;
    cache_get_stats(cache, &st);
    cr_assert_eq(st.released, 0);
    cache_obj_put(cache, again);
    /* Whole blocks 11-187 only, across several chunks, but for the FETCHING ones. */
    cache_release_behind(cache, long_obj, 10 * 64 * KiB + 1, 189 * 64 * KiB - 1);
    cache_get_stats(cache, &st);
    cr_assert_eq(st.released, 177 - 4, "released %llu", (unsigned long long)st.released);
    atomic_store(&gate_open, 1);
    while (workq_pending(wq) > 0 || !atomic_load(&worker_free))
        usleep(1000);
    for (uint64_t i = 0; i < LONG_BLOCKS; i++) {
        int kept = i < 11 || (i >= 100 && i < 104) || i >= 188;
        cr_assert_eq(cached(long_obj, i), kept, "block %llu %s", (unsigned long long)i,
                     kept ? "was dropped" : "was kept");
    }
    for (uint64_t i = 0; i <= OBJ_SIZE / (64 * KiB); i++)
        cr_assert(cached(obj, i), "block %llu of another object was dropped",
                  (unsigned long long)i);
    cache_obj_put(cache, long_obj);
    teardown();
}
