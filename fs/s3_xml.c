/* fs/s3_xml.c - placeholder until the module lands. */
typedef int ckptfs_placeholder_s3_xml;
