/*
 * tests/unit/test_cache_disk.c - what the block cache keeps in the disk cache
 * as it fetches (cache_set_disk with a diskfill writer), against the
 * in-memory store: every chunk a load fetched whole, also those no single
 * fetch covered (a load fetches item by item, and items do not start on
 * chunk boundaries), and nothing that is not whole.
 */
#include "cache.h"
#include "diskcache.h"
#include "diskfill.h"
#include "mem_store.h"
#include "workq.h"

#include "test_util.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KiB 1024u
#define CH DISKCACHE_CHUNK
#define OBJ_SIZE (4 * CH + 5) /* four chunks and a short fifth */

static char dir[256];
static struct mem_store *store;
static char etag[STORE_ETAG_MAX];
static unsigned char *content;
static struct workq *wq;
static struct diskcache *dc;
static struct diskfill *fill;
static struct cache *cache;
static struct cache_obj *obj;

static void setup(void)
{
    make_scratch_dir(dir, sizeof dir, "ckptfs-cache-disk");
    content = malloc(OBJ_SIZE);
    cr_assert_not_null(content);
    for (size_t i = 0; i < OBJ_SIZE; i++)
        content[i] = (unsigned char)((i * 2654435761u) >> 13);
    store = mem_store_new();
    cr_assert_eq(mem_store_set(store, "obj", content, OBJ_SIZE, etag), 0);
    char err[256];
    struct diskcache_config dcfg = {.capacity = 64 * CH, .floor_percent = 0};
    cr_assert_eq(diskcache_open(dir, &dcfg, &dc, err, sizeof err), 0, "%s", err);
    cr_assert_eq(diskfill_create(dc, 16 * CH, &fill), 0);
    cr_assert_eq(workq_create(4, &wq), 0);
    struct cache_config cfg = {.capacity = 32 * CH,
                               .block_size = 64 * KiB,
                               .request_size = 256 * KiB,
                               .working_set = 32 * CH};
    cr_assert_eq(cache_create(mem_store_base(store), wq, &cfg, &cache), 0);
    cache_set_disk(cache, dc, fill);
    obj = cache_obj_get(cache, "obj", etag, OBJ_SIZE, NULL);
    cr_assert_not_null(obj);
}

/* Stop fetching, then the writer (which writes what is queued first and
 * gives the blocks back), then the cache. */
static void stop_fetching(void)
{
    if (obj)
        cache_obj_put(cache, obj);
    obj = NULL;
    if (wq)
        workq_destroy(wq);
    wq = NULL;
    diskfill_destroy(fill);
    fill = NULL;
    if (cache)
        cache_destroy(cache);
    cache = NULL;
}

static void teardown(void)
{
    stop_fetching();
    diskcache_close(dc);
    mem_store_free(store);
    free(content);
    rm_tree(dir);
}

TestSuite(cache_disk, .init = setup, .fini = teardown, .timeout = 60);

/* Read [off, off + len) through the cache, as a reader of that item would. */
static void load(uint64_t off, size_t len)
{
    unsigned char *buf = malloc(len);
    cr_assert_eq(cache_read(cache, obj, off, len, buf), (ssize_t)len);
    cr_assert_eq(memcmp(buf, content + off, len), 0);
    free(buf);
}

/* Whether the disk cache holds chunk k (whole, checksum good). */
static int holds_chunk(uint64_t k)
{
    uint64_t start = k * CH, len = start + CH < OBJ_SIZE ? CH : OBJ_SIZE - start;
    unsigned char *buf = malloc(len);
    struct diskcache_version v = {.path = "obj", .etag = etag, .size = OBJ_SIZE};
    int held = diskcache_read(dc, &v, start, len, buf) == 1;
    if (held)
        cr_assert_eq(memcmp(buf, content + start, len), 0, "chunk %llu", (unsigned long long)k);
    free(buf);
    return held;
}

/* Two items meeting inside chunk 1: each fetch cuts it, neither holds it
 * whole; the second to land keeps it. */
Test(cache_disk, a_chunk_two_fetches_cut_is_kept_once_both_landed)
{
    load(0, CH + CH / 2);
    load(CH + CH / 2, OBJ_SIZE - (CH + CH / 2));
    stop_fetching();
    for (uint64_t k = 0; k < 5; k++)
        cr_assert(holds_chunk(k), "chunk %llu not kept", (unsigned long long)k);
}

/* The same two items loaded the other way round: the later fetch cuts the
 * chunk at its end, not its start. */
Test(cache_disk, a_chunk_cut_at_the_end_of_the_last_fetch_is_kept)
{
    load(CH + CH / 2, OBJ_SIZE - (CH + CH / 2));
    load(0, CH + CH / 2);
    stop_fetching();
    for (uint64_t k = 0; k < 5; k++)
        cr_assert(holds_chunk(k), "chunk %llu not kept", (unsigned long long)k);
}

/* Three items over chunk 1: the middle one, fetched last, completes it from
 * both sides. */
Test(cache_disk, a_chunk_completed_from_both_sides_is_kept)
{
    load(0, CH + CH / 4);
    load(CH + 3 * CH / 4, OBJ_SIZE - (CH + 3 * CH / 4));
    load(CH + CH / 4, CH / 2);
    stop_fetching();
    for (uint64_t k = 0; k < 5; k++)
        cr_assert(holds_chunk(k), "chunk %llu not kept", (unsigned long long)k);
}

/* A partial load: only the chunks it fetched whole; the ones it cut, whose
 * other bytes no one fetched, are not kept (not whole). */
Test(cache_disk, a_cut_chunk_whose_rest_was_never_fetched_is_not_kept)
{
    load(CH / 2, 2 * CH);
    stop_fetching();
    cr_assert(!holds_chunk(0));
    cr_assert(holds_chunk(1));
    cr_assert(!holds_chunk(2));
    cr_assert(!holds_chunk(3));
}

static atomic_int releases;

static void count_release(void *arg)
{
    (void)arg;
    atomic_fetch_add(&releases, 1);
}

/* The writer's bound: a loan past max_bytes is refused at once (counted,
 * never released: the lender keeps its blocks); one within it is written and
 * released exactly once. */
Test(cache_disk, loans_past_the_bound_are_refused_and_others_released_once)
{
    stop_fetching();
    cr_assert_eq(diskfill_create(dc, CH - 1, &fill), 0);
    atomic_store(&releases, 0);
    struct diskcache_version small = {.path = "small", .etag = "\"s\"", .size = 4096};
    struct iovec piece = {.iov_base = content, .iov_len = 4096};
    cr_assert_eq(diskfill_lend(fill, &small, 0, &piece, 1, count_release, NULL), 0);
    struct diskcache_version big = {.path = "obj", .etag = etag, .size = OBJ_SIZE};
    struct iovec whole = {.iov_base = content, .iov_len = CH};
    cr_assert_eq(diskfill_lend(fill, &big, 0, &whole, 1, count_release, NULL), -ENOBUFS);
    cr_assert_eq(diskfill_dropped(fill), 1);
    diskfill_destroy(fill);
    fill = NULL;
    cr_assert_eq(atomic_load(&releases), 1);
    unsigned char got[4096];
    cr_assert_eq(diskcache_read(dc, &small, 0, sizeof got, got), 1);
    cr_assert_eq(memcmp(got, content, sizeof got), 0);
}
