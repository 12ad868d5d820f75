/*
 * fs/core/attr.c - how an entry shows to the kernel: the mount's struct
 * stat of a store's or staging's answer (modes, owner, times, the size an
 * open handle keeps), store paths from mount paths, and the attributes set
 * through the mount (chmod, chown, utimens: docs/semantics.md, "Modes,
 * owners and times"), kept per object version in the metadata cache
 * (setattr.c sets them).
 */
#include "core_internal.h"

#include <errno.h>
#include <string.h>
#include <time.h>

const char *core_store_path(const char *path)
{
    while (*path == '/')
        path++;
    return path;
}

/* Attributes of store path spath as the mount shows them, from s (the
 * store's or staging's answer). A directory shows this mount's last change
 * to it if that is later than s's time (dirtime.h). */
void core_to_stat(const struct core *core, const char *spath, const struct store_stat *s,
                  struct stat *st)
{
    memset(st, 0, sizeof *st);
    int64_t mtime = s->mtime_ns;
    if (s->is_dir) {
        st->st_mode = S_IFDIR | (core->stage ? 0755 : 0555);
        st->st_nlink = 2;
        int64_t changed = dirtime_get(core->dirtimes, spath);
        if (changed > mtime)
            mtime = changed;
    } else {
        st->st_mode = S_IFREG | (core->stage ? 0644 : 0444);
        st->st_nlink = 1;
        st->st_size = (off_t)s->size;
        st->st_blocks = (blkcnt_t)((s->size + 511) / 512);
    }
    st->st_blksize = (blksize_t)PREFERRED_IO_SIZE;
    st->st_uid = core->uid;
    st->st_gid = core->gid;
    const struct store_attrs *a = &s->attrs;
    if (!s->is_dir && store_attrs_is_link(a)) /* a symlink: its size is its target's length */
        st->st_mode = S_IFLNK | 0777;
    else if (a->set & STORE_ATTR_MODE) /* the type stays the store's: a file or a directory */
        st->st_mode = (st->st_mode & S_IFMT) | (a->mode & 07777 & (core->stage ? 07777 : 07555));
    if (a->set & STORE_ATTR_UID)
        st->st_uid = (uid_t)a->uid;
    if (a->set & STORE_ATTR_GID)
        st->st_gid = (gid_t)a->gid;
    if (a->set & STORE_ATTR_MTIME)
        mtime = a->mtime_ns;
    st->st_mtim.tv_sec = (time_t)(mtime / 1000000000);
    st->st_mtim.tv_nsec = (long)(mtime % 1000000000);
    st->st_ctim = st->st_atim = st->st_mtim;
}

/* An open file keeps the version it opened, and the kernel keeps one size
 * per path (its GETATTR of an fstat carries no handle): while the newest
 * open handle of spath has another version than the store's s, report that
 * version's size, so that the kernel does not cut the open file's reads
 * short; the store's version shows once it is closed or newer opened. A file
 * being written on this mount (staged) shows as staging has it, and once
 * this mount has published a newer version its older handles no longer
 * count (superseded): a rewrite through the mount shows its size to every
 * new reader, as on a local disk. Lookups and listings (readdirplus sets
 * sizes too) both pass through here. */
void core_keep_opened_size(struct core *core, const char *spath, struct store_stat *s)
{
    int found = 0;
    uint64_t size = 0;
    pthread_mutex_lock(&core->files_lock);
    for (struct core_file *f = core->files; f; f = f->next) /* newest first */
        if (f->obj && !f->superseded && strcmp(cache_obj_path(f->obj), spath) == 0) {
            found = strcmp(cache_obj_etag(f->obj), s->etag) != 0;
            size = cache_obj_size(f->obj);
            break;
        }
    pthread_mutex_unlock(&core->files_lock);
    if (found && !(core->stage && stage_stat(core->stage, spath, &(struct store_stat){0})))
        s->size = size;
}

/* A directory that holds staged files shows the later of its staged files'
 * times and what the metadata cache knows of its time on the store. */
void core_staged_dir_time(struct core *core, const char *spath, struct store_stat *st)
{
    struct store_stat known;
    int err;
    if (st->is_dir && meta_find(&core->meta, spath, &err, &known) == META_FRESH && err == 0 &&
        known.mtime_ns > st->mtime_ns)
        st->mtime_ns = known.mtime_ns;
    if (st->is_dir)
        meta_get_attrs(&core->meta, spath, st, &st->attrs);
}

int core_attrs_exact(const struct core *core)
{
    return core->cfg.attrs_exact && core->store->ops->get_attrs;
}

int core_attrs_unknown_link(struct core *core, const char *spath, const struct store_stat *s)
{
    if (s->is_dir || !s->etag[0] || (s->attrs.set & STORE_ATTR_READ) ||
        !core->store->ops->get_attrs || !store_may_be_link(spath, s->size))
        return 0;
    struct store_attrs a;
    return !meta_get_attrs(&core->meta, spath, s, &a);
}

/* The attributes of spath (store answer s) the mount knows: those the
 * metadata cache keeps for s's version, else the store's (one HEAD per
 * version, then kept) with --attrs=exact, or for an object that may be a
 * symlink (store_may_be_link: docs/semantics.md, "Symbolic links"). */
void core_known_attrs(struct core *core, const char *spath, struct store_stat *s)
{
    if ((s->attrs.set & STORE_ATTR_READ) || (!s->is_dir && !s->etag[0]))
        return; /* known, or a staged file (its attributes are staging's) */
    if (meta_get_attrs(&core->meta, spath, s, &s->attrs))
        return;
    if (!core_attrs_exact(core) &&
        (s->is_dir || !core->store->ops->get_attrs || !store_may_be_link(spath, s->size)))
        return;
    struct store_attrs a;
    char etag[STORE_ETAG_MAX];
    if (core->store->ops->get_attrs(core->store, spath, s->is_dir, &a, etag) < 0)
        return;
    if (!s->is_dir && strcmp(etag, s->etag) != 0)
        return; /* another version meanwhile: its attributes are not s's */
    s->attrs = a;
    meta_set_attrs(&core->meta, spath, s, &a);
}
