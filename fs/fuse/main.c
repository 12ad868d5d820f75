/*
 * fs/fuse/main.c - the ckptfs command: options -> store -> mount -> loop.
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
#include "openmodes.h"
#include "ops.h"
#include "passthrough.h"
#include "options.h"
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* Create the cache directory (--cache-dir, else $XDG_CACHE_HOME/ckptfs or ~/.cache/ckptfs)
 * and put its absolute path in out (PATH_MAX bytes): 0, or -errno after a message on stderr. */
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

/* Check that o->mountpoint is a directory and replace it by its absolute path, kept in
 * real (PATH_MAX bytes): 0, or -1 after a message on stderr. */
static int resolve_mountpoint(struct options *o, char *real)
{
    struct stat mst;
    if (stat(o->mountpoint, &mst) < 0) {
        fprintf(stderr, "ckptfs: mountpoint '%s': %s\n", o->mountpoint, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(mst.st_mode)) {
        fprintf(stderr, "ckptfs: mountpoint '%s' is not a directory\n", o->mountpoint);
        return -1;
    }
    /* The daemon changes to / when it detaches: a relative mountpoint would
     * name another directory by the time it unmounts. */
    if (!realpath(o->mountpoint, real)) {
        fprintf(stderr, "ckptfs: mountpoint '%s': %s\n", o->mountpoint, strerror(errno));
        return -1;
    }
    o->mountpoint = real;
    return 0;
}

/* Open --log-file if the daemon detaches (*fd, else -1): 0, or -1 after a message on
 * stderr. Opened before the daemon changes to / and points stderr at /dev/null; it becomes
 * stderr once detached. */
static int open_log_file(const struct options *o, int *fd)
{
    *fd = -1;
    if (!o->log_file || o->foreground)
        return 0;
    *fd = open(o->log_file, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (*fd < 0) {
        fprintf(stderr, "ckptfs: log file '%s': %s\n", o->log_file, strerror(errno));
        return -1;
    }
    return 0;
}

/* Open and validate the store o names: the store, or NULL after a message on stderr. */
static struct store *open_store(struct options *o)
{
    char err[512] = "";
    struct store *store = NULL;
    if (store_open(o->store_url, &o->store, &store, err, sizeof err) < 0) {
        fprintf(stderr, "ckptfs: %s\n", err[0] ? err : "cannot open store");
        return NULL;
    }
    return store;
}

/* libfuse's command line for o (program name argv0) into args: 0, or -1 after a message on
 * stderr. */
static int fuse_arguments(const struct options *o, char *argv0, struct fuse_args *args)
{
    if (fuse_opt_add_arg(args, argv0) || fuse_opt_add_arg(args, "-o") ||
        fuse_opt_add_arg(args, o->fuse_opts) || (o->debug && fuse_opt_add_arg(args, "-d"))) {
        fprintf(stderr, "ckptfs: out of memory\n");
        return -1;
    }
    return 0;
}

/* Mount fuse on o->mountpoint and raise the mount's kernel readahead: 0, or -1 after a
 * message on stderr. */
static int mount_on(struct fuse *fuse, const struct options *o)
{
    if (fuse_mount(fuse, o->mountpoint) != 0) {
        fprintf(stderr,
                "ckptfs: cannot mount on '%s' (is fuse3 installed and /dev/fuse "
                "usable?)\n",
                o->mountpoint);
        return -1;
    }
    raise_kernel_readahead(o->mountpoint, o->max_readahead);
    if (o->passthrough && o->core.disk_cache_size > 0) {
        int rc = passthrough_install(fuse_get_session(fuse));
        if (rc < 0)
            log_warn("passthrough: cannot watch the FUSE connection (%s): disk cache reads go "
                     "through the daemon",
                     strerror(-rc));
    }
    return 0;
}

/* Make SIGINT, SIGTERM and SIGHUP unmount fuse: 0, or libfuse's error. */
static int take_signals(struct fuse *fuse)
{
    /* libfuse leaves a signal alone when it was ignored at start, and a shell
     * starts background jobs (`ckptfs -f ... &` in a script) with SIGINT
     * ignored: then `kill -INT` would not unmount. Every one of these signals
     * means "unmount and exit" for ckptfs, however it was started. */
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    return fuse_set_signal_handlers(fuse_get_session(fuse));
}

/* A detached daemon's pipe to the process that started it (-1: none), and that
 * process's stderr, where start-up errors are echoed until started(). */
static int start_pipe = -1, caller_stderr = -1;

/* Detach unless -f: fork; the parent waits for the child's started() and
 * exits with 0 if the mount started, 1 if not (the reason already echoed on
 * its stderr), so that mount(8) and scripts see a failed start. The child
 * logs to log_fd (if open) or else syslog. 0 in the process that goes on, or
 * -1 after a message. */
static int detach(const struct options *o, int log_fd)
{
    if (o->foreground)
        return fuse_daemonize(1) != 0 ? -1 : 0; /* chdir("/") */
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0) {
        perror("ckptfs: pipe");
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        perror("ckptfs: fork");
        return -1;
    }
    if (pid > 0) {
        close(p[1]);
        char ok = 0;
        ssize_t n;
        while ((n = read(p[0], &ok, 1)) < 0 && errno == EINTR)
            ;
        _exit(n == 1 && ok == 1 ? 0 : 1); /* EOF: the daemon died before saying */
    }
    close(p[0]);
    start_pipe = p[1];
    if (setsid() < 0 || chdir("/") < 0) {
        perror("ckptfs: detaching");
        return -1;
    }
    caller_stderr = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 3);
    int nullfd = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (nullfd >= 0) {
        dup2(nullfd, STDIN_FILENO);
        dup2(nullfd, STDOUT_FILENO);
        dup2(log_fd >= 0 ? log_fd : nullfd, STDERR_FILENO);
        close(nullfd);
    }
    if (log_fd < 0)
        log_use_syslog(1);
    log_echo_errors(caller_stderr);
    return 0;
}

/* Tell the process that started a detached daemon whether the mount started
 * (ok) and let go of its stderr; nothing in the foreground. */
static void started(int ok)
{
    log_echo_errors(-1);
    if (start_pipe >= 0) {
        char c = ok ? 1 : 0;
        if (write(start_pipe, &c, 1) != 1)
            log_warn("cannot tell the starting process the mount is %s", ok ? "up" : "down");
        close(start_pipe);
        start_pipe = -1;
    }
    if (caller_stderr >= 0) {
        close(caller_stderr);
        caller_stderr = -1;
    }
}

/* libfuse splices a reply (the bytes of a local store's or the disk cache's
 * file, not copied through the daemon) only through a pipe that holds the
 * whole reply, 1 MiB of data plus its header; past fs.pipe-max-size (1 MiB by
 * default) that needs CAP_SYS_RESOURCE, and without it every 1 MiB reply is
 * read into a buffer and written instead. Say so once, with the remedy. */
static void note_reply_pipe_limit(void)
{
    int p[2];
    if (pipe(p) < 0)
        return;
    int grown = fcntl(p[0], F_SETPIPE_SZ, (1 << 20) + (16 << 10)) >= 0;
    close(p[0]);
    close(p[1]);
    if (!grown)
        log_info("1 MiB read replies are copied, not spliced: pipes may not grow past "
                 "fs.pipe-max-size for this process; `sysctl fs.pipe-max-size=2097152` lets "
                 "them be spliced (less daemon CPU on local-store and disk-cache reads)");
}

/* Create the core (it starts threads: only after fuse_daemonize forks) on store and log the
 * mount: 0, or -1 after logging why. */
static int start_core(struct options *o, struct store *store, const char *cache_dir,
                      struct core **core)
{
    o->core.cache_dir = cache_dir;
    o->core.kernel_readahead = o->max_readahead;
    int rc = core_create(store, &o->core, core);
    if (rc < 0) {
        log_error("cannot start: %s", strerror(-rc));
        return -1;
    }
    note_reply_pipe_limit();
    log_info("mounted %s on %s (cache %llu MiB, cache dir %s, %s)", store->description,
             o->mountpoint, (unsigned long long)(o->core.cache_size >> 20), cache_dir,
             !core_writable(*core)        ? "read-only"
             : o->core.stage.fsync_remote ? "fsync remote"
                                          : "fsync staged");
    return 0;
}

/* Serve requests until unmounted or signalled: the exit status, 0 for a clean shutdown. */
static int serve(struct fuse *fuse, const struct options *o)
{
    /* The loop returns 0 after an unmount, the signal number after SIGINT/
     * SIGTERM/SIGHUP (both clean shutdowns) and -1 on error. */
    int loop_rc;
    if (o->single_thread) {
        loop_rc = fuse_loop(fuse);
    } else {
        struct fuse_loop_config lc = {.clone_fd = 0, .max_idle_threads = 16};
        loop_rc = fuse_loop_mt(fuse, &lc);
    }
    log_info("unmounting %s", o->mountpoint);
    return loop_rc < 0 ? 1 : 0;
}

int main(int argc, char **argv)
{
    tune_allocator();
    struct options o;
    options_defaults(&o);
    int prc = options_parse(argc, argv, &o);
    if (prc != 0)
        return prc > 0 ? 0 : 2;
    char mountpoint[PATH_MAX], cache_dir[PATH_MAX];
    int log_fd;
    if (resolve_mountpoint(&o, mountpoint) < 0 || open_log_file(&o, &log_fd) < 0 ||
        prepare_cache_dir(&o, cache_dir, sizeof cache_dir) < 0)
        return 1;
    struct store *store = open_store(&o);
    if (!store)
        return 1;

    options_add_fuse(&o, "fsname=ckptfs,subtype=ckptfs,default_permissions");
    struct fuse_args args = FUSE_ARGS_INIT(0, NULL);
    int rc = 1;
    struct fuse *fuse = NULL;
    struct core *core = NULL;
    struct ops_context octx = {.attr_timeout = o.core.attr_timeout,
                               .max_readahead = o.max_readahead};
    if (fuse_arguments(&o, argv[0], &args) < 0)
        goto out_store;
    fuse = fuse_new(&args, ckptfs_fuse_operations(), sizeof(struct fuse_operations), &octx);
    if (!fuse) {
        fprintf(stderr, "ckptfs: invalid FUSE options '%s'\n", o.fuse_opts);
        goto out_args;
    }
    if (mount_on(fuse, &o) < 0)
        goto out_fuse;
    if (take_signals(fuse) != 0)
        goto out_unmount;
    if (detach(&o, log_fd) < 0 || start_core(&o, store, cache_dir, &core) < 0) {
        started(0);
        goto out_signals;
    }
    started(1);
    octx.core = core;
    rc = serve(fuse, &o);

out_signals:
    fuse_remove_signal_handlers(fuse_get_session(fuse));
out_unmount:
    fuse_unmount(fuse);
out_fuse:
    fuse_destroy(fuse);
    openmodes_clear(); /* handles still open at the unmount */
    core_destroy(core);
out_args:
    fuse_opt_free_args(&args);
out_store:
    store_destroy(store);
    if (log_fd >= 0)
        close(log_fd);
    return rc;
}
