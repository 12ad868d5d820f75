/*
 * tests/unit/test_stage_replace.c - the stage when names change under
 * uploads in flight: a file replaced (rename over it) while its upload is
 * on its way, a .metadata renamed while its commit check lists the store, a
 * .metadata naming a shard in a subdirectory still uploading, an abort that
 * fails. Each test began as a reproduction of a bug found on review.
 */
#include "stage_fixture.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <time.h>

TestSuite(replace, .init = stage_setup, .fini = stage_teardown, .timeout = 60);

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Polls cond (an expression) every millisecond for at most `seconds`; its
 * value at the end. The races here are waited for on what the stage or the
 * store shows; the sleeps left are the slow requests of the scenarios. */
#define WAIT_UNTIL(cond, seconds)                                                                  \
    ({                                                                                             \
        double wait_t0_ = now();                                                                   \
        while (!(cond) && now() - wait_t0_ < (seconds))                                            \
            usleep(1000);                                                                          \
        (cond);                                                                                    \
    })

/* Body bytes of the PUTs that have taken effect on the store (counted after
 * the object is set). */
static uint64_t put_bytes_landed(void)
{
    return atomic_load(&mem_store_base(mem)->counters.put_bytes);
}

/* ---- 1: rename onto a staged file whose upload is still in flight ---- */

static atomic_int slow_put_started;

static void slow_first_put(void *arg, const struct mem_call *c)
{
    (void)arg;
    if (c->op == MEM_OP_PUT && strcmp(c->path, "d/a") == 0 &&
        atomic_fetch_add(&slow_put_started, 1) == 0)
        usleep(500000); /* the scenario: the first PUT of d/a (the old bytes) is slow */
}

static void rename_over_inflight(int keep_ref)
{
    mem_store_set_hook(mem, slow_first_put, NULL);
    unsigned char *old = pattern(1000, 1), *new = pattern(1000, 2);
    write_whole("d/a", old, 1000, 1000); /* its PUT starts, slowly */
    cr_assert(WAIT_UNTIL(atomic_load(&slow_put_started), 10), "the PUT of d/a never started");
    write_whole("d/a.tmp", new, 1000, 1000);                         /* held until renamed */
    struct wfile *keep = keep_ref ? stage_get(st, "d/a.tmp") : NULL; /* an open handle */
    cr_assert_eq(stage_rename(st, "d/a.tmp", "d/a"), 0);             /* mv d/a.tmp d/a */
    cr_assert_eq(stage_sync(st, ""), 0); /* d/a (new bytes) is on the store */
    /* ... and the old PUT lands: both PUTs' 1000 bytes have taken effect */
    cr_assert(WAIT_UNTIL(put_bytes_landed() >= 2000, 10), "the old PUT never landed");
    size_t len = 0;
    unsigned char *got = mem_store_get(mem, "d/a", &len);
    stage_put(st, keep);
    int vanished = got == NULL;
    int is_old = got && len == 1000 && memcmp(got, old, 1000) == 0;
    free(got);
    free(old);
    free(new);
    cr_assert_not(vanished, "d/a vanished from the store after sync said it was there");
    cr_assert_not(is_old, "d/a on the store holds the OLD (replaced) bytes; sync reported success");
}

Test(replace, rename_over_a_file_with_put_in_flight)
{
    rename_over_inflight(0);
}

Test(replace, rename_over_a_file_with_put_in_flight_while_open)
{
    rename_over_inflight(1);
}

/* ---- 2: rename of a commit file while its check lists the store ---- */

static atomic_int listing, listed;

/* The commit check's first request for ck/ (a listing, or a stat of a file
 * it names when few are left to find) is slow. */
static void slow_list(void *arg, const struct mem_call *c)
{
    (void)arg;
    int check = (c->op == MEM_OP_LIST && strcmp(c->path, "ck") == 0) ||
                (c->op == MEM_OP_STAT && strncmp(c->path, "ck/", 3) == 0);
    if (check && atomic_fetch_add(&listing, 1) == 0) {
        usleep(400000); /* the scenario: the check's first request is slow */
        atomic_store(&listed, 1);
    }
}

/* Staged mode: the .metadata's check runs in the background. */
static void reopen_staged_mode(void)
{
    stage_close(st);
    cfg.fsync_remote = 0;
    open_stage();
}

Test(replace, rename_of_a_metadata_during_its_check)
{
    reopen_staged_mode();
    store_shards_except(NULL); /* the shards are on the store already */
    mem_store_set_hook(mem, slow_list, NULL);
    put_fixture(".metadata", "ck/rank0.metadata", 1);
    cr_assert(WAIT_UNTIL(atomic_load(&listing), 10), "the check never looked at the store");
    /* the supervisor is listing ck/ for it: rename it meanwhile */
    cr_assert_eq(stage_rename(st, "ck/rank0.metadata", "other/rank0.metadata"), 0);
    /* the slow request has answered (the sync below waits for what the
     * check makes of it) */
    cr_assert(WAIT_UNTIL(atomic_load(&listed), 10), "the slow request never answered");
    cr_assert_eq(stage_sync(st, ""), -EIO, "published other/ although nothing it names is there");
}

/* ---- 3: .metadata naming a shard this mount is still uploading ---- */

/* What the store held at the shard's key when the .metadata was PUT. */
struct shard_watch {
    const char *key;           /* the shard this mount uploads, slowly */
    const unsigned char *want; /* its new bytes */
    size_t len;
    atomic_int meta_put, stale;
};

static void watch_shard(void *arg, const struct mem_call *c)
{
    struct shard_watch *w = arg;
    if (c->op != MEM_OP_PUT)
        return;
    if (strcmp(c->path, w->key) == 0) {
        usleep(1000000); /* the scenario: this mount's new shard is slow to upload */
    } else if (strcmp(c->path, "ck/.metadata") == 0) {
        atomic_store(&w->meta_put, 1);
        size_t len = 0;
        unsigned char *got = mem_store_get(mem, w->key, &len);
        if (!got || len != w->len || memcmp(got, w->want, len) != 0)
            atomic_store(&w->stale, 1);
        free(got);
    }
}

/* A save whose shard __0_1.distcp is named shard_name in its .metadata (same
 * length in the pickle) while an earlier save's object of the same size is
 * still on the store there: the .metadata must wait for this mount's
 * upload of the shard. */
static void metadata_waits_for_its_shard(const char *shard_name)
{
    reopen_staged_mode();
    size_t mlen;
    char *meta = slurp(CKPT "/.metadata", &mlen);
    char *at = memmem(meta, mlen, "__0_1.distcp", 12);
    cr_assert_not_null(at);
    cr_assert_eq(strlen(shard_name), 12);
    memcpy(at, shard_name, 12);
    store_shards_except("__0_1.distcp");
    char key[64];
    snprintf(key, sizeof key, "ck/%s", shard_name);
    size_t n;
    unsigned char *shard = (unsigned char *)slurp(CKPT "/__0_1.distcp", &n);
    unsigned char *old = pattern(n, 7);
    mem_store_set(mem, key, old, n, NULL);
    struct shard_watch w = {.key = key, .want = shard, .len = n};
    mem_store_set_hook(mem, watch_shard, &w);
    /* this save: the shard is written (its upload is slow), then the .metadata */
    write_whole(key, shard, n, n);
    write_whole("ck/.metadata", (unsigned char *)meta, mlen, mlen);
    int rc = stage_sync(st, "");
    mem_store_set_hook(mem, NULL, NULL);
    free(old);
    free(meta);
    free(shard);
    cr_assert_eq(rc, 0);
    cr_assert(atomic_load(&w.meta_put));
    cr_assert_eq(atomic_load(&w.stale), 0,
                 ".metadata was PUT while %s on the store still held the old save's bytes (this "
                 "mount's new shard was still uploading)",
                 key);
}

Test(replace, metadata_naming_a_shard_in_a_subdirectory_still_uploading)
{
    metadata_waits_for_its_shard("s/0_1.distcp");
}

Test(replace, metadata_naming_a_shard_in_its_directory_still_uploading)
{
    metadata_waits_for_its_shard("__0_1.distcp");
}

/* ---- 4: a failed abort is forgotten: the multipart upload stays for good ---- */
static void failed_abort_then_remount(int store_lists_uploads)
{
    size_t n = 4 * PART;
    unsigned char *d = pattern(n, 8);
    struct wfile *wf;
    cr_assert_eq(stage_create(st, "doomed", &wf), 0);
    stage_writer_open(st, wf);
    cr_assert_eq(stage_write(st, wf, d, n, 0), (ssize_t)n);
    WAIT_UNTIL(mem_store_uploads_in_progress(mem) > 0, 10);
    cr_assert_eq(mem_store_uploads_in_progress(mem), 1);
    mem_store_fail(mem, MEM_OP_MPU_ABORT, -EIO, -1); /* the store is unreachable for aborts */
    cr_assert_eq(stage_unlink(st, "doomed"), 0);
    stage_writer_close(st, wf);
    stage_put(st, wf);
    cr_assert_eq(stage_sync(st, ""), 0);
    /* the abort was tried, and failed */
    cr_assert(WAIT_UNTIL(mem_store_calls(mem, MEM_OP_MPU_ABORT) >= 1, 10), "no abort was tried");
    /* remount the same cache directory with the store reachable again */
    stage_close(st);
    mem_store_fail(mem, MEM_OP_MPU_ABORT, 0, 0);
    if (!store_lists_uploads) /* like s3rver: only the recorded id finds it */
        mem_store_fail(mem, MEM_OP_MPU_LIST, -ENOSYS, -1);
    open_stage();
    stage_wait_sweep(st, "doomed"); /* past the second sweep (if it has the key) */
    cr_assert_eq(stage_sync(st, ""), 0);
    size_t left = mem_store_uploads_in_progress(mem);
    free(d);
    cr_assert_eq(left, 0,
                 "%zu multipart upload(s) of the unlinked file left on the store after "
                 "the remount ('the next mount retries' said the log)",
                 left);
}

Test(replace, a_failed_abort_is_retried_by_the_next_mount)
{
    failed_abort_then_remount(1);
}

Test(replace, a_failed_abort_is_retried_by_the_next_mount_where_uploads_cannot_be_listed)
{
    failed_abort_then_remount(0);
}
