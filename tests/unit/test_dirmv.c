/* tests/unit/test_dirmv.c - renaming a directory on a store of keys (dirmv.h;
 * docs/semantics.md, "Renaming a directory on the store"): which object moves
 * in which step, the order of the requests the engine sends to an in-memory
 * S3-like store (every data copy before any commit file's copy; every old
 * commit file deleted before any other old object), a failed copy undone,
 * an interrupted rename finished from its journal record, and the record's
 * encoding. */
#include "dirmv.h"
#include "journal.h"
#include "mem_store.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[] = "/tmp/ckptfs-test-dirmv-XXXXXX";
static struct journal *j;
static struct mem_store *m;

static void setup(void)
{
    cr_assert_not_null(mkdtemp(dir));
    char err[256];
    cr_assert_eq(journal_open(dir, &j, err, sizeof err), 0, "%s", err);
    m = mem_store_new();
    mem_store_s3_listings(m);
}

static void teardown(void)
{
    journal_close(j);
    mem_store_free(m);
    char p[512];
    snprintf(p, sizeof p, "%s/data.mdb", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/lock.mdb", dir);
    unlink(p);
    rmdir(dir);
}

TestSuite(dirmv, .init = setup, .fini = teardown);

/* ---- the plan ---- */

Test(dirmv, kinds)
{
    cr_assert_eq(dirmv_kind_of(""), DIRMV_MARKER);
    cr_assert_eq(dirmv_kind_of("sub/"), DIRMV_MARKER);
    cr_assert_eq(dirmv_kind_of(".metadata"), DIRMV_COMMIT);
    cr_assert_eq(dirmv_kind_of("sub/__3.metadata"), DIRMV_COMMIT);
    cr_assert_eq(dirmv_kind_of("model.safetensors.index.json"), DIRMV_COMMIT);
    cr_assert_eq(dirmv_kind_of("__0_0.distcp"), DIRMV_DATA);
    cr_assert_eq(dirmv_kind_of(".metadata.tmp"), DIRMV_DATA);
    cr_assert_eq(dirmv_kind_of("model-00001-of-00002.safetensors"), DIRMV_DATA);
}

static const char *names[] = {".metadata",
                              "__0_0.distcp",
                              "",
                              "a/b/",
                              "a/",
                              "a/.metadata",
                              "a/x.distcp",
                              "z",
                              "m.safetensors.index.json"};
#define NNAMES (sizeof names / sizeof names[0])

static void plan_of(struct dirmv_item *it)
{
    for (size_t i = 0; i < NNAMES; i++)
        it[i] = (struct dirmv_item){.rel = (char *)names[i], .kind = dirmv_kind_of(names[i])};
}

Test(dirmv, copy_order_markers_data_then_commit_files)
{
    struct dirmv_item it[NNAMES];
    plan_of(it);
    dirmv_order(it, NNAMES, 0);
    const char *want[] = {"",
                          "a/",
                          "a/b/",
                          "__0_0.distcp",
                          "a/x.distcp",
                          "z",
                          ".metadata",
                          "a/.metadata",
                          "m.safetensors.index.json"};
    for (size_t i = 0; i < NNAMES; i++)
        cr_assert_str_eq(it[i].rel, want[i], "copy position %zu", i);
    cr_assert_eq(dirmv_step_of(&it[0], 0), 0);
    cr_assert_eq(dirmv_step_of(&it[3], 0), 1);
    cr_assert_eq(dirmv_step_of(&it[6], 0), 2);
}

Test(dirmv, delete_order_commit_files_data_then_markers_deepest_first)
{
    struct dirmv_item it[NNAMES];
    plan_of(it);
    dirmv_order(it, NNAMES, 1);
    const char *want[] = {".metadata",    "a/.metadata", "m.safetensors.index.json",
                          "__0_0.distcp", "a/x.distcp",  "z",
                          "a/b/",         "a/",          ""};
    for (size_t i = 0; i < NNAMES; i++)
        cr_assert_str_eq(it[i].rel, want[i], "delete position %zu", i);
}

/* ---- the engine against the in-memory store ---- */

/* Every call the store saw, in order: "copy SRC", "remove PATH", ... */
static struct {
    pthread_mutex_t lock;
    char *calls[1024];
    size_t n;
    int fail_copies_after; /* > 0: the copies after this many fail */
    int copies;
} seen = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void watch(void *arg, const struct mem_call *c)
{
    (void)arg;
    const char *op = c->op == MEM_OP_COPY     ? "copy"
                     : c->op == MEM_OP_REMOVE ? "remove"
                     : c->op == MEM_OP_MKDIR  ? "mkdir"
                     : c->op == MEM_OP_RMDIR  ? "rmdir"
                                              : NULL;
    if (!op)
        return;
    if (c->op == MEM_OP_RMDIR && strstr(c->path, "/t/u"))
        usleep(30000); /* a deep marker's removal is slow: a parent removed meanwhile fails */
    pthread_mutex_lock(&seen.lock);
    if (seen.n < 1024) {
        char *s = NULL;
        cr_assert_geq(asprintf(&s, "%s %s", op, c->path), 0);
        seen.calls[seen.n++] = s;
    }
    if (c->op == MEM_OP_COPY && ++seen.copies == seen.fail_copies_after)
        mem_store_fail(m, MEM_OP_COPY, -EIO, -1);
    pthread_mutex_unlock(&seen.lock);
}

static void forget_calls(void)
{
    for (size_t i = 0; i < seen.n; i++)
        free(seen.calls[i]);
    seen.n = 0;
    seen.copies = 0;
    seen.fail_copies_after = 0;
}

/* The position of the first (last: last = 1) call with this prefix whose
 * path ends in .metadata (commit = 1) or not (commit = 0); -1 if none. */
static long where(const char *prefix, int commit, int last)
{
    long at = -1;
    for (size_t i = 0; i < seen.n; i++) {
        if (strncmp(seen.calls[i], prefix, strlen(prefix)) != 0)
            continue;
        size_t l = strlen(seen.calls[i]);
        int is_commit = l >= 10 && strcmp(seen.calls[i] + l - 10, "/.metadata") == 0;
        if (is_commit == commit) {
            at = (long)i;
            if (!last)
                break;
        }
    }
    return at;
}

#define SHARDS 40

static void put_checkpoint(const char *d)
{
    char p[256];
    snprintf(p, sizeof p, "%s/", d);
    cr_assert_eq(mem_store_set(m, p, "", 0, NULL), 0);
    for (int i = 0; i < SHARDS; i++) {
        snprintf(p, sizeof p, "%s/__%d_0.distcp", d, i);
        cr_assert_eq(mem_store_set(m, p, "shard", 5, NULL), 0);
    }
    snprintf(p, sizeof p, "%s/.metadata", d);
    cr_assert_eq(mem_store_set(m, p, "meta", 4, NULL), 0);
    for (int i = 0; i < 3; i++) { /* empty subdirectories, nested */
        snprintf(p, sizeof p, "%s/s%d/", d, i);
        cr_assert_eq(mem_store_set(m, p, "", 0, NULL), 0);
        snprintf(p, sizeof p, "%s/s%d/t/u/", d, i);
        cr_assert_eq(mem_store_set(m, p, "", 0, NULL), 0);
    }
}

static int count_below(const char *d)
{
    int n = 0;
    char p[256];
    for (int i = 0; i < SHARDS; i++) {
        snprintf(p, sizeof p, "%s/__%d_0.distcp", d, i);
        size_t len;
        void *b = mem_store_get(m, p, &len);
        n += b != NULL;
        free(b);
    }
    snprintf(p, sizeof p, "%s/.metadata", d);
    size_t len;
    void *b = mem_store_get(m, p, &len);
    n += b != NULL;
    free(b);
    return n;
}

static int count_records(void *arg, const struct journal_dirmv *r)
{
    (void)r;
    (*(int *)arg)++;
    return 0;
}

static int records(void)
{
    int n = 0;
    cr_assert_eq(journal_dirmv_foreach(j, count_records, NULL, &n), 0);
    return n;
}

static struct dirmv_env env(void)
{
    return (struct dirmv_env){
        .store = mem_store_base(m), .journal = j, .store_name = "mem://t", .parallel = 4};
}

Test(dirmv, copies_commit_files_last_and_deletes_them_first)
{
    put_checkpoint("ck/tmp");
    mem_store_set_hook(m, watch, NULL);
    struct dirmv_env e = env();
    cr_assert_eq(dirmv_run(&e, "ck/tmp", "ck/final", 0), 0);
    mem_store_set_hook(m, NULL, NULL);
    cr_assert_eq(count_below("ck/final"), SHARDS + 1);
    cr_assert_eq(count_below("ck/tmp"), 0);
    cr_assert_eq(mem_store_objects(m), SHARDS + 2 + 6, "the markers, shards, .metadata");
    /* the new name's .metadata only after every shard is there */
    cr_assert_gt(where("copy ", 1, 0), where("copy ", 0, 1));
    /* the old name's .metadata goes before any of its shards */
    cr_assert_lt(where("remove ", 1, 0), where("remove ", 0, 0));
    cr_assert_eq(records(), 0, "the journal record is cleared");
    forget_calls();
}

Test(dirmv, a_failed_copy_is_undone)
{
    put_checkpoint("ck/tmp");
    seen.fail_copies_after = 10;
    mem_store_set_hook(m, watch, NULL);
    struct dirmv_env e = env();
    int rc = dirmv_run(&e, "ck/tmp", "ck/final", 0);
    mem_store_set_hook(m, NULL, NULL);
    mem_store_fail(m, MEM_OP_COPY, 0, 0);
    cr_assert_eq(rc, -EIO);
    cr_assert_eq(count_below("ck/tmp"), SHARDS + 1, "the old name is whole");
    cr_assert_eq(count_below("ck/final"), 0, "what was copied is deleted again");
    cr_assert_eq(where("copy ", 1, 0), -1, "no commit file copied");
    cr_assert_eq(records(), 0);
    forget_calls();
}

/* The target was an empty directory (its marker): undoing keeps it. */
Test(dirmv, undoing_keeps_the_marker_of_a_target_that_existed)
{
    put_checkpoint("ck/tmp");
    cr_assert_eq(mem_store_set(m, "ck/final/", "", 0, NULL), 0);
    seen.fail_copies_after = 3;
    mem_store_set_hook(m, watch, NULL);
    struct dirmv_env e = env();
    int rc = dirmv_run(&e, "ck/tmp", "ck/final", 1);
    mem_store_set_hook(m, NULL, NULL);
    mem_store_fail(m, MEM_OP_COPY, 0, 0);
    cr_assert_eq(rc, -EIO);
    size_t len;
    void *b = mem_store_get(m, "ck/final/", &len);
    cr_assert_not_null(b, "the target's marker stays");
    free(b);
    cr_assert_eq(mem_store_objects(m), SHARDS + 2 + 6 + 1, "the source and the target's marker");
    forget_calls();
}

Test(dirmv, too_many_objects_is_exdev_and_moves_nothing)
{
    put_checkpoint("ck/tmp");
    struct dirmv_env e = env();
    e.max_objects = SHARDS;
    cr_assert_eq(dirmv_run(&e, "ck/tmp", "ck/final", 0), -EXDEV);
    cr_assert_eq(count_below("ck/tmp"), SHARDS + 1);
    cr_assert_eq(count_below("ck/final"), 0);
    cr_assert_eq(records(), 0);
}

/* A crash while copying: a few shards at the new name, the record says
 * COPYING. Resuming copies the rest, the .metadata last, and deletes the
 * old name. */
Test(dirmv, resume_an_interrupted_copy)
{
    put_checkpoint("ck/tmp");
    cr_assert_eq(mem_store_set(m, "ck/final/__0_0.distcp", "shard", 5, NULL), 0);
    cr_assert_eq(mem_store_set(m, "ck/final/__1_0.distcp", "sha", 3, NULL), 0); /* older */
    struct journal_dirmv rec = {.id = 7,
                                .phase = JOURNAL_DIRMV_COPYING,
                                .store = "mem://t",
                                .from = "ck/tmp",
                                .to = "ck/final"};
    cr_assert_eq(journal_dirmv_put(j, &rec), 0);
    rec.id = 8;
    rec.store = "mem://other"; /* another store's: left alone */
    cr_assert_eq(journal_dirmv_put(j, &rec), 0);
    mem_store_set_hook(m, watch, NULL);
    struct dirmv_env e = env();
    cr_assert_eq(dirmv_resume_all(&e), 1);
    mem_store_set_hook(m, NULL, NULL);
    cr_assert_eq(count_below("ck/final"), SHARDS + 1);
    cr_assert_eq(count_below("ck/tmp"), 0);
    size_t len;
    char *b = mem_store_get(m, "ck/final/__1_0.distcp", &len);
    cr_assert(b && len == 5, "copied again over the stale one");
    free(b);
    cr_assert_gt(where("copy ", 1, 0), where("copy ", 0, 1));
    cr_assert_eq(records(), 1, "only the other store's record is left");
    forget_calls();
}

/* A crash while deleting the old name: its .metadata went first, some
 * shards are left. Resuming deletes the rest and copies nothing. */
Test(dirmv, resume_an_interrupted_delete)
{
    put_checkpoint("ck/final");
    cr_assert_eq(mem_store_set(m, "ck/tmp/__5_0.distcp", "shard", 5, NULL), 0);
    cr_assert_eq(mem_store_set(m, "ck/tmp/", "", 0, NULL), 0);
    struct journal_dirmv rec = {.id = 9,
                                .phase = JOURNAL_DIRMV_DELETING,
                                .store = "mem://t",
                                .from = "ck/tmp",
                                .to = "ck/final"};
    cr_assert_eq(journal_dirmv_put(j, &rec), 0);
    mem_store_set_hook(m, watch, NULL);
    struct dirmv_env e = env();
    cr_assert_eq(dirmv_resume_all(&e), 1);
    mem_store_set_hook(m, NULL, NULL);
    cr_assert_eq(where("copy ", 0, 0), -1);
    cr_assert_eq(count_below("ck/final"), SHARDS + 1);
    cr_assert_eq(mem_store_objects(m), SHARDS + 2 + 6);
    cr_assert_eq(records(), 0);
    forget_calls();
}

/* ---- the journal record ---- */

Test(dirmv, record_round_trip_and_damage)
{
    struct journal_dirmv r = {.id = 42,
                              .phase = JOURNAL_DIRMV_DELETING,
                              .flags = JOURNAL_DIRMV_TO_EXISTED,
                              .store = "s3://b/p",
                              .from = "a/tmp",
                              .to = "a/final"};
    unsigned char buf[256];
    size_t n = journal_dirmv_encode(&r, buf, sizeof buf);
    cr_assert_eq(n, journal_dirmv_encoded_size(&r));
    char scratch[300];
    struct journal_dirmv d;
    cr_assert_eq(journal_dirmv_decode(buf, n, &d, scratch, sizeof scratch), 0);
    cr_assert_eq(d.id, 42);
    cr_assert_eq(d.phase, JOURNAL_DIRMV_DELETING);
    cr_assert_eq(d.flags, JOURNAL_DIRMV_TO_EXISTED);
    cr_assert_str_eq(d.store, "s3://b/p");
    cr_assert_str_eq(d.from, "a/tmp");
    cr_assert_str_eq(d.to, "a/final");
    for (size_t cut = 0; cut < n; cut++)
        cr_assert_eq(journal_dirmv_decode(buf, cut, &d, scratch, sizeof scratch), -EINVAL, "%zu",
                     cut);
    buf[1] = 9; /* no such phase */
    cr_assert_eq(journal_dirmv_decode(buf, n, &d, scratch, sizeof scratch), -EINVAL);
}
