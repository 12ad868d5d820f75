/* fs/store_dir.c - placeholder until the module lands. */
typedef int ckptfs_placeholder_store_dir;
