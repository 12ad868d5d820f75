/*
 * index/lmdbenv.c - opening an LMDB environment so that a full disk is an
 * error, never a SIGBUS (see lmdbenv.h).
 *
 * LMDB sizes its lock file (the reader table, LOCK) with ftruncate, maps it
 * shared and writes the table's header through the map. ftruncate makes a
 * sparse file, so on a file system with no free block the first store into
 * the map has no page to land in and the kernel sends SIGBUS: the process
 * dies inside mdb_env_open. Allocating the lock file's blocks first
 * (posix_fallocate) turns that into ENOSPC before LMDB maps anything; LMDB
 * then finds the file long enough and does not truncate it. The data file
 * needs nothing: without MDB_WRITEMAP (no user here sets it) LMDB writes
 * pages with pwrite, whose ENOSPC it returns, and reads only pages it wrote.
 */
#include "lmdbenv.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

/* LMDB's reader slots are one cache line each; its header, two more lines
 * plus the first slot (lmdb 0.9: (maxreaders - 1) * 64 + 192 bytes). */
#define READER_SLOT 64u
#define HEADER_SLOTS 3u

/* Bytes of the lock file LMDB maps for env. */
static size_t lock_bytes(MDB_env *env)
{
    unsigned readers = 126; /* LMDB's default */
    mdb_env_get_maxreaders(env, &readers);
    size_t n = ((size_t)readers - 1 + HEADER_SLOTS) * READER_SLOT;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    return (n + page - 1) / page * page;
}

int lmdbenv_open(MDB_env *env, const char *path, unsigned flags, mdb_mode_t mode)
{
    if (!(flags & MDB_NOLOCK)) {
        char lock[4096];
        int n =
            snprintf(lock, sizeof lock, "%s%s", path, flags & MDB_NOSUBDIR ? "-lock" : "/lock.mdb");
        if (n < 0 || (size_t)n >= sizeof lock)
            return ENAMETOOLONG;
        /* A lock file we cannot open for writing (a read-only folder) is
         * LMDB's to judge; a disk without room is ours to report. */
        int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, mode);
        if (fd >= 0) {
            int rc = posix_fallocate(fd, 0, (off_t)lock_bytes(env));
            close(fd);
            if (rc == ENOSPC || rc == EDQUOT)
                return rc;
        }
    }
    return mdb_env_open(env, path, flags, mode);
}

const char *lmdbenv_strerror(int rc, const char *path, char *buf, size_t len)
{
    struct statvfs sv;
    if ((rc == ENOSPC || rc == EDQUOT) && statvfs(path, &sv) == 0)
        snprintf(buf, len, "%s (%llu KiB free on its file system)", mdb_strerror(rc),
                 (unsigned long long)((uint64_t)sv.f_bavail * sv.f_frsize >> 10));
    else
        snprintf(buf, len, "%s", mdb_strerror(rc));
    return buf;
}
