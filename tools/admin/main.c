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
          "options (a value follows its option, or joins it after '='):\n"
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

/* Store v as the value of option name ("--cache-dir", ...); v NULL only
 * asks whether name takes one. 0, EX_USAGE (message printed) for a bad
 * count, -1 if name takes no value. */
static int set_value(struct admin_opts *o, const char *name, const char *v)
{
    static const char *const strs[] = {"--cache-dir", "--endpoint-url", "--region", "--profile"};
    const char **sdst[] = {&o->cache_dir, &o->endpoint_url, &o->region, &o->profile};
    static const char *const nums[] = {"--next", "--lookups", "--count"};
    long *ndst[] = {&o->next, &o->lookups, &o->count};
    for (size_t i = 0; i < sizeof(strs) / sizeof(strs[0]); i++)
        if (strcmp(name, strs[i]) == 0) {
            *sdst[i] = v ? v : *sdst[i];
            return 0;
        }
    for (size_t i = 0; i < sizeof(nums) / sizeof(nums[0]); i++) {
        if (strcmp(name, nums[i]) != 0)
            continue;
        char *end = NULL;
        if (v)
            *ndst[i] = strtol(v, &end, 10);
        if (v && (!*v || *end || *ndst[i] < 0)) {
            return usage_error(o, "%s wants a count", name);
        }
        return 0;
    }
    return -1;
}

/* --watch [SECONDS] or --watch=SECONDS at argv[*i] (v: the "=" value or
 * NULL); the interval is optional, taken when the next argument is a number.
 * 0 or EX_USAGE (message printed). */
static int watch_opt(struct admin_opts *o, const char *v, int argc, char **argv, int *i)
{
    char *end = NULL;
    if (!v && *i + 1 < argc) {
        strtod(argv[*i + 1], &end);
        if (end != argv[*i + 1] && *end == '\0')
            v = argv[++*i];
    }
    o->watch = v ? strtod(v, &end) : 1.0;
    if ((v && *end) || !(o->watch > 0) || o->watch > 86400) {
        return usage_error(o, "--watch wants seconds > 0");
    }
    return 0;
}

/* The option at argv[*i] (a long option's value as "--opt VALUE" or
 * "--opt=VALUE", like getopt_long). -1 to go on, else the exit code. */
static int parse_opt(struct admin_opts *o, int argc, char **argv, int *i)
{
    const char *a = argv[*i], *eq = strncmp(a, "--", 2) == 0 ? strchr(a, '=') : NULL;
    char name[32];
    snprintf(name, sizeof(name), "%.*s", eq ? (int)(eq - a) : (int)strlen(a), a);
    if (strcmp(a, "--json") == 0) {
        o->json = 1;
    } else if (strcmp(a, "--hash") == 0) {
        o->hash = 1;
    } else if (strcmp(a, "-q") == 0 || strcmp(a, "--quiet") == 0) {
        o->quiet = 1;
    } else if (strcmp(a, "--force-path-style") == 0) {
        o->force_path_style = 1;
    } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
        usage(stdout);
        return EX_OK;
    } else if (strcmp(a, "-V") == 0 || strcmp(a, "--version") == 0) {
        printf("ckptfs-admin %s\n", CKPTFS_VERSION);
        return EX_OK;
    } else if (strcmp(name, "--watch") == 0) {
        return watch_opt(o, eq ? eq + 1 : NULL, argc, argv, i) ? EX_USAGE : -1;
    } else if (set_value(o, name, NULL) == 0) {
        const char *v = eq ? eq + 1 : *i + 1 < argc ? argv[++*i] : NULL;
        if (!v) {
            return usage_error(o, "%s needs a value", a);
        }
        return set_value(o, name, v) ? EX_USAGE : -1;
    } else {
        return usage_error(o, "unknown option %s (see --help)", a);
    }
    return -1;
}

int main(int argc, char **argv)
{
    struct admin_opts o;
    memset(&o, 0, sizeof(o));
    char **pos = calloc((size_t)argc + 1, sizeof(char *));
    if (!pos)
        return EX_IO;
    int npos = 0;
    /* --json anywhere (before "--") asks for JSON usage errors too, also
     * for an error met before the option parser reaches it */
    for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
        o.json |= strcmp(argv[i], "--json") == 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) {
            while (++i < argc)
                pos[npos++] = argv[i];
        } else if (a[0] == '-' && a[1]) {
            int ex = parse_opt(&o, argc, argv, &i);
            if (ex >= 0) {
                free(pos);
                return ex;
            }
        } else {
            pos[npos++] = argv[i];
        }
    }
    if (npos == 0) {
        usage(stderr);
        free(pos);
        return o.json ? usage_error(&o, "no verb (see --help)") : EX_USAGE;
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
    if (ex < 0)
        ex = usage_error(&o, "unknown verb '%s' (see --help)", pos[0]);
    free(pos);
    fflush(stdout);
    return ex;
}
