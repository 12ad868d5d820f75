/*
 * fs/util/pagecache.h - whether a file's bytes are in the page cache, asked
 * of the kernel by file descriptor (cachestat(2), Linux 6.5+).
 */
#ifndef CKPTFS_PAGECACHE_H
#define CKPTFS_PAGECACHE_H

#include <stdint.h>

/* Whether every page of [off, off + len) of fd is in the page cache: 1 or 0;
 * -1 when the kernel cannot tell by descriptor (no cachestat, or not for
 * this file's filesystem): ask mincore. */
int page_cache_holds(int fd, uint64_t off, uint64_t len);

#endif
