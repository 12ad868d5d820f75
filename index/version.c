/* index/version.c - the index library's version string. */
const char *ckptfs_index_version(void)
{
    return "0.1";
}
