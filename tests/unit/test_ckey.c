/*
 * tests/unit/test_ckey.c - fs/store/ckey.c: the canonical checkpoint location
 * both the mount and ckptfs-admin key the index by.
 */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "ckey.h"

static void check_prefix(const char *in, const char *want)
{
    char *got = ckpt_clean_prefix(in);
    cr_assert_not_null(got);
    cr_assert_str_eq(got, want, "ckpt_clean_prefix(\"%s\")", in);
    free(got);
}

static void check_key(const char *in, const char *want)
{
    char *got = ckpt_store_key(in);
    cr_assert_not_null(got);
    cr_assert_str_eq(got, want, "ckpt_store_key(\"%s\")", in);
    free(got);
}

Test(ckey, prefix_drops_dot_segments_and_outer_slashes)
{
    check_prefix("", "");
    check_prefix("/", "");
    check_prefix("a", "a");
    check_prefix("/a/b/", "a/b");
    check_prefix("a//b", "a//b"); /* another S3 key than a/b */
    check_prefix("//a//", "a");
    check_prefix("./a/./b/.", "a/b");
    check_prefix("./", "");
    check_prefix("a/.//b/./", "a//b");
    check_prefix("a/../b", "a/../b");
    check_prefix(".a/b./..c", ".a/b./..c");
}

Test(ckey, s3_urls_name_what_the_store_reads)
{
    check_key("s3://bucket", "s3://bucket");
    check_key("s3://bucket/", "s3://bucket");
    check_key("s3://bucket//", "s3://bucket");
    check_key("s3://bucket//x", "s3://bucket/x");
    check_key("s3://bucket/x/", "s3://bucket/x");
    check_key("s3://bucket/./x/y/./", "s3://bucket/x/y");
    check_key("s3://bucket/x//y/", "s3://bucket/x//y");
    check_key("s3://bucket/x/.metadata", "s3://bucket/x/.metadata");
    check_key("/already/real", "/already/real");
}
