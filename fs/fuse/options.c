/*
 * fs/options.c - parsing the ckptfs command line from one table (see
 * options.h). Each row names an option, the kind of value it takes (which
 * picks the parser and its bounds), where the value goes, and its help
 * line; usage() prints the rows, options_parse() walks them. Adding an
 * option is adding a row.
 */
#include "options.h"

#include "log.h"

#define FUSE_USE_VERSION 35
#include <errno.h>
#include <fuse_opt.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum kind {
    K_FLAG,    /* no value: sets an int to 1 */
    K_STRING,  /* const char * */
    K_SIZE64,  /* "512M" -> uint64_t bytes, within [min, max] */
    K_SIZE32,  /* the same into a uint32_t */
    K_SECONDS, /* "1.5" -> double seconds, within [min, max] */
    K_MS,      /* seconds -> int milliseconds, > 0 */
    K_INT,     /* int within [min, max] */
    K_CUSTOM,  /* set() decides */
};

struct opt {
    const char *name; /* long name, without "--" */
    char short_name;  /* or 0 */
    enum kind kind;
    size_t offset; /* of the target in struct options */
    double min, max;
    const char *arg;  /* value placeholder for --help, NULL for flags */
    const char *help; /* one line (or two, joined by "\n") */
    int (*set)(struct options *o, const char *value); /* K_CUSTOM */
    const char *group; /* a heading printed before the row, or NULL */
};

#define F(field) offsetof(struct options, field)
#define MiB (1024.0 * 1024.0)

static int set_log_level(struct options *o, const char *v)
{
    (void)o;
    static const char *names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++) {
        if (strcmp(v, names[i]) == 0) {
            log_set_level((enum log_level)i);
            return 0;
        }
    }
    fprintf(stderr, "ckptfs: bad --log-level '%s' (error, warn, info, debug)\n", v);
    return -1;
}

static int set_fsync(struct options *o, const char *v)
{
    if (strcmp(v, "remote") == 0 || strcmp(v, "staged") == 0) {
        o->core.stage.fsync_remote = strcmp(v, "remote") == 0;
        return 0;
    }
    fprintf(stderr, "ckptfs: bad --fsync '%s' (remote or staged)\n", v);
    return -1;
}

static int set_direct_reads(struct options *o, const char *v)
{
    static const char *const modes[] = {[CORE_DIRECT_READS_NONE] = "none",
                                        [CORE_DIRECT_READS_SHARDED] = "sharded",
                                        [CORE_DIRECT_READS_ALL] = "all"};
    for (int i = 0; i < (int)(sizeof modes / sizeof modes[0]); i++)
        if (strcmp(v, modes[i]) == 0) {
            o->core.direct_reads = i;
            return 0;
        }
    fprintf(stderr, "ckptfs: bad --direct-reads '%s' (sharded, all or none)\n", v);
    return -1;
}

static int set_passthrough(struct options *o, const char *v)
{
    if (strcmp(v, "auto") == 0 || strcmp(v, "off") == 0) {
        o->passthrough = strcmp(v, "auto") == 0;
        return 0;
    }
    fprintf(stderr, "ckptfs: bad --passthrough '%s' (auto or off)\n", v);
    return -1;
}

static int set_attrs(struct options *o, const char *v)
{
    if (strcmp(v, "known") == 0 || strcmp(v, "exact") == 0) {
        o->core.attrs_exact = strcmp(v, "exact") == 0;
        return 0;
    }
    fprintf(stderr, "ckptfs: bad --attrs '%s' (known or exact)\n", v);
    return -1;
}

static int set_retries(struct options *o, const char *v)
{
    char *end;
    long n = strtol(v, &end, 10);
    if (*v == '\0' || *end || n < 0 || n > 100) {
        fprintf(stderr, "ckptfs: --retries must be 0..100, not '%s'\n", v);
        return -1;
    }
    o->store.max_retries = n == 0 ? -1 : (int)n; /* 0 in store_options means "default" */
    return 0;
}

static void mark_read_only(struct options *o)
{
    o->read_only = 1;
    o->core.writable = 0;
}

/* --read-only: the kernel refuses writes too ("ro"). */
static int set_read_only(struct options *o, const char *v)
{
    (void)v;
    if (!o->read_only)
        options_add_fuse(o, "ro");
    mark_read_only(o);
    return 0;
}

static int set_debug(struct options *o, const char *v)
{
    (void)v;
    o->debug = o->foreground = 1;
    log_set_level(LOG_LVL_DEBUG);
    return 0;
}

static int set_mount_options(struct options *o, const char *v);
static const struct opt table[] = {
    {"endpoint-url", 0, K_STRING, F(store.endpoint_url), 0, 0, "URL",
     "S3 endpoint (AWS_ENDPOINT_URL)", NULL,
     "S3 (defaults from AWS_* variables and ~/.aws/{credentials,config}):"},
    {"region", 0, K_STRING, F(store.region), 0, 0, "REGION",
     "signing region (AWS_REGION, AWS_DEFAULT_REGION)", NULL, NULL},
    {"profile", 0, K_STRING, F(store.profile), 0, 0, "NAME",
     "profile in ~/.aws files (AWS_PROFILE)", NULL, NULL},
    {"force-path-style", 0, K_FLAG, F(store.force_path_style), 0, 0, NULL,
     "address buckets as ENDPOINT/BUCKET, not BUCKET.HOST", NULL, NULL},
    {"max-connections", 0, K_INT, F(store.max_connections), 1, 256, "N",
     "parallel requests in flight (16)", NULL, NULL},
    {"connect-timeout", 0, K_MS, F(store.connect_timeout_ms), 0, 0, "SEC", "connect timeout (5)",
     NULL, NULL},
    {"timeout", 0, K_MS, F(store.request_timeout_ms), 0, 0, "SEC",
     "a request making no progress this long fails (10); a timeout is\n"
     "retried only if the endpoint answered since the last one",
     NULL, NULL},
    {"retries", 0, K_CUSTOM, 0, 0, 0, "N", "retries of a failed request, with backoff (5)",
     set_retries, NULL},
    {"unsigned-payload", 0, K_FLAG, F(store.unsigned_payload), 0, 0, NULL,
     "do not sign upload bodies (by default their SHA-256 is signed,\n"
     "so the store checks every byte it receives)",
     NULL, NULL},

    {"cache-dir", 0, K_STRING, F(cache_dir), 0, 0, "DIR",
     "on-disk state: write staging and the index\n($XDG_CACHE_HOME/ckptfs or ~/.cache/ckptfs)",
     NULL, "Caching:"},
    {"cache-size", 0, K_SIZE64, F(core.cache_size), 16 * MiB, 0, "SIZE",
     "memory for cached file data, e.g. 512M, 4G (1G)", NULL, NULL},
    {"disk-cache-size", 0, K_SIZE64, F(core.disk_cache_size), 0, 0, "SIZE",
     "keep up to SIZE of what this node writes and reads in\n"
     "CACHE_DIR/disk-cache, across unmounts (off; e.g. 50G)",
     NULL, NULL},
    {"disk-cache-min-free", 0, K_INT, F(core.disk_cache_min_free), 0, 90, "PCT",
     "the disk cache never fills its file system past the last\n"
     "PCT percent free: least recently used objects go (5)",
     NULL, NULL},
    {"passthrough", 0, K_CUSTOM, 0, 0, 0, "MODE",
     "auto: a file the disk cache holds whole, of at most 8 MiB or\n"
     "one checkpoint item (up to 256 MiB), is checked at open and the\n"
     "kernel reads it from there itself (FUSE passthrough: Linux\n"
     "6.9+, root); other reads go through the daemon (default);\n"
     "off: disk cache reads always go through the daemon",
     set_passthrough, NULL},
    {"request-size", 0, K_SIZE32, F(core.request_size), 1 * MiB, 64 * MiB, "SIZE",
     "largest single ranged GET of a readahead or a\ncheckpoint item (8M)", NULL, NULL},
    {"readahead", 0, K_SIZE64, F(core.readahead_max), 1 * MiB, 0, "SIZE",
     "largest sequential readahead window (256M, at most\na quarter of the cache size)", NULL,
     NULL},
    {"kernel-readahead", 0, K_SIZE32, F(max_readahead), 4096, 16 * MiB, "SIZE",
     "the kernel's readahead on the mount (1M): how far it reads past\n"
     "what a reader asked for (the daemon's own prefetch runs ahead anyway)",
     NULL, NULL},
    {"direct-reads", 0, K_CUSTOM, 0, 0, 0, "MODE",
     "which checkpoint data files (*.distcp) are read around the\n"
     "page cache (no kernel readahead past what a partial load wants;\n"
     "bytes several ranks read cross FUSE once per rank): sharded,\n"
     "all but those mostly of whole items every rank loads of 16\n"
     "kernel readahead windows or more (default); all; none",
     set_direct_reads, NULL},
    {"attr-timeout", 0, K_SECONDS, F(core.attr_timeout), 0, 1e9, "SEC",
     "how long attributes and listings are trusted (1)", NULL, NULL},
    {"attrs", 0, K_CUSTOM, 0, 0, 0, "MODE",
     "known: modes, owners, times the mount learns without extra\n"
     "requests (default); exact: a HEAD per listed file version on\n"
     "its first lookup, for shared multi-user mounts (docs/operations.md)",
     set_attrs, NULL},

    {"fsync", 0, K_CUSTOM, 0, 0, 0, "MODE",
     "remote: fsync returns when the file is on the store (default);\n"
     "staged: when it is durable in local staging (uploads continue)",
     set_fsync, "Writing (see docs/semantics.md):"},
    {"stage-size", 0, K_SIZE64, F(core.stage.budget), 64 * MiB, 0, "SIZE",
     "staging space; writers wait for uploads beyond it (free disk)", NULL, NULL},
    {"part-size", 0, K_SIZE64, F(core.stage.part_size), 5 * MiB, 5 * 1024 * MiB, "SIZE",
     "multipart part size, doubling every 1000 parts (8M)", NULL, NULL},
    {"upload-workers", 0, K_INT, F(core.stage.upload_workers), 1, 64, "N", "parallel uploads (8)",
     NULL, NULL},
    {"commit-timeout", 0, K_SECONDS, F(core.stage.commit_timeout), 0, 1e9, "SEC",
     "how long a .metadata waits without progress for the files it\nnames (600)", NULL, NULL},
    {"rename-dir-max-objects", 0, K_INT, F(core.stage.rename_dir_max_objects), 0, 1000000000, "N",
     "rename a directory on S3 by server-side copies up to N objects\n"
     "below it (100000; 0 = any); above, rename answers EXDEV (mv copies)",
     NULL, NULL},
    {"read-only", 0, K_CUSTOM, 0, 0, 0, NULL, "refuse writes (also: -o ro)", set_read_only, NULL},

    {"foreground", 'f', K_FLAG, F(foreground), 0, 0, NULL, "stay in the foreground", NULL,
     "General:"},
    {"debug", 'd', K_CUSTOM, 0, 0, 0, NULL, "debug: foreground, FUSE request trace, debug log",
     set_debug, NULL},
    {"single-thread", 's', K_FLAG, F(single_thread), 0, 0, NULL, "single-threaded FUSE loop", NULL,
     NULL},
    {"options", 'o', K_CUSTOM, 0, 0, 0, "OPT[,OPT...]",
     "any option above as NAME=VALUE or NAME (for mount(8) and\n"
     "fstab), FUSE mount options (allow_other, ro, ...); _netdev,\n"
     "nofail, noauto, defaults, x-* and other fstab-only words are ignored",
     set_mount_options, NULL},
    {"log-level", 0, K_CUSTOM, 0, 0, 0, "LEVEL", "error, warn, info or debug (info)", set_log_level,
     NULL},
    {"stats-interval", 0, K_SECONDS, F(core.stats_interval), 0, 86400, "SEC",
     "log a transfer summary this often while data moves (5; 0 = never)", NULL, NULL},
    {"log-file", 0, K_STRING, F(log_file), 0, 0, "PATH",
     "log here instead of syslog when in the background", NULL, NULL},
};

#define NOPTS (sizeof table / sizeof table[0])

static void usage(FILE *out)
{
    fprintf(out, "usage: ckptfs [options] STORE MOUNTPOINT\n\n"
                 "Mount a checkpoint store. STORE is s3://BUCKET[/PREFIX] or a local directory.\n");
    for (size_t i = 0; i < NOPTS; i++) {
        const struct opt *p = &table[i];
        if (p->group)
            fprintf(out, "\n%s\n", p->group);
        char left[64];
        int n = p->short_name ? snprintf(left, sizeof left, "-%c", p->short_name)
                              : snprintf(left, sizeof left, "--%s", p->name);
        if (p->arg)
            snprintf(left + n, sizeof left - (size_t)n, " %s", p->arg);
        const char *h = p->help;
        const char *nl = strchr(h, '\n');
        fprintf(out, "  %-22s %.*s\n", left, nl ? (int)(nl - h) : (int)strlen(h), h);
        while (nl) {
            h = nl + 1;
            nl = strchr(h, '\n');
            fprintf(out, "  %-22s %.*s\n", "", nl ? (int)(nl - h) : (int)strlen(h), h);
        }
    }
    fprintf(out,
            "  -h, --help             this text\n"
            "  -V, --version          version\n"
            "\n"
            "Statistics: the extended attribute %s of the mount root\n"
            "(getfattr -n %s MOUNTPOINT). Wait for uploads: getfattr -n %s DIR.\n"
            "Unmount with: fusermount3 -u MOUNTPOINT (or SIGINT/SIGTERM to ckptfs); the daemon\n"
            "exits once what is staged is on the store.\n",
            CKPTFS_STATS_XATTR, CKPTFS_STATS_XATTR, CKPTFS_SYNC_XATTR);
}

/* "64K", "512M", "4G", "1048576" -> bytes; -1 if malformed or beyond
 * 2^64 (also "inf", "nan"). */
static double parse_size(const char *s)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !isfinite(v) || v < 0)
        return -1;
    static const char units[] = "kmgt";
    const char *u = *end ? strchr(units, *end | 0x20) : NULL;
    if (u) {
        for (const char *k = units; k <= u; k++)
            v *= 1024;
        end++;
    }
    if (*end == 'i' || *end == 'B')
        end += (*end == 'i' && end[1] == 'B') ? 2 : 1;
    return *end || v >= 18446744073709551616.0 ? -1 : v;
}

static int parse_seconds(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < 0)
        return -1;
    *out = v;
    return 0;
}

static void describe_bounds(const struct opt *p, char *buf, size_t len, int size)
{
    if (size && p->max > 0)
        snprintf(buf, len, " (%.0fM to %.0fM)", p->min / MiB, p->max / MiB);
    else if (size)
        snprintf(buf, len, " (at least %.0fM)", p->min / MiB);
    else if (p->max > 0)
        snprintf(buf, len, " (%.0f to %.0f)", p->min, p->max);
    else
        buf[0] = '\0';
}

/* Apply one option's value. 0, or -1 after printing why. */
static int apply(struct options *o, const struct opt *p, const char *v)
{
    char *target = (char *)o + p->offset, bounds[64];
    double d;
    switch (p->kind) {
    case K_FLAG:
        *(int *)target = 1;
        return 0;
    case K_STRING:
        *(const char **)target = v;
        return 0;
    case K_SIZE64:
    case K_SIZE32:
        d = parse_size(v);
        if (d < 0 || d < p->min || (p->max > 0 && d > p->max) ||
            (p->kind == K_SIZE32 && d > UINT32_MAX)) {
            describe_bounds(p, bounds, sizeof bounds, 1);
            fprintf(stderr, "ckptfs: bad --%s '%s'%s\n", p->name, v, bounds);
            return -1;
        }
        if (p->kind == K_SIZE64)
            *(uint64_t *)target = (uint64_t)d;
        else
            *(uint32_t *)target = (uint32_t)d;
        return 0;
    case K_SECONDS:
    case K_MS:
        if (parse_seconds(v, &d) < 0 || (p->max > 0 && d > p->max) ||
            (p->kind == K_MS && (d < 0.001 || d * 1000 > INT_MAX))) {
            fprintf(stderr, "ckptfs: bad --%s '%s' (seconds)\n", p->name, v);
            return -1;
        }
        if (p->kind == K_MS)
            *(int *)target = (int)(d * 1000);
        else
            *(double *)target = d;
        return 0;
    case K_INT: {
        char *end;
        long n = strtol(v, &end, 10);
        if (*v == '\0' || *end || n < (long)p->min || n > (long)p->max) {
            describe_bounds(p, bounds, sizeof bounds, 0);
            fprintf(stderr, "ckptfs: --%s must be%s, not '%s'\n", p->name, bounds, v);
            return -1;
        }
        *(int *)target = (int)n;
        return 0;
    }
    case K_CUSTOM:
        return p->set(o, v);
    }
    return -1;
}

/* Words that mount(8), systemd and fstab use for themselves: accepted and
 * dropped, as mount.fuse3 does for some of them. */
static int fstab_only(const char *opt)
{
    static const char *const words[] = {"_netdev", "nofail", "noauto", "auto",  "defaults",
                                        "user",    "users",  "nouser", "owner", "group"};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        if (strcmp(opt, words[i]) == 0)
            return 1;
    return strncmp(opt, "x-", 2) == 0 || strncmp(opt, "comment=", 8) == 0;
}

/* A copy of an -o value that lives as long as o (fuse_opt_parse frees its own). */
static const char *keep_string(struct options *o, const char *v)
{
    size_t n = strlen(v) + 1;
    if (o->strings_used + n > sizeof o->strings)
        return NULL;
    char *dst = o->strings + o->strings_used;
    memcpy(dst, v, n);
    o->strings_used += n;
    return dst;
}

struct mount_opt_ctx {
    struct options *o;
    int failed;
};

/* fuse_opt_parse's callback, once per comma-separated word of -o: a ckptfs
 * option is applied (0: dropped from the FUSE options), an fstab-only word
 * dropped, anything else kept for libfuse (1). */
static int take_mount_option(void *data, const char *arg, int key, struct fuse_args *outargs)
{
    (void)outargs;
    struct mount_opt_ctx *ctx = data;
    struct options *o = ctx->o;
    if (key != FUSE_OPT_KEY_OPT || ctx->failed)
        return ctx->failed ? 0 : 1;
    if (fstab_only(arg))
        return 0;
    if (strcmp(arg, "ro") == 0)
        mark_read_only(o); /* and the kernel refuses writes too: keep it */
    const char *eq = strchr(arg, '=');
    size_t n = eq ? (size_t)(eq - arg) : strlen(arg);
    for (size_t i = 0; i < NOPTS; i++) {
        const struct opt *p = &table[i];
        if (p->short_name == 'o' || strlen(p->name) != n || strncmp(arg, p->name, n) != 0)
            continue;
        if (p->arg && !eq) {
            fprintf(stderr, "ckptfs: mount option '%s' needs a value (%s=%s)\n", arg, p->name,
                    p->arg);
        } else if (!p->arg && eq) {
            fprintf(stderr, "ckptfs: mount option '%s' takes no value\n", arg);
        } else {
            const char *v = eq ? keep_string(o, eq + 1) : NULL;
            if (eq && !v)
                fprintf(stderr, "ckptfs: mount options too long\n");
            else if (apply(o, p, v) == 0)
                return 0;
        }
        ctx->failed = 1;
        return 0;
    }
    return 1;
}

/* -o OPT[,OPT...]: split by libfuse's own parser (which knows its escapes). */
static int set_mount_options(struct options *o, const char *v)
{
    char *argv[] = {"ckptfs", "-o", (char *)v, NULL};
    /* Not allocated: fuse_opt_parse replaces it with an allocated copy that
     * holds what the callback kept. */
    struct fuse_args args = FUSE_ARGS_INIT(3, argv);
    struct mount_opt_ctx ctx = {.o = o};
    int rc = fuse_opt_parse(&args, &ctx, NULL, take_mount_option);
    if (rc == 0 && !ctx.failed) {
        for (int i = 1; i + 1 < args.argc; i++)
            if (strcmp(args.argv[i], "-o") == 0)
                options_add_fuse(o, args.argv[i + 1]);
    } else if (rc != 0) {
        fprintf(stderr, "ckptfs: cannot parse mount options '%s'\n", v);
    }
    if (args.allocated)
        fuse_opt_free_args(&args);
    return rc == 0 && !ctx.failed ? 0 : -1;
}

void options_add_fuse(struct options *o, const char *opt)
{
    size_t n = strlen(o->fuse_opts);
    snprintf(o->fuse_opts + n, sizeof o->fuse_opts - n, "%s%s", n ? "," : "", opt);
}

void options_defaults(struct options *o)
{
    memset(o, 0, sizeof *o);
    core_config_defaults(&o->core);
    /* The kernel's readahead sizes FUSE read requests: 256K halved cold
     * sequential reads on the nginx fast path (435 vs 870 MB/s). Every byte
     * it reads ahead is fetched, so a partial load pays for up to this much
     * past its last item; --kernel-readahead trades the two. */
    o->max_readahead = 1u << 20;
    o->passthrough = 1;
    o->core.stats_interval = 5;
}

int options_parse(int argc, char **argv, struct options *o)
{
    struct option longopts[NOPTS + 3];
    char shortopts[3 * NOPTS + 8] = ":hV";
    size_t ns = strlen(shortopts);
    for (size_t i = 0; i < NOPTS; i++) {
        longopts[i] = (struct option){table[i].name, table[i].arg ? required_argument : no_argument,
                                      NULL, (int)(256 + i)};
        if (table[i].short_name) {
            shortopts[ns++] = table[i].short_name;
            if (table[i].arg)
                shortopts[ns++] = ':';
        }
    }
    shortopts[ns] = '\0';
    longopts[NOPTS] = (struct option){"help", no_argument, NULL, 'h'};
    longopts[NOPTS + 1] = (struct option){"version", no_argument, NULL, 'V'};
    longopts[NOPTS + 2] = (struct option){0, 0, 0, 0};
    opterr = 0; /* our own messages, prefixed "ckptfs:" */
    int c;
    while ((c = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
        const struct opt *p = NULL;
        if (c >= 256 && c < 256 + (int)NOPTS)
            p = &table[c - 256];
        for (size_t i = 0; !p && i < NOPTS; i++)
            if (table[i].short_name && table[i].short_name == c)
                p = &table[i];
        if (p) {
            if (apply(o, p, optarg) < 0)
                return -1;
        } else if (c == 'h') {
            usage(stdout);
            return 1;
        } else if (c == 'V') {
            printf("ckptfs %s\n", CKPTFS_VERSION);
            return 1;
        } else if (c == ':') {
            fprintf(stderr, "ckptfs: option '%s' needs a value\nTry 'ckptfs --help'.\n",
                    argv[optind - 1]);
            return -1;
        } else {
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
