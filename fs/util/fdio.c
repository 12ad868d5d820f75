/*
 * fs/util/fdio.c - file-descriptor reads (see fdio.h).
 */
#include "fdio.h"

#include <errno.h>
#include <unistd.h>

int pread_full(int fd, void *buf, size_t len, uint64_t off, size_t *done)
{
    *done = 0;
    while (*done < len) {
        ssize_t n = pread(fd, (char *)buf + *done, len - *done, (off_t)(off + *done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (n == 0)
            break;
        *done += (size_t)n;
    }
    return 0;
}

int pread_exact(int fd, void *buf, size_t len, uint64_t off)
{
    size_t done;
    int rc = pread_full(fd, buf, len, off, &done);
    if (rc < 0)
        return rc;
    return done < len ? -EIO : 0;
}
