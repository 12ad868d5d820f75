/*
 * tests/unit/test_meta_cache.c - the core's metadata cache (fs/core/core.c):
 * attributes and negative lookups answer from memory for attr_timeout
 * seconds, then the store is asked again; attr_timeout 0 caches nothing;
 * meta_forget drops one entry at once; lookups in one directory at
 * once share one listing. Over the in-memory store, whose
 * call counters show when the store was asked.
 */
#include "core.h"
#include "core_internal.h"
#include "mem_store.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#define TIMEOUT 1.0 /* attr_timeout of these tests, seconds */

static struct mem_store *mem;
static struct core *core;

static void start(double attr_timeout)
{
    mem = mem_store_new();
    cr_assert_eq(mem_store_set(mem, "d/a", "0123456789", 10, NULL), 0);
    struct core_config cfg;
    core_config_defaults(&cfg);
    cfg.cache_size = 16u << 20;
    cfg.attr_timeout = attr_timeout;
    cr_assert_eq(core_create(mem_store_base(mem), &cfg, &core), 0);
}

static void setup(void)
{
    start(TIMEOUT);
}

static void teardown(void)
{
    if (core)
        core_destroy(core);
    mem_store_free(mem);
    core = NULL;
    mem = NULL;
}

TestSuite(meta_cache, .init = setup, .fini = teardown);

/* Store calls that can answer a lookup. */
static uint64_t asked(void)
{
    return mem_store_calls(mem, MEM_OP_STAT) + mem_store_calls(mem, MEM_OP_LIST);
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* st_size of path, or the negative errno. */
static long long size_of(const char *path)
{
    struct stat st;
    int rc = core_getattr(core, path, &st);
    return rc < 0 ? rc : (long long)st.st_size;
}

Test(meta_cache, attributes_answer_from_memory_until_they_expire)
{
    cr_assert_eq(size_of("/d/a"), 10);
    uint64_t n = asked();
    cr_assert_gt(n, 0);
    cr_assert_eq(mem_store_set(mem, "d/a", "01234567890123456789", 20, NULL), 0);
    cr_assert_eq(size_of("/d/a"), 10, "a fresh entry answers, not the store");
    cr_assert_eq(asked(), n, "a fresh entry asked the store");
    sleep_s(TIMEOUT + 0.3);
    cr_assert_eq(size_of("/d/a"), 20, "an expired entry must be looked up again");
    cr_assert_gt(asked(), n);
}

Test(meta_cache, negative_lookups_expire_too)
{
    cr_assert_eq(size_of("/d/b"), -ENOENT);
    uint64_t n = asked();
    cr_assert_eq(mem_store_set(mem, "d/b", "x", 1, NULL), 0);
    cr_assert_eq(size_of("/d/b"), -ENOENT, "a fresh negative entry answers");
    cr_assert_eq(asked(), n);
    sleep_s(TIMEOUT + 0.3);
    cr_assert_eq(size_of("/d/b"), 1);
}

Test(meta_cache, forget_drops_one_entry_at_once)
{
    cr_assert_eq(size_of("/d/a"), 10);
    cr_assert_eq(mem_store_set(mem, "d/a", "0123", 4, NULL), 0);
    meta_forget(&core->meta, "d/a");
    core_listing_changed(core, "d");
    cr_assert_eq(size_of("/d/a"), 4);
}

Test(meta_cache, zero_timeout_caches_nothing)
{
    teardown(); /* the suite's core has a timeout: make one without */
    start(0);
    cr_assert_eq(size_of("/d/a"), 10);
    uint64_t n = asked();
    cr_assert_eq(mem_store_set(mem, "d/a", "01234", 5, NULL), 0);
    cr_assert_eq(size_of("/d/a"), 5);
    cr_assert_gt(asked(), n);
    cr_assert_eq(size_of("/d/c"), -ENOENT);
    cr_assert_eq(mem_store_set(mem, "d/c", "c", 1, NULL), 0);
    cr_assert_eq(size_of("/d/c"), 1);
}

struct lookup_arg {
    const char *path;
    long long size;
};

static void *lookup_thread(void *p)
{
    struct lookup_arg *a = p;
    a->size = size_of(a->path);
    return NULL;
}

/* Four ranks open four files of one checkpoint directory at once while its
 * listing is slow (S3 LIST: tens of ms): one LIST answers all four. */
Test(meta_cache, lookups_in_one_directory_at_once_share_one_listing)
{
    cr_assert_eq(mem_store_set(mem, "d/b", "bb", 2, NULL), 0);
    cr_assert_eq(mem_store_set(mem, "d/c", "ccc", 3, NULL), 0);
    mem_store_delay(mem, MEM_OP_LIST, 200 * 1000);
    struct lookup_arg a[4] = {{"/d/a", 0}, {"/d/b", 0}, {"/d/c", 0}, {"/d/missing", 0}};
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, lookup_thread, &a[i]), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    cr_expect_eq(a[0].size, 10);
    cr_expect_eq(a[1].size, 2);
    cr_expect_eq(a[2].size, 3);
    cr_expect_eq(a[3].size, -ENOENT);
    cr_expect_eq(mem_store_calls(mem, MEM_OP_LIST), 1, "%llu LISTs for one directory",
                 (unsigned long long)mem_store_calls(mem, MEM_OP_LIST));
    cr_expect_eq(mem_store_calls(mem, MEM_OP_STAT), 0, "the listing answers every name");
    cr_expect_eq(atomic_load(&core->listing_waits), 3);
}

/* A save or a load working in a directory keeps its listing (core_keep_listing):
 * lookups in it, and of the directories above, ask nothing past attr_timeout,
 * for as long as the work goes on (design.md, "Request budget"). */
Test(meta_cache, a_kept_listing_answers_past_attr_timeout)
{
    teardown(); /* the suite's core: one with a short timeout instead */
    start(0.05);
    cr_assert_eq(mem_store_set(mem, "d/b", "01", 2, NULL), 0);
    struct stat st;
    cr_assert_eq(core_getattr(core, "/d", &st), 0); /* the path walk: lists the root */
    cr_assert_eq(size_of("/d/a"), 10);              /* lists d */
    uint64_t n = asked();
    for (int i = 0; i < 4; i++) { /* 0.4 s of work, each step past attr_timeout */
        core_keep_listing(core, "d");
        sleep_s(0.1);
        cr_assert_eq(size_of("/d/a"), 10);
        cr_assert_eq(size_of("/d/b"), 2);
        cr_assert_eq(size_of("/d/none"), -ENOENT);
        cr_assert_eq(core_getattr(core, "/d", &st), 0);
    }
    cr_assert_eq(asked(), n, "a kept listing asked the store %llu times",
                 (unsigned long long)(asked() - n));
    sleep_s(2.2); /* the work stopped: past the linger, the store is asked again */
    cr_assert_eq(size_of("/d/a"), 10);
    cr_assert_gt(asked(), n);
}

/* An entry the kept listing did not report (put by a publish, say) expires with
 * attr_timeout as before: it is asked for by name, not trusted with the listing. */
Test(meta_cache, an_entry_from_elsewhere_is_not_kept_with_the_listing)
{
    teardown(); /* the suite's core: one with a short timeout instead */
    start(0.05);
    cr_assert_eq(size_of("/d/a"), 10); /* lists d */
    cr_assert_eq(mem_store_set(mem, "d/late", "0123", 4, NULL), 0);
    struct store_stat st = {.size = 3};
    meta_put(&core->meta, "d/late", 0, &st, 0);
    core_keep_listing(core, "d");
    sleep_s(0.1);
    uint64_t stats = mem_store_calls(mem, MEM_OP_STAT);
    cr_assert_eq(size_of("/d/late"), 4, "the expired entry must be asked for by name");
    cr_assert_eq(mem_store_calls(mem, MEM_OP_STAT), stats + 1);
}

/* A load's read of a file of a checkpoint can outlast the listing (a large
 * .metadata from a busy store): its close keeps the listing again, so the
 * lookups of the files the load opens next ask nothing (design.md, "Request
 * budget"). Before, the expired listing was fetched again, every page. */
Test(meta_cache, closing_a_checkpoint_file_keeps_the_listing)
{
    teardown(); /* the suite's core: one with an index instead */
    char dir[] = "/tmp/ckptfs-test-meta-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    mem = mem_store_new();
    size_t n;
    char *meta = slurp(CKPTFS_FIXTURES "/dcp-torch1.13/per_item/.metadata", &n);
    cr_assert_eq(mem_store_set(mem, "ck/.metadata", meta, n, NULL), 0);
    free(meta);
    cr_assert_eq(mem_store_set(mem, "ck/a", "0123456789", 10, NULL), 0);
    struct core_config cfg;
    core_config_defaults(&cfg);
    cfg.cache_size = 16u << 20;
    cfg.attr_timeout = 0.05;
    cfg.cache_dir = dir;
    cfg.writable = 0;
    cr_assert_eq(core_create(mem_store_base(mem), &cfg, &core), 0);
    struct core_file *f;
    int keep_cache;
    cr_assert_eq(core_open(core, "/ck/.metadata", O_RDONLY, &f, &keep_cache), 0); /* lists ck */
    sleep_s(2.3); /* a long read: past attr_timeout and the 2 s the open kept the listing */
    core_release(core, f);
    uint64_t before = asked();
    cr_assert_eq(size_of("/ck/a"), 10);
    cr_assert_eq(size_of("/ck/none"), -ENOENT);
    cr_assert_eq(asked(), before, "the store was asked %llu times after the close",
                 (unsigned long long)(asked() - before));
    core_destroy(core);
    core = NULL;
    mem_store_free(mem);
    mem = NULL;
    rm_tree(dir);
}
