/* tests/unit/test_stage.c - the write path (stage.c, upload.c, commit.c,
 * recover.c) against the in-memory store: one PUT or a streamed multipart
 * upload, parts sent again after a rewrite, retries, lost answers, a
 * multipart upload the store forgot, unlink and rename during uploads,
 * commit ordering and its timeout, the staging budget, and recovery from the
 * journal after an unmount that could not upload. Parts are 64 KiB here
 * (the mem store is told to accept them) so tests stay small. */
#include "cpu_pressure.h"
#include "stage_fixture.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

TestSuite(stage, .init = stage_setup, .fini = stage_teardown, .timeout = 60);

/* A failed upload attempt makes sync fail (-EIO) while the next attempt is
 * made in the background: sync until everything is there. Returns the
 * number of failed syncs. */
static int sync_until_ok(void)
{
    for (int failed = 0; failed < 50; failed++) {
        int rc = stage_sync(st, "");
        if (rc == 0)
            return failed;
        cr_assert_eq(rc, -EIO);
        usleep(20000); /* a poll: the next attempt is made in the background */
    }
    cr_assert_fail("sync never succeeded");
    return -1;
}

static void assert_stored(const char *path, const unsigned char *want, size_t n)
{
    size_t len = 0;
    unsigned char *got = mem_store_get(mem, path, &len);
    cr_assert_not_null(got, "%s is not on the store", path);
    cr_assert_eq(len, n, "%s: %zu bytes, want %zu", path, len, n);
    cr_assert(memcmp(got, want, n) == 0, "%s: bytes differ", path);
    free(got);
}

/* 1 if the store has an object at path. */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The stage's statistics now. */
static struct stage_stats stats_now(void)
{
    struct stage_stats s;
    stage_get_stats(st, &s);
    return s;
}

/* Polls cond (an expression) every millisecond for at most `seconds`; its
 * value at the end. The races of these tests are waited for with it, on
 * what the stage or the store shows, not for a guessed time. */
#define WAIT_UNTIL(cond, seconds)                                                                  \
    ({                                                                                             \
        double wait_t0_ = now();                                                                   \
        while (!(cond) && now() - wait_t0_ < (seconds))                                            \
            usleep(1000);                                                                          \
        (cond);                                                                                    \
    })

/* Wait (at most 10 s) until the store has seen n calls of op. */
static void wait_calls(enum mem_op op, uint64_t n)
{
    WAIT_UNTIL(mem_store_calls(mem, op) >= n, 10);
}

Test(stage, small_file_is_one_put)
{
    unsigned char *d = pattern(1000, 1);
    write_whole("a/small", d, 1000, 300);
    cr_assert_eq(stage_sync(st, ""), 0);
    assert_stored("a/small", d, 1000);
    cr_assert_eq(mem_store_calls(mem, MEM_OP_PUT), 1);
    cr_assert_eq(mem_store_calls(mem, MEM_OP_MPU_BEGIN), 0);
    struct stage_stats s;
    stage_get_stats(st, &s);
    cr_assert_eq(s.pending_files, 0);
    cr_assert_eq(s.staged_bytes, 0, "a published, closed file leaves staging");
    free(d);
}

Test(stage, a_file_cannot_grow_past_the_stores_largest_object)
{
    /* S3 holds objects up to 5 TiB while 8 MiB parts could make ~8 TiB: a
     * file past the store's limit fails its write (EFBIG), not its upload. */
    mem_store_base(mem)->max_object = 100000;
    struct wfile *wf;
    cr_assert_eq(stage_create(st, "a/capped", &wf), 0);
    stage_writer_open(st, wf);
    cr_assert_eq(stage_write(st, wf, "x", 1, 99999), 1, "the last byte the store holds");
    cr_assert_eq(stage_write(st, wf, "xy", 2, 99999), -EFBIG);
    cr_assert_eq(stage_truncate(st, wf, 100001), -EFBIG);
    cr_assert_eq(stage_truncate(st, wf, 100000), 0);
    cr_assert_eq(stage_flush(st, wf), 0);
    stage_writer_close(st, wf);
    stage_put(st, wf);
    cr_assert_eq(stage_sync(st, ""), 0);
    cr_assert(stored("a/capped"));
}

Test(stage, large_file_streams_parts_before_close)
{
    size_t n = 6 * PART + 100;
    unsigned char *d = pattern(n, 2);
    struct wfile *wf;
    cr_assert_eq(stage_create(st, "big", &wf), 0);
    stage_writer_open(st, wf);
    for (size_t off = 0; off < 5 * PART; off += PART)
        cr_assert_eq(stage_write(st, wf, d + off, PART, off), (ssize_t)PART);
    /* still open: whole written parts go up while the writer writes on */
    wait_calls(MEM_OP_MPU_PART, 4);
    cr_assert_geq(mem_store_calls(mem, MEM_OP_MPU_PART), 4, "parts must stream before close");
    cr_assert_eq(mem_store_calls(mem, MEM_OP_MPU_COMPLETE), 0);
    cr_assert_not(stored("big"), "nothing visible before complete");
    cr_assert_eq(stage_write(st, wf, d + 5 * PART, n - 5 * PART, 5 * PART),
                 (ssize_t)(n - 5 * PART));
    stage_writer_close(st, wf);
    stage_put(st, wf);
    cr_assert_eq(stage_sync(st, ""), 0);
    assert_stored("big", d, n);
    cr_assert_eq(mem_store_calls(mem, MEM_OP_MPU_PART), 7, "each part once");
    cr_assert_eq(mem_store_uploads_in_progress(mem), 0);
    free(d);
}

Test(stage, a_part_written_again_is_sent_again)
{
    size_t n = 3 * PART + 10;
    unsigned char *d = pattern(n, 3);
    struct wfile *wf;
    cr_assert_eq(stage_create(st, "rw", &wf), 0);
    stage_writer_open(st, wf);
    cr_assert_eq(stage_write(st, wf, d, n, 0), (ssize_t)n);
    wait_calls(MEM_OP_MPU_PART, 3);
    cr_assert_eq(mem_store_calls(mem, MEM_OP_MPU_PART), 3);
    memset(d + 10, 'Z', 100); /* part 1 changes after it was sent */
    cr_assert_eq(stage_write(st, wf, d + 10, 100, 10), 100);
    stage_writer_close(st, wf);
    stage_put(st, wf);
    cr_assert_eq(stage_sync(st, ""), 0);
    assert_stored("rw", d, n);
    cr_assert_eq(mem_store_calls(mem, MEM_OP_MPU_PART), 5, "part 1 again, and the short last");
    free(d);
}

Test(stage, failed_upload_is_reported_then_retried)
{
    mem_store_fail(mem, MEM_OP_PUT, -EIO, 2);
    unsigned char *d = pattern(500, 4);
    struct wfile *wf;
    cr_assert_eq(stage_create(st, "flaky", &wf), 0);
    stage_writer_open(st, wf);
    cr_assert_eq(stage_write(st, wf, d, 500, 0), 500);
    cr_assert_eq(stage_fsync(st, wf), -EIO, "remote fsync reports the failed attempt");
    stage_writer_close(st, wf);
    stage_put(st, wf);
    sync_until_ok(); /* the staged data is kept and retried */
    assert_stored("flaky", d, 500);
    cr_assert_eq(mem_store_calls(mem, MEM_OP_PUT), 3);
    free(d);
}

Test(stage, staged_fsync_returns_without_the_store)
{
    stage_close(st);
    cfg.fsync_remote = 0;
    open_stage();
    mem_store_delay(mem, MEM_OP_PUT, 300000); /* 0.3 s per PUT */
    unsigned char *d = pattern(500, 5);
    struct wfile *wf;
    cr_assert_eq(stage_create(st, "async", &wf), 0);
    stage_writer_open(st, wf);
    cr_assert_eq(stage_write(st, wf, d, 500, 0), 500);
    double t0 = now();
    cr_assert_eq(stage_fsync(st, wf), 0);
    cr_assert_lt(now() - t0, 0.25, "staged fsync waited for the store");
    cr_assert_not(stored("async"));
    stage_writer_close(st, wf);
    stage_put(st, wf);
    cr_assert_eq(stage_sync(st, ""), 0);
    assert_stored("async", d, 500);
    free(d);
}

Test(stage, lost_complete_answer_is_success)
{
    mem_store_lose_answer(mem, MEM_OP_MPU_COMPLETE, -EIO, 1);
    size_t n = 2 * PART + 1;
    unsigned char *d = pattern(n, 6);
    write_whole("lost", d, n, PART);
    sync_until_ok();
    assert_stored("lost", d, n);
    cr_assert_eq(mem_store_uploads_in_progress(mem), 0);
    free(d);
}

Test(stage, forgotten_multipart_upload_starts_over)
{
    mem_store_fail(mem, MEM_OP_MPU_COMPLETE, -ENOENT, 1); /* NoSuchUpload */
    size_t n = 2 * PART + 5;
    unsigned char *d = pattern(n, 7);
    write_whole("again", d, n, PART);
    sync_until_ok();
    assert_stored("again", d, n);
    cr_assert_eq(mem_store_calls(mem, MEM_OP_MPU_BEGIN), 2);
    free(d);
}

Test(stage, unlink_during_upload_aborts_it)
{
    mem_store_delay(mem, MEM_OP_MPU_PART, 100000);
    size_t n = 4 * PART;
    unsigned char *d = pattern(n, 8);
    struct wfile *wf;
    cr_assert_eq(stage_create(st, "doomed", &wf), 0);
    stage_writer_open(st, wf);
    cr_assert_eq(stage_write(st, wf, d, n, 0), (ssize_t)n);
    wait_calls(MEM_OP_MPU_PART, 1);
    cr_assert_eq(stage_unlink(st, "doomed"), 0);
    stage_writer_close(st, wf);
    stage_put(st, wf);
    cr_assert_eq(stage_sync(st, ""), 0);
    WAIT_UNTIL(mem_store_uploads_in_progress(mem) == 0, 10);
    cr_assert_eq(mem_store_uploads_in_progress(mem), 0, "the upload was aborted");
    cr_assert_not(stored("doomed"));
    cr_assert_eq(mem_store_calls(mem, MEM_OP_MPU_COMPLETE), 0);
    free(d);
}

static atomic_int put_of_old_name;

static void watch_old_name(void *arg, const struct mem_call *c)
{
    (void)arg;
    if ((c->op == MEM_OP_PUT || c->op == MEM_OP_MPU_BEGIN) && strcmp(c->path, "x.tmp") == 0)
        atomic_store(&put_of_old_name, 1);
}

Test(stage, rename_of_a_held_file_uploads_only_the_new_name)
{
    mem_store_set_hook(mem, watch_old_name, NULL);
    unsigned char *d = pattern(300, 9);
    write_whole("x.tmp", d, 300, 300);
    cr_assert_eq(stage_rename(st, "x.tmp", "x"), 0);
    cr_assert_eq(stage_sync(st, ""), 0);
    assert_stored("x", d, 300);
    cr_assert_not(stored("x.tmp"));
    cr_assert_eq(atomic_load(&put_of_old_name), 0, "the temporary name went to the store");
    free(d);
}

Test(stage, a_held_file_never_renamed_is_uploaded_after_its_hold)
{
    unsigned char *d = pattern(300, 10);
    write_whole("left.tmp", d, 300, 300);
    double t0 = now();
    WAIT_UNTIL(stored("left.tmp"), 10);
    assert_stored("left.tmp", d, 300);
    cr_assert_geq(now() - t0, 0.1, "uploaded before its hold expired");
    free(d);
}

/* ---- commit ordering with a real torch 1.13 checkpoint ---- */

static atomic_int metadata_too_early;

static void check_metadata_order(void *arg, const struct mem_call *c)
{
    (void)arg;
    if (c->op != MEM_OP_PUT || strcmp(c->path, "ck/.metadata") != 0)
        return;
    DIR *d = opendir(CKPT);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strstr(e->d_name, ".distcp"))
            continue;
        char key[512], path[1024];
        snprintf(key, sizeof key, "ck/%s", e->d_name);
        snprintf(path, sizeof path, "%s/%s", CKPT, e->d_name);
        struct stat sb;
        stat(path, &sb);
        size_t len = 0;
        void *got = mem_store_get(mem, key, &len);
        if (!got || len != (size_t)sb.st_size)
            atomic_store(&metadata_too_early, 1);
        free(got);
    }
    closedir(d);
}

static const char *path_base_of(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* What on_publish was told about the published .metadata. */
static struct {
    int calls, with_snapshot;
    size_t len, nfiles, files_at_size;
} published;

static void note_publish(void *arg, const char *path, const struct store_stat *s,
                         const struct stage_commit_snapshot *commit)
{
    (void)arg;
    if (strcmp(path_base_of(path), ".metadata") != 0)
        return;
    published.calls++;
    if (!commit)
        return;
    published.with_snapshot++;
    published.len = commit->len;
    published.nfiles = commit->nfiles;
    cr_assert_eq(commit->len, s->size);
    for (size_t i = 0; i < commit->nfiles; i++) {
        char p[512];
        snprintf(p, sizeof p, "ck/%s", commit->files[i].name);
        size_t n = 0;
        void *b = mem_store_get(mem, p, &n);
        published.files_at_size += b && n == commit->files[i].size;
        free(b);
    }
}

/* Write every shard of the fixture checkpoint through the stage under ck/
 * (each closed); their number. */
static int stage_fixture_shards(void)
{
    DIR *d = opendir(CKPT);
    struct dirent *e;
    int shards = 0;
    while ((e = readdir(d))) {
        if (!strstr(e->d_name, ".distcp"))
            continue;
        char as[512];
        snprintf(as, sizeof as, "ck/%s", e->d_name);
        put_fixture(e->d_name, as, 1);
        shards++;
    }
    closedir(d);
    return shards;
}

Test(stage, metadata_waits_for_every_shard_it_names)
{
    stage_close(st); /* staged mode: closing the .metadata does not wait */
    cfg.fsync_remote = 0;
    cfg.on_publish = note_publish;
    memset(&published, 0, sizeof published);
    open_stage();
    mem_store_set_hook(mem, check_metadata_order, NULL);
    mem_store_delay(mem, MEM_OP_PUT, 20000);
    /* .metadata first, then the shards: it must still go last */
    put_fixture(".metadata", "ck/.metadata", 1);
    int shards = stage_fixture_shards();
    cr_assert_gt(shards, 2);
    cr_assert_eq(stage_sync(st, ""), 0);
    cr_assert(stored("ck/.metadata"));
    cr_assert_eq(atomic_load(&metadata_too_early), 0, ".metadata reached the store too early");
    struct stage_stats s;
    stage_get_stats(st, &s);
    cr_assert_eq(s.commits, 1);
    /* The index is told what was published: the bytes, and every shard with
     * the size the check found (so it need not ask the store). */
    cr_assert_eq(published.calls, 1);
    cr_assert_eq(published.with_snapshot, 1);
    cr_assert_eq(published.nfiles, (size_t)shards);
    cr_assert_eq(published.files_at_size, (size_t)shards);
    cr_assert_gt(published.len, 0);
}

Test(stage, metadata_copied_first_in_remote_mode)
{
    /* cp -r and rsync copy .metadata before the shards: in remote mode its
     * close must not wait for shards only this same writer will write next
     * (it waited --commit-timeout and failed with EIO), and the commit's
     * clock starts over while the shards' uploads land (here they take
     * longer than the timeout in all, one upload at a time). */
    stage_close(st);
    cfg.commit_timeout = 0.4;
    cfg.upload_workers = 1;
    open_stage();
    mem_store_set_hook(mem, check_metadata_order, NULL);
    mem_store_delay(mem, MEM_OP_PUT, 80000);
    double t0 = now();
    put_fixture(".metadata", "ck/.metadata", 1); /* asserts its close returns 0 */
    cr_assert_lt(now() - t0, 5.0, "the close waited for the timeout");
    cr_assert_not(stored("ck/.metadata"));
    int shards = stage_fixture_shards();
    cr_assert_gt(shards * 0.08, cfg.commit_timeout, "the uploads should outlast the timeout");
    cr_assert_eq(stage_sync(st, ""), 0);
    cr_assert(stored("ck/.metadata"));
    cr_assert_eq(atomic_load(&metadata_too_early), 0, ".metadata reached the store too early");
    struct stage_stats s;
    stage_get_stats(st, &s);
    cr_assert_eq(s.commit_timeouts, 0);
}

Test(stage, metadata_naming_a_missing_shard_times_out)
{
    stage_close(st);
    cfg.commit_timeout = 0.5;
    open_stage();
    char path[1024];
    snprintf(path, sizeof path, "%s/.metadata", CKPT);
    size_t n;
    char *b = slurp(path, &n);
    /* and no shards at all, nor any being written here: in remote mode its
     * close returns once the check saw that (cp -r writes .metadata first),
     * and a sync waits for the commit, then fails */
    write_closing("ck/.metadata", (unsigned char *)b, n, 4096, 0);
    cr_assert_not(stored("ck/.metadata"), "published anyway");
    double t0 = now();
    cr_assert_eq(stage_sync(st, ""), -EIO);
    cr_assert_geq(now() - t0, 0.2);
    free(b);
    cr_assert_not(stored("ck/.metadata"), "published anyway");
    struct stage_stats s;
    stage_get_stats(st, &s);
    cr_assert_eq(s.commit_timeouts, 1);
    cr_assert_eq(s.pending_files, 1, "the .metadata stays staged");
}

Test(stage, metadata_counts_shards_written_by_another_node)
{
    stage_close(st);
    cfg.fsync_remote = 0;
    open_stage();
    /* The shards arrive on the store from elsewhere (another mount), later. */
    uint64_t lists = mem_store_calls(mem, MEM_OP_LIST);
    put_fixture(".metadata", "ck/.metadata", 1);
    /* its check has looked at the store twice and found no shards (or it
     * was published without them) */
    WAIT_UNTIL(mem_store_calls(mem, MEM_OP_LIST) >= lists + 2 || stored("ck/.metadata"), 10);
    cr_assert_not(stored("ck/.metadata"), "published before its shards were there");
    cr_assert_geq(mem_store_calls(mem, MEM_OP_LIST), lists + 2, "never checked");
    store_shards_except(NULL);
    cr_assert_eq(stage_sync(st, ""), 0);
    cr_assert(stored("ck/.metadata"));
}

/* ---- staging space ---- */

Test(stage, writers_wait_for_room_then_proceed)
{
    stage_close(st);
    cfg.budget = 5 * PART;
    open_stage();
    mem_store_delay(mem, MEM_OP_MPU_PART, 50000);
    size_t n = 4 * PART;
    unsigned char *a = pattern(n, 11), *b = pattern(n, 12);
    write_whole("one", a, n, PART);
    write_whole("two", b, n, PART); /* 8 parts > the budget of 5: waits for "one" */
    cr_assert_eq(stage_sync(st, ""), 0);
    assert_stored("one", a, n);
    assert_stored("two", b, n);
    struct stage_stats s;
    stage_get_stats(st, &s);
    cr_assert_geq(s.budget_waits, 1);
    free(a);
    free(b);
}

Test(stage, enospc_when_nothing_can_drain)
{
    stage_close(st);
    cfg.budget = 2 * PART;
    open_stage();
    unsigned char *d = pattern(3 * PART, 13);
    struct wfile *wf;
    cr_assert_eq(stage_create(st, "hold.tmp", &wf), 0); /* held: nothing streams */
    stage_writer_open(st, wf);
    cr_assert_eq(stage_write(st, wf, d, 2 * PART, 0), (ssize_t)(2 * PART));
    cr_assert_eq(stage_write(st, wf, d + 2 * PART, PART, 2 * PART), -ENOSPC);
    stage_writer_close(st, wf);
    stage_put(st, wf);
    free(d);
}

/* ---- recovery ---- */

static int count_files(const char *path)
{
    DIR *d = opendir(path);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", path, e->d_name);
        struct stat sb;
        if (stat(p, &sb) == 0)
            n += S_ISDIR(sb.st_mode) ? count_files(p) : 1;
    }
    closedir(d);
    return n;
}

static atomic_int sealed_flushed;

/* The PUT of r/sealed is sent only once its first close has returned. */
static void put_after_close(void *arg, const struct mem_call *c)
{
    (void)arg;
    if (c->op == MEM_OP_PUT && strcmp(c->path, "r/sealed") == 0)
        WAIT_UNTIL(atomic_load(&sealed_flushed), 10);
}

Test(stage, remount_uploads_sealed_files_and_keeps_unsealed_ones)
{
    mem_store_fail(mem, MEM_OP_ALL, -EIO, -1); /* the store is down */
    mem_store_set_hook(mem, put_after_close, NULL);
    unsigned char *a = pattern(1000, 14), *b = pattern(2000, 15);
    struct wfile *wf;
    cr_assert_eq(stage_create(st, "r/sealed", &wf), 0);
    stage_writer_open(st, wf);
    cr_assert_eq(stage_write(st, wf, a, 1000, 0), 1000);
    /* close seals it and starts its PUT, which has not failed yet when close
     * returns (the hook holds it): no upload error to report yet ... */
    int rc = stage_flush(st, wf);
    cr_assert_eq(rc, 0, "close before the upload failed: %d", rc);
    atomic_store(&sealed_flushed, 1);
    /* ... a close after the attempt failed reports it */
    cr_assert(WAIT_UNTIL(stats_now().upload_failures >= 1, 10), "the PUT was never tried");
    rc = stage_flush(st, wf);
    cr_assert_eq(rc, -EIO, "close after the upload failed: %d", rc);
    stage_writer_close(st, wf);
    stage_put(st, wf);
    cr_assert_eq(stage_create(st, "r/open", &wf), 0);
    stage_writer_open(st, wf);
    cr_assert_eq(stage_write(st, wf, b, 2000, 0), 2000);
    /* The mount ends while "r/open" is still being written (its handle was
     * never released) and "r/sealed" could not be uploaded. */
    stage_close(st);
    st = NULL;
    mem_store_fail(mem, MEM_OP_ALL, 0, 0); /* the store is back */
    open_stage();
    cr_assert_eq(stage_sync(st, ""), 0);
    assert_stored("r/sealed", a, 1000);
    cr_assert_not(stored("r/open"), "an unsealed file was published");
    char rec[512];
    snprintf(rec, sizeof rec, "%s/recovered", dir);
    cr_assert_eq(count_files(rec), 1, "the unsealed file's bytes are kept in recovered/");
    struct stage_stats s;
    stage_get_stats(st, &s);
    cr_assert_eq(s.recovered_files, 1);
    free(a);
    free(b);
}

Test(stage, remount_removes_an_empty_staging_file_the_crash_left_unnamed)
{
    /* kill -9 between the staging file's creation and the note of its path:
     * an empty file with no name loses nothing when it goes; one that holds
     * bytes (a filesystem without xattrs) is kept, under recovered/unknown. */
    stage_close(st);
    st = NULL;
    char p[1024];
    snprintf(p, sizeof p, "%s/files/00000000000000f1", dir);
    int fd = open(p, O_CREAT | O_EXCL | O_WRONLY, 0600);
    cr_assert(fd >= 0);
    close(fd);
    snprintf(p, sizeof p, "%s/files/00000000000000f2", dir);
    fd = open(p, O_CREAT | O_EXCL | O_WRONLY, 0600);
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, "abc", 3), 3);
    close(fd);
    open_stage();
    snprintf(p, sizeof p, "%s/files/00000000000000f1", dir);
    cr_assert_neq(access(p, F_OK), 0, "the empty unnamed staging file is still there");
    snprintf(p, sizeof p, "%s/recovered", dir);
    cr_assert_eq(count_files(p), 1, "only the unnamed file with bytes is kept");
    snprintf(p, sizeof p, "%s/recovered/unknown/00000000000000f2.f2", dir);
    cr_assert_eq(access(p, F_OK), 0, "the unnamed file with bytes is not where it should be");
}

Test(stage, a_begin_whose_answer_was_lost_leaves_no_upload_behind)
{
    /* CreateMultipartUpload reached the store, its answer did not: the
     * retried begin makes a second upload, and the first one used to stay
     * on the store (its parts billed) until a crash recovery swept the key. */
    mem_store_lose_answer(mem, MEM_OP_MPU_BEGIN, -ETIMEDOUT, 1);
    size_t n = 5 * 64 * 1024 + 7; /* multipart with the fixture's 64 KiB parts */
    unsigned char *d = pattern(n, 21);
    struct wfile *wf;
    cr_assert_eq(stage_create(st, "r/lost-answer", &wf), 0);
    stage_writer_open(st, wf);
    cr_assert_eq(stage_write(st, wf, d, n, 0), (ssize_t)n);
    stage_flush(st, wf); /* 0 or EIO, as the retry of the begin goes */
    stage_writer_close(st, wf);
    stage_put(st, wf);
    int rc = -1;
    for (int i = 0; i < 5 && rc != 0; i++)
        rc = stage_sync(st, ""); /* the first may see the failed begin */
    cr_assert_eq(rc, 0);
    assert_stored("r/lost-answer", d, n);
    cr_assert_eq(mem_store_calls(mem, MEM_OP_MPU_BEGIN), 2);
    cr_assert_eq(mem_store_uploads_in_progress(mem), 0, "the first begin's upload was left behind");
    free(d);
}

Test(stage, remount_cleans_an_upload_begun_for_a_file_never_journaled)
{
    /* A seal starts the upload before its journal record is written: a crash
     * in between leaves an upload (a local store's temporary file) for a
     * staging file that no record names. */
    unsigned char *b = pattern(2000, 17);
    struct wfile *wf;
    cr_assert_eq(stage_create(st, "r/unrecorded", &wf), 0);
    stage_writer_open(st, wf);
    cr_assert_eq(stage_write(st, wf, b, 2000, 0), 2000);
    struct store *s = mem_store_base(mem);
    char id[STORE_UPLOAD_ID_MAX];
    cr_assert_eq(s->ops->mpu_begin(s, "r/unrecorded", id), 0);
    stage_close(st); /* the "crash": never sealed, never journaled */
    st = NULL;
    cr_assert_eq(mem_store_uploads_in_progress(mem), 1);
    open_stage();
    cr_assert_eq(stage_sync(st, ""), 0);
    cr_assert_eq(mem_store_uploads_in_progress(mem), 0, "the stray upload was left behind");
    cr_assert_not(stored("r/unrecorded"));
    free(b);
}

/* The "crash" of remount_cleans_an_upload_begun_for_a_file_never_journaled:
 * a file being written at path, whose upload the dead daemon began. */
static void crash_with_an_unrecorded_upload(const char *path)
{
    unsigned char *b = pattern(2000, 18);
    struct wfile *wf;
    cr_assert_eq(stage_create(st, path, &wf), 0);
    stage_writer_open(st, wf);
    cr_assert_eq(stage_write(st, wf, b, 2000, 0), 2000);
    struct store *s = mem_store_base(mem);
    char id[STORE_UPLOAD_ID_MAX];
    cr_assert_eq(s->ops->mpu_begin(s, path, id), 0);
    stage_close(st);
    st = NULL;
    free(b);
}

Test(stage, remount_sweeps_again_for_a_begin_that_lands_after_recovery)
{
    /* The dead daemon's CreateMultipartUpload, held up on its way (a proxy),
     * reaches the store after recovery listed the key's uploads. */
    crash_with_an_unrecorded_upload("r/late");
    open_stage();
    cr_assert_eq(mem_store_uploads_in_progress(mem), 0);
    struct store *s = mem_store_base(mem);
    char id[STORE_UPLOAD_ID_MAX];
    cr_assert_eq(s->ops->mpu_begin(s, "r/late", id), 0); /* lands now */
    cr_assert_eq(stage_sync(st, ""), 0);
    cr_assert_eq(mem_store_uploads_in_progress(mem), 0, "the late upload was left behind");
}

Test(stage, the_second_sweep_keeps_this_mounts_own_upload_of_the_key)
{
    crash_with_an_unrecorded_upload("r/again");
    open_stage();
    /* The trainer writes the same name again; its upload is being completed
     * (slowly) when the second sweep comes. */
    mem_store_delay(mem, MEM_OP_MPU_COMPLETE, 2500000);
    uint64_t begins = mem_store_calls(mem, MEM_OP_MPU_BEGIN);
    size_t n = 3 * PART + 5;
    unsigned char *d = pattern(n, 19);
    write_whole("r/again", d, n, PART);
    cr_assert_eq(stage_sync(st, ""), 0);
    assert_stored("r/again", d, n);
    cr_assert_eq(mem_store_calls(mem, MEM_OP_MPU_BEGIN), begins + 1,
                 "the sweep aborted this mount's own upload (it was begun again)");
    cr_assert_eq(mem_store_uploads_in_progress(mem), 0);
    free(d);
}

Test(stage, an_upload_begun_while_the_second_sweep_lists_the_key_is_kept)
{
    crash_with_an_unrecorded_upload("r/race");
    open_stage();
    /* The second sweep's listing of the key is slow (due 2 s after the
     * mount); the trainer writes the same name again while it is on its way,
     * and its multipart upload begins before the listing answers. */
    mem_store_delay(mem, MEM_OP_MPU_LIST, 1000000);
    mem_store_delay(mem, MEM_OP_MPU_COMPLETE, 1500000);
    uint64_t lists = mem_store_calls(mem, MEM_OP_MPU_LIST);
    /* the second sweep's listing is on its way (counted at its start) */
    cr_assert(WAIT_UNTIL(mem_store_calls(mem, MEM_OP_MPU_LIST) > lists, 10), "no second sweep");
    uint64_t begins = mem_store_calls(mem, MEM_OP_MPU_BEGIN);
    size_t n = 3 * PART + 5;
    unsigned char *d = pattern(n, 19);
    write_whole("r/race", d, n, PART);
    cr_assert_eq(stage_sync(st, ""), 0, "the sweep aborted the upload begun during its listing");
    assert_stored("r/race", d, n);
    cr_assert_eq(mem_store_calls(mem, MEM_OP_MPU_BEGIN), begins + 1, "it was begun again");
    cr_assert_eq(mem_store_uploads_in_progress(mem), 0);
    free(d);
}

Test(stage, an_abandoned_unmount_ends_the_second_sweep_between_keys)
{
    unsigned char *b = pattern(2000, 18);
    const char *paths[] = {"k/a", "k/b", "k/c", "k/d"};
    for (int i = 0; i < 4; i++) {
        struct wfile *wf;
        cr_assert_eq(stage_create(st, paths[i], &wf), 0);
        stage_writer_open(st, wf);
        cr_assert_eq(stage_write(st, wf, b, 2000, 0), 2000);
    }
    stage_close(st); /* never closed by their writer: recovery sweeps their keys */
    st = NULL;
    open_stage();
    uint64_t lists = mem_store_calls(mem, MEM_OP_MPU_LIST);
    mem_store_delay(mem, MEM_OP_MPU_LIST, 1000000);
    /* the second sweep's first listing is on its way (counted at its start) */
    cr_assert(WAIT_UNTIL(mem_store_calls(mem, MEM_OP_MPU_LIST) > lists, 10), "no second sweep");
    stage_abandon(st); /* a second SIGTERM */
    stage_close(st);
    st = NULL;
    cr_assert_eq(mem_store_calls(mem, MEM_OP_MPU_LIST), lists + 1,
                 "the second sweep went on listing keys after the unmount was abandoned");
    free(b);
}

Test(stage, a_copy_to_a_swept_key_waits_for_the_second_sweep)
{
    crash_with_an_unrecorded_upload("r/copy");
    open_stage();
    uint64_t lists = mem_store_calls(mem, MEM_OP_MPU_LIST);
    stage_wait_sweep(st, "r/other"); /* not swept: no wait */
    cr_assert_eq(mem_store_calls(mem, MEM_OP_MPU_LIST), lists);
    stage_wait_sweep(st, "r/copy");
    cr_assert_eq(mem_store_calls(mem, MEM_OP_MPU_LIST), lists + 1,
                 "returned before the second sweep listed the key");
}

Test(stage, remount_resumes_a_multipart_upload)
{
    mem_store_fail(mem, MEM_OP_MPU_COMPLETE, -EIO, -1);
    size_t n = 5 * PART + 3;
    unsigned char *d = pattern(n, 16);
    write_whole("resume", d, n, PART);
    wait_calls(MEM_OP_MPU_COMPLETE, 1);
    uint64_t parts_before = mem_store_calls(mem, MEM_OP_MPU_PART);
    cr_assert_eq(parts_before, 6);
    stage_close(st);
    st = NULL;
    mem_store_fail(mem, MEM_OP_MPU_COMPLETE, 0, 0);
    open_stage();
    cr_assert_eq(stage_sync(st, ""), 0);
    assert_stored("resume", d, n);
    cr_assert_eq(mem_store_calls(mem, MEM_OP_MPU_PART), parts_before,
                 "parts in the journal were sent again");
    cr_assert_eq(mem_store_uploads_in_progress(mem), 0);
    free(d);
}

Test(stage, a_second_mount_of_the_same_cache_dir_is_refused)
{
    struct stage *other = NULL;
    char err[256] = "";
    cr_assert_eq(stage_open(mem_store_base(mem), "mem://test", &cfg, &other, err, sizeof err),
                 -EBUSY);
    cr_assert(strstr(err, "in use") != NULL, "%s", err);
}

/* ---- staged uploads yield to writers on a busy CPU (upload.c) ---------- */

struct busy_writer {
    pthread_t thread;
    atomic_int stop;
    struct wfile *wf;
    size_t block;       /* bytes rewritten at offset 0 every 5 ms */
    atomic_int written; /* writes made so far */
};

/* Rewrite the first b->block bytes of an open file every 5 ms until told to
 * stop (the parts are made larger than that: this file sends nothing). */
static void *busy_main(void *arg)
{
    struct busy_writer *b = arg;
    unsigned char *block = malloc(b->block);
    memset(block, 7, b->block);
    while (!b->stop) {
        cr_assert_eq(stage_write(st, b->wf, block, b->block, 0), (ssize_t)b->block);
        atomic_fetch_add(&b->written, 1);
        usleep(5000); /* the scenario: a save's pace of writes */
    }
    free(block);
    return NULL;
}

/* A save's writes: 256 KiB every 5 ms (about 50 MB/s). */
static void busy_start(struct busy_writer *b)
{
    if (!b->block)
        b->block = 256 * KiB;
    b->stop = 0;
    cr_assert_eq(stage_create(st, "busy", &b->wf), 0);
    stage_writer_open(st, b->wf);
    cr_assert_eq(pthread_create(&b->thread, NULL, busy_main, b), 0);
    /* a window of writes behind us (150 ms of them), as in a save under way */
    cr_assert(WAIT_UNTIL(atomic_load(&b->written) >= 30, 10), "the writer does not write");
}

static void busy_stop(struct busy_writer *b)
{
    b->stop = 1;
    pthread_join(b->thread, NULL);
    stage_writer_close(st, b->wf);
    stage_put(st, b->wf);
}

static void reopen_staged(void)
{
    stage_close(st);
    cfg.fsync_remote = 0;
    cfg.part_size = 16 * 1024 * KiB; /* the busy writer's file never fills a part */
    open_stage();
}

static int wait_stored(const char *path, double seconds)
{
    return WAIT_UNTIL(stored(path), seconds);
}

/* With the CPU pressure set and a save's writes under way, write and close
 * a 3000-byte file at path; returns its bytes (the caller frees them) and
 * when it was closed. */
static unsigned char *close_while_writing(struct busy_writer *b, double pressure, const char *path,
                                          unsigned seed, double *closed_at)
{
    pressure_now = pressure;
    busy_start(b);
    unsigned char *d = pattern(3000, seed);
    write_whole(path, d, 3000, 1000);
    if (closed_at)
        *closed_at = now();
    return d;
}

Test(stage, staged_uploads_wait_for_writers_on_a_busy_cpu)
{
    reopen_staged();
    struct busy_writer b = {0};
    unsigned char *d = close_while_writing(&b, 0.9, "a", 21, NULL);
    /* its upload job has seen the busy CPU and yields */
    cr_assert(WAIT_UNTIL(stats_now().upload_yields >= 1, 10), "the upload never yielded");
    /* the scenario: the writers stay busy 0.4 s more, and the upload waits all
     * of it (a span of time, not a race: upload_yield_seconds below) */
    usleep(400000);
    cr_assert_not(stored("a"), "uploaded while the writers had the busy CPU");
    busy_stop(&b);
    cr_assert(wait_stored("a", 2), "not uploaded once the writes stopped");
    assert_stored("a", d, 3000);
    struct stage_stats s;
    stage_get_stats(st, &s);
    cr_assert_geq(s.upload_yields, 1);
    cr_assert_gt(s.upload_yield_seconds, 0.3);
    cr_assert_eq(stage_sync(st, ""), 0);
    free(d);
}

Test(stage, staged_uploads_overlap_writes_on_an_idle_cpu)
{
    reopen_staged();
    struct busy_writer b = {0};
    unsigned char *d = close_while_writing(&b, 0.1, "a", 22, NULL);
    cr_assert(wait_stored("a", 2), "not uploaded while writes went on with CPU to spare");
    busy_stop(&b);
    struct stage_stats s;
    stage_get_stats(st, &s);
    cr_assert_eq(s.upload_yields, 0);
    cr_assert_eq(stage_sync(st, ""), 0);
    free(d);
}

Test(stage, a_sync_ends_the_yield)
{
    reopen_staged();
    struct busy_writer b = {0};
    unsigned char *d = close_while_writing(&b, 1.0, "dir/a", 23, NULL);
    cr_assert(WAIT_UNTIL(stats_now().upload_yields >= 1, 10), "the upload never yielded");
    cr_assert_not(stored("dir/a"));
    double t0 = now();
    cr_assert_eq(stage_sync(st, "dir"), 0);
    cr_assert_lt(now() - t0, 2, "sync waited for the writers");
    assert_stored("dir/a", d, 3000);
    busy_stop(&b);
    free(d);
}

Test(stage, remote_mode_uploads_never_yield)
{
    struct busy_writer b = {0}; /* fsync_remote: the writer waits for its uploads */
    unsigned char *d = close_while_writing(&b, 1.0, "a", 24, NULL);
    cr_assert(wait_stored("a", 2));
    busy_stop(&b);
    free(d);
}

Test(stage, an_unknown_cpu_pressure_holds_uploads_until_it_is_read)
{
    /* The first reading of a save (or after a quiet second) is unknown: the
     * uploads wait for the next one instead of starting blind. */
    reopen_staged();
    struct busy_writer b = {0};
    unsigned char *d = close_while_writing(&b, -1, "a", 27, NULL);
    /* its upload job has read the unknown pressure and waits */
    cr_assert(WAIT_UNTIL(stats_now().upload_yields >= 1, 10), "the upload never waited");
    cr_assert_not(stored("a"), "uploaded before the CPU pressure was known");
    pressure_now = 0.1;
    cr_assert(wait_stored("a", 2), "not uploaded once the CPU was known to be idle");
    busy_stop(&b);
    assert_stored("a", d, 3000);
    free(d);
}

Test(stage, an_unreadable_cpu_pressure_holds_nothing_back)
{
    reopen_staged();
    struct busy_writer b = {0};
    unsigned char *d = close_while_writing(&b, CPU_PRESSURE_UNREADABLE, "a", 28, NULL);
    cr_assert(wait_stored("a", 2), "an unreadable pressure file held the upload back");
    busy_stop(&b);
    assert_stored("a", d, 3000);
    free(d);
}

Test(stage, a_trickle_of_writes_does_not_hold_uploads_back)
{
    reopen_staged();
    struct busy_writer b = {.block = 4 * KiB}; /* about 0.8 MB/s: a log, not a save */
    unsigned char *d = close_while_writing(&b, 1.0, "a", 25, NULL);
    cr_assert(wait_stored("a", 2), "a trickle of writes held an upload back");
    busy_stop(&b);
    free(d);
}

Test(stage, an_upload_waits_for_writers_at_most_upload_yield_max)
{
    cfg.upload_yield_max = 0.5;
    reopen_staged();
    struct busy_writer b = {0};
    double t0;
    unsigned char *d = close_while_writing(&b, 1.0, "a", 26, &t0);
    cr_assert(wait_stored("a", 3), "the writers starved the upload");
    cr_assert_geq(now() - t0, 0.4, "the upload did not wait for the writers");
    busy_stop(&b);
    free(d);
}

/* ---- staged writes start their disk writes (stage.c) -------------------- */

/* The page-cache state of a file (Linux 6.5+'s cachestat). */
#ifndef __NR_cachestat
#define __NR_cachestat 451
#endif
struct cachestat_range {
    uint64_t off, len;
};
struct cachestat {
    uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
};

/* Dirty pages of fd (0..), or -1 if the kernel cannot say. */
static long dirty_pages(int fd)
{
    struct cachestat_range all = {0, 0};
    struct cachestat cs;
    return syscall(__NR_cachestat, fd, &all, &cs, 0) == 0 ? (long)cs.nr_dirty : -1;
}

/* Skip unless the staging directory's file system writes dirty pages back
 * (tmpfs does not: its pages stay dirty) and the kernel reports them. */
static void need_writeback_reports(void)
{
    char path[sizeof dir + 16];
    snprintf(path, sizeof path, "%s/probe", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    cr_assert_geq(fd, 0);
    unsigned char page[4096] = {1};
    cr_assert_eq(pwrite(fd, page, sizeof page, 0), (ssize_t)sizeof page);
    long before = dirty_pages(fd);
    fdatasync(fd);
    long after = dirty_pages(fd);
    close(fd);
    unlink(path);
    if (before != 1 || after != 0)
        cr_skip_test("no page-cache writeback reports here (cachestat %ld/%ld)", before, after);
}

/* Write n bytes of d at offset 0 of a new file at path the way the FUSE
 * adapter does (begin, write to the staging descriptor, end): the staging
 * descriptor, valid while *wf is held. */
static int write_through_staging(const char *path, const unsigned char *d, size_t n,
                                 struct wfile **wf)
{
    cr_assert_eq(stage_create(st, path, wf), 0);
    stage_writer_open(st, *wf);
    int fd = stage_write_begin(st, *wf, 0, n);
    cr_assert_geq(fd, 0);
    cr_assert_eq(pwrite(fd, d, n, 0), (ssize_t)n);
    stage_write_end(st, *wf, 0, n, (ssize_t)n);
    return fd;
}

Test(stage, a_large_staged_write_starts_its_disk_write_at_once)
{
    need_writeback_reports();
    reopen_staged();
    const size_t n = 1024 * KiB;
    unsigned char *d = pattern(n, 28);
    struct wfile *wf;
    int fd = write_through_staging("big", d, n, &wf);
    /* The flusher counts its start after sync_file_range returns, and the
     * pages may be clean before that: wait for both (the disk write, not the
     * kernel's 30 s flush). */
    long dirty = dirty_pages(fd);
    struct stage_stats s;
    stage_get_stats(st, &s);
    for (int i = 0; i < 200 && (dirty != 0 || s.writeback_starts == 0); i++) {
        usleep(10000);
        dirty = dirty_pages(fd);
        stage_get_stats(st, &s);
    }
    cr_assert_eq(dirty, 0, "%ld pages still dirty 2 s after the write", dirty);
    cr_assert_eq(s.writeback_starts, 1);
    stage_writer_close(st, wf);
    stage_put(st, wf);
    free(d);
}

Test(stage, remote_mode_and_small_writes_leave_the_disk_write_to_the_kernel)
{
    need_writeback_reports();
    const size_t n = 1024 * KiB; /* remote mode (the default here): nothing started */
    unsigned char *d = pattern(n, 29);
    struct wfile *wf;
    struct stage_stats s;
    int fd = write_through_staging("remote", d, n, &wf);
    usleep(300000); /* time for a flusher, had it been asked */
    cr_assert_eq(dirty_pages(fd), (long)(n / 4096));
    stage_get_stats(st, &s);
    cr_assert_eq(s.writeback_starts, 0);
    stage_writer_close(st, wf);
    stage_put(st, wf);
    reopen_staged(); /* staged mode, a write under the 256 KiB that starts one */
    fd = write_through_staging("small", d, 64 * KiB, &wf);
    usleep(300000); /* as above: time for a flusher, had it been asked (nothing to wait on) */
    cr_assert_eq(dirty_pages(fd), 16);
    stage_get_stats(st, &s);
    cr_assert_eq(s.writeback_starts, 0);
    stage_writer_close(st, wf);
    stage_put(st, wf);
    free(d);
}
