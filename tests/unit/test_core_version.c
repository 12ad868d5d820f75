/*
 * tests/unit/test_core_version.c - an open file keeps the version it opened
 * (fs/core/core.c): while the object is replaced on the store, lookups and
 * listings of its path report the opened size (the kernel keeps one size per
 * path), reads the opened version can no longer serve fail with ESTALE,
 * and the new version shows once the handle is released. Over the in-memory
 * store (S3's semantics: reads are checked against the opened etag).
 */
#include "core.h"
#include "mem_store.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>

static struct mem_store *mem;
static struct core *core;

static void setup(void)
{
    mem = mem_store_new();
    char big[100];
    memset(big, 'o', sizeof big);
    cr_assert_eq(mem_store_set(mem, "d/f", big, sizeof big, NULL), 0);
    struct core_config cfg;
    core_config_defaults(&cfg);
    cfg.cache_size = 16u << 20;
    cfg.attr_timeout = 0; /* every lookup asks the store */
    cr_assert_eq(core_create(mem_store_base(mem), &cfg, &core), 0);
}

static void teardown(void)
{
    core_destroy(core);
    mem_store_free(mem);
}

TestSuite(core_version, .init = setup, .fini = teardown);

static long long size_of(const char *path)
{
    struct stat st;
    int rc = core_getattr(core, path, &st);
    return rc < 0 ? rc : (long long)st.st_size;
}

static long long listed_size;
static int fill(void *arg, const char *name, const struct stat *st)
{
    (void)arg;
    if (strcmp(name, "f") == 0)
        listed_size = (long long)st->st_size;
    return 0;
}

Test(core_version, an_open_file_keeps_its_size_and_fails_stale_reads)
{
    struct core_file *f;
    int keep;
    cr_assert_eq(core_open(core, "/d/f", O_RDONLY, &f, &keep), 0);
    char buf[200];
    cr_assert_eq(mem_store_set(mem, "d/f", "new", 3, NULL), 0);

    cr_assert_eq(size_of("/d/f"), 100, "a lookup while it is open: the opened size");
    struct stat st;
    cr_assert_eq(core_fgetattr(core, f, &st), 0);
    cr_assert_eq(st.st_size, 100);
    listed_size = -1;
    cr_assert_eq(core_readdir(core, "/d", fill, NULL), 0);
    cr_assert_eq(listed_size, 100, "a listing while it is open: the opened size");
    /* Bytes of the opened version (none cached) the store no longer has:
     * ESTALE, not EOF. */
    cr_assert_eq(core_read(core, f, buf, 50, 50), -ESTALE);

    /* A new open sees the new version, and so does the path while it is the
     * newest open; once it is closed the older open's size shows again. */
    struct core_file *g;
    cr_assert_eq(core_open(core, "/d/f", O_RDONLY, &g, &keep), 0);
    cr_assert_eq(core_read(core, g, buf, sizeof buf, 0), 3);
    cr_assert_eq(size_of("/d/f"), 3, "the newest open has the store's version");
    core_release(core, g);
    cr_assert_eq(size_of("/d/f"), 100);

    core_release(core, f);
    cr_assert_eq(size_of("/d/f"), 3, "closed: the store's version shows");
    listed_size = -1;
    cr_assert_eq(core_readdir(core, "/d", fill, NULL), 0);
    cr_assert_eq(listed_size, 3);
}
