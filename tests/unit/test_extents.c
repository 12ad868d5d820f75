/* tests/unit/test_extents.c - the written-range set: merging, coverage,
 * truncation, and a randomized comparison against a byte map. */
#include "extents.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

Test(extents, merges_overlapping_and_touching)
{
    struct extents e;
    extents_init(&e);
    cr_assert_eq(extents_add(&e, 10, 20), 0);
    cr_assert_eq(extents_add(&e, 30, 40), 0);
    cr_assert_eq(e.n, 2);
    cr_assert_eq(extents_add(&e, 20, 30), 0); /* touches both: one range */
    cr_assert_eq(e.n, 1);
    cr_assert_eq(e.r[0].start, 10);
    cr_assert_eq(e.r[0].end, 40);
    cr_assert_eq(extents_add(&e, 0, 5), 0);
    cr_assert_eq(extents_add(&e, 50, 60), 0);
    cr_assert_eq(extents_add(&e, 3, 55), 0); /* swallows everything */
    cr_assert_eq(e.n, 1);
    cr_assert_eq(e.r[0].start, 0);
    cr_assert_eq(e.r[0].end, 60);
    cr_assert_eq(extents_add(&e, 7, 7), 0); /* empty: no-op */
    cr_assert_eq(extents_bytes(&e), 60);
    extents_free(&e);
}

Test(extents, covers)
{
    struct extents e;
    extents_init(&e);
    extents_add(&e, 100, 200);
    extents_add(&e, 300, 400);
    cr_assert(extents_covers(&e, 100, 200));
    cr_assert(extents_covers(&e, 150, 151));
    cr_assert(extents_covers(&e, 5, 5)); /* empty range */
    cr_assert_not(extents_covers(&e, 99, 150));
    cr_assert_not(extents_covers(&e, 150, 201));
    cr_assert_not(extents_covers(&e, 199, 301)); /* spans the gap */
    cr_assert_not(extents_covers(&e, 200, 300));
    cr_assert(extents_covers(&e, 399, 400));
    cr_assert_not(extents_covers(&e, 399, 401));
    extents_free(&e);
}

Test(extents, truncate_cuts_and_drops)
{
    struct extents e;
    extents_init(&e);
    extents_add(&e, 0, 10);
    extents_add(&e, 20, 30);
    extents_add(&e, 40, 50);
    extents_truncate(&e, 25);
    cr_assert_eq(e.n, 2);
    cr_assert_eq(e.r[1].end, 25);
    extents_truncate(&e, 20); /* exactly at a range's start: it goes */
    cr_assert_eq(e.n, 1);
    extents_truncate(&e, 0);
    cr_assert_eq(e.n, 0);
    cr_assert_eq(extents_bytes(&e), 0);
    extents_free(&e);
}

/* Random adds and truncates against a byte map of what was written. */
Test(extents, random_against_byte_map)
{
    enum { N = 4096 };
    unsigned char *map = calloc(N, 1);
    struct extents e;
    extents_init(&e);
    srand(7);
    for (int step = 0; step < 20000; step++) {
        uint64_t a = (uint64_t)(rand() % N), len = (uint64_t)(rand() % 64);
        uint64_t b = a + len > N ? N : a + len;
        if (rand() % 50 == 0) {
            extents_truncate(&e, a);
            memset(map + a, 0, N - a);
        } else {
            cr_assert_eq(extents_add(&e, a, b), 0);
            memset(map + a, 1, b - a);
        }
        uint64_t x = (uint64_t)(rand() % N), y = x + (uint64_t)(rand() % 128);
        if (y > N)
            y = N;
        int want = 1;
        for (uint64_t i = x; i < y; i++)
            want &= map[i];
        cr_assert_eq(extents_covers(&e, x, y), want, "step %d: covers(%llu, %llu)", step,
                     (unsigned long long)x, (unsigned long long)y);
    }
    uint64_t bytes = 0;
    for (int i = 0; i < N; i++)
        bytes += map[i];
    cr_assert_eq(extents_bytes(&e), bytes);
    for (size_t i = 1; i < e.n; i++) /* sorted, disjoint, never touching */
        cr_assert_gt(e.r[i].start, e.r[i - 1].end);
    extents_free(&e);
    free(map);
}
