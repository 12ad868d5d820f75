/*
 * tests/unit/test_stage_link.c - a staged symlink (stage_symlink; docs/semantics.md
 * §14, "Symbolic links") reaches the store only after the files staged before it at
 * or below its target, commit files included; files staged after it, or elsewhere,
 * do not hold it back; links do not wait for each other.
 */
#include <criterion/criterion.h>

#include "stage_fixture.h"

#include <sys/stat.h>

TestSuite(stage_link, .init = stage_setup, .fini = stage_teardown);

/* A staged file at path with one writer, some bytes written, not closed. */
static struct wfile *open_writing(const char *path)
{
    struct wfile *wf;
    cr_assert_eq(stage_create(st, path, &wf), 0);
    stage_writer_open(st, wf);
    cr_assert_eq(stage_write(st, wf, "abcd", 4, 0), 4);
    return wf;
}

static void close_writing(struct wfile *wf)
{
    stage_writer_close(st, wf);
    stage_put(st, wf);
}

/* The stored body of path as a string ("" if absent). */
static const char *body(const char *path)
{
    static char out[256];
    size_t len = 0;
    char *b = mem_store_get(mem, path, &len);
    snprintf(out, sizeof out, "%.*s", b ? (int)len : 0, b ? b : "");
    free(b);
    return out;
}

Test(stage_link, published_after_the_files_staged_before_it_below_its_target)
{
    struct wfile *shard = open_writing("run/step_1/ck/shard.distcp");
    struct wfile *meta = open_writing("run/step_1/ck/.metadata");
    cr_assert_eq(stage_symlink(st, "run/latest", "step_1", "run/step_1", NULL), 0);
    struct wfile *after = open_writing("run/step_1/after.bin"); /* made after the link */
    struct store_stat s;
    cr_assert_eq(stage_stat(st, "run/latest", &s), 1, "the mount shows it at once");
    cr_assert(store_attrs_is_link(&s.attrs));
    cr_assert_eq(s.size, 6);
    unsigned char *d = pattern(100, 1);
    write_whole("elsewhere.bin", d, 100, 100); /* elsewhere: goes at once */
    free(d);
    cr_assert_eq(stage_sync(st, "elsewhere.bin"), 0);
    cr_assert(!stored("run/latest"), "the link went before the files below its target");
    close_writing(shard);
    cr_assert_eq(stage_sync(st, "run/step_1/ck/shard.distcp"), 0);
    cr_assert(!stored("run/latest"), "the link went before the .metadata below its target");
    close_writing(meta);
    cr_assert_eq(stage_sync(st, "run/latest"), 0); /* after.bin, still open, is not waited for */
    cr_assert_str_eq(body("run/latest"), "step_1");
    cr_assert(stored("run/step_1/ck/.metadata"));
    cr_assert(!stored("run/step_1/after.bin"));
    close_writing(after);
}

Test(stage_link, links_into_each_others_directories_do_not_wait_for_each_other)
{
    cr_assert_eq(stage_symlink(st, "a/to_b", "../b", "b", NULL), 0);
    cr_assert_eq(stage_symlink(st, "b/to_a", "../a", "a", NULL), 0);
    cr_assert_eq(stage_sync(st, ""), 0);
    cr_assert_str_eq(body("a/to_b"), "../b");
    cr_assert_str_eq(body("b/to_a"), "../a");
}
