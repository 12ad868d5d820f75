/*
 * fs/write/recover.c - taking over the journal at mount (after a crash, a kill -9,
 * a reboot, or an unmount that could not upload everything).
 *
 * For each record of this store:
 *   - discarded (unlinked) files: abort their multipart upload, delete;
 *   - sealed files whose staged bytes can be trusted (same boot, so the
 *     page cache survived; or made durable by fsync before a reboot) and
 *     whose staging file has the recorded size: staged again, sealed, for
 *     stage_open to start their uploads, resuming a multipart upload with
 *     the parts the journal lists (others are sent again);
 *   - anything else (written after its last seal, never sealed, or not
 *     durable across a reboot): not published, since the writer never said
 *     it was complete. Its bytes are moved to STAGE_DIR/recovered/<path> and
 *     a warning names them: nothing is silently lost.
 * Multipart uploads of a recorded key that the record does not name (begun,
 * then the crash came before the id was journaled) are aborted. Records of
 * other stores are left alone for a mount of that store.
 *
 * Then every directory rename the journal shows interrupted is finished
 * (or undone) by dirmv.c before the mount serves.
 *
 * Also the second sweep of those keys a little later (recover_sweep_again),
 * and the sweep of a key after a begin whose answer was lost
 * (recover_sweep_key, which upload.c calls). A middle layer (stage.h):
 * calls the records (wfile.h), the journal and the store only.
 */
#include "recover.h"

#include "clock.h"
#include "dirmv.h"
#include "journal.h"
#include "log.h"
#include "parts.h"
#include "strutil.h"
#include "wfile.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

/* The ids of a key's multipart uploads in progress. */
struct id_list {
    char **ids;
    size_t n;
};

static int collect_id(void *arg, const char *upload_id)
{
    struct id_list *l = arg;
    char **n = realloc(l->ids, (l->n + 1) * sizeof *n);
    if (n)
        l->ids = n;
    if (!n || !(n[l->n] = strdup(upload_id)))
        return 1; /* out of memory: the key is swept as far as it was listed */
    l->n++;
    return 0;
}

/* List key's uploads in progress into l (lock not held): 0, or the
 * listing's negative errno, logged (-ENOSYS: the store cannot list them). */
static int list_uploads(struct stage *st, const char *key, struct id_list *l)
{
    int rc = st->store->ops->mpu_list(st->store, key, collect_id, l);
    if (rc == -ENOSYS) /* a server that cannot list them (s3rver) */
        log_debug("recover: the store cannot list multipart uploads of %s", key);
    else if (rc < 0)
        log_warn("recover: cannot list multipart uploads of %s: %s", key, strerror(-rc));
    return rc < 0 ? rc : 0;
}

/* Take out of l (and free) the ids that keep(arg, id) says to leave alone. */
static void leave_alone(struct id_list *l, int (*keep)(const void *arg, const char *id),
                        const void *arg)
{
    size_t n = 0;
    for (size_t i = 0; i < l->n; i++) {
        if (keep(arg, l->ids[i]))
            free(l->ids[i]);
        else
            l->ids[n++] = l->ids[i];
    }
    l->n = n;
}

/* Abort every upload of key in l, and empty l (lock not held). */
static void abort_listed(struct stage *st, const char *key, struct id_list *l)
{
    int aborted = 0;
    for (size_t i = 0; i < l->n; i++) {
        int rc = st->store->ops->mpu_abort(st->store, key, l->ids[i]);
        if (rc == 0)
            aborted++;
        else
            log_warn("recover: cannot abort a multipart upload of %s: %s", key, strerror(-rc));
        free(l->ids[i]);
    }
    free(l->ids);
    *l = (struct id_list){0};
    if (aborted)
        log_info("recover: aborted %d abandoned multipart upload%s of %s", aborted,
                 aborted == 1 ? "" : "s", key);
}

static int same_id(const void *keep, const char *id)
{
    return strcmp(id, keep) == 0;
}

/* Remember key for the second sweep (lock not held: recovery runs before
 * the workers and the supervisor start). */
static void note_sweep(struct stage *st, const char *key)
{
    for (size_t i = 0; i < st->nsweep_keys; i++)
        if (strcmp(st->sweep_keys[i], key) == 0)
            return;
    char **n = realloc(st->sweep_keys, (st->nsweep_keys + 1) * sizeof *n);
    if (!n)
        return;
    st->sweep_keys = n;
    if ((n[st->nsweep_keys] = strdup(key)) != NULL)
        st->nsweep_keys++;
}

/* Abort every multipart upload in progress for key except keep: 0, or the
 * listing's negative errno (-ENOSYS: the store cannot list them). */
static int abort_uploads(struct stage *st, const char *key, const char *keep)
{
    struct id_list l = {0};
    int rc = list_uploads(st, key, &l);
    leave_alone(&l, same_id, keep);
    abort_listed(st, key, &l);
    return rc;
}

/* Recovery's sweep of key: abort its uploads but keep, and note the key
 * for the second sweep (unless the store cannot list uploads at all). */
static void abort_strays(struct stage *st, const char *key, const char *keep)
{
    if (*key && abort_uploads(st, key, keep) != -ENOSYS)
        note_sweep(st, key);
}

/* mkdir -p of the directories above path (relative to dirfd). */
static void make_parents(int dirfd, const char *path)
{
    char buf[8192];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf; (p = strchr(p, '/')) != NULL; p++) {
        *p = '\0';
        mkdirat(dirfd, buf, 0700);
        *p = '/';
    }
}

/* Keep the staged bytes of an unpublishable file where a person finds them. */
static void move_to_recovered(struct stage *st, const struct journal_rec *r, const char *name,
                              const char *why)
{
    char *dir = str_printf("%s/recovered", st->cfg.dir);
    int dfd = -1;
    if (dir && (mkdir(dir, 0700) == 0 || errno == EEXIST))
        dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int moved = 0;
    if (dfd >= 0) {
        make_parents(dfd, r->path);
        char *target = str_printf("%s.%" PRIx64, r->path, r->id); /* never over another */
        moved = target && renameat(st->files_dirfd, name, dfd, target) == 0;
        if (moved)
            log_warn("recover: %s was not published (%s); its %" PRIu64
                     " staged bytes are in %s/%s",
                     r->path, why, r->size, dir, target);
        free(target);
        close(dfd);
    }
    if (!moved)
        log_error("recover: %s was not published (%s) and its staged bytes could not be moved "
                  "out of %s/%s: %s",
                  r->path, why, st->files_dir, name, strerror(errno));
    free(dir);
}

/* Stage a sealed record again (lock not held); its upload starts once the
 * whole journal is walked (stage_open kicks it). */
static int restage(struct stage *st, const struct journal_rec *r, int fd)
{
    struct wfile *wf = wfile_alloc(r->path);
    if (!wf)
        return -ENOMEM;
    wf->id = r->id;
    wf->size = r->size;
    wf->mtime_ns = wall_ns();
    int rc = extents_add(&wf->written, 0, r->size);
    wf->version = wf->seal_version = 2; /* sealed; 1 would be "a new, empty file" */
    wf->durable_version = r->flags & JOURNAL_DURABLE ? 2 : 0;
    wf->is_commit = wfile_is_commit_name(path_base(r->path));
    wf->journaled = 1;
    wf->sealed_in_journal = 1;
    wf->jseq = r->seq;
    if (rc == 0 && (r->flags & JOURNAL_LINK)) {
        /* A symlink (stage_link.c): published after everything staged before
         * it (where its target lay is not kept: anywhere). */
        wf->is_commit = 1;
        wf->attrs.set |= STORE_ATTR_MODE;
        wf->attrs.mode = S_IFLNK | 0777;
        if (!(wf->link_wait = strdup("")))
            rc = -ENOMEM;
    }
    uint32_t count = parts_count(st->cfg.part_size, r->size);
    if (rc == 0)
        rc = wfile_parts_reserve(wf, count ? count : 1);
    if (rc == 0 && *r->upload_id) {
        wf->upload_key = strdup(r->upload_key);
        wf->upload_id = strdup(r->upload_id);
        if (!wf->upload_key || !wf->upload_id)
            rc = -ENOMEM;
        wf->mpu = WFILE_MPU_ACTIVE;
        for (uint32_t i = 0; rc == 0 && i < r->nparts; i++) {
            const struct journal_part *p = &r->parts[i];
            uint64_t off = parts_offset(st->cfg.part_size, p->number);
            if (p->number > count || off != p->offset) /* another geometry: send it again */
                continue;
            struct wfile_part *wp = &wf->parts[p->number - 1];
            wp->uploaded = 1;
            wp->up_len = p->length;
            memcpy(wp->etag, p->etag, STORE_ETAG_MAX);
        }
    }
    if (rc < 0) {
        wfile_free(wf); /* fd is still -1: the caller closes it */
        return rc;
    }
    wf->fd = fd;
    pthread_mutex_lock(&st->lock);
    struct wfile *other = wfile_find(st, wf->path);
    if (other) /* two records for one name: the newer staging wins */
        log_warn("recover: %s was staged twice; keeping both until uploaded", wf->path);
    wfile_link(st, wf);
    st->stats.recovered_files++;
    wfile_unref(st, wf);
    pthread_mutex_unlock(&st->lock);
    return 0;
}

struct recover_ctx {
    struct stage *st;
    size_t foreign, restaged, moved, discarded;
    uint64_t *ids; /* every record's id: the staging files that are not orphans */
    size_t nids, capids;
};

static void note_id(struct recover_ctx *c, uint64_t id)
{
    if (c->nids == c->capids) {
        size_t cap = c->capids ? 2 * c->capids : 64;
        uint64_t *n = realloc(c->ids, cap * sizeof *n);
        if (!n)
            return;
        c->ids = n;
        c->capids = cap;
    }
    c->ids[c->nids++] = id;
}

static int recover_one(void *arg, const struct journal_rec *r)
{
    struct recover_ctx *c = arg;
    struct stage *st = c->st;
    note_id(c, r->id);
    if (strcmp(r->store, st->store_name) != 0) {
        c->foreign++;
        return 0;
    }
    char name[32];
    wfile_staging_name(r->id, name);
    int keep_id = (r->flags & JOURNAL_SEALED) && !(r->flags & JOURNAL_DISCARD);
    const char *keep = keep_id ? r->upload_id : "";
    /* Uploads nobody will complete: one begun before its id was journaled,
     * and what an interrupted PUT left (a local store's temporary file). */
    abort_strays(st, r->path, strcmp(r->path, r->upload_key) == 0 ? keep : "");
    if (*r->upload_key && strcmp(r->path, r->upload_key) != 0)
        abort_strays(st, r->upload_key, keep);
    if (r->flags & JOURNAL_DISCARD) {
        unlinkat(st->files_dirfd, name, 0);
        /* Its upload, by the recorded id: a store that cannot list uploads
         * (s3rver) finds it only so. Already gone is not an error. */
        if (*r->upload_key && *r->upload_id) {
            int arc = st->store->ops->mpu_abort(st->store, r->upload_key, r->upload_id);
            if (arc < 0) {
                log_warn("recover: cannot abort the multipart upload of %s: %s (the next mount "
                         "retries)",
                         r->upload_key, strerror(-arc));
                return 0; /* the record stays */
            }
        }
        journal_del(st->journal, r->id);
        c->discarded++;
        return 0;
    }
    int same_boot = strcmp(r->boot_id, st->boot_id) == 0;
    int fd = openat(st->files_dirfd, name, O_RDWR | O_CLOEXEC);
    struct stat sb;
    const char *why = NULL;
    if (fd < 0)
        why = "its staging file is gone";
    else if (fstat(fd, &sb) < 0 || (uint64_t)sb.st_size < r->size)
        why = "its staging file is shorter than recorded";
    else if (!(r->flags & JOURNAL_SEALED))
        why = "it was being written (never closed or fsynced since its last change)";
    else if (!same_boot && !(r->flags & JOURNAL_DURABLE))
        why = "the machine restarted before it was made durable by fsync";
    if (!why && restage(st, r, fd) == 0) {
        c->restaged++;
        log_info("recover: %s (%" PRIu64 " bytes) staged again for upload", r->path, r->size);
        return 0;
    }
    if (fd >= 0)
        close(fd);
    if (!why)
        why = "out of memory";
    if (strcmp(why, "its staging file is gone") == 0)
        log_error("recover: %s was not published: %s", r->path, why);
    else
        move_to_recovered(st, r, name, why);
    if (*r->upload_key && *r->upload_id) {
        int rc = st->store->ops->mpu_abort(st->store, r->upload_key, r->upload_id);
        if (rc < 0)
            log_warn("recover: cannot abort the multipart upload of %s: %s", r->upload_key,
                     strerror(-rc));
    }
    journal_del(st->journal, r->id);
    c->moved++;
    return 0;
}

static void bad_record(void *arg, uint64_t id)
{
    note_id(arg, id); /* its staging file stays where it is */
    log_error("recover: journal record %016" PRIx64 " is damaged; its staging file (if any) is "
              "left in place",
              id);
}

static int has_id(const struct recover_ctx *c, uint64_t id)
{
    for (size_t i = 0; i < c->nids; i++)
        if (c->ids[i] == id)
            return 1;
    return 0;
}

/* Staging files no record names: written, never sealed, and the crash came
 * before anything journaled them (a seal starts the upload before its record
 * is written, so a PUT may have begun: its leftovers are cleaned). Kept under
 * recovered/, named by the path their creation noted on them (or their id);
 * an empty one the crash caught before its path was noted is removed. */
static void keep_orphans(struct stage *st, struct recover_ctx *c)
{
    int fd = dup(st->files_dirfd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0)
            close(fd);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char *end;
        uint64_t id = strtoull(e->d_name, &end, 16);
        if (strlen(e->d_name) != 16 || *end || has_id(c, id))
            continue;
        char path[4096] = "";
        int sfd = openat(st->files_dirfd, e->d_name, O_RDONLY | O_CLOEXEC);
        ssize_t n = sfd >= 0 ? fgetxattr(sfd, WFILE_PATH_XATTR, path, sizeof path - 1) : -1;
        struct stat sb;
        uint64_t size = sfd >= 0 && fstat(sfd, &sb) == 0 ? (uint64_t)sb.st_size : 0;
        if (sfd >= 0)
            close(sfd);
        path[n > 0 ? n : 0] = '\0';
        if (!*path && size == 0) {
            /* the crash came between its creation and its name: nothing was
             * written to it, so nothing is lost */
            if (unlinkat(st->files_dirfd, e->d_name, 0) == 0) {
                log_info("recover: removed the empty, unnamed staging file %s", e->d_name);
                c->discarded++;
                continue;
            }
        }
        if (*path && !strstr(path, ".."))
            abort_strays(st, path, ""); /* a seal's upload may have begun before its record */
        else
            snprintf(path, sizeof path, "unknown/%s", e->d_name);
        struct journal_rec r = {.id = id, .path = path, .size = size};
        move_to_recovered(st, &r, e->d_name, "it was being written and never journaled");
        c->moved++;
    }
    closedir(d);
}

/* How long after recovery the second sweep comes: a request the dead
 * daemon sent (CreateMultipartUpload) may still be on its way to the store
 * during the first one, held by a proxy or a load balancer. */
#define SWEEP_AGAIN_AFTER 2.0

void recover_journal(struct stage *st)
{
    struct recover_ctx c = {.st = st};
    int rc = journal_foreach(st->journal, recover_one, bad_record, &c);
    if (rc < 0)
        log_error("recover: cannot read the journal: %s", strerror(-rc));
    else
        keep_orphans(st, &c);
    free(c.ids);
    /* Directory renames a crash interrupted: finished before the mount
     * serves (the new name gets no commit file before its objects). */
    struct dirmv_env e = {.store = st->store, .journal = st->journal, .store_name = st->store_name};
    dirmv_resume_all(&e);
    if (st->nsweep_keys)
        st->sweep_at = mono_seconds() + SWEEP_AGAIN_AFTER;
    if (c.restaged || c.moved || c.discarded)
        log_info("recover: %zu file%s to upload, %zu not publishable (kept), %zu discarded",
                 c.restaged, c.restaged == 1 ? "" : "s", c.moved, c.discarded);
    if (c.foreign)
        log_warn("recover: %zu staged file%s in this cache directory belong to another store; "
                 "they are uploaded when that store is mounted with it",
                 c.foreign, c.foreign == 1 ? "" : "s");
}

/* 1 if a live file of this mount is uploading key (a job queued or in
 * flight, or a begin under way): its uploads are not the dead daemon's, and
 * the sweep keeps off the key. Lock held. */
static int key_in_use(const struct stage *st, const char *key)
{
    for (const struct wfile *wf = st->files; wf; wf = wf->next) {
        int same = (wf->path && strcmp(wf->path, key) == 0) ||
                   (wf->upload_key && strcmp(wf->upload_key, key) == 0);
        if (same && (wf->jobs > 0 || wf->mpu == WFILE_MPU_BEGINNING))
            return 1;
    }
    return 0;
}

/* What the second sweep leaves alone of one key (lock held). */
struct sweep_key {
    const struct stage *st;
    const char *key;
};

/* 1 if a live file of this mount holds upload id of the key. */
static int held_here(const void *arg, const char *id)
{
    const struct sweep_key *k = arg;
    for (const struct wfile *wf = k->st->files; wf; wf = wf->next)
        if (wf->upload_key && wf->upload_id && strcmp(wf->upload_key, k->key) == 0 &&
            strcmp(wf->upload_id, id) == 0)
            return 1;
    return 0;
}

static int every_id(const void *arg, const char *id)
{
    (void)arg;
    (void)id;
    return 1;
}

/* One sweep of a key (the second sweep's, or after a begin whose answer was
 * lost): list its uploads, then decide with what the mount holds now, after
 * the listing, so an upload this mount began meanwhile is never in the list
 * and one it holds is kept. A key being uploaded is left alone. */
void recover_sweep_key(struct stage *st, const char *key)
{
    struct id_list l = {0};
    pthread_mutex_unlock(&st->lock);
    list_uploads(st, key, &l);
    pthread_mutex_lock(&st->lock);
    struct sweep_key k = {st, key};
    if (st->stopping || key_in_use(st, key)) {
        if (l.n && !st->stopping)
            log_debug("recover: %s is being uploaded again: no second sweep of it", key);
        leave_alone(&l, every_id, NULL);
    } else {
        leave_alone(&l, held_here, &k);
    }
    pthread_mutex_unlock(&st->lock);
    abort_listed(st, key, &l);
    pthread_mutex_lock(&st->lock);
}

double recover_sweep_again(struct stage *st)
{
    if (!st->sweep_at)
        return 0;
    if (mono_seconds() < st->sweep_at)
        return st->sweep_at;
    /* sweep_keys stays as it is while the lock is dropped: only this thread
     * and stage_close (after joining it) change it. */
    for (size_t i = 0; i < st->nsweep_keys && !st->stopping; i++)
        recover_sweep_key(st, st->sweep_keys[i]);
    recover_sweep_forget(st);
    pthread_cond_broadcast(&st->changed); /* a sync waits for the sweep */
    return 0;
}

int recover_sweep_pending(const struct stage *st, const char *key)
{
    if (!st->sweep_at)
        return 0;
    for (size_t i = 0; i < st->nsweep_keys; i++)
        if (strcmp(st->sweep_keys[i], key) == 0)
            return 1;
    return 0;
}

void recover_sweep_forget(struct stage *st)
{
    for (size_t i = 0; i < st->nsweep_keys; i++)
        free(st->sweep_keys[i]);
    free(st->sweep_keys);
    st->sweep_keys = NULL;
    st->nsweep_keys = 0;
    st->sweep_at = 0;
}
