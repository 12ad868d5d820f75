/* fs/aws_config.c - placeholder until the module lands. */
typedef int ckptfs_placeholder_aws_config;
