/*
 * tools/admin/cmd_stats.c - the stats verb: a mount's counters since it
 * started, read from the user.ckptfs.stats attribute of its root (the
 * daemon's JSON, fs/core/core.c core_stats_json), shown as a summary, passed on
 * as JSON, or sampled every few seconds as rates per second (--watch).
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "admin.h"

#define STATS_XATTR "user.ckptfs.stats" /* fs/ops.h CKPTFS_STATS_XATTR */

/* The mount's stats object, or NULL with the error reported (*ex set). */
static json_t *read_stats(const struct admin_opts *o, const char *mnt, int *ex)
{
    char buf[65536];
    ssize_t n = getxattr(mnt, STATS_XATTR, buf, sizeof buf - 1);
    if (n < 0) {
        int e = errno;
        *ex = report_msg(o, EX_IO, mnt, -e, "%s",
                         e == ENODATA || e == ENOTSUP ? "not the root of a ckptfs mount"
                                                      : strerror(e));
        return NULL;
    }
    buf[n] = '\0';
    json_error_t jerr;
    json_t *j = json_loads(buf, 0, &jerr);
    if (!j || !json_is_object(j)) {
        json_decref(j);
        *ex = report_msg(o, EX_IO, mnt, -EPROTO, "the mount's stats are not a JSON object: %s",
                         jerr.text);
        return NULL;
    }
    return j;
}

/* The number at a dotted path ("cache.hits"), 0 if absent. */
static double num(json_t *j, const char *path)
{
    char key[128];
    const char *p = path;
    while (j && *p) {
        const char *dot = strchr(p, '.');
        size_t n = dot ? (size_t)(dot - p) : strlen(p);
        if (n >= sizeof key)
            return 0;
        memcpy(key, p, n);
        key[n] = '\0';
        j = json_object_get(j, key);
        p = dot ? dot + 1 : p + n;
    }
    return json_is_number(j) ? json_number_value(j) : 0;
}

static const char *str(json_t *j, const char *path)
{
    const char *dot = strchr(path, '.');
    if (dot) {
        char key[64];
        snprintf(key, sizeof key, "%.*s", (int)(dot - path), path);
        return str(json_object_get(j, key), dot + 1);
    }
    const char *s = json_string_value(json_object_get(j, path));
    return s ? s : "?";
}

/* "1.50 GiB (1610612736 B)" */
static const char *fmt_size(char *buf, size_t len, double b)
{
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    double v = b;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    if (u == 0)
        snprintf(buf, len, "%.0f B", b);
    else
        snprintf(buf, len, "%.2f %s (%.0f B)", v, units[u], b);
    return buf;
}

static void print_summary(const char *mnt, json_t *j)
{
    char a[64], b[64], c[64];
    double read = num(j, "read_bytes"), got = num(j, "get_bytes");
    double hits = num(j, "cache.hits"), misses = num(j, "cache.misses"),
           shared = num(j, "cache.shared");
    printf("ckptfs stats of %s: %s store, up %.1f s, %.0f files open, %.0f opens\n\n", mnt,
           str(j, "store"), num(j, "uptime_s"), num(j, "open_files"), num(j, "opens"));
    printf("reads\n");
    printf("  read by clients         %s\n", fmt_size(a, sizeof a, read));
    printf("  fetched from the store  %s in %.0f GETs", fmt_size(a, sizeof a, got),
           num(j, "get_requests"));
    if (read > 0)
        printf(", %.2f x what was read", got / read);
    printf("\n");
    if (hits + misses + shared > 0)
        printf("  cache hit rate          %.1f%% (%.0f hits, %.0f misses, %.0f waited for a "
               "fetch; %.0f KiB blocks)\n",
               100 * hits / (hits + misses + shared), hits, misses, shared,
               num(j, "cache.block_size") / 1024);
    else
        printf("  cache hit rate          - (no block read through the cache)\n");
    printf("  prefetched              %s\n",
           fmt_size(a, sizeof a, num(j, "cache.prefetched_bytes")));
    printf("  prefetched never used   %s dropped unread, %s held unread\n",
           fmt_size(a, sizeof a, num(j, "cache.prefetch_unused_bytes")),
           fmt_size(b, sizeof b, num(j, "cache.prefetch_unread_bytes")));
    printf("  cache                   %s of %s held; %.0f evictions (%.0f of prefetched blocks "
           "still to be read), %.0f released behind "
           "readers, %.0f failed fetches, %.0f reads failed at once after a timeout\n",
           fmt_size(a, sizeof a, num(j, "cache.bytes_cached")),
           fmt_size(b, sizeof b, num(j, "cache.capacity")), num(j, "cache.evictions"),
           num(j, "cache.evicted_unread"), num(j, "cache.released"), num(j, "cache.fetch_errors"),
           num(j, "cache.failed_fast"));
    printf("  working set             %.0f read blocks recycled for new fetches, %.0f "
           "read-ahead ranges left to their readers\n",
           num(j, "cache.recycled"), num(j, "cache.ahead_deferred"));
    printf("\nrequests to the store\n");
    printf("  GET %.0f, HEAD %.0f, LIST %.0f, PUT %.0f, CreateMultipartUpload %.0f, UploadPart "
           "%.0f, CompleteMultipartUpload %.0f, AbortMultipartUpload %.0f, "
           "ListMultipartUploads %.0f, Copy %.0f, DELETE %.0f\n",
           num(j, "get_requests"), num(j, "head_requests"), num(j, "list_requests"),
           num(j, "write.put_requests"), num(j, "write.mpu_begin_requests"),
           num(j, "write.part_requests"), num(j, "write.complete_requests"),
           num(j, "write.abort_requests"), num(j, "write.upload_list_requests"),
           num(j, "write.copy_requests"), num(j, "write.delete_requests"));
    printf("  %.0f keys listed, %.0f retried, %.0f failed for good\n", num(j, "listed_keys"),
           num(j, "retries"), num(j, "errors"));
    printf("\nindex\n");
    if (json_is_true(json_object_get(json_object_get(j, "index"), "enabled")))
        printf("  enabled: %.0f checkpoints ready (%.0f built, %.0f reused, %.0f failed), %.0f "
               "lookups, %.0f items prefetched whole, %.0f other ranks' chunks prefetched\n",
               num(j, "index.ready"), num(j, "index.built"), num(j, "index.reused"),
               num(j, "index.failed"), num(j, "index.lookups"), num(j, "index.item_prefetches"),
               num(j, "index.sibling_prefetches"));
    else
        printf("  disabled\n");
    printf("\ndisk cache\n");
    if (json_is_true(json_object_get(json_object_get(j, "disk_cache"), "enabled"))) {
        printf("  held                    %s of %s (%.0f objects)\n",
               fmt_size(a, sizeof a, num(j, "disk_cache.held_bytes")),
               fmt_size(b, sizeof b, num(j, "disk_cache.capacity")), num(j, "disk_cache.objects"));
        printf("  hits                    %.0f reads, %s (%.0f misses; %.0f reads spliced in "
               "place)\n",
               num(j, "disk_cache.hits"), fmt_size(a, sizeof a, num(j, "disk_cache.hit_bytes")),
               num(j, "disk_cache.misses"), num(j, "disk_cache.in_place_reads"));
        printf("  kept                    %s read from the store, %s written here (%.0f files)\n",
               fmt_size(a, sizeof a, num(j, "disk_cache.stored_bytes")),
               fmt_size(b, sizeof b, num(j, "disk_cache.adopted_bytes")),
               num(j, "disk_cache.adopted_files"));
        printf("  %.0f evictions (%s), %.0f checksum failures in %.0f chunks checked, %.0f not "
               "kept (disk full or failing), %.0f not queued (writer behind)\n",
               num(j, "disk_cache.evictions"),
               fmt_size(a, sizeof a, num(j, "disk_cache.evicted_bytes")),
               num(j, "disk_cache.checksum_failures"), num(j, "disk_cache.checked_chunks"),
               num(j, "disk_cache.put_failures"), num(j, "disk_cache.fill_dropped"));
    } else {
        printf("  disabled (--disk-cache-size)\n");
    }
    printf("\nwrite\n");
    if (!json_is_true(json_object_get(json_object_get(j, "write"), "enabled"))) {
        printf("  disabled (read-only mount)\n");
        return;
    }
    printf("  fsync                   %s\n", str(j, "write.fsync"));
    printf("  written by clients      %s\n", fmt_size(a, sizeof a, num(j, "write.write_bytes")));
    printf("  uploaded                %s (%.0f files published of %.0f staged; %s in "
           "requests)\n",
           fmt_size(a, sizeof a, num(j, "write.bytes_uploaded")), num(j, "write.files_published"),
           num(j, "write.files_staged"), fmt_size(b, sizeof b, num(j, "write.put_bytes")));
    printf("  pending                 %.0f files, %s; %s in staging\n",
           num(j, "write.pending_files"), fmt_size(a, sizeof a, num(j, "write.pending_bytes")),
           fmt_size(c, sizeof c, num(j, "write.staged_bytes")));
    printf("  %.0f upload failures, %.0f commits, %.0f commit timeouts, %.0f budget waits, %.0f "
           "recovered files\n",
           num(j, "write.upload_failures"), num(j, "write.commits"),
           num(j, "write.commit_timeouts"), num(j, "write.budget_waits"),
           num(j, "write.recovered_files"));
    if (num(j, "write.upload_yields") > 0)
        printf("  %.0f uploads waited %.1f s for writers on a busy CPU (staged mode)\n",
               num(j, "write.upload_yields"), num(j, "write.upload_yield_s"));
}

/* Every counter of b (dotted names), as (b - a) / secs, into rates. Gauges
 * (now values) and settings are not rates and are left out. */
static void add_rates(json_t *rates, const char *prefix, json_t *a, json_t *b, double secs)
{
    static const char *const not_rates[] = {
        "uptime_s",           "open_files",          "cache.bytes_cached",
        "cache.capacity",     "cache.block_size",    "cache.prefetch_unread_bytes",
        "index.ready",        "write.pending_files", "write.pending_bytes",
        "write.staged_bytes", "write.last_publish"};
    const char *key;
    json_t *v;
    json_object_foreach(b, key, v)
    {
        char name[128];
        snprintf(name, sizeof name, "%s%s", prefix, key);
        if (json_is_object(v)) {
            char sub[sizeof name + 1];
            snprintf(sub, sizeof sub, "%s.", name);
            add_rates(rates, sub, json_object_get(a, key), v, secs);
            continue;
        }
        if (!json_is_integer(v))
            continue;
        int skip = 0;
        for (size_t i = 0; i < sizeof not_rates / sizeof not_rates[0]; i++)
            skip |= strcmp(name, not_rates[i]) == 0;
        json_t *old = json_object_get(a, key);
        if (skip || !json_is_integer(old))
            continue;
        double d = (double)(json_integer_value(v) - json_integer_value(old));
        json_object_set_new(rates, name, json_real(d / secs));
    }
}

static double mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void sleep_until(double t)
{
    double d = t - mono_now();
    if (d <= 0)
        return;
    struct timespec ts = {.tv_sec = (time_t)d, .tv_nsec = (long)((d - floor(d)) * 1e9)};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

static void print_rate_line(json_t *r, json_t *cur, int n)
{
    if (n % 20 == 0)
        printf("%-8s %10s %10s %7s %6s %10s %10s %7s %9s\n", "time", "read MB/s", "fetch MB/s",
               "GET/s", "hit%", "write MB/s", "upld MB/s", "PUT/s", "unused MB");
    double hits = num(r, "cache.hits"),
           blocks = hits + num(r, "cache.misses") + num(r, "cache.shared");
    char hit[16] = "-";
    if (blocks > 0)
        snprintf(hit, sizeof hit, "%.0f", 100 * hits / blocks);
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    char t[16];
    strftime(t, sizeof t, "%H:%M:%S", &tm);
    printf("%-8s %10.1f %10.1f %7.1f %6s %10.1f %10.1f %7.1f %9.1f\n", t,
           num(r, "read_bytes") / 1e6, num(r, "get_bytes") / 1e6, num(r, "get_requests"), hit,
           num(r, "write.write_bytes") / 1e6, num(r, "write.put_bytes") / 1e6,
           num(r, "write.put_requests") + num(r, "write.part_requests"),
           num(cur, "cache.prefetch_unused_bytes") / 1e6);
    fflush(stdout);
}

static int watch(const struct admin_opts *o, const char *mnt)
{
    int ex = EX_OK;
    json_t *prev = read_stats(o, mnt, &ex);
    if (!prev)
        return ex;
    double t0 = mono_now(), tprev = t0;
    for (long n = 0; o->count == 0 || n < o->count; n++) {
        sleep_until(t0 + (double)(n + 1) * o->watch);
        json_t *cur = read_stats(o, mnt, &ex);
        if (!cur)
            break;
        double t = mono_now();
        json_t *rates = json_object();
        add_rates(rates, "", prev, cur, t - tprev);
        if (o->json) {
            json_t *line = json_pack("{s:f,s:f,s:o,s:O}", "time", (double)time(NULL), "interval_s",
                                     t - tprev, "rates", rates, "stats", cur);
            json_dumpf(line, stdout, JSON_COMPACT);
            fputc('\n', stdout);
            fflush(stdout);
            json_decref(line);
        } else {
            print_rate_line(rates, cur, (int)n);
            json_decref(rates);
        }
        json_decref(prev);
        prev = cur;
        tprev = t;
    }
    json_decref(prev);
    return ex;
}

int cmd_stats(struct admin_opts *o)
{
    int ex = need_args(o, 1, "stats MOUNTPOINT [--json] [--watch [SECONDS]] [--count N]");
    if (ex)
        return ex;
    const char *mnt = o->argv[0];
    if (o->watch > 0)
        return watch(o, mnt);
    json_t *j = read_stats(o, mnt, &ex);
    if (!j)
        return ex;
    if (o->json)
        return json_out(j);
    print_summary(mnt, j);
    json_decref(j);
    return EX_OK;
}
