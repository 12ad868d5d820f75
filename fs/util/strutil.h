/*
 * fs/util/strutil.h - small string helpers shared by fs/ modules.
 */
#ifndef CKPTFS_STRUTIL_H
#define CKPTFS_STRUTIL_H

#include <stddef.h>
#include <stdint.h>

/* A malloc'd formatted string (caller frees), NULL when out of memory. */
char *str_printf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* FNV-1a hash of the len bytes at s: the hash of every fs/ hash table. */
uint64_t str_hash(const char *s, size_t len);

/* The directory part of a store path ("" for a top-level name) into buf:
 * 0, or -ENAMETOOLONG (buf then holds "") if it does not fit in len. */
int path_dir(const char *path, char *buf, size_t len);

/* The last component of a store path. */
const char *path_base(const char *path);

/* 1 if store path is dir itself or lies below it ("a/b" is at or below "a"
 * and "a/b", not below "a/bc"); every path is below "" (the root). */
int path_at_or_below(const char *path, const char *dir);

#endif
