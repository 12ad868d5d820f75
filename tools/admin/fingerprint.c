/*
 * tools/admin/fingerprint.c - the version tag `index rebuild` stores with a
 * checkpoint: the mount's own (ckindex_fingerprint, fs/read/ckindex.c) over
 * the same metadata files (ckindex_pick of the directory's listing: the
 * .metadata, else every __R.metadata, else the Hugging Face files), so an
 * index built by either is reused by the other.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "admin.h"
#include "ckindex.h"
#include "store.h"

struct names {
    char **v;
    size_t n, cap;
};

static int add_name(void *arg, const char *name, int is_dir, uint64_t size)
{
    (void)size;
    struct names *ns = arg;
    if (is_dir || !ckindex_metadata_name(name))
        return 0;
    if (ns->n == ns->cap) {
        size_t cap = ns->cap ? 2 * ns->cap : 16;
        char **v = realloc(ns->v, cap * sizeof *v);
        if (!v)
            return -ENOMEM;
        ns->v = v;
        ns->cap = cap;
    }
    if (!(ns->v[ns->n] = strdup(name)))
        return -ENOMEM;
    ns->n++;
    return 0;
}

/* The store's attributes of path below src's root: 0 or -errno. */
static int stat_of(const struct admin_src *src, const char *path, struct store_stat *st)
{
    if (src->store)
        return src->store->ops->stat(src->store, path, st);
    return io_local_store_stat(src->root, path, st);
}

int admin_fingerprint(const struct admin_src *src, const char *dir, char *out, size_t len)
{
    struct names ns = {0};
    int rc = src->io.list(src->io.ctx, dir, add_name, &ns);
    struct ckindex_meta *meta = calloc(ns.n ? ns.n : 1, sizeof *meta);
    size_t *pick = calloc(ns.n ? ns.n : 1, sizeof *pick);
    size_t np = 0;
    if (!rc && (!meta || !pick))
        rc = -ENOMEM;
    for (size_t i = 0; !rc && i < ns.n; i++)
        meta[i].name = ns.v[i];
    if (!rc)
        np = ckindex_pick(meta, ns.n, pick);
    if (!rc && np == 0)
        rc = -ENOENT;
    struct ckindex_meta *picked = rc ? NULL : calloc(np, sizeof *picked);
    if (!rc && !picked)
        rc = -ENOMEM;
    for (size_t i = 0; !rc && i < np; i++) {
        char *path = ckpt_path_join(dir, meta[pick[i]].name);
        picked[i].name = meta[pick[i]].name;
        rc = path ? stat_of(src, path, &picked[i].st) : -ENOMEM;
        free(path);
    }
    if (!rc)
        ckindex_fingerprint(picked, np, out, len);
    free(picked);
    free(pick);
    free(meta);
    for (size_t i = 0; i < ns.n; i++)
        free(ns.v[i]);
    free(ns.v);
    return rc;
}
