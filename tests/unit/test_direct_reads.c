/*
 * tests/unit/test_direct_reads.c - which open handles bypass the kernel's
 * page cache (core_file_direct_reads, fs/core/files.c): read-only handles of
 * a checkpoint's *.distcp read through the block cache, so that the kernel's
 * readahead does not fetch past what a partial load wants; by default
 * (--direct-reads sharded) all but files of whole tensors or bytes items
 * every rank reads that are long next to the kernel's readahead (16 windows:
 * there a window past a partial load's last item is little); nothing else.
 */
#include "core.h"
#include "mem_store.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdlib.h>

static char dir[] = "/tmp/ckptfs-test-direct-XXXXXX";
static struct mem_store *mem;
static struct core *core;

/* A core with an index over an in-memory store holding a torch 1.13
 * checkpoint's .metadata in ck/ (one item per file: __0_0 a chunk of the
 * sharded model.embed.weight, __0_3 the whole model.layers.0.norm.weight,
 * __0_8 the bytes item optim.step), those data files next to it and one of
 * the names in plain/ (no .metadata: not a checkpoint). */
static int direct_reads_option = CORE_DIRECT_READS_SHARDED; /* the default */
static uint32_t kernel_readahead;                           /* 0: the default */

static void setup(void)
{
    cr_assert_not_null(mkdtemp(dir));
    mem = mem_store_new();
    size_t n;
    char *meta = slurp(CKPTFS_FIXTURES "/dcp-torch1.13/per_item/.metadata", &n);
    cr_assert_eq(mem_store_set(mem, "ck/.metadata", meta, n, NULL), 0);
    free(meta);
    const char *files[] = {"ck/__0_0.distcp", "ck/__0_3.distcp", "ck/__0_8.distcp", "ck/notes.txt",
                           "plain/__0_0.distcp"};
    for (int i = 0; i < 5; i++)
        cr_assert_eq(mem_store_set(mem, files[i], "0123456789", 10, NULL), 0);
    struct core_config cfg;
    core_config_defaults(&cfg);
    cfg.cache_size = 16u << 20;
    cfg.cache_dir = dir;
    cr_assert_eq(cfg.direct_reads, CORE_DIRECT_READS_SHARDED, "the default");
    cfg.direct_reads = direct_reads_option;
    if (kernel_readahead)
        cfg.kernel_readahead = kernel_readahead;
    cr_assert_eq(core_create(mem_store_base(mem), &cfg, &core), 0);
}

static void teardown(void)
{
    core_destroy(core);
    mem_store_free(mem);
    rm_tree(dir);
}

TestSuite(direct_reads, .init = setup, .fini = teardown);

/* core_file_direct_reads of a handle of path opened with flags. */
static int direct(const char *path, int flags)
{
    struct core_file *f;
    int keep;
    cr_assert_eq(core_open(core, path, flags, &f, &keep), 0, "open %s", path);
    int d = core_file_direct_reads(core, f);
    core_release(core, f);
    return d;
}

/* a load opens .metadata first: that makes ck a checkpoint directory */
static void open_metadata(void)
{
    struct core_file *md;
    int keep;
    cr_assert_eq(core_open(core, "/ck/.metadata", O_RDONLY, &md, &keep), 0);
    cr_assert_eq(core_file_direct_reads(core, md), 0, ".metadata is read through the page cache");
    core_release(core, md);
}

Test(direct_reads, sharded_data_files_read_only)
{
    open_metadata();
    cr_assert_eq(direct("/ck/__0_0.distcp", O_RDONLY), 1, "a chunk of a sharded tensor");
    cr_assert_eq(direct("/ck/__0_3.distcp", O_RDONLY), 1, "a small whole tensor (1259 bytes)");
    cr_assert_eq(direct("/ck/__0_8.distcp", O_RDONLY), 1, "a small bytes item (431 bytes)");
    cr_assert_eq(direct("/ck/notes.txt", O_RDONLY), 0, "another file of the checkpoint");
    cr_assert_eq(direct("/plain/__0_0.distcp", O_RDONLY), 0, "not in a checkpoint directory");
    cr_assert_eq(direct("/ck/__0_0.distcp", O_RDWR), 0, "a handle that may write");
}

static void setup_long_items(void)
{
    kernel_readahead = 64; /* 16 windows: 1 KiB; whole items longer keep the page cache */
    setup();
}

static void teardown_long_items(void)
{
    teardown();
    kernel_readahead = 0;
}

TestSuite(direct_reads_long, .init = setup_long_items, .fini = teardown_long_items);

/* A whole tensor every rank reads, 16 kernel readahead windows long or more,
 * keeps the page cache (shared by the ranks); a shorter one is read direct. */
Test(direct_reads_long, whole_items_of_16_windows_keep_the_page_cache)
{
    open_metadata();
    cr_assert_eq(direct("/ck/__0_0.distcp", O_RDONLY), 1, "a chunk of a sharded tensor");
    cr_assert_eq(direct("/ck/__0_3.distcp", O_RDONLY), 0, "a whole tensor of 1259 bytes >= 1 KiB");
    cr_assert_eq(direct("/ck/__0_8.distcp", O_RDONLY), 1, "a bytes item of 431 bytes < 1 KiB");
}

static void setup_all(void)
{
    direct_reads_option = CORE_DIRECT_READS_ALL;
    setup();
}

TestSuite(direct_reads_all, .init = setup_all, .fini = teardown);

/* --direct-reads all: every data file of the checkpoint, shared items or not */
Test(direct_reads_all, every_data_file)
{
    open_metadata();
    cr_assert_eq(direct("/ck/__0_0.distcp", O_RDONLY), 1);
    cr_assert_eq(direct("/ck/__0_3.distcp", O_RDONLY), 1);
    cr_assert_eq(direct("/ck/__0_8.distcp", O_RDONLY), 1);
    cr_assert_eq(direct("/ck/notes.txt", O_RDONLY), 0);
    cr_assert_eq(direct("/plain/__0_0.distcp", O_RDONLY), 0);
    cr_assert_eq(direct("/ck/__0_0.distcp", O_RDWR), 0);
}

static void setup_none(void)
{
    direct_reads_option = CORE_DIRECT_READS_NONE;
    setup();
}

TestSuite(direct_reads_none, .init = setup_none, .fini = teardown);

/* --direct-reads none: every handle uses the page cache */
Test(direct_reads_none, nothing_is_direct)
{
    open_metadata();
    cr_assert_eq(direct("/ck/__0_0.distcp", O_RDONLY), 0);
    cr_assert_eq(direct("/ck/__0_3.distcp", O_RDONLY), 0);
}
