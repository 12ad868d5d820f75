/*
 * index/utf8.h - making arbitrary bytes valid UTF-8 for JSON: the one rule
 * the admin tool's output and the DCP planner_data conversion share.
 */
#ifndef CKPTFS_UTF8_H
#define CKPTFS_UTF8_H

#include <stddef.h>

/* Length (1..4) of the well-formed UTF-8 sequence at s[0..n) (n >= 1), 0 if
 * there is none: Jansson's rules (no overlong forms, no surrogates,
 * nothing above U+10FFFF; a NUL byte counts as a sequence of 1). */
size_t ckpt_utf8_seq(const unsigned char *s, size_t n);

/* A malloc'd, NUL-terminated copy of s[0..n) in which every byte that is not
 * part of well-formed UTF-8 (an encoded surrogate's three bytes each, a cut
 * sequence, and NUL) is replaced by U+FFFD; its length in *outlen (may be
 * NULL). NULL only when out of memory. */
char *ckpt_utf8_lossy(const char *s, size_t n, size_t *outlen);

#endif
