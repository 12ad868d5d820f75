/*
 * tests/unit/test_commit_hf.c - the commit rule of the Hugging Face layout
 * (docs/semantics.md §6) on the stage with the in-memory store: a
 * model.safetensors.index.json written by torch 2.14's
 * HuggingFaceStorageWriter (tests/fixtures/torch2/t2.14/hf) is published
 * only once every .safetensors its weight_map names is on the store,
 * whichever node wrote it; one that cannot be parsed waits for this
 * mount's files only. The real save through a mount is
 * tests/integration/test_torch2_formats.py::test_hf_index_json_published_last.
 */
#include "stage_fixture.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>
#include <time.h>

#define HF CKPTFS_TORCH2_FIXTURES "/t2.14/hf"

TestSuite(commit_hf, .init = stage_setup, .fini = stage_teardown, .timeout = 60);

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* HF fixture file name at key: staged through the stage, or put on the store. */
static void put_hf(const char *name, const char *key, int staged)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", HF, name);
    size_t n;
    char *b = slurp(path, &n);
    cr_assert(b, "%s", path);
    if (staged)
        write_whole(key, (unsigned char *)b, n, 4096);
    else
        mem_store_set(mem, key, b, n, NULL);
    free(b);
}

Test(commit_hf, is_a_commit_name)
{
    cr_assert(is_commit_name("model.safetensors.index.json"));
    cr_assert(is_commit_name("diffusion_pytorch_model.safetensors.index.json"));
    cr_assert(is_commit_name("__3.metadata"));
    cr_assert_not(is_commit_name(".safetensors.index.json"));
    cr_assert_not(is_commit_name("model.safetensors"));
    cr_assert_not(is_commit_name("model.safetensors.index.json.tmp"));
    cr_assert_not(is_commit_name("config.json"));
}

Test(commit_hf, index_json_waits_for_every_shard_it_names)
{
    stage_close(st);
    cfg.fsync_remote = 0; /* staged: the index json waits on the store for its shards */
    open_stage();
    put_hf("model-00001-of-00002.safetensors", "hf/model-00001-of-00002.safetensors", 0);
    uint64_t lists = mem_store_calls(mem, MEM_OP_LIST) + mem_store_calls(mem, MEM_OP_STAT);
    put_hf("model.safetensors.index.json", "hf/model.safetensors.index.json", 1);
    /* checked at least twice, and never published without model-00002 */
    double t0 = now_s();
    while (mem_store_calls(mem, MEM_OP_LIST) + mem_store_calls(mem, MEM_OP_STAT) < lists + 3 &&
           !stored("hf/model.safetensors.index.json") && now_s() - t0 < 10)
        usleep(1000);
    cr_assert_not(stored("hf/model.safetensors.index.json"), "published before its shards");
    struct stage_stats s;
    stage_get_stats(st, &s);
    cr_assert_geq(s.pending_files, 1, "the index json is not waiting");
    put_hf("model-00002-of-00002.safetensors", "hf/model-00002-of-00002.safetensors", 0);
    cr_assert_eq(stage_sync(st, ""), 0);
    cr_assert(stored("hf/model.safetensors.index.json"));
}

Test(commit_hf, index_json_naming_a_missing_shard_times_out)
{
    stage_close(st);
    cfg.commit_timeout = 0.5;
    open_stage();
    put_hf("model-00001-of-00002.safetensors", "hf/model-00001-of-00002.safetensors", 0);
    char path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", HF);
    size_t n;
    char *b = slurp(path, &n);
    /* the close returns (nobody here writes the missing shard); the sync fails */
    write_closing("hf/model.safetensors.index.json", (unsigned char *)b, n, 4096, 0);
    free(b);
    cr_assert_eq(stage_sync(st, ""), -EIO);
    cr_assert_not(stored("hf/model.safetensors.index.json"), "published anyway");
}

Test(commit_hf, unparsable_index_json_waits_for_this_mounts_files_only)
{
    stage_close(st);
    cfg.fsync_remote = 0;
    open_stage();
    static const char bad[] = "{\"weight_map\": {\"a\": \"../x.safetensors\"}}";
    write_whole("hf/model.safetensors.index.json", (const unsigned char *)bad, sizeof bad - 1,
                4096);
    cr_assert_eq(stage_sync(st, ""), 0);
    cr_assert(stored("hf/model.safetensors.index.json"));
}
