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

/* ---- every format ckpt_load reads: per-rank __R.metadata, Hugging Face ---- */

#define T2 CKPTFS_TORCH2_FIXTURES "/t2.14"

/* Copies fixture file T2/fix/name into the store as dir/name. */
static void put_torch2(const char *fix, const char *name, const char *dir)
{
    char src[512], dst[256];
    snprintf(src, sizeof src, "%s/%s/%s", T2, fix, name);
    snprintf(dst, sizeof dst, "%s/%s", dir, name);
    size_t n;
    void *b = slurp(src, &n);
    cr_assert_eq(mem_store_set(ms, dst, b, n, NULL), 0);
    free(b);
}

/* A listing of dir that saw names[0..n) (with their attributes on the store).
 * Returns the store requests made so far (the test's own stats included). */
static uint64_t list_and_notice(const char *dir, const char *const *names, size_t n)
{
    struct ckindex_scan sc = {0};
    for (size_t i = 0; i < n; i++) {
        char p[256];
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        struct store_stat st = stat_of(p);
        ckindex_scan_add(&sc, names[i], &st);
    }
    ckindex_scan_add(&sc, "sub", &(struct store_stat){.is_dir = 1});
    uint64_t calls = store_calls();
    ckindex_scan_end(ci, dir, &sc, 1);
    cr_assert_null(sc.files);
    return calls;
}

static const char *const per_rank_names[] = {"__0.metadata", "__0_0.distcp", "__1.metadata",
                                             "__1_0.distcp"};

static void put_per_rank(void)
{
    for (size_t i = 0; i < 4; i++)
        put_torch2("per_rank_meta", per_rank_names[i], "pr");
}

Test(ckindex, pick_follows_the_detection_of_ckpt_load)
{
    struct ckindex_meta f[] = {{"__1.metadata", {0}},  {"model.safetensors.index.json", {0}},
                               {"__0_0.distcp", {0}},  {"__0.metadata", {0}},
                               {"a.safetensors", {0}}, {".metadata", {0}}};
    size_t pick[6];
    cr_assert_eq(ckindex_pick(f, 6, pick), 1, ".metadata alone");
    cr_assert_eq(pick[0], 5);
    cr_assert_eq(ckindex_pick(f, 5, pick), 2, "every __R.metadata");
    cr_assert_eq(pick[0], 0);
    cr_assert_eq(pick[1], 3);
    cr_assert_eq(ckindex_pick(f + 1, 2, pick), 1, "an index json");
    struct ckindex_meta hf[] = {{"config.json", {0}},
                                {"model-1.safetensors", {0}},
                                {"model.safetensors.index.json", {0}},
                                {"model-2.safetensors", {0}}};
    cr_assert_eq(ckindex_pick(hf, 4, pick), 3, "the index json and every shard");
    cr_assert_eq(pick[0], 1);
    cr_assert_eq(pick[2], 3);
    cr_assert_eq(ckindex_pick(hf + 3, 1, pick), 1, "bare shards");
    cr_assert_eq(ckindex_pick(hf, 1, pick), 0, "no checkpoint");
    cr_assert_eq(ckindex_pick(f + 2, 1, pick), 0, "a shard file alone is none");
    cr_assert_eq(ckindex_metadata_name("__12.metadata"), 1);
    cr_assert_eq(ckindex_metadata_name("__1_0.metadata"), 0);
    cr_assert_eq(ckindex_metadata_name("x.safetensors.index.json"), 0, "ckpt_load reads one name");
}

static void fp_of(const struct ckindex_meta *f, size_t n, char *out)
{
    ckindex_fingerprint(f, n, out, IDXDB_FP_MAX);
}

Test(ckindex, the_fingerprint_covers_every_file_in_name_order)
{
    struct ckindex_meta f[3] = {{"__0.metadata", {.size = 100, .etag = "\"a\""}},
                                {"__1.metadata", {.size = 100, .etag = "\"b\""}},
                                {"__2.metadata", {.size = 100, .etag = "\"c\""}}};
    char base[IDXDB_FP_MAX], fp[IDXDB_FP_MAX];
    fp_of(f, 3, base);
    struct ckindex_meta swapped[3] = {f[2], f[0], f[1]};
    fp_of(swapped, 3, fp);
    cr_assert_str_eq(fp, base, "the order files come in does not count");
    for (int i = 0; i < 3; i++) { /* each file's ETag, size and name count */
        struct ckindex_meta g[3] = {f[0], f[1], f[2]};
        snprintf(g[i].st.etag, sizeof g[i].st.etag, "\"z\"");
        fp_of(g, 3, fp);
        cr_assert_str_neq(fp, base, "ETag of file %d", i);
        g[i] = f[i];
        g[i].st.size = 101;
        fp_of(g, 3, fp);
        cr_assert_str_neq(fp, base, "size of file %d", i);
        g[i] = f[i];
        g[i].name = "__7.metadata";
        fp_of(g, 3, fp);
        cr_assert_str_neq(fp, base, "name of file %d", i);
    }
    fp_of(f, 2, fp);
    cr_assert_str_neq(fp, base, "a file fewer");
    /* Fields run into each other nowhere: "a" + "bc" is not "ab" + "c". */
    struct ckindex_meta x = {"__0.metadata", {.size = 1, .etag = "12"}};
    struct ckindex_meta y = {"__0.metadata", {.size = 21, .etag = "1"}};
    char fx[IDXDB_FP_MAX];
    fp_of(&x, 1, fx);
    fp_of(&y, 1, fp);
    cr_assert_str_neq(fx, fp);
    /* A .metadata alone: the form ckptfs-admin records (store_fingerprint). */
    struct ckindex_meta md = {".metadata", {.size = 5, .etag = "\"e\""}};
    char want[IDXDB_FP_MAX];
    store_fingerprint(&md.st, want, sizeof want);
    fp_of(&md, 1, fp);
    cr_assert_str_eq(fp, want);
    cr_assert_lt(strlen(base), IDXDB_FP_MAX);
}

Test(ckindex, a_per_rank_checkpoint_is_built_from_its_rank_metadata_alone)
{
    put_per_rank();
    uint64_t reads = mem_store_calls(ms, MEM_OP_READ);
    uint64_t calls = list_and_notice("pr", per_rank_names, 4);
    cr_assert_eq(ckindex_is_checkpoint(ci, "pr"), 1);
    struct ckindex_stats st = wait_settled(1);
    cr_assert_eq(st.built, 1);
    cr_assert_eq(st.failed, 0);
    cr_assert_eq(mem_store_calls(ms, MEM_OP_READ) - reads, 2, "one GET per __R.metadata");
    cr_assert_eq(store_calls() - calls, 2, "nothing else");
    cr_assert_eq(ckindex_file_count(ci, "pr"), 2);
    struct ckindex_span sp[4];
    cr_assert_eq(ckindex_items(ci, "pr/__1_0.distcp", 0, 0, sp, 4), 1, "rank 1's items too");
    /* The same files listed again: nothing new; a remount reuses the index. */
    list_and_notice("pr", per_rank_names, 4);
    close_index();
    open_index();
    list_and_notice("pr", per_rank_names, 4);
    st = wait_settled(1);
    cr_assert_eq(st.reused, 1);
    cr_assert_eq(st.built, 0);
}

Test(ckindex, a_changed_rank_metadata_rebuilds_the_index)
{
    put_per_rank();
    list_and_notice("pr", per_rank_names, 4);
    wait_settled(1);
    /* __1.metadata gets other bytes (rank 0's: valid, merged to the same items). */
    size_t n;
    void *b = slurp(T2 "/per_rank_meta/__0.metadata", &n);
    cr_assert_eq(mem_store_set(ms, "pr/__1.metadata", b, n, NULL), 0);
    free(b);
    list_and_notice("pr", per_rank_names, 4);
    struct ckindex_stats st;
    for (int i = 0; i < 1000; i++) {
        ckindex_get_stats(ci, &st);
        if (st.built + st.failed >= 2 && st.ready == 1)
            break;
        nanosleep(&(struct timespec){0, 10000000}, NULL);
    }
    cr_assert_eq(st.built, 2, "a new __1.metadata is a new version");
    cr_assert_eq(st.failed, 0);
}

Test(ckindex, rank_metadata_published_here_join_the_set)
{
    put_per_rank();
    struct store_stat r0 = stat_of("pr/__0.metadata"), r1 = stat_of("pr/__1.metadata");
    ckindex_notice_file(ci, "pr", "__0.metadata", &r0);
    wait_settled(1);
    cr_assert_eq(ckindex_file_count(ci, "pr"), 1, "rank 0 alone names its file");
    ckindex_notice_file(ci, "pr", "__1.metadata", &r1);
    struct ckindex_stats st;
    for (int i = 0; i < 1000 && ckindex_file_count(ci, "pr") != 2; i++)
        nanosleep(&(struct timespec){0, 10000000}, NULL);
    cr_assert_eq(ckindex_file_count(ci, "pr"), 2, "both ranks' files");
    /* What a listing then finds is the same set: the same version. */
    list_and_notice("pr", per_rank_names, 4);
    ckindex_get_stats(ci, &st);
    cr_assert_eq(st.built, 2);
    cr_assert_eq(st.ready, 1);
}

Test(ckindex, hugging_face_shards_are_built_from_their_headers)
{
    const char *names[] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                           "model.safetensors.index.json"};
    for (size_t i = 0; i < 3; i++) {
        put_torch2("hf", names[i], "hf");
        if (i < 2)
            put_torch2("hf", names[i], "bare");
    }
    uint64_t calls = list_and_notice("hf", names, 3);
    wait_settled(1);
    cr_assert_eq(store_calls() - calls, 3, "index json + a GET per header, nothing else");
    calls = list_and_notice("bare", names, 2); /* no index json */
    struct ckindex_stats st = wait_settled(2);
    cr_assert_eq(st.built, 2);
    cr_assert_eq(st.failed, 0);
    /* + the stat that finds no index json (a mount knows that from its listing) */
    cr_assert_eq(store_calls() - calls, 3, "a GET per header, nothing else: %llu",
                 (unsigned long long)(store_calls() - calls));
    cr_assert_eq(mem_store_calls(ms, MEM_OP_LIST), 0);
    cr_assert_eq(ckindex_file_count(ci, "hf"), 2);
    cr_assert_eq(ckindex_file_count(ci, "bare"), 2);
    struct ckindex_span sp[2];
    cr_assert_eq(ckindex_items(ci, "bare/model-00001-of-00002.safetensors", 9000, 0, sp, 2), 1);
}

Test(ckindex, a_cut_listing_notices_a_metadata_only)
{
    put_per_rank();
    struct ckindex_scan sc = {0};
    struct store_stat st = stat_of("pr/__0.metadata");
    ckindex_scan_add(&sc, "__0.metadata", &st);
    ckindex_scan_end(ci, "pr", &sc, 0);
    cr_assert_eq(ckindex_is_checkpoint(ci, "pr"), 0, "other ranks may follow");
    st = stat_of("ck/.metadata");
    ckindex_scan_add(&sc, ".metadata", &st);
    ckindex_scan_end(ci, "ck", &sc, 0);
    cr_assert_eq(ckindex_is_checkpoint(ci, "ck"), 1);
}
