/*
 * fs/util/cpu_pressure.c - CPU pressure from /proc/pressure/cpu (see
 * cpu_pressure.h): the "some" line's total stall microseconds, sampled at
 * most once per window, turned into a share of the window's wall time.
 */
#include "cpu_pressure.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct cpu_pressure {
    int fd;
    double sampled_at; /* monotonic seconds of the latest reading, 0 = none */
    uint64_t total_us; /* its "some total=" */
    double share;      /* over the window that ended at sampled_at, -1 = unknown */
};

int cpu_pressure_parse(const char *text, uint64_t *total_us)
{
    if (strncmp(text, "some ", 5) != 0)
        return -EINVAL;
    const char *eol = strchr(text, '\n');
    const char *t = strstr(text, " total=");
    if (!t || (eol && t > eol))
        return -EINVAL;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(t + 7, &end, 10);
    if (errno || end == t + 7 || (*end != '\n' && *end != '\0' && *end != ' '))
        return -EINVAL;
    *total_us = v;
    return 0;
}

static int read_total(struct cpu_pressure *p, uint64_t *total_us)
{
    char buf[256];
    ssize_t n = pread(p->fd, buf, sizeof buf - 1, 0);
    if (n <= 0)
        return n < 0 ? -errno : -EINVAL;
    buf[n] = '\0';
    return cpu_pressure_parse(buf, total_us);
}

int cpu_pressure_open(const char *path, struct cpu_pressure **out)
{
    *out = NULL;
    struct cpu_pressure *p = calloc(1, sizeof *p);
    if (!p)
        return -ENOMEM;
    p->share = -1;
    p->fd = open(path, O_RDONLY | O_CLOEXEC);
    uint64_t total;
    int rc = p->fd < 0 ? -errno : read_total(p, &total);
    if (rc < 0) {
        if (p->fd >= 0)
            close(p->fd);
        free(p);
        return rc;
    }
    *out = p;
    return 0;
}

void cpu_pressure_close(struct cpu_pressure *p)
{
    if (!p)
        return;
    close(p->fd);
    free(p);
}

double cpu_pressure_share(struct cpu_pressure *p, double now)
{
    if (p->sampled_at > 0 && now - p->sampled_at < CPU_PRESSURE_WINDOW)
        return p->share;
    uint64_t total;
    if (read_total(p, &total) < 0) {
        p->sampled_at = 0;
        p->share = -1;
        return CPU_PRESSURE_UNREADABLE;
    }
    p->share = -1; /* a reading after a long quiet says nothing about now */
    if (p->sampled_at > 0 && total >= p->total_us &&
        now - p->sampled_at <= 10 * CPU_PRESSURE_WINDOW) {
        double share = (double)(total - p->total_us) / 1e6 / (now - p->sampled_at);
        p->share = share > 1 ? 1 : share;
    }
    p->sampled_at = now;
    p->total_us = total;
    return p->share;
}
