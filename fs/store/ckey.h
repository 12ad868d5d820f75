/*
 * fs/store/ckey.h - the canonical name of a checkpoint location: the key the
 * index stores a checkpoint under. The mount (its S3 store's prefix, hence
 * store->description, hence fs/read/ckindex.c's keys) and ckptfs-admin (its
 * s3:// arguments) both clean a location here, so an index built by one is
 * found by the other.
 */
#ifndef CKPTFS_CKEY_H
#define CKPTFS_CKEY_H

/* prefix without its "." segments and without leading and trailing
 * slashes: "/a/./b//c/" -> "a/b//c", "/" -> "". A doubled slash inside is
 * kept: S3 keys are literal, "a//c" names other objects than "a/c". ".."
 * is kept as typed. malloc'd; NULL when out of memory. */
char *ckpt_clean_prefix(const char *prefix);

/* The canonical form of a store URL "s3://BUCKET[/PREFIX]": "s3://BUCKET"
 * plus "/" and ckpt_clean_prefix(PREFIX) when that is not empty. Anything
 * else (a local path: callers pass it through realpath) is copied as is.
 * malloc'd; NULL when out of memory. */
char *ckpt_store_key(const char *url);

#endif
