/*
 * fs/clock.h - the monotonic clock fs/ modules time with (timeouts,
 * lingers, rates): seconds since an arbitrary start, never going back.
 */
#ifndef CKPTFS_CLOCK_H
#define CKPTFS_CLOCK_H

#include <time.h>

/* Monotonic seconds (CLOCK_MONOTONIC). */
static inline double mono_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

#endif
