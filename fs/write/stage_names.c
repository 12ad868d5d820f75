/*
 * fs/write/stage_names.c - the names staging adds to the store's namespace: staged
 * files and the directories that hold them (stage_stat, stage_list,
 * stage_has_entry), and renames of directories with staged files below.
 * Part of the top of fs/write (stage.h): calls the records (wfile.h) and
 * upload.c only.
 */
#include "stage.h"

#include "clock.h"
#include "dirmv.h"
#include "recover.h"
#include "strutil.h"
#include "upload.h"
#include "wfile.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- staging-only directories ------------------------------------------ */

static int pick_below(const struct wfile *wf, const void *dir)
{
    return !wf->unlinked && path_at_or_below(wf->path, dir);
}

int stage_rename_dir(struct stage *st, const char *from, const char *to)
{
    size_t fl = strlen(from);
    pthread_mutex_lock(&st->lock);
    int rc = 0;
    size_t n = 0;
    struct wfile **below = wfile_collect(st, pick_below, from, &n);
    for (size_t i = 0; i < n && rc == 0; i++) {
        struct wfile *wf = below[i];
        char *np = str_printf("%s%s", to, wf->path + fl);
        if (!np) {
            rc = -ENOMEM;
            break;
        }
        wfile_table_remove(st, wf);
        free(wf->path);
        wf->path = np;
        wfile_table_insert(st, wf);
        wf->synced_version = 0;
        wfile_journal(st, wf);
        upload_kick(st, wf);
    }
    wfile_release_all(st, below, n);
    pthread_mutex_unlock(&st->lock);
    return rc;
}

/* A multipart copy (above STORE_MAX_PART) to path begins an upload there:
 * wait until recovery's second sweep has passed path, so it is not taken
 * for one the dead daemon began (what stage_wait_sweep does). */
static void wait_sweep_before_copy(void *arg, const char *path, uint64_t size)
{
    struct stage *st = arg;
    if (size <= STORE_MAX_PART)
        return;
    pthread_mutex_lock(&st->lock);
    while (!st->stopping && recover_sweep_pending(st, path))
        wfile_wait(st, 1.0);
    pthread_mutex_unlock(&st->lock);
}

/* 1 if an upload of a file removed below dir may still land there (lock
 * held): it would be deleted again when it lands (stage.h), but a listing
 * of dir meanwhile would copy it to the new name, where nobody deletes it. */
static int stray_below(struct stage *st, const char *dir)
{
    WFILE_ASSERT_LOCKED(st);
    for (struct wfile *wf = st->files; wf; wf = wf->next)
        if (wf->unlinked && (wf->jobs > 0 || wf->discard) && path_at_or_below(wf->path, dir))
            return 1;
    return 0;
}

#define STRAY_WAIT_SECONDS 30.0 /* then the rename goes ahead anyway (a stray may be copied) */

int stage_rename_stored_dir(struct stage *st, const char *from, const char *to, int to_existed)
{
    pthread_mutex_lock(&st->lock);
    double until = mono_seconds() + STRAY_WAIT_SECONDS;
    while (!st->stopping && stray_below(st, from) && mono_seconds() < until)
        wfile_wait(st, 0.1);
    pthread_mutex_unlock(&st->lock);
    struct dirmv_env e = {.store = st->store,
                          .journal = st->journal,
                          .store_name = st->store_name,
                          .max_objects = st->cfg.rename_dir_max_objects > 0
                                             ? (uint64_t)st->cfg.rename_dir_max_objects
                                             : 0,
                          .before_copy = wait_sweep_before_copy,
                          .arg = st};
    return dirmv_run(&e, from, to, to_existed);
}

/* ---- namespace overlay -------------------------------------------------- */

int stage_stat(struct stage *st, const char *path, struct store_stat *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&st->lock);
    int found = 0;
    struct wfile *wf = wfile_find(st, path);
    if (wf) {
        out->size = wf->size;
        out->mtime_ns = wf->mtime_ns;
        out->attrs = wf->attrs;
        found = 1;
    } else if (*path) { /* a directory holding staged files: of the newest's time */
        for (struct wfile *w = st->files; w; w = w->next)
            if (!w->unlinked && path_at_or_below(w->path, path)) {
                found = 1;
                if (w->mtime_ns > out->mtime_ns)
                    out->mtime_ns = w->mtime_ns;
            }
        out->is_dir = found;
    }
    pthread_mutex_unlock(&st->lock);
    return found;
}

/* The component of path right below dir, into buf (0 if path is not below). */
static int child_of(const char *path, const char *dir, char *buf, size_t len, int *is_leaf)
{
    size_t dl = strlen(dir);
    const char *rest;
    if (dl == 0)
        rest = path;
    else if (strncmp(path, dir, dl) == 0 && path[dl] == '/')
        rest = path + dl + 1;
    else
        return 0;
    const char *slash = strchr(rest, '/');
    size_t n = slash ? (size_t)(slash - rest) : strlen(rest);
    if (n == 0 || n >= len)
        return 0;
    memcpy(buf, rest, n);
    buf[n] = '\0';
    *is_leaf = slash == NULL;
    return 1;
}

struct name_set {
    char **names;
    size_t n, cap;
};

static int name_seen(struct name_set *s, const char *name)
{
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->names[i], name) == 0)
            return 1;
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 16;
        char **nn = realloc(s->names, cap * sizeof *nn);
        if (!nn)
            return 1;
        s->names = nn;
        s->cap = cap;
    }
    s->names[s->n] = strdup(name);
    if (s->names[s->n])
        s->n++;
    return 0;
}

int stage_wf_stat(struct stage *st, struct wfile *wf, struct store_stat *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&st->lock);
    out->size = wf->size;
    out->mtime_ns = wf->mtime_ns;
    out->attrs = wf->attrs;
    pthread_mutex_unlock(&st->lock);
    return 0;
}

/* Merge a into wf's attributes (lock held). */
static void merge_attrs_locked(struct wfile *wf, const struct store_attrs *a)
{
    uint32_t bits = a->set & (STORE_ATTR_MODE | STORE_ATTR_UID | STORE_ATTR_GID | STORE_ATTR_MTIME);
    if (bits & STORE_ATTR_MODE)
        wf->attrs.mode = a->mode;
    if (bits & STORE_ATTR_UID)
        wf->attrs.uid = a->uid;
    if (bits & STORE_ATTR_GID)
        wf->attrs.gid = a->gid;
    if (bits & STORE_ATTR_MTIME) {
        wf->attrs.mtime_ns = a->mtime_ns;
        wf->mtime_ns = a->mtime_ns;
    }
    wf->attrs.set |= bits;
    wf->attrs_gen++;
}

/* Will wf's attributes reach the store with an upload: one to come or in
 * flight (it takes them when it lands), or a landing not yet done (it checks
 * for attributes set meanwhile until it ends, upload.c's landed())? Not
 * merely jobs in flight: a job that landed is still in flight until its
 * worker is done, past its last check. (Lock held.) */
static int upload_pending_locked(const struct wfile *wf)
{
    return wf->synced_version < wf->version || wf->attrs_landings > 0;
}

int stage_set_attrs(struct stage *st, const char *path, const struct store_attrs *a)
{
    pthread_mutex_lock(&st->lock);
    struct wfile *wf = wfile_find(st, path);
    int pending = wf && upload_pending_locked(wf);
    if (wf)
        merge_attrs_locked(wf, a);
    pthread_mutex_unlock(&st->lock);
    return pending;
}

int stage_set_attrs_wf(struct stage *st, struct wfile *wf, const struct store_attrs *a)
{
    pthread_mutex_lock(&st->lock);
    int pending = upload_pending_locked(wf) || wf->writers > 0 || wf->unlinked;
    merge_attrs_locked(wf, a);
    pthread_mutex_unlock(&st->lock);
    return pending;
}

int stage_list(struct stage *st, const char *dir, store_list_fn fn, void *arg)
{
    /* Collect under the lock, report after: fn may call back into the core. */
    struct entry {
        char name[256];
        struct store_stat st;
    } *ents = NULL;
    size_t n = 0, cap = 0;
    struct name_set seen = {0};
    pthread_mutex_lock(&st->lock);
    for (struct wfile *wf = st->files; wf; wf = wf->next) {
        int leaf = 0;
        char name[256];
        if (wf->unlinked || !child_of(wf->path, dir, name, sizeof name, &leaf))
            continue;
        if (name_seen(&seen, name)) { /* a subdirectory seen: of its newest file's time */
            for (size_t i = 0; i < n; i++)
                if (ents[i].st.is_dir && strcmp(ents[i].name, name) == 0 &&
                    wf->mtime_ns > ents[i].st.mtime_ns)
                    ents[i].st.mtime_ns = wf->mtime_ns;
            continue;
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            struct entry *ne = realloc(ents, cap * sizeof *ne);
            if (!ne)
                break;
            ents = ne;
        }
        memset(&ents[n], 0, sizeof ents[n]);
        snprintf(ents[n].name, sizeof ents[n].name, "%s", name);
        if (leaf) {
            ents[n].st.size = wf->size;
            ents[n].st.mtime_ns = wf->mtime_ns;
            ents[n].st.attrs = wf->attrs; /* a symlink shows as one in listings too */
        } else {                          /* a subdirectory holding staged files */
            ents[n].st.is_dir = 1;
            ents[n].st.mtime_ns = wf->mtime_ns;
        }
        n++;
    }
    pthread_mutex_unlock(&st->lock);
    size_t i = 0;
    for (; i < n; i++)
        if (fn(arg, ents[i].name, &ents[i].st) != 0)
            break;
    for (size_t k = 0; k < seen.n; k++)
        free(seen.names[k]);
    free(seen.names);
    free(ents);
    return (int)n;
}

int stage_has_entry(struct stage *st, const char *dir, const char *name)
{
    char *p = *dir ? str_printf("%s/%s", dir, name) : strdup(name);
    if (!p)
        return 0;
    struct store_stat s;
    int found = stage_stat(st, p, &s);
    free(p);
    return found;
}
