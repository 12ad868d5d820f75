/* tests/unit/test_stage_journal.c - what the journal and the commit rule
 * promise across a crash and a timeout (semantics.md §6, §7): a file is
 * never published with bytes written after the seal its record names, and a
 * .metadata that timed out waiting for its shards is tried again by a sync. */
#include "stage_fixture.h"
#include "wfile.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <lmdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

TestSuite(stage_journal, .init = stage_setup, .fini = stage_teardown, .timeout = 60);

/* semantics.md §6: "On timeout the .metadata stays staged ... the next seal or
 * sync tries again." Once the shards are there, a sync must publish it. */
Test(stage_journal, a_timed_out_metadata_is_retried_by_the_next_sync)
{
    stage_close(st);
    cfg.commit_timeout = 0.3;
    cfg.fsync_remote = 0; /* close does not wait */
    open_stage();
    put_fixture(".metadata", "ck/.metadata", 1);
    cr_assert_eq(stage_sync(st, ""), -EIO, "no shards: the commit times out");
    cr_assert_not(stored("ck/.metadata"));
    /* Now the shards arrive (another node, or a retried save). */
    store_shards_except(NULL);
    int rc = -1;
    for (int i = 0; i < 5 && rc != 0; i++) {
        rc = stage_sync(st, "");
        usleep(100000); /* a poll: the retried commit check runs in the background */
    }
    cr_assert_eq(rc, 0, "sync after the shards arrived: %d", rc);
    cr_assert(stored("ck/.metadata"), "the blocked .metadata was never retried");
}

/* ---- a write after a seal vs the journal record that says "sealed" ---- */

static void copy_file(const char *from, const char *to)
{
    size_t n;
    char *b = slurp(from, &n);
    cr_assert_not_null(b, "%s", from);
    int fd = open(to, O_CREAT | O_TRUNC | O_WRONLY, 0600);
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, b, n), (ssize_t)n);
    close(fd);
    free(b);
}

/* A kill -9 as the next mount finds it: the stage's journal and wf's
 * staging file copied into a new cache directory made from tmpl (mkdtemp). */
static void crash_copy(char *tmpl, const struct wfile *wf)
{
    char p1[1024], p2[1024], name[32];
    cr_assert_not_null(mkdtemp(tmpl));
    snprintf(p2, sizeof p2, "%s/files", tmpl);
    mkdir(p2, 0700);
    snprintf(p2, sizeof p2, "%s/journal", tmpl);
    mkdir(p2, 0700);
    snprintf(p1, sizeof p1, "%s/journal/data.mdb", dir);
    snprintf(p2, sizeof p2, "%s/journal/data.mdb", tmpl);
    copy_file(p1, p2);
    wfile_staging_name(wf->id, name);
    snprintf(p1, sizeof p1, "%s/files/%s", dir, name);
    snprintf(p2, sizeof p2, "%s/files/%s", tmpl, name);
    copy_file(p1, p2);
}

/* ---- a thread blocked on a lock, seen from /proc ---- */

static double mono(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* 1 if thread tid sleeps in a futex wait (a mutex or condition variable),
 * from /proc/self/task/TID/syscall. */
static int in_futex(pid_t tid)
{
    char p[64], line[512];
    snprintf(p, sizeof p, "/proc/self/task/%d/syscall", (int)tid);
    FILE *f = fopen(p, "r");
    long nr = -1;
    unsigned long addr = 0;
    int ok = f && fgets(line, sizeof line, f) && sscanf(line, "%ld %lx", &nr, &addr) == 2;
    if (f)
        fclose(f);
    return ok && nr == SYS_futex;
}

/* Wait (at most 10 s) until thread *tid (0 until it started) is blocked in a
 * futex, seen so at three polls 5 ms apart (a lock it takes in passing is
 * not that), or *done is set. 1 if it blocked. Here the journal's writes
 * are held (hold_journal_writes), so a writer that blocks waits for them. */
static int wait_blocked(volatile pid_t *tid, volatile int *done)
{
    double t0 = mono();
    int seen = 0;
    while (!*done && seen < 3 && mono() - t0 < 10) {
        seen = *tid && in_futex(*tid) ? seen + 1 : 0;
        usleep(5000);
    }
    return seen >= 3;
}

struct wr {
    struct wfile *wf;
    const unsigned char *buf;
    size_t len;
    uint64_t off;
    volatile int done;
    volatile pid_t tid;
};

static void *writer_thread(void *arg)
{
    struct wr *w = arg;
    w->tid = (pid_t)syscall(SYS_gettid);
    stage_write(st, w->wf, w->buf, w->len, w->off);
    w->done = 1;
    return NULL;
}

/* A file at path with data, sealed and durable, in staged mode with the
 * store down (so it stays staged). */
static struct wfile *sealed_durable_file(const char *path, const unsigned char *data, size_t n)
{
    stage_close(st);
    cfg.fsync_remote = 0;
    open_stage();
    mem_store_fail(mem, MEM_OP_ALL, -EIO, -1);
    struct wfile *wf;
    cr_assert_eq(stage_create(st, path, &wf), 0);
    stage_writer_open(st, wf);
    cr_assert_eq(stage_write(st, wf, data, n, 0), (ssize_t)n);
    stage_fsync(st, wf);
    return wf;
}

/* Hold the journal's writes: a child process opens the stage's LMDB
 * environment and keeps a write transaction open (standing in for a slow
 * commit) until let_journal_write(). Returns its pid; *release is its pipe. */
static pid_t hold_journal_writes(int *release)
{
    char jdir[1024];
    snprintf(jdir, sizeof jdir, "%s/journal", dir);
    int up[2], down[2];
    cr_assert_eq(pipe(up), 0);
    cr_assert_eq(pipe(down), 0);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(20); /* never outlive the test */
        MDB_env *env;
        MDB_txn *txn;
        char c = 'x';
        if (mdb_env_create(&env) || mdb_env_set_maxdbs(env, 4) ||
            mdb_env_set_mapsize(env, 256ull << 20) ||
            mdb_env_open(env, jdir, MDB_NOTLS | MDB_NOMETASYNC, 0600) ||
            mdb_txn_begin(env, NULL, 0, &txn))
            c = 'e';
        if (write(up[1], &c, 1) != 1)
            _exit(1);
        if (read(down[0], &c, 1) < 0)
            _exit(1);
        if (c != 'e')
            mdb_txn_abort(txn);
        mdb_env_close(env);
        _exit(0);
    }
    char c;
    cr_assert_eq(read(up[0], &c, 1), 1);
    cr_assert_eq(c, 'x', "the helper could not take LMDB's write lock");
    close(up[0]);
    close(up[1]);
    close(down[0]);
    *release = down[1];
    return pid;
}

static void let_journal_write(pid_t pid, int release)
{
    cr_assert_eq(write(release, "x", 1), 1);
    close(release);
    waitpid(pid, NULL, 0);
}

/* A write after a seal makes the record stop saying sealed before the bytes
 * change. A second writer of the same file used not to wait for the first
 * one's record: its bytes changed while the journal still said sealed, and a
 * kill -9 then published a mix nobody sealed. The journal
 * writer is held up by another process holding LMDB's write lock (standing in
 * for a slow fdatasync); the "crash" is a copy of the cache directory. */
Test(stage_journal, a_second_writer_waits_for_the_record_that_unseals)
{
    unsigned char *orig = pattern(1000, 7);
    struct wfile *wf = sealed_durable_file("f", orig, 1000);

    int release;
    pid_t pid = hold_journal_writes(&release);

    unsigned char a[100], b[100];
    memset(a, 'A', sizeof a);
    memset(b, 'B', sizeof b);
    struct wr w = {wf, a, sizeof a, 0, 0, 0};
    pthread_t t;
    pthread_create(&t, NULL, writer_thread, &w);
    /* writer A is in its journal put, waiting for LMDB */
    cr_assert(wait_blocked(&w.tid, &w.done), "writer A never waited for its journal record");
    cr_assert_not(w.done);
    /* writer B: is it held up until a record saying "not sealed" is written? */
    struct wr w2 = {wf, b, sizeof b, 500, 0, 0};
    pthread_t t2;
    pthread_create(&t2, NULL, writer_thread, &w2);
    /* B waits (for A's record, or for LMDB itself), or writes at once */
    wait_blocked(&w2.tid, &w2.done);
    cr_assert_not(w.done, "A's journal write was not held up");

    /* kill -9 now: what the next mount finds */
    char dir2[] = "/tmp/ckptfs-journal-crash-XXXXXX";
    crash_copy(dir2, wf);

    let_journal_write(pid, release);
    pthread_join(t, NULL);
    pthread_join(t2, NULL);

    struct mem_store *mem2 = mem_store_new();
    mem_store_set_min_part(mem2, 0);
    struct stage_config cfg2 = cfg;
    cfg2.dir = dir2;
    struct stage *st2;
    char err[256];
    cr_assert_eq(stage_open(mem_store_base(mem2), "mem://test", &cfg2, &st2, err, sizeof err), 0,
                 "%s", err);
    stage_sync(st2, "");
    size_t len = 0;
    unsigned char *got = mem_store_get(mem2, "f", &len);
    stage_close(st2);
    int torn = got && len == 1000 && memcmp(got, orig, 500) == 0 && got[500] == 'B';
    free(got);
    mem_store_free(mem2);
    rm_tree(dir2);
    mem_store_fail(mem, MEM_OP_ALL, 0, 0);
    stage_writer_close(st, wf);
    stage_put(st, wf);
    free(orig);
    cr_assert_not(torn, "the next mount published the sealed bytes with writer B's unsealed "
                        "write in them");
}

Test(stage_journal, rewriting_a_durably_sealed_file_syncs_the_record_that_unseals_it)
{
    /* The journal's commits may be undone by a power loss (MDB_NOMETASYNC);
     * the rewritten bytes may reach the disk anyway (early writeback). The
     * record that says "no longer sealed" is forced to disk before they
     * change, or recovery would publish them as the durable version. */
    unsigned char *d = pattern(1000, 9);
    struct wfile *wf = sealed_durable_file("g", d, 1000);
    uint64_t syncs = journal_sync_count(st->journal);
    cr_assert_eq(stage_write(st, wf, "x", 1, 10), 1);
    cr_assert_eq(journal_sync_count(st->journal), syncs + 1,
                 "the unsealing record was not forced to disk before the bytes changed");
    cr_assert_eq(stage_write(st, wf, "y", 1, 11), 1);
    cr_assert_eq(journal_sync_count(st->journal), syncs + 1, "only the first write unseals");
    mem_store_fail(mem, MEM_OP_ALL, 0, 0);
    stage_writer_close(st, wf);
    stage_put(st, wf);
    free(d);
}

struct trunc {
    struct wfile *wf;
    uint64_t size;
    volatile int done;
    volatile pid_t tid;
};

static void *truncate_thread(void *arg)
{
    struct trunc *t = arg;
    t->tid = (pid_t)syscall(SYS_gettid);
    stage_truncate(st, t->wf, t->size);
    t->done = 1;
    return NULL;
}

Test(stage_journal, a_truncate_of_a_sealed_file_unseals_its_record_first)
{
    /* truncate used to shorten the staging file before writing the record
     * that unseals it: a crash in between found a staging file shorter than
     * its sealed record, and the sealed content went to recovered/ instead of
     * the store. */
    unsigned char *d = pattern(1000, 11);
    struct wfile *wf = sealed_durable_file("h", d, 1000);
    int release;
    pid_t pid = hold_journal_writes(&release);
    struct trunc t = {wf, 10, 0, 0};
    pthread_t th;
    pthread_create(&th, NULL, truncate_thread, &t);
    /* the truncate waits for its record, or cuts at once */
    wait_blocked(&t.tid, &t.done);
    char name[32], p[1024];
    wfile_staging_name(wf->id, name);
    snprintf(p, sizeof p, "%s/files/%s", dir, name);
    struct stat sb;
    cr_assert_eq(stat(p, &sb), 0);
    int early = sb.st_size != 1000;
    let_journal_write(pid, release);
    pthread_join(th, NULL);
    cr_assert_not(early, "the staging file was cut before its record stopped saying sealed");
    cr_assert_eq(stat(p, &sb), 0);
    cr_assert_eq(sb.st_size, 10);
    mem_store_fail(mem, MEM_OP_ALL, 0, 0);
    stage_writer_close(st, wf);
    stage_put(st, wf);
    free(d);
}

/* semantics.md §7: a file recovered from the journal is uploaded by the next
 * mount on its own, without a sync or an unmount asking for it (stage_open
 * starts the uploads of what recovery restaged). The "crash" is a copy of the
 * cache directory while every request of the first mount fails. */
Test(stage_journal, a_recovered_file_uploads_without_a_sync)
{
    unsigned char *orig = pattern(1000, 9);
    struct wfile *wf = sealed_durable_file("rec/f", orig, 1000);
    char dir2[] = "/tmp/ckptfs-journal-recover-XXXXXX";
    crash_copy(dir2, wf);

    struct mem_store *mem2 = mem_store_new();
    mem_store_set_min_part(mem2, 0);
    struct stage_config cfg2 = cfg;
    cfg2.dir = dir2;
    struct stage *st2;
    char err[256];
    cr_assert_eq(stage_open(mem_store_base(mem2), "mem://test", &cfg2, &st2, err, sizeof err), 0,
                 "%s", err);
    size_t len = 0;
    unsigned char *got = NULL;
    for (int i = 0; i < 1000 && !got; i++) { /* up to 10 s; no sync, no unmount */
        got = mem_store_get(mem2, "rec/f", &len);
        if (!got)
            usleep(10 * 1000);
    }
    int published = got && len == 1000 && memcmp(got, orig, 1000) == 0;
    free(got);
    stage_close(st2);
    mem_store_free(mem2);
    rm_tree(dir2);
    mem_store_fail(mem, MEM_OP_ALL, 0, 0);
    stage_writer_close(st, wf);
    stage_put(st, wf);
    free(orig);
    cr_assert(published, "the recovered file was not uploaded until something asked for it");
}
