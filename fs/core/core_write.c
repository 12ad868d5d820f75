/*
 * fs/core/core_write.c - the core's calls that change files and names (see
 * core.h): create, open for writing, write, truncate, close and fsync,
 * unlink, mkdir, rmdir, rename, sync, symlink and readlink. Bytes and
 * uploads are the staging area's business (stage.h); this file decides what
 * each call means for the store and the namespace, and keeps the metadata
 * cache in step.
 */
#include "clock.h"
#include "core_internal.h"

#include "log.h"
#include "strutil.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0)
#endif
#ifndef RENAME_EXCHANGE
#define RENAME_EXCHANGE (1 << 1)
#endif

int core_writable(const struct core *core)
{
    return core->stage != NULL;
}

/* The parent of spath exists as a directory: 0, -ENOENT or -ENOTDIR. */
static int check_parent(struct core *core, const char *spath)
{
    if (!strchr(spath, '/'))
        return 0; /* in the root */
    char dir[4096];
    struct store_stat st;
    int rc = path_dir(spath, dir, sizeof dir);
    if (rc == 0)
        rc = core_lookup(core, dir, &st);
    return rc < 0 ? rc : st.is_dir ? 0 : -ENOTDIR;
}

/* 0 if the store can hold an object named spath (else -ENAMETOOLONG or
 * -EINVAL, at create or rename rather than at every upload). */
static int check_name(struct core *core, const char *spath)
{
    struct store *s = core->store;
    return s->ops->check_name ? s->ops->check_name(s, spath) : 0;
}

/* A new file or link may be made at spath: its name fits the store and its
 * parent is a directory (0, or check_name's or check_parent's error). */
static int check_new_entry(struct core *core, const char *spath)
{
    int rc = check_name(core, spath);
    return rc < 0 ? rc : check_parent(core, spath);
}

/* The store path of path, for a change the root cannot take: 0 with *spath
 * set, -EROFS on a mount that does not write, or root_err for the root. */
static int dir_change_path(struct core *core, const char *path, int root_err, const char **spath)
{
    if (!core->stage)
        return -EROFS;
    *spath = core_store_path(path);
    return **spath ? 0 : root_err;
}

/* An entry was created, removed or renamed at spath: its directory changed
 * now (POSIX; the store may not show it, dirtime.h). */
static void entry_changed(struct core *core, const char *spath)
{
    char dir[4096];
    if (path_dir(spath, dir, sizeof dir) == 0) {
        dirtime_touch(core->dirtimes, dir, wall_ns());
        core_dir_entry_changed(core, dir); /* issue #18: a time set on dir no longer holds */
    }
}

int core_create_file(struct core *core, const char *path, int flags, struct core_file **out)
{
    (void)flags;
    if (!core->stage)
        return -EROFS;
    const char *spath = core_store_path(path);
    int rc = check_new_entry(core, spath);
    if (rc < 0)
        return rc;
    struct wfile *wf;
    rc = stage_create(core->stage, spath, &wf);
    if (rc < 0)
        return rc;
    entry_changed(core, spath);
    char dir[4096];
    if (path_dir(spath, dir, sizeof dir) == 0)
        core_keep_listing(core, dir); /* a save: its next files' lookups cost nothing */
    return core_file_staged(core, wf, 1, out);
}

/* wf, just staged from the object at spath (st: its store stat), keeps that
 * object's mode and owner (issue #18): a rewrite or a rename is not a new file. */
static void keep_mode_and_owner(struct core *core, const char *spath, struct store_stat *st,
                                struct wfile *wf)
{
    core_known_attrs(core, spath, st);
    st->attrs.set &= STORE_ATTR_MODE | STORE_ATTR_UID | STORE_ATTR_GID;
    if (store_attrs_is_link(&st->attrs))
        st->attrs.set &= ~STORE_ATTR_MODE; /* a file now, not a link */
    if (st->attrs.set)
        stage_set_attrs_wf(core->stage, wf, &st->attrs);
}

int core_open_write(struct core *core, const char *spath, int flags, struct core_file **out)
{
    if (!core->stage)
        return -EROFS;
    struct wfile *wf = stage_get(core->stage, spath);
    if (!wf) {
        struct store_stat st;
        int rc = core_lookup_store(core, spath, &st);
        if (rc < 0)
            return rc;
        if (st.is_dir)
            return -EISDIR;
        /* O_TRUNC: a new, empty file replaces the object once published;
         * otherwise the object's bytes are copied to staging to be changed. */
        rc = flags & O_TRUNC ? stage_create(core->stage, spath, &wf)
                             : stage_adopt(core->stage, spath, st.etag, st.size, st.size, &wf);
        if (rc < 0)
            return rc;
        flags &= ~O_TRUNC;
        keep_mode_and_owner(core, spath, &st, wf);
    }
    struct core_file *f;
    int rc = core_file_staged(core, wf, 1, &f);
    if (rc < 0)
        return rc;
    if (flags & O_TRUNC)
        rc = stage_truncate(core->stage, f->wf, 0);
    if (rc < 0) {
        core_file_release(core, f, 0);
        return rc;
    }
    *out = f;
    return 0;
}

ssize_t core_write(struct core *core, struct core_file *f, const void *buf, size_t len,
                   uint64_t off)
{
    if (!f->wf || !f->writable)
        return -EBADF;
    return stage_write(core->stage, f->wf, buf, len, off);
}

int core_write_begin(struct core *core, struct core_file *f, uint64_t off, size_t len)
{
    if (!f->wf || !f->writable)
        return -EBADF;
    return stage_write_begin(core->stage, f->wf, off, len);
}

void core_write_end(struct core *core, struct core_file *f, uint64_t off, size_t len,
                    ssize_t written)
{
    stage_write_end(core->stage, f->wf, off, len, written);
}

int core_truncate(struct core *core, const char *path, struct core_file *f, uint64_t size)
{
    if (!core->stage)
        return -EROFS;
    if (f && f->wf)
        return stage_truncate(core->stage, f->wf, size);
    const char *spath = core_store_path(path);
    struct wfile *wf = stage_get(core->stage, spath);
    if (!wf) {
        struct store_stat st;
        int rc = core_lookup_store(core, spath, &st);
        if (rc < 0)
            return rc;
        if (st.is_dir)
            return -EISDIR;
        rc =
            stage_adopt(core->stage, spath, st.etag, st.size, size < st.size ? size : st.size, &wf);
        if (rc < 0)
            return rc;
        keep_mode_and_owner(core, spath, &st, wf);
    }
    int rc = stage_truncate(core->stage, wf, size);
    stage_put(core->stage, wf);
    return rc;
}

/* The process (thread group) of a thread, from /proc; the thread's own id
 * if that cannot be read (it is gone, or in no namespace we see). */
static pid_t process_of(pid_t thread)
{
    char path[48], line[128];
    snprintf(path, sizeof path, "/proc/%d/status", (int)thread);
    FILE *f = fopen(path, "re");
    if (!f)
        return thread;
    pid_t process = thread;
    int n;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "Tgid: %d", &n) == 1) {
            process = n;
            break;
        }
    fclose(f);
    return process;
}

void core_file_set_opener(struct core_file *f, pid_t thread)
{
    f->opener_thread = thread;
    f->opener = thread > 0 ? process_of(thread) : 0;
}

int core_flush(struct core *core, struct core_file *f, pid_t thread)
{
    /* The opening thread closes, as a trainer's save does: no /proc read. */
    if (f->opener && thread > 0 && thread != f->opener_thread && process_of(thread) != f->opener)
        return 0; /* e.g. a child exiting with an inherited descriptor mid-write */
    return f->wf && f->writable ? stage_flush(core->stage, f->wf) : 0;
}

int core_fsync(struct core *core, struct core_file *f)
{
    /* A read-only handle wrote nothing: its fsync must not publish what
     * another handle is in the middle of writing. */
    return f->wf && f->writable ? stage_fsync(core->stage, f->wf) : 0;
}

/* Remove spath's object from the store if the store has one. 0 if it was
 * removed or there was none. */
static int remove_from_store(struct core *core, const char *spath)
{
    struct store_stat st;
    int rc = core_lookup_store(core, spath, &st);
    if (rc == -ENOENT)
        return 0;
    if (rc == 0 && st.is_dir)
        return -EISDIR;
    if (rc == 0)
        rc = core->store->ops->remove(core->store, spath);
    if (rc == 0 || rc == -ENOENT)
        meta_put(&core->meta, spath, -ENOENT, NULL, 0);
    return rc == -ENOENT ? 0 : rc;
}

int core_unlink(struct core *core, const char *path)
{
    if (!core->stage)
        return -EROFS;
    const char *spath = core_store_path(path);
    struct store_stat st;
    int rc = core_lookup(core, spath, &st);
    if (rc < 0)
        return rc;
    if (st.is_dir)
        return -EISDIR;
    if (stage_unlink(core->stage, spath) == 0) {
        /* Staged: what the metadata cache says of the store may predate an
         * upload; ask the store to remove whatever it has there. */
        rc = core->store->ops->remove(core->store, spath);
        if (rc == -ENOENT)
            rc = 0;
    } else {
        rc = remove_from_store(core, spath);
    }
    meta_put(&core->meta, spath, -ENOENT, NULL, 0);
    if (rc == 0)
        entry_changed(core, spath);
    return rc;
}

int core_mkdir(struct core *core, const char *path)
{
    const char *spath;
    int rc = dir_change_path(core, path, -EEXIST, &spath);
    if (rc == 0)
        rc = check_parent(core, spath);
    if (rc < 0)
        return rc;
    struct store_stat st;
    rc = core_lookup(core, spath, &st);
    if (rc == 0)
        return -EEXIST;
    if (rc != -ENOENT)
        return rc;
    /* A real directory on the local store, a "dir/" marker on S3: either way
     * every mount of the store sees it (DCP's coordinator makes the
     * checkpoint directory and the other nodes' ranks write into it). */
    rc = core->store->ops->mkdir(core->store, spath);
    if (rc == 0) {
        struct store_stat dir = {.is_dir = 1, .mtime_ns = wall_ns()};
        meta_put(&core->meta, spath, 0, &dir, 0);
        core_listing_made(core, spath);
        core_keep_listing(core, spath); /* made to be written into (a save's directory) */
        entry_changed(core, spath);
    }
    return rc;
}

int core_rmdir(struct core *core, const char *path)
{
    const char *spath;
    struct store_stat st;
    int rc = dir_change_path(core, path, -EBUSY, &spath);
    if (rc == 0)
        rc = core_lookup(core, spath, &st);
    if (rc < 0)
        return rc;
    if (!st.is_dir)
        return -ENOTDIR;
    if (stage_busy_below(core->stage, spath))
        return -ENOTEMPTY;
    rc = core->store->ops->rmdir(core->store, spath);
    if (rc == 0) {
        meta_forget_below(&core->meta, spath); /* its listing mark too */
        meta_put(&core->meta, spath, -ENOENT, NULL, 0);
        dirtime_forget_below(core->dirtimes, spath);
        entry_changed(core, spath);
    }
    return rc;
}

/* A listing callback that notes there is at least one entry. */
static int any_entry(void *arg, const char *name, const struct store_stat *st)
{
    (void)name;
    (void)st;
    *(int *)arg = 1;
    return 1; /* one is enough */
}

/* 1 if anything below directory dir is on the store, 0 if nothing, or a
 * negative errno. */
static int stored_below(struct core *core, const char *dir)
{
    int any = 0;
    int rc = core->store->ops->list(core->store, dir, any_entry, &any);
    return rc < 0 && rc != -ENOENT ? rc : any;
}

/* Rename a directory: the store renames it if it can (a local directory),
 * after what is staged below it is on the store. On a store of keys (S3)
 * a directory with nothing of it on the store yet moves in staging (and its
 * marker); one with objects on the store is copied server-side, commit files
 * last, then the old keys are deleted (stage_rename_stored_dir, journaled;
 * docs/semantics.md, "Renaming a directory on the store"): rename blocks
 * until that is done; -EXDEV above --rename-dir-max-objects. */
static int rename_dir(struct core *core, const char *sfrom, const char *sto, int to_existed)
{
    if (core->store->ops->rename) {
        int rc = stage_sync(core->stage, sfrom);
        if (rc == 0)
            rc = core->store->ops->rename(core->store, sfrom, sto);
        if (rc == 0)
            rc = stage_rename_dir(core->stage, sfrom, sto);
        return rc;
    }
    int rc = stored_below(core, sfrom);
    if (rc < 0)
        return rc;
    if (rc > 0) {
        /* Whatever is staged below reaches the store first: the copies then
         * see every file, and a staged .metadata waits for its shards. */
        rc = stage_sync(core->stage, sfrom);
        if (rc == 0)
            rc = stage_rename_stored_dir(core->stage, sfrom, sto, to_existed);
        if (rc == 0)
            rc = stage_rename_dir(core->stage, sfrom, sto); /* files still open */
        return rc;
    }
    rc = stage_rename_dir(core->stage, sfrom, sto);
    if (rc == 0 && core->store->ops->mkdir && core->store->ops->rmdir) {
        /* Its marker moves too (nothing else of it is on the store): the new
         * name first, so the directory is never missing. */
        rc = core->store->ops->mkdir(core->store, sto);
        if (rc == 0 || rc == -EEXIST)
            rc = core->store->ops->rmdir(core->store, sfrom);
        if (rc == -ENOENT)
            rc = 0;
    }
    return rc;
}

/* A directory renamed onto directory sto replaces it if it is empty (as
 * rename(2) does): 0, or -ENOTEMPTY if something is there, on the store or
 * staged. A store that renames directories replaces the empty one itself;
 * on a store of keys, sto's marker stays and the moved names appear below
 * it. */
static int replace_empty_dir(struct core *core, const char *sto)
{
    if (stage_busy_below(core->stage, sto))
        return -ENOTEMPTY;
    int rc = stored_below(core, sto);
    return rc > 0 ? -ENOTEMPTY : rc;
}

/* Rename an object that is on the store (not staged). */
static int rename_stored(struct core *core, const char *sfrom, const struct store_stat *st,
                         const char *sto)
{
    struct store *s = core->store;
    stage_unlink(core->stage, sto); /* a staged file there is replaced */
    if (is_commit_name(path_base(sto))) {
        /* Becoming a .metadata: it must wait for the files it names, like
         * any staged one. Stage it (a copy of its bytes) under the new name. */
        struct wfile *wf;
        int rc = stage_adopt(core->stage, sfrom, st->etag, st->size, st->size, &wf);
        if (rc == 0) {
            struct store_stat kept = *st;
            keep_mode_and_owner(core, sfrom, &kept, wf); /* rename keeps them (issue #18) */
            rc = stage_rename(core->stage, sfrom, sto);
            stage_put(core->stage, wf);
        }
        if (rc == 0)
            rc = remove_from_store(core, sfrom);
        return rc;
    }
    if (s->ops->rename)
        return s->ops->rename(s, sfrom, sto);
    char etag[STORE_ETAG_MAX];
    stage_wait_sweep(core->stage, sto); /* a large copy is a multipart upload to sto */
    int rc = s->ops->copy(s, sfrom, st->etag, st->size, sto, etag);
    if (rc == 0) {
        /* sto's entry is the store's answer for the copy (size, etag and,
         * issue #18, the attributes it carried over), not st: st may be an
         * older answer (a listing's, taken while sfrom was being replaced)
         * that only the copy's If-Match would catch, which not every store
         * checks. */
        struct store_stat ns;
        if (s->ops->stat(s, sto, &ns) == 0 && !ns.is_dir)
            meta_put(&core->meta, sto, 0, &ns, 0);
        else
            meta_forget(&core->meta, sto);
        rc = s->ops->remove(s, sfrom);
        if (rc == -ENOENT)
            rc = 0;
    }
    return rc;
}

int core_rename(struct core *core, const char *from, const char *to, unsigned flags)
{
    if (flags & ~(unsigned)RENAME_NOREPLACE)
        return -EINVAL; /* RENAME_EXCHANGE, RENAME_WHITEOUT */
    if (!core->stage)
        return -EROFS;
    const char *sfrom = core_store_path(from), *sto = core_store_path(to);
    struct store_stat sf, stt;
    int copied = 0; /* sto's entry is already right: a stored file copied there, or staged */
    int rc = core_lookup(core, sfrom, &sf);
    if (rc < 0)
        return rc;
    int to_rc = core_lookup(core, sto, &stt);
    if (to_rc < 0 && to_rc != -ENOENT)
        return to_rc;
    if (to_rc == 0 && (flags & RENAME_NOREPLACE))
        return -EEXIST;
    if (!sf.is_dir && (rc = check_name(core, sto)) < 0)
        return rc;
    if ((rc = check_parent(core, sto)) < 0)
        return rc;
    if (sf.is_dir) {
        if (to_rc == 0 && !stt.is_dir)
            return -ENOTDIR;
        if (to_rc == 0 && (rc = replace_empty_dir(core, sto)) < 0)
            return rc;
        rc = rename_dir(core, sfrom, sto, to_rc == 0);
    } else if (to_rc == 0 && stt.is_dir) {
        return -EISDIR;
    } else {
        struct wfile *wf = stage_get(core->stage, sfrom);
        if (wf) {
            /* Forget sto's entry now: its upload may land (and put its entry,
             * with its attributes) before the rename returns (issue #18). */
            meta_forget(&core->meta, sto);
            copied = 1;
            /* wf stays held across the rename: let go before it, a clean
             * file could leave staging (its last reference) in between, and
             * the rename would find no sfrom (rsync saw ENOENT). */
            rc = stage_rename(core->stage, sfrom, sto);
            stage_put(core->stage, wf);
            /* Whether sfrom is on the store is asked only now: stage_rename
             * waited for the file's requests in flight, and an upload under
             * sfrom may have landed (and been published there) before the
             * rename took the name. Asked before, that object was left
             * behind under the old name, with the old bytes. */
            struct store_stat old;
            if (rc == 0 && core_lookup_store(core, sfrom, &old) == 0 && !old.is_dir)
                rc = remove_from_store(core, sfrom);
        } else {
            /* Not staged now. An entry with no etag was staged when looked
             * up and has left staging since (uploaded, so on the store):
             * rename what the store has. */
            rc = sf.etag[0] ? 0 : core_lookup_store(core, sfrom, &sf);
            if (rc == 0)
                rc = rename_stored(core, sfrom, &sf, sto);
            copied = !core->store->ops->rename && !is_commit_name(path_base(sto));
        }
    }
    if (rc == 0) {
        if (sf.is_dir) { /* every name below both changed */
            meta_forget_below(&core->meta, sfrom);
            meta_forget_below(&core->meta, sto);
            dirtime_forget_below(core->dirtimes, sfrom);
        }
        entry_changed(core, sfrom);
        entry_changed(core, sto);
        meta_put(&core->meta, sfrom, -ENOENT, NULL, 0);
        if (!copied)
            meta_forget(&core->meta, sto);
        /* else (issue #18) keep what rename_stored put for sto (the copy
         * carries the attributes: S3's COPY directive), or its upload did */
        char dir[4096];
        if (path_dir(sto, dir, sizeof dir) == 0)
            core_listing_changed(core, dir); /* sto is on the store now, or staged */
    }
    return rc;
}

int core_sync(struct core *core, const char *path)
{
    return core->stage ? stage_sync(core->stage, core_store_path(path)) : 0;
}

unsigned core_name_max(const struct core *core)
{
    return core->store->ops->name_max ? core->store->ops->name_max : 1024;
}

void core_space(struct core *core, uint64_t *total, uint64_t *used)
{
    *total = *used = 0;
    if (core->stage) {
        struct stage_stats ws;
        stage_get_stats(core->stage, &ws);
        *total = ws.budget;
        *used = ws.staged_bytes;
    }
}

/* ---- symbolic links (docs/semantics.md, "Symbolic links") ---- */

int core_symlink(struct core *core, const char *target, const char *path,
                 const struct store_attrs *a)
{
    if (!core->stage)
        return -EROFS;
    size_t len = strlen(target);
    if (len == 0)
        return -ENOENT; /* symlink(2): an empty target */
    if (len > STORE_LINK_MAX)
        return -ENAMETOOLONG;
    const char *spath = core_store_path(path);
    int rc = check_new_entry(core, spath);
    if (rc < 0)
        return rc;
    struct store_stat st;
    rc = core_lookup(core, spath, &st);
    if (rc == 0)
        return -EEXIST;
    if (rc != -ENOENT)
        return rc;
    char wait[4096];
    if (store_link_wait_path(spath, target, wait, sizeof wait) < 0)
        wait[0] = '\0'; /* too long to tell: after everything staged */
    rc = stage_symlink(core->stage, spath, target, wait, a);
    if (rc < 0)
        return rc;
    entry_changed(core, spath); /* its publish puts it in the metadata cache */
    return 0;
}

/* The target of the link answered as s at spath, from the store (no lock). */
static ssize_t stored_link(struct core *core, const char *spath, const struct store_stat *s,
                           char *buf, size_t len)
{
    struct store *store = core->store;
    if (store->ops->readlink)
        return store->ops->readlink(store, spath, buf, len);
    size_t n = s->size < len ? (size_t)s->size : len, got = 0;
    int rc = store->ops->read(store, spath, s->etag, 0, n, buf, &got);
    return rc < 0 ? rc : (ssize_t)got;
}

ssize_t core_readlink(struct core *core, const char *path, char *buf, size_t len)
{
    const char *spath = core_store_path(path);
    struct store_stat s;
    int rc = core_lookup(core, spath, &s);
    if (rc < 0)
        return rc;
    if (!s.is_dir)
        core_known_attrs(core, spath, &s);
    if (s.is_dir || !store_attrs_is_link(&s.attrs))
        return -EINVAL;
    struct wfile *wf = core->stage ? stage_get(core->stage, spath) : NULL;
    if (!wf)
        return stored_link(core, spath, &s, buf, len);
    uint64_t size;
    int fd = stage_fd(core->stage, wf, &size);
    ssize_t n = fd < 0 ? fd : pread(fd, buf, size < len ? (size_t)size : len, 0);
    if (n < 0 && fd >= 0)
        n = -errno;
    stage_put(core->stage, wf);
    return n;
}
