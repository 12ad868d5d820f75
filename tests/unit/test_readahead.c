/* tests/unit/test_readahead.c - sequential detection and window growth. */
#include "readahead.h"

#include <criterion/criterion.h>

#define MiB (1ull << 20)

Test(readahead, sequential_reads_grow_window_to_max)
{
    struct readahead ra;
    readahead_init(&ra, 1 * MiB, 64 * MiB);
    uint64_t size = 10000 * MiB, start, len, last_len = 0, requested_end = 0;
    for (uint64_t off = 0; off < 2000 * MiB; off += MiB) {
        readahead_advise(&ra, off, MiB, size, &start, &len);
        if (len) {
            /* Ahead ranges are contiguous and never re-request bytes. */
            cr_assert(start >= off + MiB, "ahead range starts before the read end");
            if (requested_end)
                cr_assert_eq(start, requested_end);
            requested_end = start + len;
            last_len = len;
        }
    }
    cr_assert_eq(ra.window, 64 * MiB);
    /* Refills come in half-window chunks or more: large requests. */
    cr_assert_geq(last_len, 32 * MiB);
    cr_assert_leq(requested_end, 2000 * MiB + 64 * MiB + MiB);
}

Test(readahead, random_reads_fetch_nothing_ahead)
{
    struct readahead ra;
    readahead_init(&ra, 1 * MiB, 64 * MiB);
    uint64_t offs[] = {500 * MiB, 20 * MiB, 900 * MiB, 300 * MiB, 700 * MiB, 100 * MiB};
    uint64_t start, len, total = 0;
    for (size_t i = 0; i < sizeof offs / sizeof offs[0]; i++) {
        readahead_advise(&ra, offs[i], 128 * 1024, 1000 * MiB, &start, &len);
        total += len;
    }
    cr_assert_eq(total, 0, "random access triggered %llu bytes of readahead",
                 (unsigned long long)total);
}

Test(readahead, jump_resets_window_then_regrows)
{
    struct readahead ra;
    readahead_init(&ra, 1 * MiB, 64 * MiB);
    uint64_t start, len;
    for (uint64_t off = 0; off < 100 * MiB; off += MiB)
        readahead_advise(&ra, off, MiB, 1000 * MiB, &start, &len);
    cr_assert_eq(ra.window, 64 * MiB);
    readahead_advise(&ra, 800 * MiB, MiB, 1000 * MiB, &start, &len);
    cr_assert_eq(len, 0);
    cr_assert_eq(ra.window, 0);
    readahead_advise(&ra, 801 * MiB, MiB, 1000 * MiB, &start, &len);
    cr_assert_eq(start, 802 * MiB);
    cr_assert_eq(len, 1 * MiB, "restarts at the minimum window");
}

Test(readahead, slightly_reordered_reads_stay_sequential)
{
    struct readahead ra;
    readahead_init(&ra, 1 * MiB, 16 * MiB);
    uint64_t start, len;
    uint64_t order[] = {0, 2, 1, 3, 5, 4, 6, 7, 9, 8, 10, 11};
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++)
        readahead_advise(&ra, order[i] * MiB, MiB, 1000 * MiB, &start, &len);
    cr_assert_gt(ra.window, 1 * MiB);
}

Test(readahead, clamped_to_file_size)
{
    struct readahead ra;
    readahead_init(&ra, 4 * MiB, 64 * MiB);
    uint64_t start, len, size = 3 * MiB + 17, end = 0;
    for (uint64_t off = 0; off < size; off += MiB) {
        readahead_advise(&ra, off, MiB, size, &start, &len);
        if (len)
            end = start + len;
    }
    cr_assert_eq(end, size);
}

Test(readahead, a_lower_max_shrinks_the_window_and_caps_refills)
{
    struct readahead ra;
    uint64_t s, l;
    readahead_init(&ra, 1 * MiB, 64 * MiB);
    uint64_t off = 0;
    for (int i = 0; i < 200; i++, off += MiB)
        readahead_advise(&ra, off, MiB, 1ull << 40, &s, &l);
    cr_assert_eq(ra.window, 64 * MiB);
    /* More streams share the cache now: this one's window is cut. */
    readahead_set_max(&ra, 8 * MiB);
    cr_assert_eq(ra.window, 8 * MiB);
    uint64_t most = 0;
    for (int i = 0; i < 200; i++, off += MiB) {
        readahead_advise(&ra, off, MiB, 1ull << 40, &s, &l);
        if (l && s + l - (off + MiB) > most)
            most = s + l - (off + MiB);
    }
    cr_assert_leq(most, 8 * MiB, "requested %llu MiB ahead", (unsigned long long)(most / MiB));
    cr_assert_gt(most, 0);
    /* Never below the smallest window. */
    readahead_set_max(&ra, 4096);
    cr_assert_eq(ra.max_window, 1 * MiB);
    cr_assert_eq(ra.window, 1 * MiB);
}
