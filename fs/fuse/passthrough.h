/*
 * fs/fuse/passthrough.h - FUSE passthrough (Linux >= 6.9) under libfuse 3.14,
 * which predates it: the kernel then reads an open file's bytes straight from
 * a local file (the disk cache's checked copy), without a request to us.
 *
 * libfuse 3.14 can neither ask for it at INIT nor name a backing file in an
 * OPEN reply, so this module sits between libfuse and /dev/fuse (libfuse's
 * custom I/O hooks): it adds FUSE_PASSTHROUGH to the INIT reply when the
 * kernel offers it, and FOPEN_PASSTHROUGH with a backing id to the OPEN reply
 * of a handle registered for it by the thread that replies. Everything else
 * passes unchanged.
 */
#ifndef CKPTFS_PASSTHROUGH_H
#define CKPTFS_PASSTHROUGH_H

#define FUSE_USE_VERSION 35
#include <fuse.h>
#include <stdint.h>

/* Put the hooks between se and its /dev/fuse descriptor (after mounting,
 * before INIT): 0 or -errno (then nothing changed). */
int passthrough_install(struct fuse_session *se);

/* Whether the kernel took passthrough at INIT (known once INIT is done). */
int passthrough_enabled(void);

/* Register fd (a local file open for reading) as a backing file: its id
 * (> 0), or -errno (EPERM: no CAP_SYS_ADMIN; not enabled: -ENOTSUP). */
int passthrough_backing_open(int fd);

/* Forget backing id (open files keep their backing file). */
void passthrough_backing_close(int id);

/* The OPEN reply this thread sends next for handle fh opens it in
 * passthrough on backing id (set just before the reply; cleared by it). */
void passthrough_expect_open(uint64_t fh, int id);

#endif
