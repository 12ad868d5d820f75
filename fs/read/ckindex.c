/*
 * fs/read/ckindex.c - building, reusing and querying checkpoint indexes for the
 * mount (see ckindex.h).
 *
 * State: a chained hash from checkpoint directory (store path) to what we
 * know of it: its metadata files and their fingerprint last noticed, whether its index is
 * being built, ready (with its id in the LMDB index) or failed. Protected by
 * ci->lock; builds and lookups run without it (LMDB has its own locking,
 * and a read transaction per lookup is cheap). A build stores its index
 * under ci->store_lock and only while its version is still the directory's
 * current one, so an older build that ends last cannot replace (and so
 * delete) the index of a newer one. A build reads the metadata files
 * pinned to the ETags it fingerprints (ckpt_io_from_pinset): a file
 * replaced meanwhile is indexed under its own fingerprint, never under the
 * old one.
 */
#include "ckindex.h"

#include "ckpt.h"
#include "ckpt_io_store.h"
#include "idxdb.h"
#include "log.h"
#include "strutil.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CKINDEX_BUCKETS 1024

enum dir_state { DIR_BUILDING, DIR_READY, DIR_FAILED };

struct ckdir {
    struct ckdir *next;
    enum dir_state state;
    uint64_t id;     /* DIR_READY: the checkpoint's id in the index */
    uint32_t nfiles; /* DIR_READY: the files its metadata names */
    size_t nmeta;    /* its metadata files last noticed (names owned) */
    struct ckindex_meta *meta;
    char fingerprint[IDXDB_FP_MAX];
    char dir[];
};

struct ckindex {
    struct store *store;
    struct workq *wq;
    struct idxdb *db;
    char *store_url;
    ckindex_known_fn known; /* the mount's sizes for builds, or NULL */
    void *known_arg;
    atomic_int stopping;
    pthread_mutex_t lock;
    pthread_cond_t built;                /* a build finished (signalled under lock) */
    pthread_mutex_t store_lock;          /* one build stores and records at a time; before lock */
    struct ckdir *dirs[CKINDEX_BUCKETS]; /* protected by lock */
    struct ckindex_stats st;             /* protected by lock */
};

/* How often a build starts over when metadata changes while it is read. */
#define BUILD_TRIES 3

#define INDEX_JSON "model.safetensors.index.json"

struct build_job {
    struct ckindex *ci;
    char fingerprint[IDXDB_FP_MAX];
    size_t nmeta; /* the metadata files fingerprinted, at their versions */
    struct ckindex_meta *meta;
    /* A .metadata this mount published: its bytes and the files it names
     * with their sizes on the store (NULL/0: read the store). */
    void *bytes;
    size_t len;
    struct store_file_size *files;
    size_t nfiles;
    char dir[];
};

static void meta_free(struct ckindex_meta *m, size_t n)
{
    for (size_t i = 0; m && i < n; i++)
        free((char *)m[i].name);
    free(m);
}

/* A copy of m[0..n) with its names, or NULL. */
static struct ckindex_meta *meta_copy(const struct ckindex_meta *m, size_t n)
{
    struct ckindex_meta *c = calloc(n ? n : 1, sizeof *c);
    for (size_t i = 0; c && i < n; i++) {
        c[i] = m[i];
        if (!(c[i].name = strdup(m[i].name))) {
            meta_free(c, i);
            return NULL;
        }
    }
    return c;
}

static void build_job_free(struct build_job *j)
{
    for (size_t i = 0; i < j->nfiles; i++)
        free((char *)j->files[i].name);
    free(j->files);
    free(j->bytes);
    meta_free(j->meta, j->nmeta);
    free(j);
}

/* ---- which files describe a checkpoint, and their fingerprint ---- */

static int has_suffix(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcmp(s + a - b, suf) == 0;
}

enum meta_kind { META_NONE, META_GLOBAL, META_RANK, META_HF };

static enum meta_kind kind_of(const char *name)
{
    if (strcmp(name, ".metadata") == 0)
        return META_GLOBAL;
    if (ckpt_rank_metadata_of(name) >= 0)
        return META_RANK;
    if (strcmp(name, INDEX_JSON) == 0 || has_suffix(name, ".safetensors"))
        return META_HF;
    return META_NONE;
}

int ckindex_metadata_name(const char *name)
{
    return kind_of(name) != META_NONE;
}

size_t ckindex_pick(const struct ckindex_meta *files, size_t n, size_t *pick)
{
    enum meta_kind best = META_NONE;
    for (size_t i = 0; i < n; i++) {
        enum meta_kind k = kind_of(files[i].name);
        if (k != META_NONE && (best == META_NONE || k < best))
            best = k; /* .metadata, then __R.metadata, then Hugging Face */
    }
    size_t np = 0;
    for (size_t i = 0; best != META_NONE && i < n; i++)
        if (kind_of(files[i].name) == best)
            pick[np++] = i;
    return np;
}

static int cmp_meta_ptr(const void *a, const void *b)
{
    const struct ckindex_meta *x = *(const struct ckindex_meta *const *)a;
    const struct ckindex_meta *y = *(const struct ckindex_meta *const *)b;
    return strcmp(x->name, y->name);
}

/* FNV-1a 64 over len bytes, from h. */
static uint64_t fnv1a(uint64_t h, const void *p, size_t len)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < len; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

void ckindex_fingerprint(const struct ckindex_meta *files, size_t n, char *out, size_t len)
{
    if (n == 1 && strcmp(files[0].name, ".metadata") == 0) {
        store_fingerprint(&files[0].st, out, len);
        return;
    }
    const struct ckindex_meta **order = malloc((n ? n : 1) * sizeof *order);
    if (!order) {
        snprintf(out, len, "unknown"); /* never stored: the build fails without memory */
        return;
    }
    for (size_t i = 0; i < n; i++)
        order[i] = &files[i];
    qsort(order, n, sizeof *order, cmp_meta_ptr);
    /* Two FNV-1a hashes (other bases) of "name\0etag\0size\0" per file. */
    uint64_t h1 = 0xcbf29ce484222325ull, h2 = 0x84222325cbf29ce4ull;
    for (size_t i = 0; i < n; i++) {
        char size[32];
        int sl = snprintf(size, sizeof size, "%" PRIu64, order[i]->st.size);
        const char *parts[3] = {order[i]->name, order[i]->st.etag, size};
        size_t lens[3] = {strlen(parts[0]) + 1, strlen(parts[1]) + 1, (size_t)sl + 1};
        for (int k = 0; k < 3; k++) {
            h1 = fnv1a(h1, parts[k], lens[k]);
            h2 = fnv1a(h2, parts[k], lens[k]);
        }
    }
    snprintf(out, len, "files=%zu first=%.64s hash=%016" PRIx64 "%016" PRIx64, n,
             n ? order[0]->name : "", h1, h2);
    free(order);
}

static size_t dir_bucket(const char *dir, size_t len)
{
    return str_hash(dir, len) % CKINDEX_BUCKETS;
}

static struct ckdir *dir_find_locked(struct ckindex *ci, const char *dir, size_t len)
{
    for (struct ckdir *d = ci->dirs[dir_bucket(dir, len)]; d; d = d->next)
        if (strlen(d->dir) == len && memcmp(d->dir, dir, len) == 0)
            return d;
    return NULL;
}

/* The index key of a checkpoint directory: the store URL joined with dir. */
static char *key_of(const struct ckindex *ci, const char *dir)
{
    return *dir ? ckpt_path_join(ci->store_url, dir) : strdup(ci->store_url);
}

/* Record the outcome of a build for the version it was started for. */
static void finish_build(struct ckindex *ci, const char *dir, const char *fp, enum dir_state state,
                         uint64_t id, uint32_t nfiles, int reused)
{
    pthread_mutex_lock(&ci->lock);
    struct ckdir *d = dir_find_locked(ci, dir, strlen(dir));
    if (d && strcmp(d->fingerprint, fp) == 0) {
        d->state = state;
        d->id = id;
        d->nfiles = nfiles;
        if (state == DIR_READY) {
            ci->st.ready++;
            if (reused)
                ci->st.reused++;
            else
                ci->st.built++;
        } else {
            ci->st.failed++;
        }
    }
    pthread_cond_broadcast(&ci->built);
    pthread_mutex_unlock(&ci->lock);
}

/* Store c as dir's index under key if version fp is still the one noticed
 * for dir, and record it ready: 0 and *id; -ECANCELED (nothing stored) when
 * a newer version took over (its own build does the work); or idxdb's error. */
static int store_if_current(struct ckindex *ci, const char *dir, const char *key, const char *fp,
                            const struct ckpt *c, uint64_t *id, struct ckpt_err *e)
{
    pthread_mutex_lock(&ci->store_lock);
    pthread_mutex_lock(&ci->lock);
    struct ckdir *d = dir_find_locked(ci, dir, strlen(dir));
    int current = d && strcmp(d->fingerprint, fp) == 0;
    pthread_mutex_unlock(&ci->lock);
    int rc = current ? idxdb_put(ci->db, key, fp, c, id, e) : -ECANCELED;
    if (rc == 0)
        finish_build(ci, dir, fp, DIR_READY, *id, c->nfiles, 0); /* before another build stores */
    pthread_mutex_unlock(&ci->store_lock);
    return rc;
}

/* Reuse the stored index if its fingerprint matches: returns 1, *id and
 * *nfiles. */
static int stored_index_matches(struct ckindex *ci, const char *key, const char *fp, uint64_t *id,
                                uint32_t *nfiles)
{
    struct idxdb_txn *t;
    struct ckpt_err e = {0};
    if (idxdb_begin(ci->db, &t, &e) != 0)
        return 0;
    struct idxdb_ckpt c;
    int match = idxdb_ckpt_get(t, key, &c) == 0 && c.fingerprint_len == strlen(fp) &&
                memcmp(c.fingerprint, fp, c.fingerprint_len) == 0;
    if (match) {
        *id = c.id;
        *nfiles = c.nfiles;
    }
    idxdb_end(t);
    return match;
}

/* 1 if fp is still the version noticed for dir. */
static int is_current(struct ckindex *ci, const char *dir, const char *fp)
{
    pthread_mutex_lock(&ci->lock);
    struct ckdir *d = dir_find_locked(ci, dir, strlen(dir));
    int current = d && strcmp(d->fingerprint, fp) == 0;
    pthread_mutex_unlock(&ci->lock);
    return current;
}

/* The build of dir moves on from version fingerprint from to to, the
 * metadata files meta[0..n) (one changed under it). 0 if dir has meanwhile
 * been noticed at another version: that version's own build does the work. */
static int rebuild_as(struct ckindex *ci, const char *dir, const char *from, const char *to,
                      const struct ckindex_meta *meta, size_t n)
{
    struct ckindex_meta *copy = meta_copy(meta, n);
    if (!copy)
        return 0;
    pthread_mutex_lock(&ci->lock);
    struct ckdir *d = dir_find_locked(ci, dir, strlen(dir));
    int mine = d && strcmp(d->fingerprint, from) == 0;
    if (mine) {
        snprintf(d->fingerprint, sizeof d->fingerprint, "%s", to);
        meta_free(d->meta, d->nmeta);
        d->meta = copy;
        d->nmeta = n;
        copy = NULL;
    }
    pthread_mutex_unlock(&ci->lock);
    meta_free(copy, n);
    return mine;
}

/* Parse dir's checkpoint with its metadata files pinned to the versions
 * noticed (j->meta) and store it under key and j->fingerprint: 0 and *id,
 * -ESTALE if one of them is no longer that version, or another error (e says
 * why). ckpt_load detects the format from the metadata files (the io lists
 * them from memory), so the store sees one GET per metadata file and
 * nothing else: the files are the ones they name, their sizes what the
 * mount knows (ci->known), no listing. */
static int build_set(struct ckindex *ci, const struct build_job *j, const char *key, uint64_t *id,
                     struct ckpt_err *e)
{
    struct ckpt_io_pinned_file *pins = calloc(j->nmeta ? j->nmeta : 1, sizeof *pins);
    if (!pins)
        return -ENOMEM;
    for (size_t i = 0; i < j->nmeta; i++)
        pins[i] =
            (struct ckpt_io_pinned_file){j->meta[i].name, j->meta[i].st.etag, j->meta[i].st.size};
    struct ckpt_io_pinset set = {.store = ci->store,
                                 .dir = j->dir,
                                 .files = pins,
                                 .nfiles = j->nmeta,
                                 .known = ci->known,
                                 .known_arg = ci->known_arg};
    struct ckpt_io io;
    ckpt_io_from_pinset(&io, &set);
    struct ckpt_load_options opt;
    ckpt_load_options_default(&opt);
    opt.stat_files = CKPT_FILES_KNOWN;
    struct ckpt *c = NULL;
    int rc = ckpt_load(&io, j->dir, &opt, &c, e);
    ckpt_io_pinset_done(&set);
    if (rc == 0)
        rc = store_if_current(ci, j->dir, key, j->fingerprint, c, id, e);
    if (rc == 0)
        log_info("index: built %s (%u items in %u files, from %zu metadata file%s)", key, c->nitems,
                 c->nfiles, j->nmeta, j->nmeta == 1 ? "" : "s");
    ckpt_free(c);
    free(pins);
    return rc;
}

/* The build of dir found one of its metadata files changed (-ESTALE): ask
 * the store for the versions there now and move the build to them (1), or
 * 0 (one is gone, or dir was noticed anew meanwhile: that build does the
 * work). */
static int restat_set(struct ckindex *ci, struct build_job *j)
{
    for (size_t i = 0; i < j->nmeta; i++) {
        char *p = ckpt_path_join(j->dir, j->meta[i].name);
        struct store_stat st;
        int ok = p && ci->store->ops->stat(ci->store, p, &st) == 0 && !st.is_dir;
        free(p);
        if (!ok)
            return 0;
        j->meta[i].st = st;
    }
    char fp[IDXDB_FP_MAX];
    ckindex_fingerprint(j->meta, j->nmeta, fp, sizeof fp);
    if (!rebuild_as(ci, j->dir, j->fingerprint, fp, j->meta, j->nmeta))
        return 0;
    snprintf(j->fingerprint, sizeof j->fingerprint, "%s", fp);
    return 1;
}

/* Build from what this mount published (no store requests): 0, or an error
 * after which the store is read instead. */
static int build_from_snapshot(struct ckindex *ci, const struct build_job *j, const char *key,
                               uint64_t *id, struct ckpt_err *e)
{
    char *mpath = ckpt_path_join(j->dir, ".metadata");
    if (!mpath)
        return -ENOMEM;
    struct ckpt_io_snapshot snap = {ci->store, j->dir,   mpath,    j->bytes,
                                    j->len,    j->files, j->nfiles};
    struct ckpt_io io;
    ckpt_io_from_snapshot(&io, &snap);
    struct ckpt_load_options opt;
    ckpt_load_options_default(&opt);
    struct ckpt *c = NULL;
    int rc = ckpt_load_file(&io, j->dir, ".metadata", &opt, &c, e);
    if (rc == 0)
        rc = store_if_current(ci, j->dir, key, j->fingerprint, c, id, e);
    if (rc == 0)
        log_info("index: built %s as published (%u items in %u files)", key, c->nitems, c->nfiles);
    ckpt_free(c);
    free(mpath);
    return rc;
}

static void build_job_run(void *arg)
{
    struct build_job *j = arg;
    struct ckindex *ci = j->ci;
    uint64_t id = 0;
    uint32_t nfiles = 0;
    char *key = key_of(ci, j->dir);
    for (int tries = 1;; tries++) {
        if (atomic_load(&ci->stopping) || !key) {
            finish_build(ci, j->dir, j->fingerprint, DIR_FAILED, 0, 0, 0);
            break;
        }
        if (!is_current(ci, j->dir, j->fingerprint))
            break; /* noticed anew while queued: that version's build does the work */
        if (stored_index_matches(ci, key, j->fingerprint, &id, &nfiles)) {
            log_info("index: %s is up to date (reused)", key);
            finish_build(ci, j->dir, j->fingerprint, DIR_READY, id, nfiles, 1);
            break;
        }
        struct ckpt_err e = {0};
        int rc = -ENOENT;
        if (j->bytes && tries == 1) {
            rc = build_from_snapshot(ci, j, key, &id, &e);
            if (rc != 0 && rc != -ECANCELED) {
                log_info("index: %s as published: %s; reading the store", key,
                         e.msg[0] ? e.msg : ckpt_strerror(rc));
                e = (struct ckpt_err){0};
            }
        }
        if (rc != 0 && rc != -ECANCELED)
            rc = build_set(ci, j, key, &id, &e);
        if (rc == 0 || rc == -ECANCELED) /* stored and recorded, or superseded */
            break;
        if (rc == -ESTALE && tries < BUILD_TRIES) {
            /* Replaced since it was noticed: index the versions there now
             * (under their own fingerprint), unless a newer notice took over. */
            log_info("index: metadata of %s changed while being indexed; starting over", key);
            if (restat_set(ci, j))
                continue;
            if (is_current(ci, j->dir, j->fingerprint))
                finish_build(ci, j->dir, j->fingerprint, DIR_FAILED, 0, 0, 0);
            break;
        }
        /* Once per metadata version: the state stays FAILED until it changes. */
        log_warn("index: cannot index %s: %s; reads continue without the index", key,
                 e.msg[0] ? e.msg : ckpt_strerror(rc));
        finish_build(ci, j->dir, j->fingerprint, DIR_FAILED, 0, 0, 0);
        break;
    }
    free(key);
    build_job_free(j);
}

/* The build job for dir with metadata files meta[0..n), or NULL (already
 * built or building this version, or out of memory). */
static struct build_job *notice_job(struct ckindex *ci, const char *dir,
                                    const struct ckindex_meta *meta, size_t n)
{
    char fp[IDXDB_FP_MAX];
    ckindex_fingerprint(meta, n, fp, sizeof fp);
    size_t len = strlen(dir);
    struct ckindex_meta *kept = meta_copy(meta, n);
    struct build_job *j = calloc(1, sizeof *j + len + 1);
    if (!kept || !j || !(j->meta = meta_copy(meta, n))) {
        meta_free(kept, n);
        free(j);
        return NULL;
    }
    j->nmeta = n;
    pthread_mutex_lock(&ci->lock);
    struct ckdir *d = dir_find_locked(ci, dir, len);
    if (d && strcmp(d->fingerprint, fp) == 0) {
        pthread_mutex_unlock(&ci->lock);
        meta_free(kept, n);
        build_job_free(j);
        return NULL; /* this version is built, being built, or known bad */
    }
    if (!d) {
        d = calloc(1, sizeof *d + len + 1);
        if (!d) {
            pthread_mutex_unlock(&ci->lock);
            meta_free(kept, n);
            build_job_free(j);
            return NULL;
        }
        memcpy(d->dir, dir, len + 1);
        size_t b = dir_bucket(dir, len);
        d->next = ci->dirs[b];
        ci->dirs[b] = d;
    } else if (d->state == DIR_READY) {
        ci->st.ready--;
    }
    d->state = DIR_BUILDING;
    snprintf(d->fingerprint, sizeof d->fingerprint, "%s", fp);
    meta_free(d->meta, d->nmeta);
    d->meta = kept;
    d->nmeta = n;
    pthread_mutex_unlock(&ci->lock);

    j->ci = ci;
    snprintf(j->fingerprint, sizeof j->fingerprint, "%s", fp);
    memcpy(j->dir, dir, len + 1);
    return j;
}

static void submit_job(struct ckindex *ci, struct build_job *j)
{
    if (workq_submit(ci->wq, build_job_run, j) < 0) {
        finish_build(ci, j->dir, j->fingerprint, DIR_FAILED, 0, 0, 0);
        build_job_free(j);
    }
}

/* Notice dir by the metadata files among files[0..n) (ckindex_pick). */
static void notice_files(struct ckindex *ci, const char *dir, const struct ckindex_meta *files,
                         size_t n)
{
    size_t *pick = malloc((n ? n : 1) * sizeof *pick);
    struct ckindex_meta *set = calloc(n ? n : 1, sizeof *set);
    size_t np = pick && set ? ckindex_pick(files, n, pick) : 0;
    for (size_t i = 0; i < np; i++)
        set[i] = files[pick[i]];
    struct build_job *j = np ? notice_job(ci, dir, set, np) : NULL;
    if (j)
        submit_job(ci, j);
    free(set);
    free(pick);
}

void ckindex_notice(struct ckindex *ci, const char *dir, const struct store_stat *metadata)
{
    struct ckindex_meta m = {".metadata", *metadata};
    notice_files(ci, dir, &m, 1);
}

void ckindex_notice_file(struct ckindex *ci, const char *dir, const char *name,
                         const struct store_stat *st)
{
    pthread_mutex_lock(&ci->lock);
    struct ckdir *d = dir_find_locked(ci, dir, strlen(dir));
    size_t n = d ? d->nmeta : 0;
    struct ckindex_meta *all = meta_copy(d ? d->meta : NULL, n);
    struct ckindex_meta *grown = all ? realloc(all, (n + 1) * sizeof *all) : NULL;
    pthread_mutex_unlock(&ci->lock);
    if (!grown) {
        meta_free(all, n);
        return;
    }
    all = grown;
    size_t i = 0;
    while (i < n && strcmp(all[i].name, name) != 0)
        i++;
    if (i == n)
        all[n++].name = NULL;
    free((char *)all[i].name);
    all[i] = (struct ckindex_meta){strdup(name), *st};
    if (all[i].name)
        notice_files(ci, dir, all, n);
    meta_free(all, n);
}

void ckindex_scan_add(struct ckindex_scan *sc, const char *name, const struct store_stat *st)
{
    if (sc->oom || st->is_dir || !ckindex_metadata_name(name))
        return;
    if (sc->n == sc->cap) {
        size_t cap = sc->cap ? 2 * sc->cap : 8;
        struct ckindex_meta *grown = realloc(sc->files, cap * sizeof *grown);
        if (!grown) {
            sc->oom = 1;
            return;
        }
        sc->files = grown;
        sc->cap = cap;
    }
    if (!(sc->files[sc->n].name = strdup(name))) {
        sc->oom = 1;
        return;
    }
    sc->files[sc->n++].st = *st;
}

void ckindex_scan_end(struct ckindex *ci, const char *dir, struct ckindex_scan *sc, int complete)
{
    /* Without memory some files may be missing: only a .metadata is sure. */
    if (complete && !sc->oom) {
        notice_files(ci, dir, sc->files, sc->n);
    } else {
        for (size_t i = 0; i < sc->n; i++)
            if (strcmp(sc->files[i].name, ".metadata") == 0)
                ckindex_notice(ci, dir, &sc->files[i].st);
    }
    ckindex_scan_drop(sc);
}

void ckindex_scan_drop(struct ckindex_scan *sc)
{
    meta_free(sc->files, sc->n);
    *sc = (struct ckindex_scan){0};
}

void ckindex_notice_published(struct ckindex *ci, const char *dir,
                              const struct store_stat *metadata, const void *bytes, size_t len,
                              const struct store_file_size *files, size_t nfiles)
{
    struct ckindex_meta m = {".metadata", *metadata};
    struct build_job *j = notice_job(ci, dir, &m, 1);
    if (!j)
        return;
    /* Without memory for the copies the build reads the store. */
    j->bytes = malloc(len ? len : 1);
    j->files = calloc(nfiles ? nfiles : 1, sizeof *j->files);
    for (size_t i = 0; j->bytes && j->files && i < nfiles; i++, j->nfiles++) {
        j->files[i].size = files[i].size;
        if (!(j->files[i].name = strdup(files[i].name)))
            break;
    }
    if (j->bytes && j->files && j->nfiles == nfiles) {
        memcpy(j->bytes, bytes, len);
        j->len = len;
    } else {
        free(j->bytes);
        j->bytes = NULL;
    }
    submit_job(ci, j);
}

/* Where item_lookup found byte off of a file: an open read transaction of
 * the index, the checkpoint's id, the file's number and the item's span. */
struct item_at {
    struct idxdb_txn *t;
    uint64_t id;
    uint32_t file;
    struct idxdb_span sp;
};

/* A read transaction at the item holding byte off of the file at path:
 * 0 with *at filled (the caller ends at->t); -1 when the file is not in a
 * ready index or no item holds off. */
static int item_lookup(struct ckindex *ci, const char *path, uint64_t off, struct item_at *at)
{
    const char *slash = strrchr(path, '/');
    size_t dlen = slash ? (size_t)(slash - path) : 0;
    pthread_mutex_lock(&ci->lock);
    struct ckdir *d = dir_find_locked(ci, path, dlen);
    at->id = d && d->state == DIR_READY ? d->id : 0;
    pthread_mutex_unlock(&ci->lock);
    struct ckpt_err e = {0};
    if (!at->id || idxdb_begin(ci->db, &at->t, &e) != 0)
        return -1;
    pthread_mutex_lock(&ci->lock);
    ci->st.lookups++;
    pthread_mutex_unlock(&ci->lock);
    if (idxdb_file_find(at->t, at->id, slash ? slash + 1 : path, &at->file) == 0 &&
        idxdb_item_at(at->t, at->id, at->file, off, &at->sp) == 0)
        return 0;
    idxdb_end(at->t);
    return -1;
}

int ckindex_items(struct ckindex *ci, const char *path, uint64_t off, uint64_t budget,
                  struct ckindex_span *out, int max)
{
    struct item_at at;
    if (max < 1 || item_lookup(ci, path, off, &at) != 0)
        return 0;
    struct idxdb_span sp = at.sp;
    int n = 0;
    uint64_t total = sp.length;
    out[n++] = (struct ckindex_span){sp.offset, sp.length};
    while (n < max && idxdb_layout_next(at.t, &sp) == 0 && total + sp.length <= budget) {
        total += sp.length;
        out[n++] = (struct ckindex_span){sp.offset, sp.length};
    }
    idxdb_end(at.t);
    return n;
}

int ckindex_siblings(struct ckindex *ci, const char *path, uint64_t off, struct ckindex_chunk *out,
                     int max)
{
    struct item_at at;
    if (max < 1 || item_lookup(ci, path, off, &at) != 0)
        return 0;
    int n = 0;
    struct idxdb_item it;
    struct idxdb_tensor tn;
    if (idxdb_item_get(at.t, at.id, at.sp.item, &it) == 0 && it.kind == CKPT_ITEM_TENSOR &&
        idxdb_tensor_get(at.t, at.id, it.tensor, &tn) == 0) {
        for (uint32_t c = 0; c < tn.nchunks && n < max; c++) {
            struct idxdb_item ch;
            struct idxdb_file f;
            uint32_t item = idxdb_u32(tn.chunk_items, c);
            if (item == at.sp.item || idxdb_item_get(at.t, at.id, item, &ch) != 0 ||
                ch.file == at.file || idxdb_file_get(at.t, at.id, ch.file, &f) != 0 ||
                f.name_len >= sizeof out[n].name)
                continue;
            memcpy(out[n].name, f.name, f.name_len);
            out[n].name[f.name_len] = '\0';
            out[n].rank = f.rank;
            out[n].offset = ch.offset;
            out[n].length = ch.length;
            n++;
        }
    }
    idxdb_end(at.t);
    return n;
}

/* Wait (at most wait_s seconds) while the index of the directory of path is
 * being built. */
static void wait_built(struct ckindex *ci, const char *path, double wait_s)
{
    const char *slash = strrchr(path, '/');
    size_t dlen = slash ? (size_t)(slash - path) : 0;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += (time_t)wait_s;
    until.tv_nsec += (long)((wait_s - (double)(time_t)wait_s) * 1e9);
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&ci->lock);
    for (;;) {
        struct ckdir *d = dir_find_locked(ci, path, dlen);
        if (!d || d->state != DIR_BUILDING || atomic_load(&ci->stopping) ||
            pthread_cond_timedwait(&ci->built, &ci->lock, &until) != 0)
            break;
    }
    pthread_mutex_unlock(&ci->lock);
}

/* Items looked at by ckindex_file_sharing; the rest of a larger file is
 * taken to be like them. */
#define SHARING_SCAN_MAX 65536

int ckindex_file_sharing(struct ckindex *ci, const char *path, double wait_s, uint64_t min_len,
                         uint64_t *shared, uint64_t *total)
{
    *shared = *total = 0;
    wait_built(ci, path, wait_s);
    const char *slash = strrchr(path, '/');
    size_t dlen = slash ? (size_t)(slash - path) : 0;
    pthread_mutex_lock(&ci->lock);
    struct ckdir *d = dir_find_locked(ci, path, dlen);
    uint64_t id = d && d->state == DIR_READY ? d->id : 0;
    pthread_mutex_unlock(&ci->lock);
    struct idxdb_txn *t;
    struct ckpt_err e = {0};
    if (!id || idxdb_begin(ci->db, &t, &e) != 0)
        return -1;
    uint32_t file;
    struct idxdb_span sp;
    int rc = -1;
    if (idxdb_file_find(t, id, slash ? slash + 1 : path, &file) == 0) {
        rc = 0;
        int more = idxdb_item_from(t, id, file, 0, &sp) == 0;
        for (int n = 0; more && n < SHARING_SCAN_MAX; n++, more = idxdb_layout_next(t, &sp) == 0) {
            struct idxdb_item it;
            struct idxdb_tensor tn;
            /* a chunk of a tensor with others: the rank that overlaps it;
             * a whole tensor or a bytes item: every rank */
            int one = idxdb_item_get(t, id, sp.item, &it) == 0 && it.kind == CKPT_ITEM_TENSOR &&
                      idxdb_tensor_get(t, id, it.tensor, &tn) == 0 && tn.nchunks > 1;
            *total += sp.length;
            if (!one && sp.length >= min_len)
                *shared += sp.length;
        }
    }
    idxdb_end(t);
    return rc;
}

int ckindex_building(struct ckindex *ci, const char *path)
{
    const char *slash = strrchr(path, '/');
    size_t dlen = slash ? (size_t)(slash - path) : 0;
    pthread_mutex_lock(&ci->lock);
    struct ckdir *d = dir_find_locked(ci, path, dlen);
    int building = d && d->state == DIR_BUILDING;
    pthread_mutex_unlock(&ci->lock);
    return building;
}

int ckindex_is_checkpoint(struct ckindex *ci, const char *dir)
{
    pthread_mutex_lock(&ci->lock);
    int known = dir_find_locked(ci, dir, strlen(dir)) != NULL;
    pthread_mutex_unlock(&ci->lock);
    return known;
}

int64_t ckindex_file_count(struct ckindex *ci, const char *dir)
{
    pthread_mutex_lock(&ci->lock);
    const struct ckdir *d = dir_find_locked(ci, dir, strlen(dir));
    int64_t n = -1;
    if (d && d->state != DIR_FAILED)
        n = d->state == DIR_BUILDING ? 0 : (int64_t)d->nfiles;
    pthread_mutex_unlock(&ci->lock);
    return n;
}

void ckindex_get_stats(struct ckindex *ci, struct ckindex_stats *out)
{
    pthread_mutex_lock(&ci->lock);
    *out = ci->st;
    pthread_mutex_unlock(&ci->lock);
}

int ckindex_open(const char *cache_dir, const char *store_url, struct store *store,
                 struct workq *wq, ckindex_known_fn known, void *known_arg, struct ckindex **out,
                 char *err, size_t errlen)
{
    struct ckindex *ci = calloc(1, sizeof *ci);
    char *dir = ckpt_path_join(cache_dir, "index");
    if (!ci || !dir || !(ci->store_url = strdup(store_url))) {
        free(dir);
        if (ci)
            free(ci->store_url);
        free(ci);
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    struct idxdb_options opt;
    idxdb_options_default(&opt);
    opt.flags |= IDXDB_RESET; /* an index of another schema is only a cache: rebuild */
    struct ckpt_err e = {0};
    int rc = idxdb_open(dir, &opt, &ci->db, &e);
    if (rc != 0) {
        snprintf(err, errlen, "cannot open the index in %s: %s", dir,
                 e.msg[0] ? e.msg : ckpt_strerror(rc));
        free(dir);
        free(ci->store_url);
        free(ci);
        return rc < 0 ? rc : -EIO;
    }
    free(dir);
    ci->store = store;
    ci->wq = wq;
    ci->known = known;
    ci->known_arg = known_arg;
    pthread_mutex_init(&ci->lock, NULL);
    pthread_cond_init(&ci->built, NULL);
    pthread_mutex_init(&ci->store_lock, NULL);
    *out = ci;
    return 0;
}

void ckindex_cancel(struct ckindex *ci)
{
    if (ci)
        atomic_store(&ci->stopping, 1);
}

void ckindex_close(struct ckindex *ci)
{
    if (!ci)
        return;
    for (size_t b = 0; b < CKINDEX_BUCKETS; b++) {
        struct ckdir *d = ci->dirs[b];
        while (d) {
            struct ckdir *next = d->next;
            meta_free(d->meta, d->nmeta);
            free(d);
            d = next;
        }
    }
    idxdb_close(ci->db);
    pthread_mutex_destroy(&ci->lock);
    pthread_cond_destroy(&ci->built);
    pthread_mutex_destroy(&ci->store_lock);
    free(ci->store_url);
    free(ci);
}
