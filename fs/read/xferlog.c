/*
 * fs/read/xferlog.c - the periodic transfer summary (see xferlog.h): one thread
 * sleeping on a condition variable between samples, so stopping is prompt.
 */
#include "xferlog.h"

#include "clock.h"
#include "log.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

struct xferlog {
    double interval;
    xferlog_sample_fn sample;
    void *arg;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond; /* CLOCK_MONOTONIC */
    int stopping;        /* protected by lock */
    struct xfer_counters last;
    double last_t;
};

/* "12.3 MB/s" style: decimal megabytes, as the benchmarks report. */
static void fmt_rate(char *buf, size_t len, double bytes, double secs)
{
    snprintf(buf, len, "%.1f MB/s", secs > 0 ? bytes / secs / 1e6 : 0.0);
}

static void fmt_bytes(char *buf, size_t len, uint64_t b)
{
    if (b >= 10ull << 30)
        snprintf(buf, len, "%.1f GiB", (double)b / (1ull << 30));
    else if (b >= 10ull << 20)
        snprintf(buf, len, "%.1f MiB", (double)b / (1ull << 20));
    else if (b >= 10ull << 10)
        snprintf(buf, len, "%.1f KiB", (double)b / (1ull << 10));
    else
        snprintf(buf, len, "%llu B", (unsigned long long)b);
}

int xferlog_format(const struct xfer_counters *a, const struct xfer_counters *b, double secs,
                   char *buf, size_t len)
{
#define D(f) (b->f - a->f)
    size_t n = 0;
    buf[0] = '\0';
    if (D(read_bytes) == 0 && D(get_requests) == 0 && D(get_bytes) == 0 && D(write_bytes) == 0 &&
        D(put_requests) == 0 && D(put_bytes) == 0 && D(errors) == 0)
        return 0;
    char r[32], t[32];
#define PUT(...)                                                                                   \
    do {                                                                                           \
        if (n < len)                                                                               \
            n += (size_t)snprintf(buf + n, len - n, __VA_ARGS__);                                  \
    } while (0)
    PUT("transfers in %.1f s:", secs);
    if (D(read_bytes) || D(get_bytes) || D(get_requests)) {
        fmt_rate(r, sizeof r, (double)D(read_bytes), secs);
        fmt_bytes(t, sizeof t, D(read_bytes));
        PUT(" read %s (%s)", r, t);
        fmt_rate(r, sizeof r, (double)D(get_bytes), secs);
        fmt_bytes(t, sizeof t, D(get_bytes));
        PUT(", fetched %s (%s in %llu GETs)", r, t, (unsigned long long)D(get_requests));
        uint64_t blocks = D(hits) + D(misses) + D(shared);
        if (blocks)
            PUT(", hit rate %.0f%%", 100.0 * (double)D(hits) / (double)blocks);
    }
    if (D(write_bytes) || D(put_bytes) || D(put_requests)) {
        fmt_rate(r, sizeof r, (double)D(write_bytes), secs);
        fmt_bytes(t, sizeof t, D(write_bytes));
        PUT("%s written %s (%s)", n > 0 && buf[n - 1] != ':' ? ";" : "", r, t);
        fmt_rate(r, sizeof r, (double)D(put_bytes), secs);
        fmt_bytes(t, sizeof t, D(put_bytes));
        PUT(", uploaded %s (%s in %llu PUTs/parts)", r, t, (unsigned long long)D(put_requests));
    }
    if (D(errors))
        PUT("; %llu failed requests", (unsigned long long)D(errors));
#undef PUT
#undef D
    return 1;
}

/* Log what moved since the last sample and make now the last sample. */
static void tick(struct xferlog *xl)
{
    struct xfer_counters now;
    xl->sample(xl->arg, &now);
    double t = mono_seconds();
    char line[512];
    if (xferlog_format(&xl->last, &now, t - xl->last_t, line, sizeof line))
        log_info("%s", line);
    xl->last = now;
    xl->last_t = t;
}

static void *run(void *arg)
{
    struct xferlog *xl = arg;
    pthread_mutex_lock(&xl->lock);
    while (!xl->stopping) {
        double due = xl->last_t + xl->interval;
        struct timespec ts = {.tv_sec = (time_t)due,
                              .tv_nsec = (long)((due - (double)(time_t)due) * 1e9)};
        int rc = pthread_cond_timedwait(&xl->cond, &xl->lock, &ts);
        if (rc == ETIMEDOUT && !xl->stopping) {
            pthread_mutex_unlock(&xl->lock);
            tick(xl);
            pthread_mutex_lock(&xl->lock);
        }
    }
    pthread_mutex_unlock(&xl->lock);
    return NULL;
}

int xferlog_start(double interval, xferlog_sample_fn sample, void *arg, struct xferlog **out)
{
    if (!(interval > 0))
        return -EINVAL;
    struct xferlog *xl = calloc(1, sizeof *xl);
    if (!xl)
        return -ENOMEM;
    xl->interval = interval;
    xl->sample = sample;
    xl->arg = arg;
    sample(arg, &xl->last);
    xl->last_t = mono_seconds();
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&xl->cond, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&xl->lock, NULL);
    int rc = pthread_create(&xl->thread, NULL, run, xl);
    if (rc != 0) {
        pthread_cond_destroy(&xl->cond);
        pthread_mutex_destroy(&xl->lock);
        free(xl);
        return -rc;
    }
    *out = xl;
    return 0;
}

void xferlog_stop(struct xferlog *xl)
{
    if (!xl)
        return;
    pthread_mutex_lock(&xl->lock);
    xl->stopping = 1;
    pthread_cond_signal(&xl->cond);
    pthread_mutex_unlock(&xl->lock);
    pthread_join(xl->thread, NULL);
    tick(xl);
    pthread_cond_destroy(&xl->cond);
    pthread_mutex_destroy(&xl->lock);
    free(xl);
}
