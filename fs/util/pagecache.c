/*
 * fs/util/pagecache.c - page-cache residency by file descriptor with
 * cachestat(2): one walk of the file's cache per range, a large folio at a
 * time (mincore on a mapping looks each 4 KiB page up: about 100 times the
 * CPU for a read-ahead file). Remembers when the kernel lacks the call.
 */
#include "pagecache.h"

#include <errno.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SYS_cachestat
#define SYS_cachestat 451 /* the same number on every architecture */
#endif

struct cachestat_range {
    uint64_t off, len;
};

struct cachestat_counts {
    uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
};

/* Set once the kernel refused the call as unknown (or a filter forbade it). */
static atomic_int cachestat_missing;

int page_cache_holds(int fd, uint64_t off, uint64_t len)
{
    if (len == 0)
        return 1;
    if (atomic_load_explicit(&cachestat_missing, memory_order_relaxed))
        return -1;
    struct cachestat_range range = {off, len};
    struct cachestat_counts counts;
    if (syscall(SYS_cachestat, fd, &range, &counts, 0) != 0) {
        if (errno == ENOSYS || errno == EPERM) {
            atomic_store(&cachestat_missing, 1);
            return -1;
        }
        if (errno == EOPNOTSUPP)
            return -1; /* this file's filesystem (hugetlbfs): mincore can tell */
        return 0;      /* EBADF and the like: not known to be there */
    }
    long page = sysconf(_SC_PAGESIZE);
    uint64_t pages = (off + len - 1) / (uint64_t)page - off / (uint64_t)page + 1;
    return counts.nr_cache >= pages;
}
