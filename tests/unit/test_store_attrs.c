/*
 * tests/unit/test_store_attrs.c - fs/store/store_attrs.c: modes, owners and
 * times as S3 user metadata in the s3fs convention (docs/semantics.md,
 * "Modes, owners and times"), and the metadata cache keeping them per object
 * version (fs/core/meta.c).
 */
#include <criterion/criterion.h>
#include <string.h>
#include <sys/stat.h>

#include "meta.h"
#include "store.h"

/* The headers of a as "name=value;..." */
static void headers_of(const struct store_attrs *a, char *out, size_t len)
{
    const char *names[STORE_ATTR_HDR_MAX];
    char vals[STORE_ATTR_HDR_MAX][STORE_ATTR_VALUE_MAX];
    int n = store_attrs_headers(a, names, vals);
    out[0] = '\0';
    for (int i = 0; i < n; i++) {
        strncat(out, names[i], len - strlen(out) - 1);
        strncat(out, "=", len - strlen(out) - 1);
        strncat(out, vals[i], len - strlen(out) - 1);
        strncat(out, ";", len - strlen(out) - 1);
    }
}

static int parse(struct store_attrs *a, const char *name, const char *value)
{
    return store_attrs_parse_header(a, name, strlen(name), value, strlen(value));
}

Test(store_attrs, headers_are_decimal_with_type_bits_and_seconds)
{
    char got[512];
    struct store_attrs a = {.set = STORE_ATTR_MODE | STORE_ATTR_UID | STORE_ATTR_GID |
                                   STORE_ATTR_MTIME | STORE_ATTR_READ,
                            .mode = S_IFREG | 0600,
                            .uid = 1234,
                            .gid = 0,
                            .mtime_ns = 1500000000LL * 1000000000};
    headers_of(&a, got, sizeof got);
    cr_assert_str_eq(got, "x-amz-meta-mode=33152;x-amz-meta-uid=1234;x-amz-meta-gid=0;"
                          "x-amz-meta-mtime=1500000000;");
    a = (struct store_attrs){.set = STORE_ATTR_MTIME, .mtime_ns = 1400000000123456789LL};
    headers_of(&a, got, sizeof got);
    cr_assert_str_eq(got, "x-amz-meta-mtime=1400000000.123456789;");
    a = (struct store_attrs){.set = STORE_ATTR_MODE, .mode = S_IFDIR | 0750};
    headers_of(&a, got, sizeof got);
    cr_assert_str_eq(got, "x-amz-meta-mode=16872;");
    a = (struct store_attrs){.set = STORE_ATTR_READ};
    headers_of(&a, got, sizeof got);
    cr_assert_str_eq(got, "", "nothing set, nothing sent");
}

Test(store_attrs, parsing_reads_what_headers_write_and_s3fs_forms)
{
    struct store_attrs a = {0};
    cr_assert_eq(parse(&a, "X-Amz-Meta-Mode", "33152"), 1, "any case");
    cr_assert_eq(parse(&a, "x-amz-meta-uid", "1234"), 1);
    cr_assert_eq(parse(&a, "x-amz-meta-gid", "4294967294"), 1);
    cr_assert_eq(parse(&a, "x-amz-meta-mtime", "1400000000.123456789"), 1);
    cr_assert_eq(a.set, STORE_ATTR_MODE | STORE_ATTR_UID | STORE_ATTR_GID | STORE_ATTR_MTIME);
    cr_assert_eq(a.mode, S_IFREG | 0600);
    cr_assert_eq(a.uid, 1234);
    cr_assert_eq(a.gid, 4294967294u);
    cr_assert_eq(a.mtime_ns, 1400000000123456789LL);
    cr_assert_eq(parse(&a, "x-amz-meta-mtime", "1500000000"), 1, "whole seconds");
    cr_assert_eq(a.mtime_ns, 1500000000LL * 1000000000);
    cr_assert_eq(parse(&a, "x-amz-meta-mtime", "1500000000.5"), 1, "a short fraction");
    cr_assert_eq(a.mtime_ns, 1500000000500000000LL);
}

Test(store_attrs, malformed_or_other_headers_are_ignored)
{
    struct store_attrs a = {0};
    cr_assert_eq(parse(&a, "x-amz-meta-mode", ""), 0);
    cr_assert_eq(parse(&a, "x-amz-meta-mode", "0644x"), 0);
    cr_assert_eq(parse(&a, "x-amz-meta-mode", "-1"), 0);
    cr_assert_eq(parse(&a, "x-amz-meta-uid", "4294967296"), 0, "past 32 bits");
    cr_assert_eq(parse(&a, "x-amz-meta-mtime", "12.3x"), 0);
    cr_assert_eq(parse(&a, "x-amz-meta-mtime", "abc"), 0);
    cr_assert_eq(parse(&a, "x-amz-meta-modes", "1"), 0);
    cr_assert_eq(parse(&a, "x-amz-meta-atime", "1"), 0, "access times are not kept");
    cr_assert_eq(a.set, 0);
}

Test(store_attrs, headers_round_trip_through_parsing)
{
    int64_t times[] = {0, 1, 999999999, 1000000000, 1796000000123000000LL, -1500000000LL};
    for (size_t i = 0; i < sizeof times / sizeof *times; i++) {
        struct store_attrs a = {.set = STORE_ATTR_MTIME | STORE_ATTR_MODE,
                                .mode = S_IFDIR | 01777,
                                .mtime_ns = times[i]},
                           b = {0};
        const char *names[STORE_ATTR_HDR_MAX];
        char vals[STORE_ATTR_HDR_MAX][STORE_ATTR_VALUE_MAX];
        int n = store_attrs_headers(&a, names, vals);
        for (int k = 0; k < n; k++)
            cr_assert_eq(parse(&b, names[k], vals[k]), 1);
        cr_assert_eq(b.set, a.set);
        cr_assert_eq(b.mode, a.mode);
        cr_assert_eq(b.mtime_ns, a.mtime_ns, "%lld", (long long)times[i]);
    }
}

/* The metadata cache keeps a version's attributes over answers without any. */
Test(store_attrs, meta_cache_keeps_attributes_per_version)
{
    struct meta_cache mc;
    cr_assert_eq(meta_init(&mc, 60, 60), 0);
    struct store_stat v1 = {.size = 10, .etag = "\"abc\""};
    v1.attrs = (struct store_attrs){.set = STORE_ATTR_MODE | STORE_ATTR_READ, .mode = 0100600};
    meta_put(&mc, "f", 0, &v1, 0);
    struct store_stat listed = {.size = 10, .etag = "abc"}; /* a listing: no quotes, no attrs */
    meta_put(&mc, "f", 0, &listed, 5);
    struct store_attrs got;
    cr_assert_eq(meta_get_attrs(&mc, "f", &listed, &got), 1, "kept over a listing");
    cr_assert_eq(got.mode, 0100600);
    struct store_stat v2 = {.size = 11, .etag = "\"def\""};
    meta_put(&mc, "f", 0, &v2, 5);
    cr_assert_eq(meta_get_attrs(&mc, "f", &v2, &got), 0, "another version has its own");
    struct store_stat d = {.is_dir = 1};
    d.attrs = (struct store_attrs){.set = STORE_ATTR_MTIME | META_ATTRS_SET_HERE, .mtime_ns = 7};
    meta_put(&mc, "d", 0, &d, 0);
    struct store_stat d_read = {.is_dir = 1};
    d_read.attrs = (struct store_attrs){.set = STORE_ATTR_MTIME | STORE_ATTR_READ, .mtime_ns = 9};
    meta_put(&mc, "d", 0, &d_read, 0);
    cr_assert_eq(meta_get_attrs(&mc, "d", &d_read, &got), 1);
    cr_assert_eq(got.mtime_ns, 7, "what this mount set stays over a later answer");
    meta_destroy(&mc);
}
