/*
 * tests/unit/test_ckindex.c - fs/read/ckindex.c, the mount's checkpoint indexes:
 * built in the background from the store, reused when the stored
 * fingerprint matches (a remount), rebuilt when .metadata changes, pinned to
 * the .metadata version it fingerprints, failed once for a bad .metadata,
 * built without listing the directory (file sizes from what the mount
 * knows), and item lookups in layout order within a budget. Runs on the in-memory
 * store with the real torch 1.13 checkpoint of the fixtures.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ckindex.h"
#include "idxdb.h"
#include "mem_store.h"
#include "workq.h"

#define FIX CKPTFS_FIXTURES "/dcp-torch1.13/per_rank"

static char cache_dir[64];
static struct mem_store *ms;
static struct workq *wq;
static struct ckindex *ci;

/* What "the mount" knows of a file for the builds (ckindex_known_fn): the
 * size of known_path, nothing else; on_known runs first (a test's hook). */
static const char *known_path;
static uint64_t known_size;
static void (*on_known)(void);

static int known(void *arg, const char *path, uint64_t *size)
{
    (void)arg;
    if (on_known)
        on_known();
    if (!known_path || strcmp(path, known_path) != 0)
        return 1;
    *size = known_size;
    return 0;
}

static void *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *b = malloc((size_t)n + 1);
    cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

/* Copies fixture file name into the store as ck/name. */
static void put_fixture(const char *name)
{
    char src[512], dst[256];
    snprintf(src, sizeof src, "%s/%s", FIX, name);
    snprintf(dst, sizeof dst, "ck/%s", name);
    size_t n;
    void *b = slurp(src, &n);
    cr_assert_eq(mem_store_set(ms, dst, b, n, NULL), 0);
    free(b);
}

static void open_index(void)
{
    char err[256] = "";
    cr_assert_eq(workq_create(2, &wq), 0);
    cr_assert_eq(ckindex_open(cache_dir, "mem://test", mem_store_base(ms), wq, known, NULL, &ci,
                              err, sizeof err),
                 0, "%s", err);
}

static void close_index(void)
{
    ckindex_cancel(ci);
    workq_destroy(wq);
    ckindex_close(ci);
    ci = NULL;
    wq = NULL;
}

static void setup(void)
{
    strcpy(cache_dir, "/tmp/ckptfs-ckindex-XXXXXX");
    cr_assert_not_null(mkdtemp(cache_dir));
    ms = mem_store_new();
    put_fixture(".metadata");
    put_fixture("__0_0.distcp");
    put_fixture("__1_0.distcp");
    open_index();
}

static void teardown(void)
{
    if (ci)
        close_index();
    known_path = NULL;
    on_known = NULL;
    mem_store_free(ms);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cache_dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(ckindex, .init = setup, .fini = teardown);

static struct store_stat stat_of(const char *path)
{
    struct store *s = mem_store_base(ms);
    struct store_stat st;
    cr_assert_eq(s->ops->stat(s, path, &st), 0, "%s", path);
    return st;
}

/* Waits (up to 10 s) until ready + failed of the stats reach n. */
static struct ckindex_stats wait_settled(uint64_t n)
{
    struct ckindex_stats st;
    for (int i = 0; i < 1000; i++) {
        ckindex_get_stats(ci, &st);
        if (st.ready + st.failed >= n)
            return st;
        nanosleep(&(struct timespec){0, 10000000}, NULL);
    }
    cr_assert_fail("index builds did not finish: ready %llu failed %llu",
                   (unsigned long long)st.ready, (unsigned long long)st.failed);
    return st;
}

/* ck/.metadata becomes another checkpoint's (the per-item fixture). */
static void replace_metadata(void)
{
    size_t n;
    void *b = slurp(CKPTFS_FIXTURES "/dcp-torch1.13/per_item/.metadata", &n);
    cr_assert_eq(mem_store_set(ms, "ck/.metadata", b, n, NULL), 0);
    free(b);
}

Test(ckindex, builds_then_a_reopen_reuses_the_stored_index)
{
    cr_assert_eq(ckindex_is_checkpoint(ci, "ck"), 0);
    struct store_stat md = stat_of("ck/.metadata");
    uint64_t stats0 = mem_store_calls(ms, MEM_OP_STAT), lists0 = mem_store_calls(ms, MEM_OP_LIST);
    ckindex_notice(ci, "ck", &md);
    cr_assert_eq(ckindex_is_checkpoint(ci, "ck"), 1);
    struct ckindex_stats st = wait_settled(1);
    cr_assert_eq(st.ready, 1);
    cr_assert_eq(st.built, 1);
    cr_assert_eq(st.reused, 0);
    cr_assert_eq(st.failed, 0);
    /* The noticed version's size and a .metadata known to be there: the
     * build asks the store for the GET alone (the files are the ones the
     * .metadata names; no listing for their sizes). */
    cr_expect_eq(mem_store_calls(ms, MEM_OP_STAT) - stats0, 0, "a stat (HEAD) of .metadata");
    cr_expect_eq(mem_store_calls(ms, MEM_OP_LIST) - lists0, 0, "%llu listings",
                 (unsigned long long)(mem_store_calls(ms, MEM_OP_LIST) - lists0));
    cr_expect_eq(ckindex_file_count(ci, "ck"), 2);
    /* The same version noticed again: nothing new. */
    uint64_t reads = mem_store_calls(ms, MEM_OP_READ);
    ckindex_notice(ci, "ck", &md);
    cr_assert_eq(mem_store_calls(ms, MEM_OP_READ), reads);

    close_index();
    open_index();
    reads = mem_store_calls(ms, MEM_OP_READ);
    ckindex_notice(ci, "ck", &md);
    st = wait_settled(1);
    cr_assert_eq(st.reused, 1, "a remount must reuse the index");
    cr_assert_eq(st.built, 0);
    cr_assert_eq(mem_store_calls(ms, MEM_OP_READ), reads, "a reused index reads nothing");
}

Test(ckindex, items_in_layout_order_within_the_budget)
{
    struct ckindex_span sp[8];
    cr_assert_eq(ckindex_items(ci, "ck/__0_0.distcp", 500, 0, sp, 8), 0, "not indexed yet");
    struct store_stat md = stat_of("ck/.metadata");
    ckindex_notice(ci, "ck", &md);
    wait_settled(1);
    /* __0_0.distcp: [0,431) [431,862) [862,525897) [525897,532916) ... */
    cr_assert_eq(ckindex_items(ci, "ck/__0_0.distcp", 500, 0, sp, 8), 1);
    cr_assert_eq(sp[0].offset, 431);
    cr_assert_eq(sp[0].length, 431);
    /* The first item always counts; the next only while within budget. */
    cr_assert_eq(ckindex_items(ci, "ck/__0_0.distcp", 0, 862, sp, 8), 2);
    cr_assert_eq(sp[1].offset, 431);
    cr_assert_eq(ckindex_items(ci, "ck/__0_0.distcp", 0, 1ull << 30, sp, 3), 3, "max bounds it");
    cr_assert_eq(sp[2].offset, 862);
    cr_assert_eq(sp[2].length, 525035);
    cr_assert_eq(ckindex_items(ci, "ck/nope.distcp", 0, 0, sp, 8), 0);
    cr_assert_eq(ckindex_items(ci, "other/__0_0.distcp", 0, 0, sp, 8), 0);
    struct ckindex_stats st;
    ckindex_get_stats(ci, &st);
    cr_assert_geq(st.lookups, 4);
}

Test(ckindex, siblings_are_the_other_chunks_of_the_tensor)
{
    struct ckindex_chunk ch[4];
    cr_assert_eq(ckindex_siblings(ci, "ck/__0_0.distcp", 900, ch, 4), 0, "not indexed yet");
    struct store_stat md = stat_of("ck/.metadata");
    ckindex_notice(ci, "ck", &md);
    wait_settled(1);
    /* model.embed.weight: chunk 0 at __0_0.distcp [862, +525035), chunk 1 at
     * __1_0.distcp [0, +525035). */
    cr_assert_eq(ckindex_siblings(ci, "ck/__0_0.distcp", 900, ch, 4), 1);
    cr_assert_str_eq(ch[0].name, "__1_0.distcp");
    cr_assert_eq(ch[0].rank, 1);
    cr_assert_eq(ch[0].offset, 0);
    cr_assert_eq(ch[0].length, 525035);
    cr_assert_eq(ckindex_siblings(ci, "ck/__1_0.distcp", 10, ch, 4), 1, "and back");
    cr_assert_str_eq(ch[0].name, "__0_0.distcp");
    cr_assert_eq(ch[0].rank, 0);
    cr_assert_eq(ch[0].offset, 862);
    cr_assert_eq(ckindex_siblings(ci, "ck/__1_0.distcp", 10, ch, 0), 0, "max bounds it");
    cr_assert_eq(ckindex_siblings(ci, "ck/nope.distcp", 0, ch, 4), 0);
    /* A tensor of one chunk (rank 0's plain tensors) has no siblings. */
    int lone = 0;
    struct ckindex_span sp[64];
    int n = ckindex_items(ci, "ck/__0_0.distcp", 0, 1ull << 30, sp, 64);
    for (int i = 0; i < n; i++)
        lone += ckindex_siblings(ci, "ck/__0_0.distcp", sp[i].offset, ch, 4) == 0;
    cr_assert_gt(lone, 0, "some items of rank 0 are not sharded");
    cr_assert_lt(lone, n, "and some are");
}

Test(ckindex, changed_metadata_is_rebuilt)
{
    struct store_stat md = stat_of("ck/.metadata");
    ckindex_notice(ci, "ck", &md);
    wait_settled(1);
    /* A new version (here: the other layout of the same model). */
    replace_metadata();
    struct store_stat md2 = stat_of("ck/.metadata");
    cr_assert_str_neq(md.etag, md2.etag);
    ckindex_notice(ci, "ck", &md2);
    struct ckindex_stats st = wait_settled(1);
    cr_assert_eq(st.built, 2);
}

Test(ckindex, unparsable_metadata_fails_once_per_version)
{
    cr_assert_eq(mem_store_set(ms, "bad/.metadata", "not a pickle", 12, NULL), 0);
    struct store_stat md = stat_of("bad/.metadata");
    ckindex_notice(ci, "bad", &md);
    struct ckindex_stats st = wait_settled(1);
    cr_assert_eq(st.failed, 1);
    cr_assert_eq(st.ready, 0);
    cr_assert_eq(ckindex_is_checkpoint(ci, "bad"), 1);
    uint64_t reads = mem_store_calls(ms, MEM_OP_READ);
    ckindex_notice(ci, "bad", &md);
    cr_assert_eq(mem_store_calls(ms, MEM_OP_READ), reads, "a known bad version is not retried");
    struct ckindex_span sp[1];
    cr_assert_eq(ckindex_items(ci, "bad/x", 0, 0, sp, 1), 0);
}

/* Replaces ck/.metadata with the per_item layout's at the first read of it:
 * after it was noticed (and fingerprinted), before the build reads it. */
static int replaced;
static void replace_on_read(void *arg, const struct mem_call *call)
{
    (void)arg;
    if (call->op != MEM_OP_READ || strcmp(call->path, "ck/.metadata") != 0 || replaced)
        return;
    replaced = 1;
    replace_metadata();
}

/* The mount's stored index (cache_dir/index), read-only, in a read
 * transaction; the caller ends both. */
static void open_stored_index(struct idxdb **db, struct idxdb_txn **t)
{
    char dir[128];
    snprintf(dir, sizeof dir, "%s/index", cache_dir);
    struct idxdb_options o;
    idxdb_options_default(&o);
    o.flags = IDXDB_RDONLY;
    struct ckpt_err e;
    cr_assert_eq(idxdb_open(dir, &o, db, &e), 0, "%s", e.msg);
    cr_assert_eq(idxdb_begin(*db, t, &e), 0);
}

Test(ckindex, metadata_replaced_during_the_build_is_indexed_under_its_own_fingerprint)
{
    struct store_stat md = stat_of("ck/.metadata");
    mem_store_set_hook(ms, replace_on_read, NULL);
    ckindex_notice(ci, "ck", &md);
    struct ckindex_stats st = wait_settled(1);
    mem_store_set_hook(ms, NULL, NULL);
    cr_assert_eq(replaced, 1);
    cr_assert_eq(st.ready, 1);
    struct store_stat now = stat_of("ck/.metadata");
    close_index();

    /* What the index holds is fingerprinted as the version it was built from. */
    char want[IDXDB_FP_MAX];
    store_fingerprint(&now, want, sizeof want);
    struct idxdb *db;
    struct idxdb_txn *t;
    open_stored_index(&db, &t);
    struct idxdb_ckpt c;
    cr_assert_eq(idxdb_ckpt_get(t, "mem://test/ck", &c), 0);
    cr_assert_eq(c.fingerprint_len, strlen(want), "%.*s", (int)c.fingerprint_len, c.fingerprint);
    cr_assert_eq(memcmp(c.fingerprint, want, c.fingerprint_len), 0, "stored %.*s, want %s",
                 (int)c.fingerprint_len, c.fingerprint, want);
    idxdb_end(t);
    idxdb_close(db);
}

/* Store requests of every kind so far. */
static uint64_t store_calls(void)
{
    uint64_t n = 0;
    for (int op = 0; op < MEM_OP_COUNT; op++)
        n += mem_store_calls(ms, (enum mem_op)op);
    return n;
}

static struct store_file_size fixture_files[2];

static void known_fixture_files(void)
{
    fixture_files[0] = (struct store_file_size){"__0_0.distcp", stat_of("ck/__0_0.distcp").size};
    fixture_files[1] = (struct store_file_size){"__1_0.distcp", stat_of("ck/__1_0.distcp").size};
}

Test(ckindex, a_published_metadata_is_indexed_without_store_requests)
{
    size_t len;
    void *bytes = slurp(FIX "/.metadata", &len);
    struct store_stat md = stat_of("ck/.metadata");
    known_fixture_files();
    uint64_t calls = store_calls();
    ckindex_notice_published(ci, "ck", &md, bytes, len, fixture_files, 2);
    free(bytes); /* copied */
    struct ckindex_stats st = wait_settled(1);
    cr_assert_eq(st.ready, 1);
    cr_assert_eq(st.built, 1);
    cr_assert_eq(store_calls(), calls, "the build asked the store");
    struct ckindex_span sp[8];
    cr_assert_eq(ckindex_items(ci, "ck/__0_0.distcp", 500, 0, sp, 8), 1);
    cr_assert_eq(sp[0].offset, 431);
    cr_assert_eq(sp[0].length, 431);
    /* Built under the fingerprint of the store's object: a remount reuses it. */
    close_index();
    open_index();
    ckindex_notice(ci, "ck", &md);
    st = wait_settled(1);
    cr_assert_eq(st.reused, 1);
}

Test(ckindex, a_published_metadata_that_does_not_parse_is_read_from_the_store)
{
    struct store_stat md = stat_of("ck/.metadata");
    known_fixture_files();
    uint64_t reads = mem_store_calls(ms, MEM_OP_READ);
    ckindex_notice_published(ci, "ck", &md, "not a pickle", 12, fixture_files, 2);
    struct ckindex_stats st = wait_settled(1);
    cr_assert_eq(st.ready, 1, "the store's .metadata is good");
    cr_assert_gt(mem_store_calls(ms, MEM_OP_READ), reads);
}

/* Replace ck/.metadata with another version and notice it while the build
 * of the first version looks up its files' sizes (after its read and parse):
 * the second build runs on the other worker and is ready before the first
 * one goes on. */
static int overtaken;
static void replace_and_build_during_sizes(void)
{
    if (overtaken)
        return;
    overtaken = 1;
    replace_metadata();
    struct store_stat md2 = stat_of("ck/.metadata");
    ckindex_notice(ci, "ck", &md2);
    wait_settled(1);
}

Test(ckindex, an_older_build_ending_last_leaves_the_newer_index)
{
    /* The older build used to store its index last, replacing (and so
     * deleting) the newer one that the mount had recorded as ready: loads
     * of the current version then ran without guidance, for good. */
    struct store_stat md = stat_of("ck/.metadata");
    on_known = replace_and_build_during_sizes;
    ckindex_notice(ci, "ck", &md);
    wait_settled(1);
    close_index(); /* both builds have ended */
    on_known = NULL;
    cr_assert_eq(overtaken, 1);
    struct store_stat now = stat_of("ck/.metadata");
    open_index();
    ckindex_notice(ci, "ck", &now);
    struct ckindex_stats st = wait_settled(1);
    cr_assert_eq(st.reused, 1, "the index of the current .metadata was not the one stored");
    struct ckindex_span sp[1];
    cr_assert_gt(ckindex_items(ci, "ck/__0_0.distcp", 0, 0, sp, 1), 0);
}

/* The file records of ck's stored index: present and size by name. */
static void stored_file(const char *name, int *present, uint64_t *size)
{
    struct idxdb *db;
    struct idxdb_txn *t;
    open_stored_index(&db, &t);
    struct idxdb_ckpt c;
    uint32_t file;
    struct idxdb_file f;
    cr_assert_eq(idxdb_ckpt_get(t, "mem://test/ck", &c), 0);
    cr_assert_eq(idxdb_file_find(t, c.id, name, &file), 0, "%s", name);
    cr_assert_eq(idxdb_file_get(t, c.id, file, &f), 0);
    *present = f.present;
    *size = f.size;
    idxdb_end(t);
    idxdb_close(db);
}

/* At 8,192 ranks a checkpoint directory holds ~98k files, ~99 LIST pages: a
 * build that listed it for its files' sizes cost each of 1,024 mounts that.
 * The build takes the files from the .metadata and the sizes the mount
 * knows (its metadata cache), and asks the store for nothing but the GET. */
Test(ckindex, a_build_lists_nothing_and_records_the_sizes_the_mount_knows)
{
    struct store_stat md = stat_of("ck/.metadata");
    known_path = "ck/__0_0.distcp";
    known_size = stat_of(known_path).size;
    uint64_t lists = mem_store_calls(ms, MEM_OP_LIST), stats = mem_store_calls(ms, MEM_OP_STAT);
    ckindex_notice(ci, "ck", &md);
    cr_assert_eq(ckindex_file_count(ci, "ck"), 0, "being built: not counted yet");
    struct ckindex_stats st = wait_settled(1);
    cr_assert_eq(st.ready, 1);
    cr_assert_eq(mem_store_calls(ms, MEM_OP_LIST), lists, "the build listed the directory");
    cr_assert_eq(mem_store_calls(ms, MEM_OP_STAT), stats, "the build sent a HEAD");
    cr_assert_eq(ckindex_file_count(ci, "ck"), 2);
    cr_assert_eq(ckindex_file_count(ci, "elsewhere"), -1);
    close_index();
    int present;
    uint64_t size;
    stored_file("__0_0.distcp", &present, &size);
    cr_assert_eq(present, 1);
    cr_assert_eq(size, known_size);
    stored_file("__1_0.distcp", &present, &size);
    cr_assert_eq(present, -1, "a size the mount does not know is recorded unknown");
    cr_assert_eq(size, CKPT_SIZE_UNKNOWN);
}
