/* tests/unit/test_pagecache.c - page_cache_holds (fs/util/pagecache.c) against
 * the real page cache: a file's pages dropped with posix_fadvise are not
 * held, the pages a read brought in are, exactly for the range read; a range
 * past the end of the file or a closed descriptor is not held. */
#include "pagecache.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MIB (1u << 20)

static char path[] = "/tmp/ckptfs-test-pagecache-XXXXXX";
static int fd = -1;

/* A 4 MiB file on disk, none of it in the page cache. */
static void setup(void)
{
    fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    char *buf = malloc(MIB);
    cr_assert_not_null(buf);
    memset(buf, 0x5a, MIB);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(write(fd, buf, MIB), (ssize_t)MIB);
    free(buf);
    cr_assert_eq(fsync(fd), 0);
    cr_assert_eq(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
}

static void teardown(void)
{
    if (fd >= 0)
        close(fd);
    unlink(path);
}

TestSuite(pagecache, .init = setup, .fini = teardown);

/* The kernel's answer for [off, off + len), skipping the test where it has
 * no cachestat (the callers fall back to mincore there). */
static int holds(uint64_t off, uint64_t len)
{
    int held = page_cache_holds(fd, off, len);
    if (held < 0)
        cr_skip_test("the kernel has no cachestat(2)");
    return held;
}

Test(pagecache, dropped_pages_are_not_held_and_read_pages_are)
{
    cr_assert_eq(holds(0, 4 * MIB), 0);
    char *buf = malloc(MIB);
    cr_assert_not_null(buf);
    cr_assert_eq(pread(fd, buf, MIB, MIB), (ssize_t)MIB);
    free(buf);
    cr_assert_eq(holds(MIB, MIB), 1, "the MiB just read is held");
    cr_assert_eq(holds(MIB + 4096, 10), 1, "a part of a page counts as its page");
    cr_assert_eq(holds(0, MIB), 0, "the first MiB was never read");
    cr_assert_eq(holds(MIB, MIB + 4096), 0, "one page past the read is not held");
    cr_assert_eq(posix_fadvise(fd, MIB, MIB, POSIX_FADV_DONTNEED), 0);
    cr_assert_eq(holds(MIB, MIB), 0, "dropped again");
}

Test(pagecache, a_range_past_the_end_is_not_held)
{
    char *buf = malloc(4 * MIB);
    cr_assert_not_null(buf);
    cr_assert_eq(pread(fd, buf, 4 * MIB, 0), (ssize_t)(4 * MIB));
    free(buf);
    cr_assert_eq(holds(0, 4 * MIB), 1);
    cr_assert_eq(holds(3 * MIB, 2 * MIB), 0, "the file ends at 4 MiB");
}

Test(pagecache, an_empty_range_is_held_and_a_closed_fd_is_not)
{
    cr_assert_eq(page_cache_holds(fd, 123, 0), 1);
    int spare = dup(fd);
    cr_assert_geq(spare, 0);
    close(spare);
    cr_assert_neq(page_cache_holds(spare, 0, MIB), 1, "a closed descriptor: not held");
}
