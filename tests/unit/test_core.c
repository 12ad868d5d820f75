/* tests/unit/test_core.c - the FUSE-free core: attributes, listing, reads,
 * the read-only refusal, and an unmount that comes before the kernel's
 * RELEASE of an open file (the core must free it). Every test runs twice:
 * over a local directory store (reads straight from its fds) and over the
 * in-memory test store (mem_store.h: no fds, reads through the block cache,
 * as on S3). */
#include "core.h"
#include "mem_store.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char root[] = "/tmp/ckptfs-test-core-XXXXXX";
static struct mem_store *mem;
static struct store *store;
static struct core *core;

static void start_core(void)
{
    struct core_config cfg;
    core_config_defaults(&cfg);
    cfg.cache_size = 64u << 20;
    cr_assert_eq(core_create(store, &cfg, &core), 0);
}

static void setup_dir(void)
{
    mem = NULL;
    cr_assert_not_null(mkdtemp(root));
    write_text(root, "a", "hello core");
    char err[256];
    cr_assert_eq(store_dir_open(root, &store, err, sizeof err), 0, "%s", err);
    start_core();
}

static void setup_mem(void)
{
    mem = mem_store_new();
    cr_assert_eq(mem_store_set(mem, "a", "hello core", 10, NULL), 0);
    store = mem_store_base(mem);
    start_core();
}

static void teardown(void)
{
    core_destroy(core);
    store_destroy(store);
    if (!mem) {
        char path[512];
        snprintf(path, sizeof path, "%s/a", root);
        unlink(path);
        rmdir(root);
    }
}

TestSuite(core_dir, .init = setup_dir, .fini = teardown);
TestSuite(core_mem, .init = setup_mem, .fini = teardown);

/* Each test body once per suite. */
#define CORE_TEST(name)                                                                            \
    static void name(void);                                                                        \
    Test(core_dir, name)                                                                           \
    {                                                                                              \
        name();                                                                                    \
    }                                                                                              \
    Test(core_mem, name)                                                                           \
    {                                                                                              \
        name();                                                                                    \
    }                                                                                              \
    static void name(void)

CORE_TEST(getattr_and_read)
{
    struct stat st;
    cr_assert_eq(core_getattr(core, "/a", &st), 0);
    cr_assert_eq(st.st_size, 10);
    cr_assert_eq(core_getattr(core, "/missing", &st), -ENOENT);
    struct core_file *f;
    int keep = 0;
    cr_assert_eq(core_open(core, "/a", O_RDONLY, &f, &keep), 0);
    char buf[32] = {0};
    cr_assert_eq(core_read(core, f, buf, sizeof buf, 6), 4);
    cr_assert_str_eq(buf, "core");
    core_release(core, f);
}

CORE_TEST(refuses_writes)
{
    struct core_file *f;
    int keep = 0;
    cr_assert_eq(core_open(core, "/a", O_WRONLY, &f, &keep), -EROFS);
    cr_assert_eq(core_open(core, "/a", O_RDWR, &f, &keep), -EROFS);
}

/* A signal can end the FUSE loop between a close() and its RELEASE: the
 * handles still open are freed by core_destroy (LeakSanitizer checks). */
CORE_TEST(destroy_frees_unreleased_handles)
{
    struct core_file *f1, *f2, *f3;
    int keep = 0;
    cr_assert_eq(core_open(core, "/a", O_RDONLY, &f1, &keep), 0);
    cr_assert_eq(core_open(core, "/a", O_RDONLY, &f2, &keep), 0);
    cr_assert_eq(core_open(core, "/a", O_RDONLY, &f3, &keep), 0);
    core_release(core, f2); /* the middle of the list */
    char stats[2048];
    core_stats_json(core, stats, sizeof stats);
    cr_assert_not_null(strstr(stats, "\"open_files\": 2"), "%s", stats);
}
