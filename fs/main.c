/*
 * fs/main.c - the ckptfs command: options -> store -> mount -> loop.
 *
 *   ckptfs [options] STORE MOUNTPOINT
 *
 * A straight line: parse options, open and validate the store (so a bad
 * bucket or credentials fail the mount with a one-line message before we
 * detach), mount, detach unless -f, start the core's threads, serve until
 * unmounted or signalled, and unwind in reverse order.
 */
#include "core.h"
#include "log.h"
#include "ops.h"
#include "store.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct options {
    const char *store_url;
    const char *mountpoint;
    const char *cache_dir;
    const char *log_file;
    int foreground, debug, single_thread;
    char fuse_opts[4096];
    struct store_options store;
    struct core_config core;
    unsigned max_readahead;
};

static void usage(FILE *out)
{
    fprintf(out,
            "usage: ckptfs [options] STORE MOUNTPOINT\n"
            "\n"
            "Mount a checkpoint store. STORE is s3://BUCKET[/PREFIX] or a local directory.\n"
            "\n"
            "S3 (defaults from AWS_* variables and ~/.aws/{credentials,config}):\n"
            "  --endpoint-url URL     S3 endpoint (AWS_ENDPOINT_URL)\n"
            "  --region REGION        signing region (AWS_REGION, AWS_DEFAULT_REGION)\n"
            "  --profile NAME         profile in ~/.aws files (AWS_PROFILE)\n"
            "  --force-path-style     address buckets as ENDPOINT/BUCKET, not BUCKET.HOST\n"
            "  --max-connections N    parallel requests in flight (16)\n"
            "  --connect-timeout SEC  connect timeout (5)\n"
            "  --timeout SEC          a request making no progress this long fails (30)\n"
            "  --retries N            retries of a failed request, with backoff (5)\n"
            "\n"
            "Caching:\n"
            "  --cache-dir DIR        on-disk state: write staging and the index\n"
            "                         ($XDG_CACHE_HOME/ckptfs or ~/.cache/ckptfs)\n"
            "  --cache-size SIZE      memory for cached file data, e.g. 512M, 4G (1G)\n"
            "  --request-size SIZE    largest single ranged GET of a readahead (8M)\n"
            "  --readahead SIZE       largest sequential readahead window (256M, at most\n"
            "                         a quarter of the cache size)\n"
            "  --attr-timeout SEC     how long attributes and listings are trusted (1)\n"
            "\n"
            "General:\n"
            "  -f                     stay in the foreground\n"
            "  -d                     debug: foreground, FUSE request trace, debug log\n"
            "  -s                     single-threaded FUSE loop\n"
            "  -o OPT[,OPT...]        FUSE mount options (allow_other, ...)\n"
            "  --log-level LEVEL      error, warn, info or debug (info)\n"
            "  --log-file PATH        log here instead of syslog when in the background\n"
            "  -h, --help             this text\n"
            "  -V, --version          version\n"
            "\n"
            "The mount is read-only in this version. Statistics: the extended attribute\n"
            "%s of the mount root (getfattr -n %s MOUNTPOINT).\n"
            "Unmount with: fusermount3 -u MOUNTPOINT (or SIGINT/SIGTERM to ckptfs).\n",
            CKPTFS_STATS_XATTR, CKPTFS_STATS_XATTR);
}

/* "64K", "512M", "4G", "1048576" -> bytes; -1 if malformed. */
static long long parse_size(const char *s)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || v < 0)
        return -1;
    long long mul = 1;
    switch (*end) {
    case 'k':
    case 'K':
        mul = 1ll << 10;
        end++;
        break;
    case 'm':
    case 'M':
        mul = 1ll << 20;
        end++;
        break;
    case 'g':
    case 'G':
        mul = 1ll << 30;
        end++;
        break;
    case 't':
    case 'T':
        mul = 1ll << 40;
        end++;
        break;
    default:
        break;
    }
    if (*end == 'i' || *end == 'B')
        end += (*end == 'i' && end[1] == 'B') ? 2 : 1;
    if (*end)
        return -1;
    return (long long)(v * (double)mul);
}

static int parse_seconds(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || v < 0)
        return -1;
    *out = v;
    return 0;
}

static int fail(const char *fmt, const char *arg)
{
    fprintf(stderr, "ckptfs: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n");
    return -1;
}

static void add_fuse_opt(struct options *o, const char *opt)
{
    size_t n = strlen(o->fuse_opts);
    snprintf(o->fuse_opts + n, sizeof o->fuse_opts - n, "%s%s", n ? "," : "", opt);
}

enum {
    OPT_ENDPOINT = 256,
    OPT_REGION,
    OPT_PROFILE,
    OPT_PATH_STYLE,
    OPT_MAXCONN,
    OPT_CONNECT_TIMEOUT,
    OPT_TIMEOUT,
    OPT_RETRIES,
    OPT_CACHE_DIR,
    OPT_CACHE_SIZE,
    OPT_READAHEAD,
    OPT_REQUEST_SIZE,
    OPT_ATTR_TIMEOUT,
    OPT_LOG_LEVEL,
    OPT_LOG_FILE,
};

static int parse_options(int argc, char **argv, struct options *o)
{
    static const struct option longopts[] = {
        {"endpoint-url", required_argument, 0, OPT_ENDPOINT},
        {"region", required_argument, 0, OPT_REGION},
        {"profile", required_argument, 0, OPT_PROFILE},
        {"force-path-style", no_argument, 0, OPT_PATH_STYLE},
        {"max-connections", required_argument, 0, OPT_MAXCONN},
        {"connect-timeout", required_argument, 0, OPT_CONNECT_TIMEOUT},
        {"timeout", required_argument, 0, OPT_TIMEOUT},
        {"retries", required_argument, 0, OPT_RETRIES},
        {"cache-dir", required_argument, 0, OPT_CACHE_DIR},
        {"cache-size", required_argument, 0, OPT_CACHE_SIZE},
        {"readahead", required_argument, 0, OPT_READAHEAD},
        {"request-size", required_argument, 0, OPT_REQUEST_SIZE},
        {"attr-timeout", required_argument, 0, OPT_ATTR_TIMEOUT},
        {"log-level", required_argument, 0, OPT_LOG_LEVEL},
        {"log-file", required_argument, 0, OPT_LOG_FILE},
        {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, 'V'},
        {0, 0, 0, 0},
    };
    int c;
    double secs;
    long long size;
    opterr = 0; /* our own messages, prefixed "ckptfs:" */
    while ((c = getopt_long(argc, argv, ":fdso:hV", longopts, NULL)) != -1) {
        switch (c) {
        case 'f':
            o->foreground = 1;
            break;
        case 'd':
            o->debug = o->foreground = 1;
            log_set_level(LOG_LVL_DEBUG);
            break;
        case 's':
            o->single_thread = 1;
            break;
        case 'o':
            add_fuse_opt(o, optarg);
            break;
        case 'h':
            usage(stdout);
            exit(0);
        case 'V':
            printf("ckptfs %s\n", CKPTFS_VERSION);
            exit(0);
        case OPT_ENDPOINT:
            o->store.endpoint_url = optarg;
            break;
        case OPT_REGION:
            o->store.region = optarg;
            break;
        case OPT_PROFILE:
            o->store.profile = optarg;
            break;
        case OPT_PATH_STYLE:
            o->store.force_path_style = 1;
            break;
        case OPT_MAXCONN:
            o->store.max_connections = atoi(optarg);
            if (o->store.max_connections < 1 || o->store.max_connections > 256)
                return fail("--max-connections must be 1..256, not '%s'", optarg);
            break;
        case OPT_CONNECT_TIMEOUT:
            if (parse_seconds(optarg, &secs) < 0 || secs <= 0)
                return fail("bad --connect-timeout '%s' (seconds)", optarg);
            o->store.connect_timeout_ms = (int)(secs * 1000);
            break;
        case OPT_TIMEOUT:
            if (parse_seconds(optarg, &secs) < 0 || secs <= 0)
                return fail("bad --timeout '%s' (seconds)", optarg);
            o->store.request_timeout_ms = (int)(secs * 1000);
            break;
        case OPT_RETRIES:
            o->store.max_retries = atoi(optarg);
            if (o->store.max_retries < 0 || o->store.max_retries > 100)
                return fail("--retries must be 0..100, not '%s'", optarg);
            if (o->store.max_retries == 0)
                o->store.max_retries = -1; /* 0 in store_options means "default" */
            break;
        case OPT_CACHE_DIR:
            o->cache_dir = optarg;
            break;
        case OPT_CACHE_SIZE:
            size = parse_size(optarg);
            if (size < (16ll << 20))
                return fail("bad --cache-size '%s' (at least 16M)", optarg);
            o->core.cache_size = (uint64_t)size;
            break;
        case OPT_READAHEAD:
            size = parse_size(optarg);
            if (size < (1ll << 20))
                return fail("bad --readahead '%s' (at least 1M)", optarg);
            o->core.readahead_max = (uint64_t)size;
            break;
        case OPT_REQUEST_SIZE:
            size = parse_size(optarg);
            if (size < (1ll << 20) || size > (64ll << 20) || size % (1ll << 20))
                return fail("bad --request-size '%s' (1M to 64M, whole MiB)", optarg);
            o->core.request_size = (uint32_t)size;
            break;
        case OPT_ATTR_TIMEOUT:
            if (parse_seconds(optarg, &secs) < 0)
                return fail("bad --attr-timeout '%s' (seconds)", optarg);
            o->core.attr_timeout = secs;
            break;
        case OPT_LOG_LEVEL:
            if (!strcmp(optarg, "error"))
                log_set_level(LOG_LVL_ERROR);
            else if (!strcmp(optarg, "warn"))
                log_set_level(LOG_LVL_WARN);
            else if (!strcmp(optarg, "info"))
                log_set_level(LOG_LVL_INFO);
            else if (!strcmp(optarg, "debug"))
                log_set_level(LOG_LVL_DEBUG);
            else
                return fail("bad --log-level '%s' (error, warn, info, debug)", optarg);
            break;
        case OPT_LOG_FILE:
            o->log_file = optarg;
            break;
        case ':':
            fprintf(stderr, "ckptfs: option '%s' needs a value\nTry 'ckptfs --help'.\n",
                    argv[optind - 1]);
            return -1;
        default:
            fprintf(stderr, "ckptfs: unknown option '%s'\nTry 'ckptfs --help'.\n",
                    argv[optind - 1]);
            return -1;
        }
    }
    if (argc - optind != 2) {
        fprintf(stderr, "ckptfs: expected STORE and MOUNTPOINT\n"
                        "usage: ckptfs [options] STORE MOUNTPOINT (ckptfs --help for more)\n");
        return -1;
    }
    o->store_url = argv[optind];
    o->mountpoint = argv[optind + 1];
    return 0;
}

/* The kernel caps readahead of a FUSE mount at its bdi's read_ahead_kb
 * (128 KiB by default) whatever the filesystem asks for, which makes every
 * sequential read arrive as 128 KiB requests. Raise it for this mount (it
 * needs root; without it reads still work, just in smaller requests). The
 * mount's device number comes from /proc/self/mountinfo, because stat() on
 * the mountpoint would wait for the FUSE INIT we have not answered yet. */
static void raise_kernel_readahead(const char *mountpoint, unsigned bytes)
{
    char real[PATH_MAX], line[4096], mp[PATH_MAX];
    if (!realpath(mountpoint, real))
        return;
    FILE *f = fopen("/proc/self/mountinfo", "r");
    if (!f)
        return;
    unsigned major = 0, minor = 0;
    int found = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned maj, min;
        if (sscanf(line, "%*d %*d %u:%u %*s %4095s", &maj, &min, mp) == 3 &&
            strcmp(mp, real) == 0 && strstr(line, "fuse.ckptfs")) {
            major = maj;
            minor = min;
            found = 1; /* keep going: the last match is the newest mount */
        }
    }
    fclose(f);
    if (!found)
        return;
    char path[128];
    snprintf(path, sizeof path, "/sys/class/bdi/%u:%u/read_ahead_kb", major, minor);
    FILE *ra = fopen(path, "w");
    if (!ra) {
        log_debug("cannot raise kernel readahead (%s): %s", path, strerror(errno));
        return;
    }
    fprintf(ra, "%u\n", bytes / 1024);
    if (fclose(ra) != 0)
        log_debug("cannot raise kernel readahead (%s): %s", path, strerror(errno));
}

/* mkdir -p for the cache directory. */
static int make_dirs(const char *path)
{
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return -ENAMETOOLONG;
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = 0;
        if (mkdir(buf, 0700) < 0 && errno != EEXIST)
            return -errno;
        *p = '/';
    }
    if (mkdir(buf, 0700) < 0 && errno != EEXIST)
        return -errno;
    return 0;
}

static int prepare_cache_dir(struct options *o, char *out, size_t outlen)
{
    char def[PATH_MAX];
    const char *dir = o->cache_dir;
    if (!dir) {
        const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
        if (xdg && *xdg)
            snprintf(def, sizeof def, "%s/ckptfs", xdg);
        else
            snprintf(def, sizeof def, "%s/.cache/ckptfs", home && *home ? home : "/tmp");
        dir = def;
    }
    int rc = make_dirs(dir);
    if (rc < 0) {
        fprintf(stderr, "ckptfs: cannot create cache directory '%s': %s\n", dir, strerror(-rc));
        return rc;
    }
    if (!realpath(dir, out)) {
        fprintf(stderr, "ckptfs: cache directory '%s': %s\n", dir, strerror(errno));
        return -errno;
    }
    (void)outlen;
    return 0;
}

/* Fetch buffers have their own pool (bufpool.c); what is left on the heap
 * per read is libfuse's 1 MiB reply buffer. glibc's default maps the first
 * ones afresh (a page fault per 4 KiB) until its dynamic threshold catches
 * up: serve them from the heap from the start and keep freed memory. */
static void tune_allocator(void)
{
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 256 << 20);
}

int main(int argc, char **argv)
{
    tune_allocator();
    struct options o = {0};
    core_config_defaults(&o.core);
    o.max_readahead = 1u << 20;
    if (parse_options(argc, argv, &o) < 0)
        return 2;

    struct stat mst;
    if (stat(o.mountpoint, &mst) < 0) {
        fprintf(stderr, "ckptfs: mountpoint '%s': %s\n", o.mountpoint, strerror(errno));
        return 1;
    }
    if (!S_ISDIR(mst.st_mode)) {
        fprintf(stderr, "ckptfs: mountpoint '%s' is not a directory\n", o.mountpoint);
        return 1;
    }
    char cache_dir[PATH_MAX];
    if (prepare_cache_dir(&o, cache_dir, sizeof cache_dir) < 0)
        return 1;

    char err[512] = "";
    struct store *store = NULL;
    if (store_open(o.store_url, &o.store, &store, err, sizeof err) < 0) {
        fprintf(stderr, "ckptfs: %s\n", err[0] ? err : "cannot open store");
        return 1;
    }

    /* Read-only until the write path lands: the kernel then answers every
     * modifying call with EROFS itself. */
    add_fuse_opt(&o, "ro,fsname=ckptfs,subtype=ckptfs,default_permissions");
    struct fuse_args args = FUSE_ARGS_INIT(0, NULL);
    int rc = 1;
    struct fuse *fuse = NULL;
    struct core *core = NULL;
    struct ops_context octx = {.attr_timeout = o.core.attr_timeout,
                               .max_readahead = o.max_readahead};
    if (fuse_opt_add_arg(&args, argv[0]) || fuse_opt_add_arg(&args, "-o") ||
        fuse_opt_add_arg(&args, o.fuse_opts) || (o.debug && fuse_opt_add_arg(&args, "-d"))) {
        fprintf(stderr, "ckptfs: out of memory\n");
        goto out_store;
    }
    fuse = fuse_new(&args, ckptfs_fuse_operations(), sizeof(struct fuse_operations), &octx);
    if (!fuse) {
        fprintf(stderr, "ckptfs: invalid FUSE options '%s'\n", o.fuse_opts);
        goto out_args;
    }
    if (fuse_mount(fuse, o.mountpoint) != 0) {
        fprintf(stderr,
                "ckptfs: cannot mount on '%s' (is fuse3 installed and /dev/fuse "
                "usable?)\n",
                o.mountpoint);
        goto out_fuse;
    }
    raise_kernel_readahead(o.mountpoint, o.max_readahead);
    /* libfuse leaves a signal alone when it was ignored at start, and a shell
     * starts background jobs (`ckptfs -f ... &` in a script) with SIGINT
     * ignored: then `kill -INT` would not unmount. Every one of these signals
     * means "unmount and exit" for ckptfs, however it was started. */
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    if (fuse_set_signal_handlers(fuse_get_session(fuse)) != 0)
        goto out_unmount;
    if (!o.foreground) {
        if (o.log_file) {
            if (!freopen(o.log_file, "a", stderr))
                log_use_syslog(1);
        } else {
            log_use_syslog(1);
        }
    }
    if (fuse_daemonize(o.foreground) != 0)
        goto out_signals;

    /* Threads start only now: fuse_daemonize forks. */
    o.core.cache_dir = cache_dir;
    rc = core_create(store, &o.core, &core);
    if (rc < 0) {
        log_error("cannot start: %s", strerror(-rc));
        rc = 1;
        goto out_signals;
    }
    octx.core = core;
    log_info("mounted %s on %s (cache %llu MiB, cache dir %s)", store->description, o.mountpoint,
             (unsigned long long)(o.core.cache_size >> 20), cache_dir);

    /* The loop returns 0 after an unmount, the signal number after SIGINT/
     * SIGTERM/SIGHUP (both clean shutdowns) and -1 on error. */
    int loop_rc;
    if (o.single_thread) {
        loop_rc = fuse_loop(fuse);
    } else {
        struct fuse_loop_config lc = {.clone_fd = 0, .max_idle_threads = 16};
        loop_rc = fuse_loop_mt(fuse, &lc);
    }
    rc = loop_rc < 0 ? 1 : 0;
    log_info("unmounting %s", o.mountpoint);

out_signals:
    fuse_remove_signal_handlers(fuse_get_session(fuse));
out_unmount:
    fuse_unmount(fuse);
out_fuse:
    fuse_destroy(fuse);
    core_destroy(core);
out_args:
    fuse_opt_free_args(&args);
out_store:
    store_destroy(store);
    return rc;
}
