/*
 * tests/unit/test_symlink_rule.c - fs/store/symlink.c (docs/semantics.md §14,
 * "Symbolic links"): which listed objects a lookup asks the store about (a
 * HEAD: may it be a link?), and where a new link's target lies on the store
 * (what its publish waits for).
 */
#include <criterion/criterion.h>
#include <string.h>
#include <sys/stat.h>

#include "store.h"

Test(symlink_rule, only_small_objects_that_are_not_checkpoint_files_may_be_links)
{
    cr_expect(store_may_be_link("latest", 8));
    cr_expect(store_may_be_link("run/last.ckpt", 30), "Lightning's save_last=\"link\"");
    cr_expect(store_may_be_link("latest.pt", 12));
    cr_expect(store_may_be_link("config.json", 600));
    cr_expect(store_may_be_link("x", 1));
    cr_expect(store_may_be_link("x", STORE_LINK_MAX));
    cr_expect(!store_may_be_link("x", 0), "an empty object is no link");
    cr_expect(!store_may_be_link("x", STORE_LINK_MAX + 1), "longer than any target");
    cr_expect(!store_may_be_link("ckpt/__0_0.distcp", 100));
    cr_expect(!store_may_be_link("ckpt/.metadata", 100));
    cr_expect(!store_may_be_link("ckpt/__3.metadata", 100));
    cr_expect(!store_may_be_link("model-00001-of-00002.safetensors", 100));
    cr_expect(!store_may_be_link("model.safetensors.index.json", 900));
    cr_expect(store_may_be_link("distcp", 10), "a suffix, not a name");
}

Test(symlink_rule, a_mode_with_s_iflnk_is_a_link)
{
    struct store_attrs a = {.set = STORE_ATTR_MODE, .mode = S_IFLNK | 0777};
    cr_expect(store_attrs_is_link(&a));
    a.mode = 41471; /* what s3fs 1.90 writes */
    cr_expect(store_attrs_is_link(&a));
    a.mode = S_IFREG | 0644;
    cr_expect(!store_attrs_is_link(&a));
    a = (struct store_attrs){.mode = S_IFLNK | 0777}; /* no mode set */
    cr_expect(!store_attrs_is_link(&a));
}

static const char *wait_of(const char *link, const char *target)
{
    static char out[4096];
    cr_assert_eq(store_link_wait_path(link, target, out, sizeof out), 0);
    return out;
}

Test(symlink_rule, the_target_is_resolved_from_the_links_directory)
{
    cr_expect_str_eq(wait_of("run/latest", "step_200"), "run/step_200");
    cr_expect_str_eq(wait_of("latest", "step_200"), "step_200");
    cr_expect_str_eq(wait_of("a/b/l", "../c/./d/"), "a/c/d");
    cr_expect_str_eq(wait_of("a/b/l", "."), "a/b");
    cr_expect_str_eq(wait_of("a/l", ".."), "");
    cr_expect_str_eq(wait_of("l", "x//y"), "x/y");
    cr_expect_str_eq(wait_of("a/l", "../../x"), "", "above the root: anything");
    cr_expect_str_eq(wait_of("a/l", "/mnt/ckpt/x"), "", "absolute: anything");
    char small[4];
    cr_expect_eq(store_link_wait_path("l", "abcdef", small, sizeof small), -1);
}
