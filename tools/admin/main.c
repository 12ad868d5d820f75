/*
 * tools/admin/main.c - ckptfs-admin: inspect, verify and index checkpoints;
 * show a mount's statistics.
 *
 *   ckptfs-admin VERB ARGS... [--json] [options]
 *
 * A straight line: parse options -> pick the verb -> run it -> exit code.
 * Every verb prints a human table by default and one JSON document with
 * --json. See usage() for verbs and exit codes, docs/index.md for details.
 */
#include <stdlib.h>
#include <string.h>

#include "admin.h"

static void usage(FILE *f)
{
    fputs("usage: ckptfs-admin VERB ARGS... [--json]\n"
          "\n"
          "CKPT is a checkpoint directory (DCP .metadata, or Hugging Face safetensors) or one\n"
          "file in it (.metadata, *.safetensors, model.safetensors.index.json): a local path\n"
          "(a path on a ckptfs mount too) or s3://BUCKET/PREFIX[/FILE].\n"
          "\n"
          "verbs:\n"
          "  ls CKPT                 tensors (fqn, dtype, shape, chunks) and bytes entries\n"
          "  where CKPT FQN          file, offset and length of every chunk of FQN\n"
          "  inspect CKPT            per file: bytes, items, save order; replicated tensors;\n"
          "                          files each rank reads when loading at the same world size\n"
          "  verify CKPT             every file present, every item inside its file, no\n"
          "                          overlaps, item sizes consistent with the tensors\n"
          "  dump FILE|DIR [--hash]  everything parsed, as JSON (fixtures' expected schema);\n"
          "                          --hash adds SHA-256 of files and items\n"
          "  index rebuild STORE[/PATH]   find every checkpoint under the path, parse it and\n"
          "                          write the index (progress on stderr)\n"
          "  index ls                checkpoints in the index\n"
          "  index files CKPT        files the indexed checkpoint names (write-path check)\n"
          "  index at CKPT FILE OFFSET [--next N]\n"
          "                          the item holding byte OFFSET of FILE, and N items after\n"
          "                          it in layout order, answered from the index\n"
          "  stats MOUNTPOINT        a ckptfs mount's counters since it started: bytes read\n"
          "                          and fetched, requests by kind, hit rate, prefetched\n"
          "                          bytes never used, index and write state\n"
          "    --watch [SECONDS]     print rates per second every SECONDS (1) until\n"
          "                          interrupted (--json: one object per line)\n"
          "    --count N             stop --watch after N lines\n"
          "\n"
          "options:\n"
          "  --json                  one JSON document on stdout (errors: {\"error\": ...})\n"
          "  --cache-dir DIR         index location (default $XDG_CACHE_HOME/ckptfs or\n"
          "                          ~/.cache/ckptfs); the LMDB files live in DIR/index/\n"
          "  -q, --quiet             no progress output\n"
          "  --endpoint-url URL, --region R, --profile P, --force-path-style\n"
          "                          for s3:// URLs, as for the mount (credentials from\n"
          "                          AWS_* or ~/.aws, like the mount)\n"
          "  -h, --help              this text\n"
          "  -V, --version           print the version\n"
          "\n"
          "exit codes:\n"
          "  0  success\n"
          "  1  verify found problems / index rebuild: some checkpoints failed\n"
          "  2  usage error\n"
          "  3  malformed or invalid checkpoint metadata (pickle, DCP, safetensors)\n"
          "  4  I/O error: cannot read, list or find the checkpoint\n"
          "  5  index database error (including a schema version mismatch)\n"
          "  6  not found: no such FQN, or no item at that offset\n",
          f);
}

/* Does option a take the next argument as its value? */
static int takes_value(const char *a)
{
    static const char *const opts[] = {"--cache-dir",    "--next",   "--lookups", "--count",
                                       "--endpoint-url", "--region", "--profile"};
    for (size_t i = 0; i < sizeof(opts) / sizeof(opts[0]); i++)
        if (strcmp(a, opts[i]) == 0)
            return 1;
    return 0;
}

int main(int argc, char **argv)
{
    struct admin_opts o;
    memset(&o, 0, sizeof(o));
    char **pos = calloc((size_t)argc + 1, sizeof(char *));
    if (!pos)
        return EX_IO;
    int npos = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--json") == 0) {
            o.json = 1;
        } else if (strcmp(a, "--hash") == 0) {
            o.hash = 1;
        } else if (strcmp(a, "-q") == 0 || strcmp(a, "--quiet") == 0) {
            o.quiet = 1;
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            free(pos);
            return EX_OK;
        } else if (strcmp(a, "-V") == 0 || strcmp(a, "--version") == 0) {
            printf("ckptfs-admin %s\n", CKPTFS_VERSION);
            free(pos);
            return EX_OK;
        } else if (takes_value(a) && i + 1 >= argc) {
            fprintf(stderr, "ckptfs-admin: %s needs a value\n", a);
            free(pos);
            return EX_USAGE;
        } else if (strcmp(a, "--watch") == 0 || strncmp(a, "--watch=", 8) == 0) {
            /* The interval is optional: taken when the next argument is a number. */
            const char *v = a[7] == '=' ? a + 8 : NULL;
            char *end = NULL;
            if (!v && i + 1 < argc) {
                strtod(argv[i + 1], &end);
                if (end != argv[i + 1] && *end == '\0')
                    v = argv[++i];
            }
            o.watch = v ? strtod(v, &end) : 1.0;
            if ((v && *end) || !(o.watch > 0) || o.watch > 86400) {
                fprintf(stderr, "ckptfs-admin: --watch wants seconds > 0\n");
                free(pos);
                return EX_USAGE;
            }
        } else if (strcmp(a, "--cache-dir") == 0 || strcmp(a, "--next") == 0 ||
                   strcmp(a, "--lookups") == 0 || strcmp(a, "--count") == 0) {
            if (a[2] == 'c' && a[3] == 'a') {
                o.cache_dir = argv[++i];
            } else {
                char *end;
                long *dst = a[2] == 'n' ? &o.next : a[2] == 'l' ? &o.lookups : &o.count;
                *dst = strtol(argv[++i], &end, 10);
                if (*end || *dst < 0) {
                    fprintf(stderr, "ckptfs-admin: %s wants a count\n", a);
                    free(pos);
                    return EX_USAGE;
                }
            }
        } else if (strcmp(a, "--endpoint-url") == 0 || strcmp(a, "--region") == 0 ||
                   strcmp(a, "--profile") == 0) {
            const char **dst = a[2] == 'e' ? &o.endpoint_url : a[2] == 'r' ? &o.region : &o.profile;
            *dst = argv[++i];
        } else if (strcmp(a, "--force-path-style") == 0) {
            o.force_path_style = 1;
        } else if (strncmp(a, "--cache-dir=", 12) == 0) {
            o.cache_dir = a + 12;
        } else if (a[0] == '-' && a[1] && strcmp(a, "--") != 0) {
            fprintf(stderr, "ckptfs-admin: unknown option %s (see --help)\n", a);
            free(pos);
            return EX_USAGE;
        } else if (strcmp(a, "--") == 0) {
            while (++i < argc)
                pos[npos++] = argv[i];
        } else {
            pos[npos++] = argv[i];
        }
    }
    if (npos == 0) {
        usage(stderr);
        free(pos);
        return EX_USAGE;
    }
    static const struct {
        const char *name;
        int (*fn)(struct admin_opts *);
    } verbs[] = {{"ls", cmd_ls},           {"where", cmd_where},   {"dump", cmd_dump},
                 {"inspect", cmd_inspect}, {"verify", cmd_verify}, {"index", cmd_index},
                 {"stats", cmd_stats}};
    int ex = -1;
    o.argc = npos - 1;
    o.argv = pos + 1;
    for (size_t v = 0; v < sizeof(verbs) / sizeof(verbs[0]); v++)
        if (strcmp(pos[0], verbs[v].name) == 0)
            ex = verbs[v].fn(&o);
    if (ex < 0) {
        fprintf(stderr, "ckptfs-admin: unknown verb '%s' (see --help)\n", pos[0]);
        ex = EX_USAGE;
    }
    free(pos);
    fflush(stdout);
    return ex;
}
