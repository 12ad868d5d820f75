/*
 * fs/write/wfile.c - the records of the write path (see wfile.h): staged
 * files' life (allocation, references, the drop of a clean file), the table
 * by path and the list, the journal record of a file, the waits on
 * stage->changed and the clients' write rate. The bottom of fs/write: it
 * calls extents, parts, journal and util only.
 */
#include "wfile.h"

#include "clock.h"
#include "journal.h"
#include "log.h"
#include "parts.h"
#include "strutil.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- names ------------------------------------------------------------- */

void wfile_staging_name(uint64_t id, char name[32])
{
    snprintf(name, 32, "%016" PRIx64, id);
}

int wfile_is_commit_name(const char *name)
{
    size_t n = strlen(name);
    return (n >= 9 && strcmp(name + n - 9, ".metadata") == 0) || wfile_is_hf_index_name(name);
}

int wfile_is_hf_index_name(const char *name)
{
    static const char suf[] = ".safetensors.index.json";
    size_t n = strlen(name), k = sizeof suf - 1;
    return n > k && strcmp(name + n - k, suf) == 0;
}

int wfile_is_hold_name(const char *name)
{
    size_t n = strlen(name);
    return n > 4 && strcmp(name + n - 4, ".tmp") == 0;
}

/* ---- one record -------------------------------------------------------- */

struct wfile *wfile_alloc(const char *path)
{
    struct wfile *wf = calloc(1, sizeof *wf);
    if (!wf || !(wf->path = strdup(path))) {
        free(wf);
        return NULL;
    }
    wf->fd = -1;
    extents_init(&wf->written);
    wf->refs = 1;
    return wf;
}

void wfile_free(struct wfile *wf)
{
    if (wf->fd >= 0)
        close(wf->fd);
    extents_free(&wf->written);
    for (size_t i = 0; i < wf->nneeds; i++)
        free(wf->needs[i].name);
    free(wf->needs);
    free(wf->parts);
    free(wf->upload_key);
    free(wf->upload_id);
    free(wf->link_wait);
    free(wf->path);
    free(wf);
}

void wfile_ref(struct wfile *wf)
{
    assert(wf->refs >= 0);
    wf->refs++;
}

int wfile_clean(const struct wfile *wf)
{
    return wf->synced_version == wf->version;
}

int wfile_retire(struct stage *st, const struct wfile *wf)
{
    if (!st->cfg.on_retire || wf->unlinked || !wfile_clean(wf) || !wf->synced_etag[0] ||
        wf->synced_size != wf->size || wf->size == 0)
        return 0;
    char name[32];
    wfile_staging_name(wf->id, name);
    char *file = str_printf("%s/%s", st->files_dir, name);
    int taken = file && st->cfg.on_retire(st->cfg.on_retire_arg, wf->path, wf->synced_etag,
                                          wf->size, file) == 0;
    free(file);
    return taken;
}

/* Remove wf for good (lock held on entry and exit; unlocks in between). */
static void wfile_drop(struct stage *st, struct wfile *wf)
{
    assert(wf->refs == 0 && wf->jobs == 0);
    if (!wf->unlinked)
        wfile_table_remove(st, wf);
    if (wf->prev)
        wf->prev->next = wf->next;
    else
        st->files = wf->next;
    if (wf->next)
        wf->next->prev = wf->prev;
    assert(st->staged_bytes >= wf->size);
    st->staged_bytes -= wf->size;
    pthread_mutex_unlock(&st->lock);
    if (wf->journaled && journal_del(st->journal, wf->id) < 0)
        log_warn("stage: cannot remove the journal record of %s", wf->path);
    char name[32];
    wfile_staging_name(wf->id, name);
    if (!wfile_retire(st, wf) && unlinkat(st->files_dirfd, name, 0) < 0 && errno != ENOENT)
        log_warn("stage: cannot remove staging file %s: %s", name, strerror(errno));
    wfile_free(wf);
    pthread_mutex_lock(&st->lock);
    pthread_cond_broadcast(&st->changed);
}

void wfile_unref(struct stage *st, struct wfile *wf)
{
    WFILE_ASSERT_LOCKED(st);
    assert(wf->refs > 0);
    if (--wf->refs > 0)
        return;
    if (wf->unlinked || (wfile_clean(wf) && !st->stopping))
        wfile_drop(st, wf);
}

int wfile_parts_reserve(struct wfile *wf, uint32_t count)
{
    if (count <= wf->nparts)
        return 0;
    uint32_t cap = wf->nparts ? wf->nparts : 16;
    while (cap < count)
        cap *= 2;
    struct wfile_part *p = realloc(wf->parts, cap * sizeof *p);
    if (!p)
        return -ENOMEM;
    memset(p + wf->nparts, 0, (cap - wf->nparts) * sizeof *p);
    wf->parts = p;
    wf->nparts = cap;
    return 0;
}

/* ---- the journal record ------------------------------------------------ */

/* What one journal write needs, copied out of wf under the lock. */
struct jsnap {
    struct journal_rec rec;
    struct journal_part *parts;
    char *path, *upload_key, *upload_id;
};

static void jsnap_free(struct jsnap *s)
{
    if (!s)
        return;
    free(s->path);
    free(s->upload_key);
    free(s->upload_id);
    free(s->parts);
    free(s);
}

/* The parts of wf's active multipart upload that hold the current bytes,
 * into s->parts; returns how many (lock held). s->parts stays NULL when out
 * of memory. */
static uint32_t snapshot_parts(struct stage *st, struct wfile *wf, struct jsnap *s)
{
    uint32_t n = 0, count = parts_count(st->cfg.part_size, wf->size);
    s->parts = calloc(count ? count : 1, sizeof *s->parts);
    for (uint32_t i = 0; s->parts && i < count && i < wf->nparts; i++) {
        const struct wfile_part *p = &wf->parts[i];
        uint64_t off = parts_offset(st->cfg.part_size, i + 1);
        uint64_t len = parts_size(st->cfg.part_size, i + 1);
        if (off + len > wf->size)
            len = wf->size - off;
        if (p->uploaded && p->up_gen == p->gen && p->up_len == len) {
            s->parts[n] = (struct journal_part){.number = i + 1, .offset = off, .length = len};
            memcpy(s->parts[n].etag, p->etag, STORE_ETAG_MAX);
            n++;
        }
    }
    return n;
}

/* wf's record as it stands (lock held), or NULL when out of memory. */
static struct jsnap *snapshot(struct stage *st, struct wfile *wf)
{
    struct jsnap *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->path = strdup(wf->path);
    s->upload_key = strdup(wf->upload_key ? wf->upload_key : "");
    s->upload_id = strdup(wf->upload_id ? wf->upload_id : "");
    int sealed = wf->seal_version == wf->version;
    int with_parts = sealed && wf->mpu == WFILE_MPU_ACTIVE;
    uint32_t n = with_parts ? snapshot_parts(st, wf, s) : 0;
    if (!s->path || !s->upload_key || !s->upload_id || (with_parts && !s->parts)) {
        jsnap_free(s);
        return NULL;
    }
    uint32_t flags = 0;
    if (wf->discard)
        flags |= JOURNAL_DISCARD;
    else if (sealed)
        flags |= JOURNAL_SEALED | (wf->durable_version == wf->version ? JOURNAL_DURABLE : 0);
    if (wf->link_wait)
        flags |= JOURNAL_LINK;
    s->rec = (struct journal_rec){.id = wf->id,
                                  .seq = ++wf->jseq,
                                  .flags = flags,
                                  .size = wf->size,
                                  .boot_id = st->boot_id,
                                  .store = st->store_name,
                                  .path = s->path,
                                  .upload_key = s->upload_key,
                                  .upload_id = s->upload_id,
                                  .nparts = n,
                                  .parts = s->parts};
    wf->journaled = 1;
    if (flags & JOURNAL_SEALED) /* cleared only once a record saying otherwise is written */
        wf->sealed_in_journal = 1;
    wf->journaled_at = mono_seconds();
    return s;
}

int wfile_journal(struct stage *st, struct wfile *wf)
{
    WFILE_ASSERT_LOCKED(st);
    assert(wf->refs > 0);
    struct jsnap *s = snapshot(st, wf);
    pthread_mutex_unlock(&st->lock);
    int rc = s ? journal_put(st->journal, &s->rec) : -ENOMEM;
    if (rc < 0)
        log_error("stage: cannot journal %s: %s (a crash now could lose track of it)",
                  s ? s->path : "a staged file", strerror(-rc));
    pthread_mutex_lock(&st->lock);
    /* The record stops saying "sealed" when it is on disk, not before: a
     * second writer meanwhile still sees the flag and waits for its own
     * record, instead of changing bytes the journal calls sealed. */
    if (rc == 0 && !(s->rec.flags & JOURNAL_SEALED) && wf->jseq == s->rec.seq)
        wf->sealed_in_journal = 0;
    jsnap_free(s);
    return rc;
}

/* ---- the table and the list -------------------------------------------- */

static size_t bucket_of(const char *path)
{
    return str_hash(path, strlen(path)) % WFILE_BUCKETS;
}

struct wfile *wfile_find(struct stage *st, const char *path)
{
    WFILE_ASSERT_LOCKED(st);
    for (struct wfile *wf = st->table[bucket_of(path)]; wf; wf = wf->hnext)
        if (strcmp(wf->path, path) == 0)
            return wf;
    return NULL;
}

void wfile_table_insert(struct stage *st, struct wfile *wf)
{
    size_t b = bucket_of(wf->path);
    wf->hnext = st->table[b];
    st->table[b] = wf;
}

void wfile_table_remove(struct stage *st, struct wfile *wf)
{
    for (struct wfile **pp = &st->table[bucket_of(wf->path)]; *pp; pp = &(*pp)->hnext) {
        if (*pp == wf) {
            *pp = wf->hnext;
            wf->hnext = NULL;
            return;
        }
    }
}

void wfile_link(struct stage *st, struct wfile *wf)
{
    assert(!wf->prev && !wf->next && wf != st->files);
    wfile_table_insert(st, wf);
    wf->next = st->files;
    if (wf->next)
        wf->next->prev = wf;
    st->files = wf;
    st->staged_bytes += wf->size;
}

struct wfile **wfile_collect(struct stage *st, int (*pick)(const struct wfile *, const void *),
                             const void *arg, size_t *n)
{
    WFILE_ASSERT_LOCKED(st);
    size_t count = 0;
    for (struct wfile *wf = st->files; wf; wf = wf->next)
        count += pick(wf, arg) != 0;
    *n = 0;
    struct wfile **v = count ? malloc(count * sizeof *v) : NULL;
    for (struct wfile *wf = st->files; v && wf; wf = wf->next) {
        if (pick(wf, arg)) {
            wfile_ref(wf);
            v[(*n)++] = wf;
        }
    }
    return v;
}

void wfile_release_all(struct stage *st, struct wfile **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        wfile_unref(st, v[i]);
    free(v);
}

/* ---- waiting ----------------------------------------------------------- */

void wfile_wait(struct stage *st, double seconds)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long ns = ts.tv_nsec + (long)((seconds - (double)(long)seconds) * 1e9);
    ts.tv_sec += (time_t)seconds + ns / 1000000000L;
    ts.tv_nsec = ns % 1000000000L;
    pthread_cond_timedwait(&st->changed, &st->lock, &ts);
}

void wfile_waiter_enter(struct stage *st)
{
    st->upload_waiters++;
    pthread_cond_broadcast(&st->changed); /* uploads yielding to writers: go */
}

void wfile_waiter_leave(struct stage *st)
{
    assert(st->upload_waiters > 0);
    st->upload_waiters--;
}

/* ---- the clients' write rate ------------------------------------------- */

void wfile_note_write(struct stage *st, uint64_t n)
{
    double now = mono_seconds();
    if (now - st->write_window_at >= WFILE_WRITE_WINDOW) {
        st->write_previous =
            now - st->write_window_at < 2 * WFILE_WRITE_WINDOW ? st->write_window : 0;
        st->write_window = 0;
        st->write_window_at = now;
    }
    st->write_window += n;
}

uint64_t wfile_recent_writes(struct stage *st, double now)
{
    double age = now - st->write_window_at;
    if (age < WFILE_WRITE_WINDOW)
        return st->write_previous + st->write_window;
    return age < 2 * WFILE_WRITE_WINDOW ? st->write_window : 0;
}
