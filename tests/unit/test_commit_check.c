/*
 * tests/unit/test_commit_check.c - what the commit check of a staged
 * .metadata asks the store while it waits for other nodes' shards: its
 * first check lists the checkpoint directory, and each later one asks only
 * for what it has not found yet (design.md, "Request budget"), so a long
 * wait costs what is missing, not what the checkpoint holds times the polls.
 */
#include "stage_fixture.h"

#include <criterion/criterion.h>
#include <stdatomic.h>
#include <string.h>

TestSuite(commit_check, .init = stage_setup, .fini = stage_teardown, .timeout = 60);

/* The store calls made for ck/: listings, and stats by name. */
struct asked {
    atomic_int lists;    /* listings of ck */
    atomic_int stats;    /* stats of a file below ck/ */
    atomic_int stat_hit; /* stats of a file the store already held */
};

static const char *missing[] = {"ck/__0_1.distcp", "ck/__1_1.distcp"};

static int is_missing(const char *path)
{
    for (size_t i = 0; i < sizeof missing / sizeof *missing; i++)
        if (strcmp(path, missing[i]) == 0)
            return 1;
    return 0;
}

static void count_asks(void *arg, const struct mem_call *c)
{
    struct asked *a = arg;
    if (c->op == MEM_OP_LIST && strcmp(c->path, "ck") == 0)
        atomic_fetch_add(&a->lists, 1);
    if (c->op == MEM_OP_STAT && strncmp(c->path, "ck/", 3) == 0 &&
        strcmp(c->path, "ck/.metadata") != 0) {
        atomic_fetch_add(&a->stats, 1);
        if (!is_missing(c->path))
            atomic_fetch_add(&a->stat_hit, 1);
    }
}

Test(commit_check, later_checks_ask_only_for_the_files_still_missing)
{
    stage_close(st);
    cfg.fsync_remote = 0; /* staged: the .metadata waits on the store for its shards */
    open_stage();
    store_shards_except(NULL); /* another node's shards: all but two are on the store */
    for (size_t i = 0; i < sizeof missing / sizeof *missing; i++)
        cr_assert_eq(mem_store_base(mem)->ops->remove(mem_store_base(mem), missing[i]), 0);
    struct asked a = {0};
    mem_store_set_hook(mem, count_asks, &a);
    put_fixture(".metadata", "ck/.metadata", 1);
    for (int i = 0; i < 300 && atomic_load(&a.stats) < 6; i++) /* three later checks */
        usleep(10000);
    cr_assert_geq(atomic_load(&a.stats), 6, "the check was not repeated (%d stats)",
                  atomic_load(&a.stats));
    cr_assert_not(stored("ck/.metadata"), "published before its shards");
    for (size_t i = 0; i < sizeof missing / sizeof *missing; i++) /* they land */
        put_fixture(missing[i] + 3, missing[i], 0);
    cr_assert_eq(stage_sync(st, ""), 0);
    mem_store_set_hook(mem, NULL, NULL);
    cr_assert(stored("ck/.metadata"));
    cr_assert_eq(atomic_load(&a.lists), 1, "the directory was listed %d times, not once",
                 atomic_load(&a.lists));
    cr_assert_eq(atomic_load(&a.stat_hit), 0, "%d stats of shards already found",
                 atomic_load(&a.stat_hit));
}
