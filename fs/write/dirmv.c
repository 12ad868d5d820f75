/*
 * fs/write/dirmv.c - renaming a directory on a store of keys (see dirmv.h):
 * the plan (which object moves in which step), the parallel copies and
 * deletes, the journal record of each phase, and the resumption of an
 * interrupted rename at mount.
 *
 * Phases, each journaled (and synced) before it starts:
 *   COPYING   from is whole; copy markers, then data, then commit files
 *             (every data object is at the new name before any commit file).
 *   DELETING  to is whole; delete from's commit files first (the old name
 *             stops looking complete), then its data, then its markers.
 *   UNDOING   a copy failed: delete what is below to (it was empty before),
 *             commit files first, leaving from as it was.
 * The objects are listed again from the store at each (re)start: in COPYING
 * nothing of from was deleted yet, in DELETING what is left of from is what
 * remains to delete, so the record needs only the two names.
 */
#include "dirmv.h"

#include "clock.h"
#include "journal.h"
#include "log.h"
#include "strutil.h"
#include "wfile.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define PROGRESS_OBJECTS 1000 /* a progress line every this many objects ... */
#define PROGRESS_SECONDS 5.0  /* ... or this many seconds */

/* ---- the plan (pure) ----------------------------------------------------- */

enum dirmv_kind dirmv_kind_of(const char *rel)
{
    size_t n = strlen(rel);
    if (n == 0 || rel[n - 1] == '/')
        return DIRMV_MARKER;
    return wfile_is_commit_name(path_base(rel)) ? DIRMV_COMMIT : DIRMV_DATA;
}

int dirmv_step_of(const struct dirmv_item *item, int deleting)
{
    switch (item->kind) {
    case DIRMV_MARKER:
        return deleting ? 2 : 0;
    case DIRMV_DATA:
        return 1;
    case DIRMV_COMMIT:
        return deleting ? 0 : 2;
    }
    return 1;
}

static size_t depth_of(const char *rel)
{
    size_t d = 0;
    for (; *rel; rel++)
        d += *rel == '/';
    return d;
}

static int order_deleting; /* qsort has no argument: dirmv_order is called under order_lock */
static pthread_mutex_t order_lock = PTHREAD_MUTEX_INITIALIZER;

static int compare_items(const void *pa, const void *pb)
{
    const struct dirmv_item *a = pa, *b = pb;
    int sa = dirmv_step_of(a, order_deleting), sb = dirmv_step_of(b, order_deleting);
    if (sa != sb)
        return sa < sb ? -1 : 1;
    if (a->kind == DIRMV_MARKER) { /* made shallow first, removed deepest first */
        size_t da = depth_of(a->rel), db = depth_of(b->rel);
        if (da != db)
            return (da < db) == !order_deleting ? -1 : 1;
    }
    return strcmp(a->rel, b->rel);
}

void dirmv_order(struct dirmv_item *items, size_t n, int deleting)
{
    pthread_mutex_lock(&order_lock);
    order_deleting = deleting;
    qsort(items, n, sizeof *items, compare_items);
    pthread_mutex_unlock(&order_lock);
}

/* ---- listing ------------------------------------------------------------- */

struct plan {
    struct dirmv_item *items;
    size_t n, cap;
    uint64_t limit; /* stop (-EXDEV) beyond this many; 0 = none */
    uint64_t bytes;
    int rc;
};

static int add_item(void *arg, const char *name, const struct store_stat *st)
{
    struct plan *p = arg;
    if (strstr(name, ".ckptfs-upload."))
        return 0; /* a local store's upload in progress: never on S3 */
    if (p->limit && p->n >= p->limit) {
        p->rc = -EXDEV;
        return 1;
    }
    if (p->n == p->cap) {
        size_t cap = p->cap ? 2 * p->cap : 256;
        struct dirmv_item *ni = realloc(p->items, cap * sizeof *ni);
        if (!ni) {
            p->rc = -ENOMEM;
            return 1;
        }
        p->items = ni;
        p->cap = cap;
    }
    struct dirmv_item *it = &p->items[p->n];
    memset(it, 0, sizeof *it);
    if (!(it->rel = strdup(name))) {
        p->rc = -ENOMEM;
        return 1;
    }
    it->size = st->size;
    memcpy(it->etag, st->etag, sizeof it->etag);
    it->etag[STORE_ETAG_MAX - 1] = '\0';
    it->kind = dirmv_kind_of(name);
    p->bytes += st->size;
    p->n++;
    return 0;
}

static void plan_free(struct plan *p)
{
    for (size_t i = 0; i < p->n; i++)
        free(p->items[i].rel);
    free(p->items);
    memset(p, 0, sizeof *p);
}

/* Every object below dir into p (limit: more is -EXDEV). */
static int list_plan(const struct dirmv_env *e, const char *dir, uint64_t limit, struct plan *p)
{
    memset(p, 0, sizeof *p);
    p->limit = limit;
    if (!e->store->ops->list_below)
        return -EXDEV;
    int rc = e->store->ops->list_below(e->store, dir, add_item, p);
    if (rc == -ENOENT)
        rc = 0;
    if (rc == 0)
        rc = p->rc;
    if (rc < 0)
        plan_free(p);
    return rc;
}

/* ---- running one step in parallel --------------------------------------- */

struct run {
    const struct dirmv_env *e;
    const char *from, *to; /* directories: objects are copied from/rel -> to/rel */
    const char *what;      /* for logs: "copied", "deleted" */
    int deleting;
    int keep_own_marker; /* deleting: leave the directory's own marker ("") */
    struct dirmv_item *items;
    size_t begin, end;  /* this step's items */
    atomic_size_t next; /* the next item to take */
    atomic_size_t done; /* items finished, all steps */
    size_t total;
    atomic_int rc; /* the first failure */
    pthread_mutex_t log_lock;
    double logged_at;
    size_t logged_done;
};

/* "dir/rel" without a marker's trailing slash (malloc'ed). */
static char *join(const char *dir, const char *rel)
{
    size_t n = strlen(rel);
    if (n && rel[n - 1] == '/')
        n--;
    return n ? str_printf("%s/%.*s", dir, (int)n, rel) : strdup(dir);
}

/* Copy (or delete) one item. */
static int move_one(struct run *r, const struct dirmv_item *it)
{
    struct store *s = r->e->store;
    int rc;
    if (r->deleting) {
        if (it->kind == DIRMV_MARKER && !*it->rel && r->keep_own_marker)
            return 0;
        char *p = join(r->from, it->rel);
        if (!p)
            return -ENOMEM;
        rc = it->kind == DIRMV_MARKER ? s->ops->rmdir(s, p) : s->ops->remove(s, p);
        if (rc == -ENOTEMPTY) { /* something new appeared in it meanwhile: it stays */
            log_warn("rename: %s is not empty after its objects were moved; it stays", p);
            rc = 0;
        }
        free(p);
        return rc == -ENOENT ? 0 : rc;
    }
    char *src = join(r->from, it->rel), *dst = join(r->to, it->rel);
    rc = src && dst ? 0 : -ENOMEM;
    if (rc == 0 && it->kind == DIRMV_MARKER) {
        rc = s->ops->mkdir(s, dst);
        if (rc == -EEXIST)
            rc = 0;
    } else if (rc == 0) {
        char etag[STORE_ETAG_MAX];
        if (r->e->before_copy)
            r->e->before_copy(r->e->arg, dst, it->size);
        rc = s->ops->copy(s, src, it->etag, it->size, dst, etag);
    }
    if (rc < 0)
        log_error("rename: cannot copy %s to %s: %s", src ? src : "?", dst ? dst : "?",
                  strerror(-rc));
    free(src);
    free(dst);
    return rc;
}

static void progress(struct run *r)
{
    size_t done = atomic_fetch_add(&r->done, 1) + 1;
    double now = mono_seconds();
    pthread_mutex_lock(&r->log_lock);
    if (done - r->logged_done >= PROGRESS_OBJECTS || now - r->logged_at >= PROGRESS_SECONDS) {
        log_info("rename: %s -> %s: %s %zu of %zu objects", r->from, r->to, r->what, done,
                 r->total);
        r->logged_at = now;
        r->logged_done = done;
    }
    pthread_mutex_unlock(&r->log_lock);
}

static void *worker(void *arg)
{
    struct run *r = arg;
    for (;;) {
        if (atomic_load(&r->rc) < 0)
            break; /* a failure: stop taking new items */
        size_t i = atomic_fetch_add(&r->next, 1) + r->begin;
        if (i >= r->end)
            break;
        int rc = move_one(r, &r->items[i]);
        if (rc < 0) {
            int zero = 0;
            atomic_compare_exchange_strong(&r->rc, &zero, rc);
            break;
        }
        progress(r);
    }
    return NULL;
}

/* Run items [begin, end) with up to e->parallel threads (the caller is one). */
static int run_step(struct run *r, size_t begin, size_t end)
{
    r->begin = begin;
    r->end = end;
    atomic_store(&r->next, 0);
    int nt = r->e->parallel > 0 ? r->e->parallel : DIRMV_PARALLEL;
    /* Markers one by one, in order: made shallowest first (a store that
     * shows a deeper one makes its parents exist, and mkdir of an existing
     * directory makes no marker), removed deepest first (a marker goes once
     * nothing is below it). */
    if (r->items[begin].kind == DIRMV_MARKER)
        nt = 1;
    if ((size_t)nt > end - begin)
        nt = (int)(end - begin);
    pthread_t t[64];
    int started = 0;
    for (int i = 1; i < nt && i < 64; i++)
        if (pthread_create(&t[started], NULL, worker, r) == 0)
            started++;
    worker(r);
    for (int i = 0; i < started; i++)
        pthread_join(t[i], NULL);
    return atomic_load(&r->rc);
}

/* Order p's items for copying or deleting and run them step by step: a
 * step starts only when every item of the one before is done. */
static int run_all(const struct dirmv_env *e, struct plan *p, const char *from, const char *to,
                   int deleting, int keep_own_marker)
{
    dirmv_order(p->items, p->n, deleting);
    struct run r = {.e = e,
                    .from = from,
                    .to = to,
                    .what = deleting ? "deleted" : "copied",
                    .deleting = deleting,
                    .keep_own_marker = keep_own_marker,
                    .items = p->items,
                    .total = p->n,
                    .logged_at = mono_seconds()};
    pthread_mutex_init(&r.log_lock, NULL);
    int rc = 0;
    for (size_t b = 0; b < p->n && rc == 0;) {
        int step = dirmv_step_of(&p->items[b], deleting);
        size_t end = b;
        while (end < p->n && dirmv_step_of(&p->items[end], deleting) == step)
            end++;
        rc = run_step(&r, b, end);
        b = end;
    }
    pthread_mutex_destroy(&r.log_lock);
    return rc;
}

/* ---- phases --------------------------------------------------------------- */

/* Delete every object below dir (commit files first, markers last; its own
 * marker kept if keep_own_marker). */
static int delete_below(const struct dirmv_env *e, const char *dir, int keep_own_marker)
{
    struct plan p;
    int rc = list_plan(e, dir, 0, &p);
    if (rc == 0)
        rc = run_all(e, &p, dir, dir, 1, keep_own_marker);
    plan_free(&p);
    return rc;
}

/* Journal rec at phase, synced before the phase's first request. */
static int enter_phase(const struct dirmv_env *e, struct journal_dirmv *rec, uint32_t phase)
{
    rec->phase = phase;
    int rc = journal_dirmv_put(e->journal, rec);
    if (rc < 0)
        log_error("rename: %s -> %s: cannot journal it: %s", rec->from, rec->to, strerror(-rc));
    return rc;
}

/* From DELETING on: delete what is left of from, then the record. */
static int finish(const struct dirmv_env *e, struct journal_dirmv *rec)
{
    int rc = enter_phase(e, rec, JOURNAL_DIRMV_DELETING);
    if (rc == 0)
        rc = delete_below(e, rec->from, 0);
    if (rc == 0)
        rc = journal_dirmv_del(e->journal, rec->id);
    if (rc < 0)
        log_error("rename: %s -> %s: the old objects could not all be deleted (%s); the next "
                  "mount finishes it",
                  rec->from, rec->to, strerror(-rc));
    return rc;
}

/* A copy failed: delete what reached to, then the record. */
static int undo(const struct dirmv_env *e, struct journal_dirmv *rec)
{
    int rc = enter_phase(e, rec, JOURNAL_DIRMV_UNDOING);
    if (rc == 0)
        rc = delete_below(e, rec->to, rec->flags & JOURNAL_DIRMV_TO_EXISTED);
    if (rc == 0)
        rc = journal_dirmv_del(e->journal, rec->id);
    if (rc < 0)
        log_error("rename: %s -> %s: the copies could not all be undone (%s); the next mount "
                  "tries again",
                  rec->from, rec->to, strerror(-rc));
    return rc;
}

/* Copy from's objects to to (from whole), then finish. */
static int copy_and_finish(const struct dirmv_env *e, struct journal_dirmv *rec, struct plan *p)
{
    double t0 = mono_seconds();
    log_info("rename: %s -> %s: %zu objects (%" PRIu64 " bytes) to copy on the store", rec->from,
             rec->to, p->n, p->bytes);
    int rc = run_all(e, p, rec->from, rec->to, 0, 0);
    if (rc < 0) {
        undo(e, rec);
        return rc;
    }
    rc = finish(e, rec);
    if (rc == 0)
        log_info("rename: %s -> %s: done, %zu objects in %.1f s", rec->from, rec->to, p->n,
                 mono_seconds() - t0);
    return rc;
}

int dirmv_run(const struct dirmv_env *e, const char *from, const char *to, int to_existed)
{
    struct plan p;
    int rc = list_plan(e, from, e->max_objects, &p);
    if (rc == -EXDEV) {
        log_info("rename: %s has more than %" PRIu64 " objects (--rename-dir-max-objects): "
                 "EXDEV, the caller copies",
                 from, e->max_objects);
        return rc;
    }
    if (rc < 0)
        return rc;
    struct journal_dirmv rec = {.store = e->store_name,
                                .from = from,
                                .to = to,
                                .flags = to_existed ? JOURNAL_DIRMV_TO_EXISTED : 0};
    rc = journal_new_id(e->journal, &rec.id);
    if (rc == 0)
        rc = enter_phase(e, &rec, JOURNAL_DIRMV_COPYING);
    if (rc == 0)
        rc = copy_and_finish(e, &rec, &p);
    plan_free(&p);
    return rc;
}

/* ---- resuming at mount ----------------------------------------------------- */

struct resume_ctx {
    const struct dirmv_env *e;
    int finished;
};

static int resume_one(void *arg, const struct journal_dirmv *r)
{
    struct resume_ctx *c = arg;
    const struct dirmv_env *e = c->e;
    if (strcmp(r->store, e->store_name) != 0)
        return 0; /* another store's: for a mount of that one */
    struct journal_dirmv rec = *r;
    static const char *phases[] = {"", "copying", "deleting the old name", "undoing"};
    log_info("recover: resuming the rename of directory %s to %s (interrupted while %s)", r->from,
             r->to, phases[r->phase]);
    int rc;
    if (r->phase == JOURNAL_DIRMV_COPYING) {
        struct plan p;
        rc = list_plan(e, r->from, 0, &p);
        if (rc == 0)
            rc = copy_and_finish(e, &rec, &p);
        plan_free(&p);
    } else if (r->phase == JOURNAL_DIRMV_DELETING) {
        rc = finish(e, &rec);
    } else {
        rc = undo(e, &rec);
    }
    if (rc == 0) {
        c->finished++;
        log_info("recover: the rename of directory %s to %s is %s", r->from, r->to,
                 r->phase == JOURNAL_DIRMV_UNDOING ? "undone" : "complete");
    } else {
        log_warn("recover: the rename of directory %s to %s could not be finished: %s (the next "
                 "mount tries again)",
                 r->from, r->to, strerror(-rc));
    }
    return 0;
}

static void bad_dirmv(void *arg, uint64_t id)
{
    (void)arg;
    log_error("recover: directory rename record %016" PRIx64 " is damaged; left in place", id);
}

int dirmv_resume_all(const struct dirmv_env *e)
{
    struct resume_ctx c = {.e = e};
    int rc = journal_dirmv_foreach(e->journal, resume_one, bad_dirmv, &c);
    if (rc < 0)
        log_error("recover: cannot read the directory renames of the journal: %s", strerror(-rc));
    return c.finished;
}
