/*
 * fs/fuse/options.h - the ckptfs command line: one table of options, from which
 * both the parser and the --help text come.
 *
 *   ckptfs [options] STORE MOUNTPOINT
 */
#ifndef CKPTFS_OPTIONS_H
#define CKPTFS_OPTIONS_H

#include "core.h"
#include "store.h"

struct options {
    const char *store_url;
    const char *mountpoint;
    const char *cache_dir;
    const char *log_file;
    int foreground, debug, single_thread, read_only;
    char fuse_opts[4096]; /* -o values, comma-joined, for libfuse */
    char strings[4096];   /* values of ckptfs options given with -o */
    size_t strings_used;
    struct store_options store;
    struct core_config core;
    unsigned max_readahead; /* the kernel's readahead for the mount */
    int passthrough;        /* --passthrough=auto (1) or off (0) */
};

/* Defaults for every field (core_config_defaults and the rest). */
void options_defaults(struct options *o);

/* Parse argv into o. 0 to go on, 1 when --help or --version printed what
 * was asked (exit 0), -1 after printing a one-line error (exit 2). */
int options_parse(int argc, char **argv, struct options *o);

/* Append a comma-separated FUSE option to o->fuse_opts. */
void options_add_fuse(struct options *o, const char *opt);

#endif
