/*
 * tests/unit/test_cohort.c - the table of saved ranks being loaded (fs/read/cohort.h).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "cohort.h"

Test(cohort, a_touched_rank_is_active_for_the_linger_only)
{
    struct cohort *c = cohort_create(2.0);
    cr_assert_not_null(c);
    cr_assert_eq(cohort_active(c, "run/a", 5, 1, 10.0), 0, "never touched");
    cohort_touch(c, "run/a", 5, 1, 10.0);
    cr_assert_eq(cohort_active(c, "run/a", 5, 1, 11.9), 1);
    cr_assert_eq(cohort_active(c, "run/a", 5, 1, 12.0), 0, "linger over");
    cr_assert_eq(cohort_active(c, "run/a", 5, 2, 10.5), 0, "another rank");
    cr_assert_eq(cohort_active(c, "run/b", 5, 1, 10.5), 0, "another checkpoint");
    cr_assert_eq(cohort_active(c, "run/abc", 5, 1, 10.5), 1, "dir is the first dir_len bytes");
    cohort_touch(c, "run/a", 5, 1, 13.0);
    cr_assert_eq(cohort_active(c, "run/a", 5, 1, 14.0), 1, "touched again");
    cohort_touch(c, "run/a", 5, -1, 13.0);
    cr_assert_eq(cohort_active(c, "run/a", 5, -1, 13.0), 0, "no rank, never active");
    cohort_destroy(c);
}

Test(cohort, a_full_table_reuses_the_slot_touched_longest_ago)
{
    struct cohort *c = cohort_create(1000.0);
    for (int r = 0; r < COHORT_SLOTS; r++)
        cohort_touch(c, "d", 1, r, 100.0 + r);
    for (int r = 0; r < COHORT_SLOTS; r++)
        cr_assert_eq(cohort_active(c, "d", 1, r, 500.0), 1, "rank %d", r);
    cohort_touch(c, "d", 1, 0, 600.0); /* rank 0 is fresh again: rank 1 is the stalest */
    cohort_touch(c, "e", 1, 7, 601.0);
    cr_assert_eq(cohort_active(c, "e", 1, 7, 602.0), 1, "the new rank has a slot");
    cr_assert_eq(cohort_active(c, "d", 1, 1, 602.0), 0, "the stalest slot went");
    cr_assert_eq(cohort_active(c, "d", 1, 0, 602.0), 1);
    cr_assert_eq(cohort_active(c, "d", 1, 2, 602.0), 1);
    cohort_destroy(c);
}
