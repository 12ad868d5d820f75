/*
 * tests/unit/test_util.h - small helpers shared by the criterion unit tests
 * (header-only: every test is its own executable).
 */
#ifndef CKPTFS_TEST_UTIL_H
#define CKPTFS_TEST_UTIL_H

#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The whole file at path in a malloc'd buffer (one spare byte, so an empty
 * file still gets a valid pointer); *n = its length. Fails the test if the
 * file cannot be read. The caller frees. */
static inline char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "%s", path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)len + 1);
    cr_assert_not_null(b);
    cr_assert_eq(fread(b, 1, (size_t)len, f), (size_t)len, "%s", path);
    fclose(f);
    *n = (size_t)len;
    return b;
}

/* Call fn(path, name, arg) for every file NAME ending in ".metadata" in dir
 * (a fixtures folder); returns how many. Fails the test if dir cannot be
 * opened. */
typedef void (*metadata_fn)(const char *path, const char *name, void *arg);
static inline int for_each_metadata(const char *dir, metadata_fn fn, void *arg)
{
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "%s", dir);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) {
        size_t l = strlen(e->d_name);
        if (l < 9 || strcmp(e->d_name + l - 9, ".metadata") != 0)
            continue;
        char path[1024];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        fn(path, e->d_name, arg);
        n++;
    }
    closedir(d);
    return n;
}

/* Make a fresh scratch directory $TMPDIR/NAME-XXXXXX (/tmp without TMPDIR)
 * into dir[n]; fails the test if it cannot. Remove it with rm_tree. */
static inline void make_scratch_dir(char *dir, size_t n, const char *name)
{
    const char *t = getenv("TMPDIR");
    snprintf(dir, n, "%s/%s-XXXXXX", t && *t ? t : "/tmp", name);
    cr_assert_not_null(mkdtemp(dir), "%s", dir);
}

/* Remove path and everything below it (a test's scratch directory). */
static inline void rm_tree(const char *path)
{
    DIR *d = opendir(path);
    if (!d) {
        unlink(path);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            char p[4096];
            if (snprintf(p, sizeof p, "%s/%s", path, e->d_name) < (int)sizeof p)
                rm_tree(p);
        }
    closedir(d);
    rmdir(path);
}

/* Write text to dir/name, replacing the file. Fails the test on error. */
static inline void write_text(const char *dir, const char *name, const char *text)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s", path);
    cr_assert_geq(fputs(text, f), 0, "%s", path);
    cr_assert_eq(fclose(f), 0, "%s", path);
}

#endif
