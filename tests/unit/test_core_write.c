/* tests/unit/test_core_write.c - the core's write calls (core_write.c) over
 * the in-memory store, without FUSE: read-your-writes, what reaches the store
 * and when, renames of staged and stored files, unlink, mkdir markers,
 * changing an existing object, truncate, and lookups answered by one listing
 * instead of a request per name. */
#include "core.h"
#include "mem_store.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static char cache[] = "/tmp/ckptfs-test-core-write-XXXXXX";
static struct mem_store *mem;
static struct core *core;

static void setup(void)
{
    cr_assert_not_null(mkdtemp(cache));
    mem = mem_store_new();
    mem_store_set_min_part(mem, 0);
    cr_assert_eq(mem_store_set(mem, "stored/obj", "0123456789", 10, NULL), 0);
    struct core_config cfg;
    core_config_defaults(&cfg);
    cfg.cache_size = 64u << 20;
    cfg.cache_dir = cache;
    cfg.stage.part_size = 64 * 1024;
    cfg.stage.upload_workers = 2;
    cr_assert_eq(core_create(mem_store_base(mem), &cfg, &core), 0);
    cr_assert(core_writable(core));
}

static void teardown(void)
{
    core_destroy(core);
    mem_store_free(mem);
    rm_tree(cache);
}

TestSuite(core_write, .init = setup, .fini = teardown, .timeout = 30);

static void write_all(const char *path, const char *text)
{
    struct core_file *f;
    cr_assert_eq(core_create_file(core, path, O_WRONLY, &f), 0);
    size_t n = strlen(text);
    cr_assert_eq(core_write(core, f, text, n, 0), (ssize_t)n);
    cr_assert_eq(core_flush(core, f, 0), 0);
    core_release(core, f);
}

static int stored_is(const char *path, const char *want)
{
    size_t len;
    char *got = mem_store_get(mem, path, &len);
    int same = got && len == strlen(want) && memcmp(got, want, len) == 0;
    free(got);
    return same;
}

static int has_name(void *arg, const char *name, const struct stat *st)
{
    (void)st;
    const char **want = arg;
    if (strcmp(name, want[0]) == 0)
        want[1] = "seen";
    return 0;
}

static int listed(const char *dir, const char *name)
{
    const char *want[2] = {name, NULL};
    cr_assert_eq(core_readdir(core, dir, has_name, want), 0);
    return want[1] != NULL;
}

Test(core_write, read_your_writes_then_published)
{
    mem_store_delay(mem, MEM_OP_PUT, 200000); /* the upload lags behind */
    cr_assert_eq(core_mkdir(core, "/d"), 0);
    struct core_file *f;
    cr_assert_eq(core_create_file(core, "/d/x", O_RDWR, &f), 0);
    cr_assert_eq(core_write(core, f, "abcdef", 6, 0), 6);
    struct stat st;
    cr_assert_eq(core_getattr(core, "/d/x", &st), 0);
    cr_assert_eq(st.st_size, 6);
    cr_assert(listed("/d", "x"), "a file being written is listed at once");
    char buf[16] = {0};
    cr_assert_eq(core_read(core, f, buf, sizeof buf, 2), 4);
    cr_assert_str_eq(buf, "cdef");
    cr_assert_eq(core_flush(core, f, 0), 0);
    core_release(core, f);
    cr_assert(!stored_is("d/x", "abcdef"), "published before its upload could finish");
    cr_assert_eq(core_sync(core, "/"), 0);
    cr_assert(stored_is("d/x", "abcdef"));
    cr_assert(listed("/d", "x"));
}

/* The store has path with any content, within about a second (uploads are
 * not held back in remote mode). */
static int appears_soon(const char *path)
{
    for (int i = 0; i < 100; i++) {
        size_t len;
        char *got = mem_store_get(mem, path, &len);
        free(got);
        if (got)
            return 1;
        usleep(10000);
    }
    return 0;
}

static void *flush_from_another_thread(void *f)
{
    cr_assert_eq(core_flush(core, f, (pid_t)syscall(SYS_gettid)), 0);
    return NULL;
}

Test(core_write, a_close_by_another_process_than_the_opener_seals_nothing)
{
    /* FUSE sends a flush for every close(2), also a forked child's close of
     * a descriptor it inherited (a DataLoader worker exiting, say) while
     * the parent is still writing: that must not publish half a file. */
    struct core_file *f;
    cr_assert_eq(core_create_file(core, "/half", O_WRONLY, &f), 0);
    core_file_set_opener(f, getpid()); /* this process's main thread */
    cr_assert_eq(core_write(core, f, "first ", 6, 0), 6);
    cr_assert_eq(core_flush(core, f, getppid()), 0);
    cr_assert(!appears_soon("half"), "a child's close published a half-written file");
    cr_assert_eq(core_write(core, f, "second", 6, 6), 6);
    cr_assert_eq(core_flush(core, f, getpid()), 0);
    cr_assert_eq(core_sync(core, "/"), 0);
    cr_assert(stored_is("half", "first second"));
    core_release(core, f);

    /* Another process's close, then the last close (release): that seals. */
    cr_assert_eq(core_create_file(core, "/late", O_WRONLY, &f), 0);
    core_file_set_opener(f, getpid()); /* this process's main thread */
    cr_assert_eq(core_write(core, f, "by the child", 12, 0), 12);
    cr_assert_eq(core_flush(core, f, getppid()), 0);
    core_release(core, f);
    cr_assert(appears_soon("late"), "the last close did not seal");
    cr_assert_eq(core_sync(core, "/"), 0);
    cr_assert(stored_is("late", "by the child"));

    /* Another thread of the opener's process closes: that is the opener's close. */
    cr_assert_eq(core_create_file(core, "/threaded", O_WRONLY, &f), 0);
    core_file_set_opener(f, getpid());
    cr_assert_eq(core_write(core, f, "a thread", 8, 0), 8);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, flush_from_another_thread, f), 0);
    cr_assert_eq(pthread_join(t, NULL), 0);
    cr_assert(appears_soon("threaded"), "a close by the opener's other thread did not seal");
    core_release(core, f);
}

Test(core_write, a_rewrite_shows_its_size_while_an_older_reader_is_open)
{
    /* On a local disk every new reader sees a rewrite at once; an open
     * handle of the replaced version must not hold the path's size back
     * (the kernel would cut new readers' reads at it). */
    struct core_file *old;
    int keep;
    cr_assert_eq(core_open(core, "/stored/obj", O_RDONLY, &old, &keep), 0);
    write_all("/stored/obj", "a longer content than the old one");
    cr_assert_eq(core_sync(core, "/"), 0);
    cr_assert(stored_is("stored/obj", "a longer content than the old one"));
    struct stat st;
    cr_assert_eq(core_getattr(core, "/stored/obj", &st), 0);
    cr_assert_eq(st.st_size, 33, "the path shows the replaced version's size (%lld)",
                 (long long)st.st_size);
    core_release(core, old);
}

Test(core_write, renaming_a_staged_file_publishes_only_the_new_name)
{
    write_all("/tmp1.tmp", "payload"); /* *.tmp: held until renamed */
    cr_assert_eq(core_rename(core, "/tmp1.tmp", "/final", 0), 0);
    struct stat st;
    cr_assert_eq(core_getattr(core, "/tmp1.tmp", &st), -ENOENT);
    cr_assert_eq(core_sync(core, "/"), 0);
    cr_assert(stored_is("final", "payload"));
    size_t len;
    void *old = mem_store_get(mem, "tmp1.tmp", &len);
    cr_assert_null(old);
    cr_assert_eq(mem_store_calls(mem, MEM_OP_COPY), 0);
    cr_assert_eq(core_rename(core, "/final", "/final2", RENAME_NOREPLACE), 0);
    write_all("/other", "o");
    cr_assert_eq(core_rename(core, "/final2", "/other", RENAME_NOREPLACE), -EEXIST);
    cr_assert_eq(core_rename(core, "/final2", "/other", RENAME_EXCHANGE), -EINVAL);
}

/* semantics.md §6: a staged file renamed onto a stored object replaces it,
 * and renamed away again takes it along: the old object does not come back
 * (the model-based test's first find). */
Test(core_write, a_staged_file_renamed_over_a_stored_one_then_away_leaves_no_old_object)
{
    cr_assert_eq(mem_store_set(mem, "d/h.tmp", "old", 3, NULL), 0);
    write_all("/d/y.tmp", "new bytes"); /* *.tmp: held, not uploaded */
    cr_assert_eq(core_rename(core, "/d/y.tmp", "/d/h.tmp", 0), 0);
    cr_assert_eq(core_rename(core, "/d/h.tmp", "/d/g", 0), 0);
    struct stat st;
    cr_assert_eq(core_getattr(core, "/d/h.tmp", &st), -ENOENT);
    cr_assert_eq(core_sync(core, "/"), 0);
    cr_assert(stored_is("d/g", "new bytes"));
    size_t len;
    void *old = mem_store_get(mem, "d/h.tmp", &len);
    cr_assert_null(old, "the replaced object came back");
}

Test(core_write, renaming_a_stored_object_copies_then_removes)
{
    cr_assert_eq(core_rename(core, "/stored/obj", "/stored/moved", 0), 0);
    cr_assert(stored_is("stored/moved", "0123456789"));
    size_t len;
    void *old = mem_store_get(mem, "stored/obj", &len);
    cr_assert_null(old);
    cr_assert_eq(mem_store_calls(mem, MEM_OP_COPY), 1);
    struct stat st;
    cr_assert_eq(core_getattr(core, "/stored/obj", &st), -ENOENT);
    cr_assert_eq(core_getattr(core, "/stored/moved", &st), 0);
    cr_assert_eq(st.st_size, 10);
}

Test(core_write, unlink_and_rmdir)
{
    cr_assert_eq(core_rmdir(core, "/stored"), -ENOTEMPTY);
    cr_assert_eq(core_unlink(core, "/stored/obj"), 0);
    struct stat st;
    cr_assert_eq(core_getattr(core, "/stored/obj", &st), -ENOENT);
    cr_assert_eq(core_unlink(core, "/stored/obj"), -ENOENT);
    cr_assert_eq(core_mkdir(core, "/e"), 0);
    cr_assert_eq(core_mkdir(core, "/e"), -EEXIST);
    cr_assert_eq(core_getattr(core, "/e", &st), 0);
    cr_assert(S_ISDIR(st.st_mode));
    cr_assert_eq(mem_store_calls(mem, MEM_OP_MKDIR), 1, "a marker makes it exist for all");
    write_all("/e/f", "1");
    cr_assert_eq(core_rmdir(core, "/e"), -ENOTEMPTY);
    cr_assert_eq(core_unlink(core, "/e/f"), 0);
    cr_assert_eq(core_rmdir(core, "/e"), 0);
    cr_assert_eq(core_getattr(core, "/e", &st), -ENOENT);
}

Test(core_write, an_existing_object_is_changed_in_place)
{
    struct core_file *f;
    int keep;
    cr_assert_eq(core_open(core, "/stored/obj", O_RDWR, &f, &keep), 0);
    cr_assert_eq(core_write(core, f, "XY", 2, 4), 2);
    char buf[16] = {0};
    cr_assert_eq(core_read(core, f, buf, sizeof buf, 0), 10);
    cr_assert_str_eq(buf, "0123XY6789");
    core_release(core, f);
    cr_assert_eq(core_truncate(core, "/stored/obj", NULL, 6), 0); /* not open: sealed */
    cr_assert_eq(core_sync(core, "/"), 0);
    cr_assert(stored_is("stored/obj", "0123XY"));
}

Test(core_write, lookups_of_new_names_cost_one_listing)
{
    cr_assert_eq(core_mkdir(core, "/ck"), 0);
    uint64_t stats0 = mem_store_calls(mem, MEM_OP_STAT), lists0 = mem_store_calls(mem, MEM_OP_LIST);
    struct stat st;
    for (int i = 0; i < 20; i++) { /* what the kernel does before each create */
        char p[64];
        snprintf(p, sizeof p, "/ck/__0_%d.distcp", i);
        cr_assert_eq(core_getattr(core, p, &st), -ENOENT);
        write_all(p, "shard");
    }
    cr_assert_eq(mem_store_calls(mem, MEM_OP_STAT), stats0, "a request per new name");
    cr_assert_eq(mem_store_calls(mem, MEM_OP_LIST), lists0, "the new directory was known empty");
    /* a directory made elsewhere: one listing answers every lookup in it */
    cr_assert_eq(mem_store_set(mem, "other/a", "1", 1, NULL), 0);
    stats0 = mem_store_calls(mem, MEM_OP_STAT);
    lists0 = mem_store_calls(mem, MEM_OP_LIST);
    for (int i = 0; i < 20; i++) {
        char p[64];
        snprintf(p, sizeof p, "/other/n%d", i);
        cr_assert_eq(core_getattr(core, p, &st), -ENOENT);
    }
    cr_assert_eq(core_getattr(core, "/other/a", &st), 0);
    cr_assert_eq(mem_store_calls(mem, MEM_OP_STAT), stats0);
    cr_assert_leq(mem_store_calls(mem, MEM_OP_LIST) - lists0, 2);
}

Test(core_write, a_listed_name_whose_entry_expired_is_asked_for_by_name)
{
    cr_assert_eq(mem_store_set(mem, "old/a", "1", 1, NULL), 0);
    cr_assert_eq(mem_store_set(mem, "old/b", "22", 2, NULL), 0);
    struct stat st;
    cr_assert_eq(core_getattr(core, "/old/b", &st), 0); /* lists old/ */
    /* writing into old/ keeps its listing mark past attr_timeout ... */
    struct core_file *f;
    cr_assert_eq(core_create_file(core, "/old/new", O_WRONLY, &f), 0);
    usleep(1300 * 1000); /* attr_timeout is 1 s by default */
    /* ... but the entries of the listing have expired: they are not "missing" */
    cr_assert_eq(core_getattr(core, "/old/a", &st), 0, "an existing file reported missing");
    cr_assert_eq(st.st_size, 1);
    cr_assert_eq(core_getattr(core, "/old/zz", &st), -ENOENT);
    core_release(core, f);
}
