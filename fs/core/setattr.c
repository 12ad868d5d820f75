/*
 * fs/core/setattr.c - chmod, chown, utimens (docs/semantics.md §13): the
 * attributes a call sets go to the staged file (sent with its upload) or to
 * the store at once (store.h's set_attrs, no bytes sent again), and into the
 * metadata cache marked as this mount's; and a directory's time this mount
 * set is kept while uploads land in it.
 */
#include "core_internal.h"

#include <errno.h>
#include <string.h>

/* a's set fields over known's (attributes replace, on the store, all earlier ones). */
static struct store_attrs merged(const struct store_attrs *known, const struct store_attrs *a)
{
    struct store_attrs m = *known;
    m.set &= ~(STORE_ATTR_READ | META_ATTRS_SET_HERE);
    if (a->set & STORE_ATTR_MODE)
        m.mode = a->mode;
    if (a->set & STORE_ATTR_UID)
        m.uid = a->uid;
    if (a->set & STORE_ATTR_GID)
        m.gid = a->gid;
    if (a->set & STORE_ATTR_MTIME)
        m.mtime_ns = a->mtime_ns;
    m.set |= a->set & ~STORE_ATTR_READ;
    return m;
}

int core_setattr(struct core *core, const char *path, struct core_file *f,
                 const struct store_attrs *a)
{
    if (!path)
        return 0; /* an unlinked open file whose upload is done: nothing to keep them on */
    const char *spath = core_store_path(path);
    if (f && f->wf && stage_set_attrs_wf(core->stage, f->wf, a))
        return 0; /* kept with the staged file, sent with its upload */
    if (!(f && f->wf) && core->stage && stage_set_attrs(core->stage, spath, a))
        return 0;
    struct store_stat s;
    int rc = core_lookup(core, spath, &s);
    if (rc < 0)
        return rc;
    if (!core->stage)
        return -EROFS;
    struct store *store = core->store;
    if (!store->ops->set_attrs)
        return 0; /* a store that keeps none: accepted, as before */
    if (!(s.attrs.set & STORE_ATTR_READ) && !meta_get_attrs(&core->meta, spath, &s, &s.attrs) &&
        store->ops->get_attrs) {
        /* Learn the attributes set before (by another mount), so that those
         * not set now are kept: one HEAD. */
        char etag[STORE_ETAG_MAX];
        struct store_attrs known;
        if (store->ops->get_attrs(store, spath, s.is_dir, &known, etag) == 0)
            s.attrs = known;
    }
    struct store_attrs m = merged(&s.attrs, a);
    if (!s.is_dir && !(m.set & STORE_ATTR_MTIME) && s.mtime_ns) {
        /* A copy gets a new LastModified: keep the file's time (chmod and
         * chown do not change it). A directory's time stays its newest
         * entry's (§10) unless one is set. */
        m.set |= STORE_ATTR_MTIME;
        m.mtime_ns = s.mtime_ns;
    }
    char etag[STORE_ETAG_MAX];
    rc = store->ops->set_attrs(store, spath, s.is_dir, s.etag, s.size, &m, etag);
    if (rc < 0)
        return rc;
    m.set |= STORE_ATTR_READ | META_ATTRS_SET_HERE;
    s.attrs = m;
    if (etag[0])
        memcpy(s.etag, etag, STORE_ETAG_MAX);
    if (m.set & STORE_ATTR_MTIME)
        s.mtime_ns = m.mtime_ns;
    meta_put(&core->meta, spath, 0, &s, 0);
    return 0;
}

void core_dir_entry_changed(struct core *core, const char *dir)
{
    struct store_stat d = {.is_dir = 1};
    struct store_attrs a;
    if (meta_get_attrs(&core->meta, dir, &d, &a) && (a.set & STORE_ATTR_MTIME)) {
        a.set &= ~STORE_ATTR_MTIME; /* changed since its time was set */
        meta_set_attrs(&core->meta, dir, &d, &a);
    }
}

void core_dir_published_in(struct core *core, const char *dir)
{
    struct store *s = core->store;
    struct store_stat d = {.is_dir = 1};
    struct store_attrs a;
    /* Only where directories are real (the local store, which can rename):
     * the upload's rename into dir moved its time; an S3 "dir/" marker
     * keeps its metadata. */
    if (!s->ops->rename || !s->ops->set_attrs || !*dir ||
        !meta_get_attrs(&core->meta, dir, &d, &a) || !(a.set & META_ATTRS_SET_HERE) ||
        !(a.set & STORE_ATTR_MTIME))
        return;
    struct store_attrs t = {.set = STORE_ATTR_MTIME, .mtime_ns = a.mtime_ns};
    char etag[STORE_ETAG_MAX];
    s->ops->set_attrs(s, dir, 1, "", 0, &t, etag);
}
