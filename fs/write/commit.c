/*
 * fs/write/commit.c - when a .metadata may reach the store.
 *
 * A DCP checkpoint is complete when its .metadata exists; so a sealed file
 * named .metadata (or *.metadata, and likewise a Hugging Face
 * *.safetensors.index.json, whose weight_map names the shards) is published
 * only after
 *   (a) every other file written through this mount into its directory is
 *       complete on the store, and
 *   (b) every file the .metadata names (parsed with index/, bounded and
 *       safe) exists on the store with a size that covers the largest
 *       offset + length it refers to, whichever node wrote it: checked
 *       with a listing of the directory (strongly consistent on S3), relisted
 *       with backoff while something is missing.
 * The wait is bounded by --commit-timeout: then the file is blocked (kept
 * staged, its fsync/close fail with EIO, a log line names what is missing)
 * until it is sealed again or synced. A .metadata that cannot be parsed
 * waits for (a) only, with a warning. Runs in the stage supervisor thread.
 * Once published, commit_snapshot() hands the index what the check found, so
 * the new checkpoint is indexed without asking the store again. A middle
 * layer (stage.h): calls the records (wfile.h), the parser and the store;
 * a file found ready goes to the supervisor's callback, which starts its
 * upload.
 */
#include "commit.h"

#include "clock.h"
#include "dcp.h"
#include "safetensors.h"
#include "fdio.h"
#include "log.h"
#include "strutil.h"
#include "wfile.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define COMMIT_MAX_METADATA (1ull << 30) /* as ckpt_load's default */
#define COMMIT_FIRST_RELIST 0.1
#define COMMIT_MAX_RELIST 5.0
#define COMMIT_LOG_EVERY 10.0
#define COMMIT_SNAPSHOT_MAX (256u << 20) /* larger .metadata: the index reads the store */
#define COMMIT_HEAD_MAX 4 /* this few files missing: ask for each by name, not a listing */

static void free_needs(struct wfile_need *needs, size_t n);

/* All of fd's size bytes into a new buffer, or NULL. */
static unsigned char *read_whole(int fd, uint64_t size)
{
    unsigned char *buf = malloc(size ? size : 1);
    if (buf && pread_exact(fd, buf, size, 0) < 0) {
        free(buf);
        buf = NULL;
    }
    return buf;
}

int commit_allows(struct stage *st, struct wfile *wf)
{
    if (!wf->is_commit)
        return 1;
    if (wf->commit == WFILE_COMMIT_READY && wf->commit_version == wf->version)
        return 1;
    if (wf->commit == WFILE_COMMIT_NONE || wf->commit_version != wf->version) {
        wf->commit = WFILE_COMMIT_WAITING;
        wf->commit_version = wf->version;
        wf->commit_foreign = 0;
        wf->commit_pending = wf->commit_missing = LONG_MAX;
        wf->commit_deadline = mono_seconds() + st->cfg.commit_timeout;
        wf->commit_next_check = 0;
        wf->commit_logged = mono_seconds();
        pthread_cond_broadcast(&st->changed);
    }
    return 0;
}

void commit_reset(struct wfile *wf)
{
    free_needs(wf->needs, wf->nneeds);
    wf->needs = NULL;
    wf->nneeds = 0;
    wf->commit_parsed = 0;
    wf->commit = WFILE_COMMIT_NONE;
    wf->commit_epoch++;
}

void commit_retry(struct wfile *wf)
{
    if (wf->commit != WFILE_COMMIT_BLOCKED)
        return;
    commit_reset(wf);
    wf->error = 0;
}

/* Files of this mount at or below dir (other than commit files and
 * temporaries held for a rename) that are not yet complete on the store
 * (lock held). Below too: a .metadata may name a shard in a subdirectory,
 * and the store may still hold an older save's object there. */
static size_t local_pending(struct stage *st, const struct wfile *self, const char *dir,
                            const char **example)
{
    size_t n = 0;
    for (struct wfile *wf = st->files; wf; wf = wf->next) {
        if (wf == self || wf->unlinked || wf->is_commit || wf->held || wfile_clean(wf))
            continue;
        if (path_at_or_below(wf->path, dir)) {
            if (!n)
                *example = path_base(wf->path);
            n++;
        }
    }
    return n;
}

/* A symlink's wait (docs/semantics.md, "Symbolic links"): files of this
 * mount staged before it (lower ids: ids only grow, so two links into each
 * other's directories never wait for each other) at or below its target
 * that are not yet complete on the store (lock held). Commit
 * files count: a link made after a save goes out after its .metadata. A
 * file being written counts until its writer closes it. */
static size_t link_pending(struct stage *st, const struct wfile *link, const char **example)
{
    size_t n = 0;
    for (struct wfile *wf = st->files; wf; wf = wf->next) {
        if (wf == link || wf->unlinked || wf->id > link->id || wfile_clean(wf))
            continue;
        if (wf->version != wf->seal_version && wf->writers == 0)
            continue; /* abandoned unsealed (the mount ended under its writer): never sent */
        if (path_at_or_below(wf->path, link->link_wait)) {
            if (!n)
                *example = path_base(wf->path);
            n++;
        }
    }
    return n;
}

static int cmp_need(const void *a, const void *b)
{
    return strcmp(((const struct wfile_need *)a)->name, ((const struct wfile_need *)b)->name);
}

/* Whether an earlier check found need on the store, large enough. */
static int need_met(const struct wfile_need *need)
{
    return need->found_size != UINT64_MAX && need->found_size >= need->min_size;
}

/* The files a Hugging Face index json names (weight_map values, each once,
 * sorted by name), each needing at least a safetensors header's length
 * prefix and "{}" (the index gives no sizes). 0 or an error (e set). */
static int hf_needs(const unsigned char *buf, uint64_t size, struct wfile_need **out, size_t *nout,
                    struct ckpt_err *e)
{
    struct st_index *ix = NULL;
    int rc = st_index_parse(buf, (size_t)size, &ix, e);
    if (rc)
        return rc;
    struct wfile_need *needs = calloc(ix->n ? ix->n : 1, sizeof *needs);
    size_t n = 0;
    for (uint32_t i = 0; needs && i < ix->n; i++) {
        needs[n].name = strdup(ix->file[i]);
        needs[n].min_size = ST_PREFIX_LEN + 2;
        needs[n].found_size = UINT64_MAX;
        if (!needs[n].name) {
            free_needs(needs, n);
            needs = NULL;
            break;
        }
        n++;
    }
    st_index_free(ix);
    if (!needs)
        return ckpt_err_set(e, -ENOMEM, CKPT_NOPOS, "out of memory");
    qsort(needs, n, sizeof *needs, cmp_need);
    size_t u = 0; /* many tensors name one file: keep it once */
    for (size_t i = 0; i < n; i++) {
        if (u && strcmp(needs[u - 1].name, needs[i].name) == 0)
            free(needs[i].name);
        else
            needs[u++] = needs[i];
    }
    *out = needs;
    *nout = u;
    return 0;
}

/* Read the staged .metadata and note, per file it names, the size it needs
 * (no lock: reads the staging file, which a sealed, referenced file keeps). */
static void parse_needs(struct wfile *wf, uint64_t size, struct wfile_need **out, size_t *nout)
{
    *out = NULL;
    *nout = 0;
    if (size > COMMIT_MAX_METADATA) {
        log_warn("commit: %s is %" PRIu64 " bytes, too large to check; publishing after this "
                 "mount's files only",
                 wf->path, size);
        return;
    }
    unsigned char *buf = read_whole(wf->fd, size);
    struct ckpt *c = NULL;
    struct ckpt_err e = {0};
    int rc;
    if (wfile_is_hf_index_name(path_base(wf->path))) {
        rc = buf ? hf_needs(buf, size, out, nout, &e) : -EIO;
        free(buf);
        if (rc != 0)
            log_warn("commit: cannot parse %s (%s); publishing it after this mount's files only",
                     wf->path, e.msg[0] ? e.msg : ckpt_strerror(rc));
        return;
    }
    rc = buf ? dcp_parse(buf, size, NULL, &c, &e) : -EIO;
    free(buf);
    if (rc != 0) {
        log_warn("commit: cannot parse %s (%s); publishing it after this mount's files only",
                 wf->path, e.msg[0] ? e.msg : ckpt_strerror(rc));
        return;
    }
    struct wfile_need *needs = calloc(c->nfiles ? c->nfiles : 1, sizeof *needs);
    for (uint32_t f = 0; needs && f < c->nfiles; f++) {
        uint64_t need = 0;
        for (uint32_t k = 0; k < c->files[f].nitems; k++) {
            const struct ckpt_item *it = &c->items[c->files[f].items[k]];
            if (it->offset + it->length > need)
                need = it->offset + it->length;
        }
        needs[f].name = strdup(c->files[f].name);
        needs[f].min_size = need;
        needs[f].found_size = UINT64_MAX;
        if (!needs[f].name) {
            for (uint32_t k = 0; k < f; k++)
                free(needs[k].name);
            free(needs);
            needs = NULL;
        }
    }
    if (needs) {
        qsort(needs, c->nfiles, sizeof *needs, cmp_need); /* by name, as listings come */
        *out = needs;
        *nout = c->nfiles;
    }
    ckpt_free(c);
}

struct seen {
    struct wfile_need *needs;
    size_t n;
    uint64_t *size; /* per need: size found, UINT64_MAX = not seen */
};

static int on_entry(void *arg, const char *name, const struct store_stat *st)
{
    struct seen *s = arg;
    if (st->is_dir)
        return 0;
    struct wfile_need key = {.name = (char *)name};
    const struct wfile_need *hit = bsearch(&key, s->needs, s->n, sizeof key, cmp_need);
    if (hit)
        s->size[hit - s->needs] = st->size;
    return 0;
}

/* How many needed files (needs, sorted by name) are missing or short on
 * the store (no lock); size[i] gets the size found for needs[i]
 * (UINT64_MAX: none). One an earlier check found is not asked again; of the
 * rest, at most COMMIT_HEAD_MAX are asked for by name, more by one listing
 * of dir from the first of them on (list_after), and names in
 * subdirectories by name. So a check costs what is still missing, not what
 * the checkpoint holds (docs/design.md, "Request budget"). The first one
 * missing is named in example. -errno if the store cannot be asked. */
static long count_missing(struct store *store, const char *dir, struct wfile_need *needs, size_t n,
                          uint64_t *size, char *example, size_t exlen)
{
    size_t first = n, left = 0;
    for (size_t i = 0; i < n; i++) {
        size[i] = need_met(&needs[i]) ? needs[i].found_size : UINT64_MAX;
        if (size[i] == UINT64_MAX) {
            left++;
            if (first == n)
                first = i;
        }
    }
    if (!left)
        return 0;
    int rc = 0, by_name = left <= COMMIT_HEAD_MAX && left < n; /* the first check lists */
    if (!by_name) {
        struct seen s = {needs, n, size};
        rc = first > 0 && store->ops->list_after
                 ? store->ops->list_after(store, dir, needs[first - 1].name, on_entry, &s)
                 : store->ops->list(store, dir, on_entry, &s);
        if (rc == -ENOENT)
            rc = 0; /* nothing there yet */
    }
    long missing = 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        if (size[i] == UINT64_MAX && (by_name || strchr(needs[i].name, '/'))) {
            char p[8192];
            snprintf(p, sizeof p, "%s%s%s", dir, *dir ? "/" : "", needs[i].name);
            struct store_stat sst;
            if (store->ops->stat(store, p, &sst) == 0 && !sst.is_dir)
                size[i] = sst.size;
        }
        if (size[i] == UINT64_MAX || size[i] < needs[i].min_size) {
            if (!missing)
                snprintf(example, exlen, "%s: %s", needs[i].name,
                         size[i] == UINT64_MAX ? "missing" : "short");
            missing++;
        }
    }
    return rc < 0 ? rc : missing;
}

/* A copy of needs (names and sizes), or NULL. */
static struct wfile_need *copy_needs(const struct wfile_need *needs, size_t n)
{
    struct wfile_need *c = calloc(n ? n : 1, sizeof *c);
    for (size_t i = 0; c && i < n; i++) {
        c[i].min_size = needs[i].min_size;
        c[i].found_size = needs[i].found_size;
        if (!(c[i].name = strdup(needs[i].name))) {
            for (size_t k = 0; k < i; k++)
                free(c[k].name);
            free(c);
            c = NULL;
        }
    }
    return c;
}

static void free_needs(struct wfile_need *needs, size_t n)
{
    for (size_t i = 0; needs && i < n; i++)
        free(needs[i].name);
    free(needs);
}

static void block(struct stage *st, struct wfile *wf, const char *why)
{
    wf->commit = WFILE_COMMIT_BLOCKED;
    wf->error = -EIO;
    st->stats.commit_timeouts++;
    log_error("commit: %s was not published: %s after %.0f s (--commit-timeout); it stays staged "
              "and is retried on the next sync or seal",
              wf->path, why, st->cfg.commit_timeout);
    pthread_cond_broadcast(&st->changed);
}

/* One step for one waiting commit file (lock held, ref held; unlocks to
 * read the staged file and to list the store): it stays waiting, or becomes
 * blocked, or ready (returns 1). */
static int check_one(struct stage *st, struct wfile *wf, double now)
{
    char dir[4096], why[512], example[300] = "";
    path_dir(wf->path, dir, sizeof dir);
    uint64_t version = wf->version;
    unsigned epoch = wf->commit_epoch; /* a rename or a new seal resets the check */
    const char *local = "";
    long missing = 0; /* named files not on the store (-errno: the store could not say) */
    size_t pending =
        wf->link_wait ? link_pending(st, wf, &local) : local_pending(st, wf, dir, &local);
    if (pending) {
        snprintf(why, sizeof why, "%zu file%s of this mount in %.200s not uploaded yet (%.200s)",
                 pending, pending == 1 ? "" : "s",
                 wf->link_wait ? (*wf->link_wait ? wf->link_wait : "/")
                 : *dir        ? dir
                               : "/",
                 local);
    } else if (wf->link_wait) {
        wf->commit = WFILE_COMMIT_READY; /* a link names no files of its own */
        return 1;
    } else {
        if (!wf->commit_parsed) {
            uint64_t size = wf->size;
            struct wfile_need *needs;
            size_t n;
            pthread_mutex_unlock(&st->lock);
            parse_needs(wf, size, &needs, &n);
            pthread_mutex_lock(&st->lock);
            if (wf->commit != WFILE_COMMIT_WAITING || wf->commit_version != version ||
                wf->version != version || wf->commit_epoch != epoch) {
                free_needs(needs, n);
                return 0; /* changed meanwhile: the next seal starts over */
            }
            wf->needs = needs;
            wf->nneeds = n;
            wf->commit_parsed = 1;
        }
        size_t n = wf->nneeds;
        if (n) {
            struct wfile_need *needs = copy_needs(wf->needs, n);
            uint64_t *found = malloc(n * sizeof *found);
            pthread_mutex_unlock(&st->lock);
            missing = needs && found
                          ? count_missing(st->store, dir, needs, n, found, example, sizeof example)
                          : -ENOMEM;
            free_needs(needs, n);
            pthread_mutex_lock(&st->lock);
            if (wf->commit != WFILE_COMMIT_WAITING || wf->commit_version != version ||
                wf->version != version || wf->commit_epoch != epoch) {
                free(found);
                return 0;
            }
            for (size_t i = 0; missing >= 0 && i < n; i++) /* seen: not asked again */
                if (found[i] != UINT64_MAX && found[i] >= wf->needs[i].min_size)
                    wf->needs[i].found_size = found[i]; /* what the index will be told */
            free(found);
        }
        if (missing == 0) {
            wf->commit = WFILE_COMMIT_READY;
            return 1;
        }
        if (missing < 0)
            snprintf(why, sizeof why, "cannot list %.200s on the store (%s)", *dir ? dir : "/",
                     strerror((int)-missing));
        else
            snprintf(why, sizeof why, "%ld of the %zu files it names not on the store (%s)",
                     missing, n, example);
    }
    /* The timeout is for waiting in vain: when an upload of this mount into
     * the directory landed, or fewer named files are missing than at the
     * last check, the wait made progress and its clock starts over. */
    if ((pending && wf->commit_pending > (long)pending) ||
        (!pending && missing > 0 && wf->commit_missing > missing))
        wf->commit_deadline = now + st->cfg.commit_timeout;
    if (pending)
        wf->commit_pending = (long)pending;
    else if (missing > 0) {
        wf->commit_missing = missing;
        if (!wf->commit_foreign) {
            wf->commit_foreign = 1; /* a close stops waiting (stage_flush) */
            pthread_cond_broadcast(&st->changed);
        }
    }
    if (now >= wf->commit_deadline) {
        block(st, wf, why);
        return 0;
    }
    double waited = now - (wf->commit_deadline - st->cfg.commit_timeout);
    if (now - wf->commit_logged >= COMMIT_LOG_EVERY) {
        wf->commit_logged = now;
        log_info("commit: %s waits: %s (%.0f of %.0f s)", wf->path, why, waited,
                 st->cfg.commit_timeout);
    }
    /* This mount's uploads wake us when they land (commit_wake); listings of
     * the store back off from 0.1 s to 5 s. */
    double delay = COMMIT_FIRST_RELIST;
    while (delay < COMMIT_MAX_RELIST && delay < waited / 4)
        delay *= 2;
    wf->commit_next_check = now + (pending ? 1.0 : delay);
    return 0;
}

void commit_wake(struct stage *st, const char *path)
{
    char dir[4096], d[4096];
    path_dir(path, dir, sizeof dir);
    for (struct wfile *wf = st->files; wf; wf = wf->next) {
        if (!wf->is_commit || wf->commit != WFILE_COMMIT_WAITING)
            continue;
        if (wf->link_wait) { /* links wait for files anywhere below their target */
            wf->commit_next_check = 0;
            continue;
        }
        path_dir(wf->path, d, sizeof d);
        if (strcmp(d, dir) == 0)
            wf->commit_next_check = 0;
    }
}

double commit_check_all(struct stage *st, void (*ready)(struct stage *st, struct wfile *wf))
{
    WFILE_ASSERT_LOCKED(st);
    double next = 0;
    /* A walk that unlocks: hold a reference on the current file, so it stays
     * in the list, and start over from the head after each unlocking check
     * (the list is short: one entry per staged file). */
    for (int restart = 1; restart;) {
        restart = 0;
        for (struct wfile *wf = st->files; wf && !st->stopping; wf = wf->next) {
            if (!wf->is_commit || wf->unlinked || wf->commit != WFILE_COMMIT_WAITING ||
                wf->commit_version != wf->version || wf->seal_version != wf->version)
                continue;
            double now = mono_seconds();
            if (wf->commit_next_check > now) {
                if (!next || wf->commit_next_check < next)
                    next = wf->commit_next_check;
                continue;
            }
            wfile_ref(wf);
            if (check_one(st, wf, now))
                ready(st, wf); /* its upload starts before the next file's check */
            if (wf->commit == WFILE_COMMIT_WAITING && wf->commit_next_check &&
                (!next || wf->commit_next_check < next))
                next = wf->commit_next_check;
            wfile_unref(st, wf);
            restart = 1;
            break;
        }
    }
    return next;
}

struct stage_commit_snapshot *commit_snapshot(struct stage *st, struct wfile *wf, uint64_t version,
                                              uint64_t size)
{
    size_t n = wf->nneeds;
    if (!wf->commit_parsed || n == 0 || size > COMMIT_SNAPSHOT_MAX ||
        wfile_is_hf_index_name(path_base(wf->path))) /* the index takes DCP's only */
        return NULL;
    for (size_t i = 0; i < n; i++)
        if (wf->needs[i].found_size == UINT64_MAX)
            return NULL;
    struct stage_commit_snapshot *s = calloc(1, sizeof *s);
    struct store_file_size *files = calloc(n, sizeof *files);
    for (size_t i = 0; s && files && i < n; i++) {
        files[i].size = wf->needs[i].found_size;
        if (!(files[i].name = strdup(wf->needs[i].name))) {
            free(s);
            s = NULL;
        }
    }
    if (!s) {
        for (size_t i = 0; files && i < n; i++)
            free((char *)files[i].name);
        free(files);
        return NULL;
    }
    s->files = files;
    s->nfiles = n;
    pthread_mutex_unlock(&st->lock);
    s->bytes = read_whole(wf->fd, size);
    s->len = (size_t)size;
    pthread_mutex_lock(&st->lock);
    if (!s->bytes || wf->version != version) { /* rewritten meanwhile: not what was published */
        commit_snapshot_free(s);
        return NULL;
    }
    return s;
}

void commit_snapshot_free(struct stage_commit_snapshot *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->nfiles; i++)
        free((char *)s->files[i].name);
    free((void *)s->files);
    free((void *)s->bytes);
    free(s);
}
