/* tests/unit/test_dir_times.c - directories' times on a store of keys
 * (store.h, "STORE_DIR_TIME_KEYS"; docs/design.md, "Directory times"): the
 * newest object of a prefix's first keys, the same whether the core learns it
 * from the parent's listing, a readdir or a lookup by name, stable while the
 * store does not change; and the mount's own changes (dirtime.h) on top. The
 * in-memory store lists and times prefixes as the S3 store does. */
#include "core.h"
#include "dirtime.h"
#include "mem_store.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define SEC 1000000000LL
#define T0 (1700000000LL * SEC)

static char cache[] = "/tmp/ckptfs-test-dir-times-XXXXXX";
static struct mem_store *mem;
static struct core *core;

static void put(const char *path, int64_t mtime_ns)
{
    cr_assert_eq(mem_store_set(mem, path, "x", 1, NULL), 0);
    cr_assert_eq(mem_store_set_mtime(mem, path, mtime_ns), 0);
}

static void start(double attr_timeout)
{
    struct core_config cfg;
    core_config_defaults(&cfg);
    cfg.cache_size = 16u << 20;
    cfg.attr_timeout = attr_timeout;
    cfg.cache_dir = cache; /* a writable mount: changes go through staging */
    cr_assert_eq(core_create(mem_store_base(mem), &cfg, &core), 0);
}

static void setup(void)
{
    memcpy(cache + strlen(cache) - 6, "XXXXXX", 6);
    cr_assert_not_null(mkdtemp(cache));
    mem = mem_store_new();
    mem_store_s3_listings(mem);
}

static void teardown(void)
{
    core_destroy(core);
    store_destroy(mem_store_base(mem));
    rm_tree(cache);
}

TestSuite(dir_times, .init = setup, .fini = teardown);

static int64_t mtime_of(const char *path)
{
    struct stat st;
    cr_assert_eq(core_getattr(core, path, &st), 0, "getattr %s", path);
    cr_assert(S_ISDIR(st.st_mode), "%s is a directory", path);
    return (int64_t)st.st_mtim.tv_sec * SEC + st.st_mtim.tv_nsec;
}

struct shown {
    char name[64][32];
    int64_t mtime[64];
    int n;
};

static int remember(void *arg, const char *name, const struct stat *st)
{
    struct shown *s = arg;
    cr_assert_lt(s->n, 64);
    snprintf(s->name[s->n], sizeof s->name[s->n], "%s", name);
    s->mtime[s->n++] = (int64_t)st->st_mtim.tv_sec * SEC + st->st_mtim.tv_nsec;
    return 0;
}

static int64_t listed_mtime(const struct shown *s, const char *name)
{
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->name[i], name) == 0)
            return s->mtime[i];
    cr_assert_fail("%s not listed", name);
    return 0;
}

Test(dir_times, a_prefix_shows_its_newest_object_by_every_path)
{
    put("run/ckpt-5/a", T0 + 5 * SEC);
    put("run/ckpt-5/b", T0 + 6 * SEC + 250000000);
    put("run/ckpt-10/", T0 + 9 * SEC); /* a marker counts */
    put("run/ckpt-10/a", T0 + 10 * SEC);
    put("run/ckpt-10/sub/deep", T0 + 12 * SEC); /* any depth */
    start(1.0);
    /* readdir first (the times come with the entries, as readdirplus uses them) */
    struct shown s = {0};
    cr_assert_eq(core_readdir(core, "/run", remember, &s), 0);
    cr_assert_eq(s.n, 2);
    cr_expect_eq(listed_mtime(&s, "ckpt-5"), T0 + 6 * SEC + 250000000);
    cr_expect_eq(listed_mtime(&s, "ckpt-10"), T0 + 12 * SEC);
    cr_expect_eq(mtime_of("/run/ckpt-5"), T0 + 6 * SEC + 250000000);
    cr_expect_eq(mtime_of("/run/ckpt-10"), T0 + 12 * SEC);
    cr_expect_eq(mtime_of("/run"), T0 + 12 * SEC);
    cr_expect_eq(mtime_of("/"), T0 + 12 * SEC);
}

Test(dir_times, a_lookup_by_name_and_a_parent_listing_agree)
{
    put("d/x", T0 + 1 * SEC);
    put("d/y/z", T0 + 3 * SEC);
    put("d/y/w", T0 + 2 * SEC);
    start(0); /* nothing cached: every getattr asks the store by name */
    int64_t by_name = mtime_of("/d/y");
    core_destroy(core);
    start(60.0); /* through the listing of d */
    struct stat st;
    cr_assert_eq(core_getattr(core, "/d/x", &st), 0); /* lists d */
    cr_expect_eq(mtime_of("/d/y"), by_name);
    cr_expect_eq(by_name, T0 + 3 * SEC);
}

Test(dir_times, the_newest_of_the_first_keys_of_a_large_prefix)
{
    char path[64];
    for (int i = 0; i < STORE_DIR_TIME_KEYS + 5; i++) {
        snprintf(path, sizeof path, "big/f%05d", i);
        put(path, T0 + i * SEC);
    }
    put("big/zz-late", T0 + 100000 * SEC); /* beyond the first keys in key order */
    put("small/a", T0);
    start(0);
    int64_t by_name = mtime_of("/big");
    cr_expect_eq(by_name, T0 + (STORE_DIR_TIME_KEYS - 1) * SEC);
    core_destroy(core);
    start(60.0);
    struct shown s = {0};
    cr_assert_eq(core_readdir(core, "/", remember, &s), 0);
    cr_expect_eq(listed_mtime(&s, "big"), by_name);
    cr_expect_eq(mtime_of("/big"), by_name);
    cr_expect_eq(mtime_of("/small"), T0);
    core_destroy(core);
    start(60.0); /* a lookup inside big lists big: its own time comes from that listing */
    struct stat st;
    cr_assert_eq(core_getattr(core, "/big/f00000", &st), 0);
    cr_expect_eq(mtime_of("/big"), by_name);
}

Test(dir_times, stable_while_the_store_does_not_change)
{
    put("d/a", T0 + 1 * SEC);
    start(0.05);
    int64_t first = mtime_of("/d");
    struct timespec pause = {0, 80 * 1000 * 1000}; /* past the attribute timeout */
    nanosleep(&pause, NULL);
    cr_expect_eq(mtime_of("/d"), first);
    put("d/b", T0 + 2 * SEC); /* a new entry: the directory's time moves, once a */
    struct timespec linger = {2, 200 * 1000 * 1000}; /* directory's entry is asked again */
    nanosleep(&linger, NULL);
    cr_expect_eq(mtime_of("/d"), T0 + 2 * SEC);
}

Test(dir_times, a_removal_on_this_mount_moves_the_time_forward)
{
    start(1.0);
    put("d/a", T0 + 1 * SEC);
    put("d/b", T0 + 2 * SEC);
    cr_expect_eq(mtime_of("/d"), T0 + 2 * SEC);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    int64_t before = (int64_t)now.tv_sec * SEC + now.tv_nsec;
    cr_assert_eq(core_unlink(core, "/d/a"), 0); /* leaves the newest (b) in place */
    cr_expect_geq(mtime_of("/d"), before);
}

Test(dirtime, keeps_the_latest_change_and_forgets_below)
{
    struct dirtime *t = dirtime_create();
    cr_assert_not_null(t);
    dirtime_touch(t, "a", 5);
    dirtime_touch(t, "a", 3); /* earlier: ignored */
    dirtime_touch(t, "a/b", 7);
    dirtime_touch(t, "ab", 9);
    cr_expect_eq(dirtime_get(t, "a"), 5);
    cr_expect_eq(dirtime_get(t, "a/b"), 7);
    cr_expect_eq(dirtime_get(t, "zz"), 0);
    dirtime_forget_below(t, "a");
    cr_expect_eq(dirtime_get(t, "a"), 0);
    cr_expect_eq(dirtime_get(t, "a/b"), 0);
    cr_expect_eq(dirtime_get(t, "ab"), 9); /* not below "a" */
    dirtime_destroy(t);
}

Test(dirtime, full_table_forgets_the_oldest_change)
{
    struct dirtime *t = dirtime_create();
    char dir[32];
    for (int i = 0; i < DIRTIME_MAX + 10; i++) {
        snprintf(dir, sizeof dir, "d%d", i);
        dirtime_touch(t, dir, 1000 + i);
    }
    cr_expect_eq(dirtime_count(t), DIRTIME_MAX);
    cr_expect_eq(dirtime_get(t, "d0"), 0);
    cr_expect_eq(dirtime_get(t, "d9"), 0);
    cr_expect_eq(dirtime_get(t, "d10"), 1010);
    snprintf(dir, sizeof dir, "d%d", DIRTIME_MAX + 9);
    cr_expect_eq(dirtime_get(t, dir), 1000 + DIRTIME_MAX + 9);
    dirtime_forget_below(t, "");
    cr_expect_eq(dirtime_count(t), 0);
    dirtime_destroy(t);
}
