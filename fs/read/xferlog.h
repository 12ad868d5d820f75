/*
 * fs/read/xferlog.h - the periodic transfer summary: a thread that samples the
 * mount's counters every few seconds and logs one info line about what moved
 * since the last sample (client reads, store GETs, hit rate, writes,
 * uploads), and nothing while the mount is idle.
 */
#ifndef CKPTFS_XFERLOG_H
#define CKPTFS_XFERLOG_H

#include <stddef.h>
#include <stdint.h>

/* Cumulative counters since the mount, as one sample sees them. */
struct xfer_counters {
    uint64_t read_bytes;   /* returned to clients */
    uint64_t get_requests; /* ranged GETs / preads sent to the store */
    uint64_t get_bytes;    /* bytes they brought */
    uint64_t hits;         /* cache blocks served from memory */
    uint64_t misses;       /* cache blocks a reader fetched itself */
    uint64_t shared;       /* cache blocks a reader waited for */
    uint64_t write_bytes;  /* written by clients */
    uint64_t put_requests; /* puts and parts sent */
    uint64_t put_bytes;    /* bytes they carried */
    uint64_t errors;       /* store requests that failed for good */
};

/* Fills *out with the counters now. */
typedef void (*xferlog_sample_fn)(void *arg, struct xfer_counters *out);

/* One summary of what moved from a to b in secs seconds into buf (always
 * NUL-terminated). Returns 0 and writes "" if nothing moved, else 1. */
int xferlog_format(const struct xfer_counters *a, const struct xfer_counters *b, double secs,
                   char *buf, size_t len);

struct xferlog;

/* Start logging every interval seconds (interval > 0). 0 or a negative errno. */
int xferlog_start(double interval, xferlog_sample_fn sample, void *arg, struct xferlog **out);
/* Log what moved since the last line, stop the thread and free it (NULL: no-op). */
void xferlog_stop(struct xferlog *xl);

#endif
