/* tests/unit/test_parts.c - multipart geometry: tiers, offsets, the 10,000
 * part limit and the 5 GiB part cap. */
#include "parts.h"
#include "store.h"

#include <criterion/criterion.h>

#define MiB (1ull << 20)

Test(parts, first_tier_is_equal_parts)
{
    cr_assert_eq(parts_size(8 * MiB, 1), 8 * MiB);
    cr_assert_eq(parts_offset(8 * MiB, 1), 0);
    cr_assert_eq(parts_offset(8 * MiB, 2), 8 * MiB);
    cr_assert_eq(parts_at(8 * MiB, 0), 1);
    cr_assert_eq(parts_at(8 * MiB, 8 * MiB - 1), 1);
    cr_assert_eq(parts_at(8 * MiB, 8 * MiB), 2);
    cr_assert_eq(parts_count(8 * MiB, 0), 0);
    cr_assert_eq(parts_count(8 * MiB, 1), 1);
    cr_assert_eq(parts_count(8 * MiB, 8 * MiB), 1);
    cr_assert_eq(parts_count(8 * MiB, 8 * MiB + 1), 2);
}

Test(parts, tiers_double_every_thousand)
{
    uint64_t b = 8 * MiB;
    cr_assert_eq(parts_size(b, 1000), b);
    cr_assert_eq(parts_size(b, 1001), 2 * b);
    cr_assert_eq(parts_offset(b, 1001), 1000 * b);
    cr_assert_eq(parts_size(b, 2001), 4 * b);
    cr_assert_eq(parts_offset(b, 2001), 1000 * b + 2000 * b);
    /* offsets and parts_at agree, and parts tile the object */
    for (uint32_t n = 1; n <= STORE_MAX_PARTS; n += 37) {
        uint64_t off = parts_offset(b, n), len = parts_size(b, n);
        cr_assert_eq(parts_at(b, off), n);
        cr_assert_eq(parts_at(b, off + len - 1), n);
        cr_assert_eq(parts_offset(b, n + 1), off + len);
    }
}

Test(parts, limits)
{
    uint64_t b = 8 * MiB;
    /* 10,000 parts reach past S3's 5 TiB object limit */
    cr_assert_geq(parts_max_object(b), 5ull << 40);
    cr_assert_eq(parts_count(b, parts_max_object(b)), STORE_MAX_PARTS);
    cr_assert_gt(parts_count(b, parts_max_object(b) + 1), STORE_MAX_PARTS);
    /* every part of a big base is capped at 5 GiB and at least 5 MiB */
    uint64_t big = 1ull << 30;
    for (uint32_t n = 1; n <= STORE_MAX_PARTS; n += 999) {
        cr_assert_leq(parts_size(big, n), STORE_MAX_PART);
        cr_assert_geq(parts_size(big, n), STORE_MIN_PART);
    }
    cr_assert_eq(parts_size(big, STORE_MAX_PARTS), STORE_MAX_PART);
}
