/*
 * fs/fuse/passthrough.c - FUSE passthrough under libfuse 3.14 (see
 * passthrough.h): the custom I/O hooks between libfuse and /dev/fuse that
 * add it to the INIT and OPEN replies, and the backing-file ioctls.
 *
 * The wire layouts used here (fuse_init_out's flags2 and max_stack_depth,
 * fuse_open_out's backing_id, the ioctls) are the kernel's ABI since
 * protocol 7.40; Debian 12's headers predate them, so they are spelt out.
 */
#include "passthrough.h"

#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/uio.h>
#include <unistd.h>

#define OP_INIT 26
#define INIT_EXT_FLAG (1u << 30)        /* FUSE_INIT_EXT, in flags */
#define PASSTHROUGH_FLAG2 (1u << 5)     /* FUSE_PASSTHROUGH (1 << 37), in flags2 */
#define OPEN_PASSTHROUGH_FLAG (1u << 7) /* FOPEN_PASSTHROUGH */

struct wire_in_header {
    uint32_t len, opcode;
    uint64_t unique, nodeid;
    uint32_t uid, gid, pid;
    uint16_t total_extlen, padding;
};

struct wire_init_in {
    uint32_t major, minor, max_readahead, flags, flags2;
};

struct wire_out_header {
    uint32_t len;
    int32_t error;
    uint64_t unique;
};

struct wire_init_out {
    uint32_t major, minor, max_readahead, flags;
    uint16_t max_background, congestion_threshold;
    uint32_t max_write, time_gran;
    uint16_t max_pages, map_alignment;
    uint32_t flags2, max_stack_depth;
    uint32_t unused[6];
};

struct wire_open_out {
    uint64_t fh;
    uint32_t open_flags;
    int32_t backing_id;
};

struct wire_backing_map {
    int32_t fd;
    uint32_t flags;
    uint64_t padding;
};

#define IOC_BACKING_OPEN _IOW(229, 1, struct wire_backing_map)
#define IOC_BACKING_CLOSE _IOW(229, 2, uint32_t)

_Static_assert(sizeof(struct wire_in_header) == 40, "fuse_in_header");
_Static_assert(sizeof(struct wire_init_out) == 64, "fuse_init_out");
_Static_assert(sizeof(struct wire_open_out) == 16, "fuse_open_out");

static int dev_fd = -1;
static _Atomic uint64_t init_unique; /* the INIT request's id, 0 until seen */
static atomic_int kernel_offers;     /* the kernel offered passthrough at INIT */
static atomic_int enabled;           /* ... and we took it */

static _Thread_local uint64_t expect_fh;
static _Thread_local int expect_id; /* 0: none */

static ssize_t hook_read(int fd, void *buf, size_t len, void *userdata)
{
    (void)userdata;
    ssize_t n = read(fd, buf, len);
    if (n >= (ssize_t)(sizeof(struct wire_in_header) + sizeof(struct wire_init_in))) {
        const struct wire_in_header *h = buf;
        if (h->opcode == OP_INIT) {
            const struct wire_init_in *in = (const void *)(h + 1);
            atomic_store(&kernel_offers,
                         (in->flags & INIT_EXT_FLAG) && (in->flags2 & PASSTHROUGH_FLAG2));
            atomic_store(&init_unique, h->unique);
        }
    }
    return n;
}

/* The INIT reply with passthrough added (max_stack_depth 1: backing files
 * are on a plain file system). */
static void add_to_init(struct iovec *iov, int count, struct wire_init_out *copy)
{
    if (count < 2 || iov[1].iov_len != sizeof *copy)
        return;
    memcpy(copy, iov[1].iov_base, sizeof *copy);
    if (!atomic_load(&kernel_offers) || !(copy->flags & INIT_EXT_FLAG)) {
        log_info("passthrough: the kernel does not offer it (Linux 6.9+ with "
                 "CONFIG_FUSE_PASSTHROUGH): disk cache reads go through the daemon");
        return;
    }
    copy->flags2 |= PASSTHROUGH_FLAG2;
    copy->max_stack_depth = 1;
    iov[1].iov_base = copy;
    atomic_store(&enabled, 1);
    log_info("passthrough: on (files the disk cache holds whole are read by the kernel)");
}

static void add_to_open(struct iovec *iov, int count, struct wire_open_out *copy)
{
    if (count < 2 || iov[1].iov_len != sizeof *copy)
        return;
    memcpy(copy, iov[1].iov_base, sizeof *copy);
    if (copy->fh != expect_fh)
        return;
    copy->open_flags |= OPEN_PASSTHROUGH_FLAG;
    copy->backing_id = expect_id;
    iov[1].iov_base = copy;
}

static ssize_t hook_writev(int fd, struct iovec *iov, int count, void *userdata)
{
    (void)userdata;
    struct wire_init_out init_copy;
    struct wire_open_out open_copy;
    struct iovec patched[count > 0 ? count : 1];
    if (count >= 2 && iov[0].iov_len == sizeof(struct wire_out_header)) {
        const struct wire_out_header *h = iov[0].iov_base;
        memcpy(patched, iov, sizeof(struct iovec) * (size_t)count);
        uint64_t init_id = atomic_load(&init_unique);
        if (h->error == 0 && init_id && h->unique == init_id) {
            add_to_init(patched, count, &init_copy);
            atomic_store(&init_unique, 0);
        } else if (h->error == 0 && expect_id > 0) {
            add_to_open(patched, count, &open_copy);
        }
        expect_id = 0;
        return writev(fd, patched, count);
    }
    return writev(fd, iov, count);
}

static ssize_t hook_splice(int fdin, off_t *offin, int fdout, off_t *offout, size_t len,
                           unsigned int flags, void *userdata)
{
    (void)userdata;
    return splice(fdin, offin, fdout, offout, len, flags);
}

int passthrough_install(struct fuse_session *se)
{
    static const struct fuse_custom_io io = {.read = hook_read,
                                             .writev = hook_writev,
                                             .splice_receive = hook_splice,
                                             .splice_send = hook_splice};
    int fd = fuse_session_fd(se);
    if (fd < 0)
        return -EBADF;
    dev_fd = fd;
    return fuse_session_custom_io(se, &io, fd);
}

int passthrough_enabled(void)
{
    return atomic_load(&enabled);
}

int passthrough_backing_open(int fd)
{
    if (!atomic_load(&enabled))
        return -ENOTSUP;
    struct wire_backing_map map = {.fd = fd};
    int id = ioctl(dev_fd, IOC_BACKING_OPEN, &map);
    return id < 0 ? -errno : id;
}

void passthrough_backing_close(int id)
{
    uint32_t v = (uint32_t)id;
    (void)ioctl(dev_fd, IOC_BACKING_CLOSE, &v);
}

void passthrough_expect_open(uint64_t fh, int id)
{
    expect_fh = fh;
    expect_id = id;
}
