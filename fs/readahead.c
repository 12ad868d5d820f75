/* fs/readahead.c - placeholder until the module lands. */
typedef int ckptfs_placeholder_readahead;
