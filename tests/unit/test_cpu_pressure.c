/* tests/unit/test_cpu_pressure.c - the PSI reader (fs/util/cpu_pressure.c): the
 * "some" line's total parsed strictly, and shares taken over windows of at
 * least CPU_PRESSURE_WINDOW from a file the test rewrites between readings. */
#include "cpu_pressure.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static char path[] = "/tmp/ckptfs-test-psi-XXXXXX";

static void psi_file(unsigned long long some_total)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f, "some avg10=1.00 avg60=2.00 avg300=3.00 total=%llu\n", some_total);
    fprintf(f, "full avg10=0.00 avg60=0.00 avg300=0.00 total=7\n");
    fclose(f);
}

static void setup(void)
{
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    close(fd);
}

static void teardown(void)
{
    unlink(path);
}

TestSuite(cpu_pressure, .init = setup, .fini = teardown);

Test(cpu_pressure, parses_the_some_total)
{
    uint64_t t = 0;
    cr_assert_eq(cpu_pressure_parse("some avg10=0.00 avg60=0.00 avg300=0.00 total=123456\n"
                                    "full avg10=0.00 avg60=0.00 avg300=0.00 total=9\n",
                                    &t),
                 0);
    cr_assert_eq(t, 123456);
}

Test(cpu_pressure, refuses_what_is_not_a_some_line)
{
    uint64_t t = 42;
    cr_assert_eq(cpu_pressure_parse("", &t), -EINVAL);
    cr_assert_eq(cpu_pressure_parse("full avg10=0.00 total=5\n", &t), -EINVAL);
    cr_assert_eq(cpu_pressure_parse("some avg10=0.00\nfull total=5\n", &t), -EINVAL,
                 "a total on the next line is not the some line's");
    cr_assert_eq(cpu_pressure_parse("some avg10=0.00 total=\n", &t), -EINVAL);
    cr_assert_eq(cpu_pressure_parse("some avg10=0.00 total=12x\n", &t), -EINVAL);
    cr_assert_eq(cpu_pressure_parse("some total=99999999999999999999999\n", &t), -EINVAL);
    cr_assert_eq(t, 42, "a refused text leaves the total alone");
}

Test(cpu_pressure, a_missing_file_is_an_error)
{
    struct cpu_pressure *p = (void *)1;
    cr_assert_eq(cpu_pressure_open("/nonexistent/pressure/cpu", &p), -ENOENT);
    cr_assert_null(p);
}

/* Times are binary fractions, so window arithmetic is exact. */
Test(cpu_pressure, share_is_stall_time_over_wall_time_of_a_window)
{
    psi_file(1000000);
    struct cpu_pressure *p;
    cr_assert_eq(cpu_pressure_open(path, &p), 0);
    cr_assert_eq(cpu_pressure_share(p, 8.0), -1, "one reading is no window");
    psi_file(1050000); /* 50 ms of stall ... */
    cr_assert_eq(cpu_pressure_share(p, 8.0625), -1, "not read again within a window");
    cr_assert_float_eq(cpu_pressure_share(p, 8.125), 0.4, 1e-9, "... in 125 ms");
    cr_assert_float_eq(cpu_pressure_share(p, 8.1875), 0.4, 1e-9, "the last share, until a window");
    cr_assert_float_eq(cpu_pressure_share(p, 8.375), 0.0, 1e-9, "no stall in 250 ms");
    psi_file(2050000);
    cr_assert_float_eq(cpu_pressure_share(p, 8.5), 1.0, 1e-9, "more than the window: capped");
    psi_file(2150000);
    cr_assert_eq(cpu_pressure_share(p, 10.0), -1, "a reading after a long gap says nothing");
    psi_file(2200000);
    cr_assert_float_eq(cpu_pressure_share(p, 10.25), 0.2, 1e-9);
    cpu_pressure_close(p);
}

Test(cpu_pressure, an_unreadable_total_says_so)
{
    psi_file(1000000);
    struct cpu_pressure *p;
    cr_assert_eq(cpu_pressure_open(path, &p), 0);
    cr_assert_eq(cpu_pressure_share(p, 1.0), -1);
    FILE *f = fopen(path, "w");
    fputs("garbage\n", f);
    fclose(f);
    cr_assert_eq(cpu_pressure_share(p, 1.25), CPU_PRESSURE_UNREADABLE);
    psi_file(1100000);
    cr_assert_eq(cpu_pressure_share(p, 1.5), -1, "a failed read starts the windows over");
    psi_file(1150000);
    cr_assert_float_eq(cpu_pressure_share(p, 1.75), 0.2, 1e-9);
    cpu_pressure_close(p);
}
