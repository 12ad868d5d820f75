/*
 * fs/util/fdio.h - file-descriptor reads shared by fs/ modules.
 */
#ifndef CKPTFS_FDIO_H
#define CKPTFS_FDIO_H

#include <stddef.h>
#include <stdint.h>

/* Read len bytes of fd at off into buf, retrying short reads and EINTR:
 * 0 (*done < len only at end of file) or -errno (*done bytes read first). */
int pread_full(int fd, void *buf, size_t len, uint64_t off, size_t *done);

/* Read exactly len bytes of fd at off into buf (pread_full): 0, -errno, or
 * -EIO when the file ends first. */
int pread_exact(int fd, void *buf, size_t len, uint64_t off);

#endif
