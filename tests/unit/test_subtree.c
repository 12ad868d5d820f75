/*
 * tests/unit/test_subtree.c - the subdirectories a listing lists whole on
 * the way (fs/core/subtree.c): their entries, when their keys end, their
 * times, and what keeps one from counting as whole.
 */
#include "subtree.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

static char entries[64][256];
static int nentries;
static char wholes[64][256];
static int nwholes;
static int scanned; /* metadata-named files the last whole subdirectory's scan held */

static void on_entry(void *arg, const char *sub, const char *name, const struct store_stat *st)
{
    (void)arg;
    if (nentries == 64)
        return; /* the long listings' first 64 are enough to look at */
    snprintf(entries[nentries++], 256, "%s|%s|%s|%lld", sub, name, st->is_dir ? "d" : "f",
             (long long)st->mtime_ns);
}

static void on_whole(void *arg, const char *sub, int64_t newest, uint64_t keys,
                     struct ckindex_scan *scan)
{
    (void)arg;
    cr_assert_lt(nwholes, 64);
    snprintf(wholes[nwholes++], 256, "%s|%lld|%llu", sub, (long long)newest,
             (unsigned long long)keys);
    scanned = (int)scan->n;
    ckindex_scan_drop(scan);
}

static const struct subtree_ops ops = {.entry = on_entry, .whole = on_whole};

static void listing(struct subtree *t)
{
    nentries = nwholes = scanned = 0;
    subtree_init(t, &ops, NULL);
}

static void key(struct subtree *t, const char *rel, int64_t mtime)
{
    struct store_stat st = {.mtime_ns = mtime, .size = 1};
    subtree_key(t, rel, &st);
}

/* n keys a/f00000, a/f00001, ... of time mtime. */
static void files_of_a(struct subtree *t, int n, int64_t mtime)
{
    char rel[64];
    for (int i = 0; i < n; i++) {
        snprintf(rel, sizeof rel, "a/f%05d", i);
        key(t, rel, mtime);
    }
}

static int has(char list[][256], int n, const char *want)
{
    for (int i = 0; i < n; i++)
        if (strcmp(list[i], want) == 0)
            return 1;
    return 0;
}

Test(subtree, subdirectories_whose_keys_all_came_are_whole_with_their_entries)
{
    struct subtree t;
    listing(&t);
    key(&t, "a/f1", 5);
    key(&t, "a/f2", 7);
    cr_assert_eq(nwholes, 0, "a's keys may go on");
    cr_assert_eq(nentries, 0, "nor are its entries known all");
    key(&t, "b/c/g", 3);
    cr_assert(has(wholes, nwholes, "a|7|2"), "a ended with b's first key");
    key(&t, "b/c/h", 4);
    key(&t, "b/x", 9);
    key(&t, "top", 1);
    subtree_end(&t, 1);
    cr_assert_eq(nwholes, 3, "%d: %s %s", nwholes, wholes[0], wholes[1]);
    cr_assert(has(wholes, nwholes, "b/c|4|2"));
    cr_assert(has(wholes, nwholes, "b|9|3"));
    cr_assert(has(entries, nentries, "a|f1|f|5"));
    cr_assert(has(entries, nentries, "a|f2|f|7"));
    cr_assert(has(entries, nentries, "b/c|g|f|3"));
    cr_assert(has(entries, nentries, "b/c|h|f|4"));
    cr_assert(has(entries, nentries, "b|c|d|4"), "b lists its subdirectory c, with c's time");
    cr_assert(has(entries, nentries, "b|x|f|9"));
    cr_assert_eq(nentries, 6, "top is the listed directory's own file");
}

Test(subtree, a_listing_cut_short_makes_nothing_whole_that_was_still_open)
{
    struct subtree t;
    listing(&t);
    key(&t, "a/f", 1);
    key(&t, "b/c/f", 2);
    subtree_end(&t, 0);
    cr_assert_eq(nwholes, 1);
    cr_assert(has(wholes, nwholes, "a|1|1"));
    cr_assert(!has(entries, nentries, "b|c|d|2"), "c's keys may have gone on: no time for it");
    cr_assert(!has(entries, nentries, "b/c|f|f|2"), "nothing of a subdirectory cut short");
    cr_assert_eq(nentries, 1);
}

Test(subtree, a_subdirectory_of_too_many_entries_is_not_whole)
{
    struct subtree t;
    listing(&t);
    files_of_a(&t, SUBTREE_HELD_MAX + 1, 1);
    key(&t, "b/f", 1);
    subtree_end(&t, 1);
    cr_assert_eq(nwholes, 1);
    cr_assert(has(wholes, nwholes, "b|1|1"));
    cr_assert_eq(nentries, 1, "none of a's");
}

Test(subtree, a_directory_marker_counts_for_the_time_and_is_no_entry)
{
    struct subtree t;
    listing(&t);
    key(&t, "a/", 9);
    key(&t, "a/f", 5);
    subtree_end(&t, 1);
    cr_assert(has(wholes, nwholes, "a|9|2"));
    cr_assert_eq(nentries, 1);
    cr_assert(has(entries, nentries, "a|f|f|5"));
}

Test(subtree, the_time_is_the_newest_of_the_first_keys)
{
    struct subtree t;
    listing(&t);
    files_of_a(&t, STORE_DIR_TIME_KEYS, 10);
    key(&t, "a/z", 99); /* past the first STORE_DIR_TIME_KEYS: store.h's rule leaves it out */
    subtree_end(&t, 1);
    char want[64];
    snprintf(want, sizeof want, "a|10|%d", STORE_DIR_TIME_KEYS + 1);
    cr_assert(has(wholes, nwholes, want), "%s", nwholes ? wholes[0] : "none");
}

Test(subtree, a_subdirectory_too_deep_to_follow_leaves_its_parent_not_whole)
{
    struct subtree t;
    listing(&t);
    char rel[128] = "";
    for (int d = 1; d <= SUBTREE_DEPTH + 1; d++)
        snprintf(rel + strlen(rel), sizeof rel - strlen(rel), "%d/", d);
    strcat(rel, "f");
    key(&t, rel, 1);
    subtree_end(&t, 1);
    cr_assert_eq(nwholes, SUBTREE_DEPTH - 1, "levels 1..%d whole, level %d not", SUBTREE_DEPTH - 1,
                 SUBTREE_DEPTH);
    cr_assert(has(wholes, nwholes, "1|1|1"));
}

Test(subtree, an_empty_name_leaves_its_parent_not_whole)
{
    struct subtree t;
    listing(&t);
    key(&t, "a//f", 1);
    key(&t, "b/f", 1);
    subtree_end(&t, 1);
    cr_assert_eq(nwholes, 1);
    cr_assert(has(wholes, nwholes, "b|1|1"));
}

Test(subtree, a_subdirectory_scan_holds_its_metadata_files)
{
    struct subtree t;
    listing(&t);
    key(&t, "ck/.metadata", 1);
    key(&t, "ck/__0_0.distcp", 1);
    key(&t, "ck/inner/.metadata", 1);
    subtree_end(&t, 1);
    cr_assert(has(wholes, nwholes, "ck|1|3"));
    cr_assert_eq(scanned, 1, "ck's own .metadata only (the last whole is ck)");
}
