/* fs/s3_error.c - placeholder until the module lands. */
typedef int ckptfs_placeholder_s3_error;
