/* tests/unit/test_xferlog.c - the transfer summary: silent when nothing
 * moved, rates and totals of what did, and the thread logging while
 * counters move and stopping promptly. */
#include "xferlog.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

Test(xferlog, idle_interval_formats_nothing)
{
    struct xfer_counters a = {.read_bytes = 5, .get_bytes = 7, .hits = 3}, b = a;
    char buf[256] = "x";
    cr_assert_eq(xferlog_format(&a, &b, 5.0, buf, sizeof buf), 0);
    cr_assert_str_eq(buf, "");
}

Test(xferlog, reads_give_rates_totals_and_hit_rate)
{
    struct xfer_counters a = {0};
    struct xfer_counters b = {
        .read_bytes = 100000000, .get_requests = 12, .get_bytes = 50000000, .hits = 3, .misses = 1};
    char buf[256];
    cr_assert_eq(xferlog_format(&a, &b, 2.0, buf, sizeof buf), 1);
    cr_assert(strstr(buf, "read 50.0 MB/s"), "%s", buf);
    cr_assert(strstr(buf, "fetched 25.0 MB/s"), "%s", buf);
    cr_assert(strstr(buf, "in 12 GETs"), "%s", buf);
    cr_assert(strstr(buf, "hit rate 75%"), "%s", buf);
    cr_assert_null(strstr(buf, "written"), "%s", buf);
}

Test(xferlog, writes_alone_show_uploads)
{
    struct xfer_counters a = {.read_bytes = 9}, b = a;
    b.write_bytes = 4000000;
    b.put_bytes = 2000000;
    b.put_requests = 3;
    char buf[256];
    cr_assert_eq(xferlog_format(&a, &b, 1.0, buf, sizeof buf), 1);
    cr_assert(strstr(buf, "written 4.0 MB/s"), "%s", buf);
    cr_assert(strstr(buf, "uploaded 2.0 MB/s"), "%s", buf);
    cr_assert(strstr(buf, "3 PUTs/parts"), "%s", buf);
    cr_assert_null(strstr(buf, "fetched"), "%s", buf);
}

Test(xferlog, short_buffer_stays_terminated)
{
    struct xfer_counters a = {0}, b = {.read_bytes = 1, .write_bytes = 1, .errors = 2};
    char buf[16];
    cr_assert_eq(xferlog_format(&a, &b, 1.0, buf, sizeof buf), 1);
    cr_assert_lt(strlen(buf), sizeof buf);
}

static atomic_int samples;

static void sample(void *arg, struct xfer_counters *out)
{
    (void)arg;
    int n = atomic_fetch_add(&samples, 1);
    *out = (struct xfer_counters){.read_bytes = (uint64_t)n * 1000};
}

Test(xferlog, thread_samples_every_interval_and_stops_promptly)
{
    struct xferlog *xl;
    cr_assert_eq(xferlog_start(0.05, sample, NULL, &xl), 0);
    usleep(300000);
    int seen = atomic_load(&samples);
    cr_assert_geq(seen, 4, "%d samples in 0.3 s at 0.05 s", seen);
    xferlog_stop(xl); /* would hang the test if the thread did not wake */
    cr_assert_eq(xferlog_start(0, sample, NULL, &xl), -EINVAL);
}
