/*
 * fs/util/clock.h - the clocks fs/ modules use: the monotonic clock they time
 * with (timeouts, lingers, rates: seconds since an arbitrary start, never
 * going back), and the wall clock files' and directories' times come from.
 */
#ifndef CKPTFS_CLOCK_H
#define CKPTFS_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Monotonic seconds (CLOCK_MONOTONIC). */
static inline double mono_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Nanoseconds since the epoch (CLOCK_REALTIME): a file's or directory's time. */
static inline int64_t wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

#endif
