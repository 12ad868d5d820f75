/* fs/sigv4.c - placeholder until the module lands. */
typedef int ckptfs_placeholder_sigv4;
