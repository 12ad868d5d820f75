/*
 * fs/ops.h - the FUSE adapter: fuse_operations that unpack each request,
 * call the core, and reply.
 */
#ifndef CKPTFS_OPS_H
#define CKPTFS_OPS_H

#define FUSE_USE_VERSION 35
#include <fuse.h>

struct core;

/* What the adapter needs at mount time; passed as fuse private_data. */
struct ops_context {
    struct core *core;
    double attr_timeout;    /* kernel entry/attribute cache, seconds */
    unsigned max_readahead; /* kernel readahead, bytes */
};

const struct fuse_operations *ckptfs_fuse_operations(void);

#endif
