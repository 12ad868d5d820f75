/*
 * tests/unit/test_meta.c - the metadata cache on its own (fs/core/meta.c):
 * entries expire, directories last at least dir_life, forgetting below a
 * directory spares its siblings, marks keep and collect rent only as
 * meta.h says, and the table stays bounded.
 */
#include "meta.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <unistd.h>

static struct meta_cache mc;

static void fini(void)
{
    meta_destroy(&mc);
}

static const struct store_stat file_st = {.size = 7, .mtime_ns = 42};
static const struct store_stat dir_st = {.is_dir = 1};

/* A put answers until attr_timeout, then the entry is expired, not gone. */
Test(meta, an_entry_is_fresh_until_attr_timeout_then_expired, .fini = fini)
{
    cr_assert_eq(meta_init(&mc, 0.05, 0.05), 0);
    meta_put(&mc, "d/a", 0, &file_st, 0);
    int err = 1;
    struct store_stat st = {0};
    cr_assert_eq(meta_find(&mc, "d/a", &err, &st), META_FRESH);
    cr_expect_eq(err, 0);
    cr_expect_eq(st.size, 7);
    usleep(80 * 1000); /* the scenario: let attr_timeout pass */
    cr_expect_eq(meta_find(&mc, "d/a", &err, &st), META_EXPIRED);
    cr_expect_eq(meta_find(&mc, "d/b", &err, &st), META_ABSENT);
}

/* A directory's entry lasts dir_life when that is longer than attr_timeout. */
Test(meta, a_directory_lasts_dir_life, .fini = fini)
{
    cr_assert_eq(meta_init(&mc, 0.01, 5.0), 0);
    meta_put(&mc, "d", 0, &dir_st, 0);
    meta_put(&mc, "d/f", 0, &file_st, 0);
    usleep(30 * 1000);
    int err;
    cr_expect_eq(meta_find(&mc, "d", &err, NULL), META_FRESH);
    cr_expect_eq(meta_find(&mc, "d/f", &err, NULL), META_EXPIRED);
}

/* attr_timeout 0: nothing is kept. */
Test(meta, zero_attr_timeout_keeps_nothing, .fini = fini)
{
    cr_assert_eq(meta_init(&mc, 0, 2.0), 0);
    meta_put(&mc, "d", 0, &dir_st, 0);
    int err;
    cr_expect_eq(meta_find(&mc, "d", &err, NULL), META_ABSENT);
}

/* forget_below drops dir, what is below it and its mark; "d/ab" is no child of "d/a". */
Test(meta, forget_below_spares_names_that_only_share_a_prefix, .fini = fini)
{
    cr_assert_eq(meta_init(&mc, 10, 10), 0);
    const char *paths[] = {"d/a", "d/a/x", "d/a/", "d/ab", "d"};
    for (size_t i = 0; i < sizeof paths / sizeof *paths; i++)
        meta_put(&mc, paths[i], 0, &file_st, 0);
    meta_forget_below(&mc, "d/a");
    int err;
    cr_expect_eq(meta_find(&mc, "d/a", &err, NULL), META_ABSENT);
    cr_expect_eq(meta_find(&mc, "d/a/x", &err, NULL), META_ABSENT);
    cr_expect_eq(meta_find(&mc, "d/a/", &err, NULL), META_ABSENT);
    cr_expect_eq(meta_find(&mc, "d/ab", &err, NULL), META_FRESH);
    cr_expect_eq(meta_find(&mc, "d", &err, NULL), META_FRESH);
    meta_forget(&mc, "d");
    cr_expect_eq(meta_find(&mc, "d", &err, NULL), META_ABSENT);
    cr_expect_eq(mc.count, 1);
}

/* Rent goes on a large directory's mark only; keep_mark extends whole and large marks. */
Test(meta, rent_and_keep_touch_only_the_marks_they_are_for, .fini = fini)
{
    cr_assert_eq(meta_init(&mc, 10, 10), 0);
    meta_put(&mc, "big/", -E2BIG, &(struct store_stat){.size = 1000}, 1.0);
    meta_put(&mc, "small/", 0, &(struct store_stat){.size = 3}, 1.0);
    meta_put(&mc, "gone/", -ENOENT, NULL, 1.0);
    meta_add_rent(&mc, "big/", 11);
    meta_add_rent(&mc, "big/", 1);
    meta_add_rent(&mc, "small/", 5);
    struct meta_entry e;
    cr_assert_eq(meta_get(&mc, "big/", &e), META_FRESH);
    cr_expect_eq(e.rent, 12);
    cr_assert_eq(meta_get(&mc, "small/", &e), META_FRESH);
    cr_expect_eq(e.rent, 0);
    meta_keep_mark(&mc, "big/", 1e9);
    meta_keep_mark(&mc, "small/", 1e9);
    meta_keep_mark(&mc, "gone/", 1e9);
    meta_get(&mc, "big/", &e);
    cr_expect_eq(e.kept_until, 1e9);
    meta_get(&mc, "small/", &e);
    cr_expect_eq(e.kept_until, 1e9);
    meta_get(&mc, "gone/", &e);
    cr_expect_eq(e.kept_until, 0);
    meta_put(&mc, "big/", -E2BIG, &(struct store_stat){.size = 1000}, 2.0); /* listed again */
    meta_get(&mc, "big/", &e);
    cr_expect_eq(e.rent, 0);
    cr_expect_eq(e.listed, 2.0);
}

/* A directory's time is set once, only where the entry has none. */
Test(meta, a_dir_time_fills_only_an_entry_without_one, .fini = fini)
{
    cr_assert_eq(meta_init(&mc, 10, 10), 0);
    meta_put(&mc, "d", 0, &dir_st, 0);
    meta_put(&mc, "e", 0, &(struct store_stat){.is_dir = 1, .mtime_ns = 5}, 0);
    meta_set_dir_time(&mc, "d", 9);
    meta_set_dir_time(&mc, "e", 9);
    struct store_stat st;
    int err;
    meta_find(&mc, "d", &err, &st);
    cr_expect_eq(st.mtime_ns, 9);
    meta_find(&mc, "e", &err, &st);
    cr_expect_eq(st.mtime_ns, 5);
}

/* The table is bounded: past its limit, fresh entries are dropped wholesale. */
Test(meta, the_table_stays_bounded, .fini = fini)
{
    cr_assert_eq(meta_init(&mc, 100, 100), 0);
    char name[32];
    size_t most = 0;
    for (int i = 0; i < 300000; i++) {
        snprintf(name, sizeof name, "f%d", i);
        meta_put(&mc, name, 0, &file_st, 0);
        if (mc.count > most)
            most = mc.count;
    }
    cr_expect_leq(most, 262144);
    cr_expect_lt(mc.count, 300000);
    int err;
    cr_expect_eq(meta_find(&mc, "f299999", &err, NULL), META_FRESH); /* the newest is kept */
}

/* put_if_absent never replaces an entry (a listing's older answer must not
 * replace the one a publish put meanwhile), and fills an absent one. */
Test(meta, put_if_absent_leaves_an_existing_entry_alone, .fini = fini)
{
    cr_assert_eq(meta_init(&mc, 10, 10), 0);
    meta_put(&mc, "d/f", 0, &(struct store_stat){.size = 780}, 0);
    meta_put_if_absent(&mc, "d/f", 0, &(struct store_stat){.size = 0}, 1.0);
    meta_put_if_absent(&mc, "d/g", 0, &(struct store_stat){.size = 5}, 1.0);
    struct store_stat st;
    int err;
    cr_assert_eq(meta_find(&mc, "d/f", &err, &st), META_FRESH);
    cr_expect_eq(st.size, 780);
    cr_assert_eq(meta_find(&mc, "d/g", &err, &st), META_FRESH);
    cr_expect_eq(st.size, 5);
}
