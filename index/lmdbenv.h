/*
 * index/lmdbenv.h - opening an LMDB environment so that a full disk is an
 * error (ENOSPC), never a SIGBUS. Every LMDB user of the project (the
 * checkpoint index, the write journal, the disk cache's catalogue) opens its
 * environment here.
 */
#ifndef CKPTFS_LMDBENV_H
#define CKPTFS_LMDBENV_H

#include <lmdb.h>
#include <stddef.h>

/* mdb_env_open(env, path, flags, mode), after the lock file's blocks are
 * allocated on disk: 0, or LMDB's code (an errno value, ENOSPC when the disk
 * has no room for the lock file). */
int lmdbenv_open(MDB_env *env, const char *path, unsigned flags, mdb_mode_t mode);

/* Writes LMDB's message for rc into buf; for ENOSPC or EDQUOT it adds how
 * many bytes the file system of path has free. Returns buf. */
const char *lmdbenv_strerror(int rc, const char *path, char *buf, size_t len);

#endif
