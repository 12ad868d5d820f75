/* fs/store.c - placeholder until the module lands. */
typedef int ckptfs_placeholder_store;
