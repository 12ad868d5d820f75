/* fs/store_s3.c - placeholder until the module lands. */
typedef int ckptfs_placeholder_store_s3;
