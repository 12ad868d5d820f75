/*
 * tests/unit/mem_store.c - the in-memory store of the unit tests (see
 * mem_store.h). Objects and uploads live in arrays under one mutex, searched
 * linearly (tests hold at most thousands); data copied in or out of a
 * caller's buffer or fd is copied under the lock, but the hook and the
 * injected delays run without it, so delayed calls overlap.
 */
#include "mem_store.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct mem_obj {
    char *path;
    unsigned char *data;
    size_t size;
    int64_t mtime_ns;
    char etag[STORE_ETAG_MAX];
};

struct mem_part {
    uint32_t number;
    unsigned char *data;
    uint64_t len;
    char etag[STORE_ETAG_MAX];
};

struct mem_upload {
    char id[64];
    char *path;
    struct mem_part *parts;
    size_t nparts;
};

struct mem_fault {
    int err;   /* negative errno, 0 = none */
    int times; /* calls left to fail, < 0 = every call */
    int after; /* 1: take effect, then fail (lost answer) */
};

struct mem_store {
    struct store base; /* first: a struct store * is a struct mem_store * */
    pthread_mutex_t lock;
    struct mem_obj *objs;
    size_t nobjs, capobjs;
    struct mem_upload *ups;
    size_t nups, capups;
    uint64_t next_upload;
    uint64_t min_part;
    struct mem_fault faults[MEM_OP_COUNT];
    unsigned delay_us[MEM_OP_COUNT];
    uint64_t calls[MEM_OP_COUNT];
    mem_store_hook_fn hook;
    void *hook_arg;
    int s3_listings;         /* list_below and directory times as the S3 store has them */
    struct store_ops s3_ops; /* with s3_listings: mem_ops and list_below */
    /* progressive reads: bytes "arrive" stream_chunk at a time, stream_us
     * apart; with stream_err, the read fails once stream_fail_at arrived */
    size_t stream_chunk, stream_fail_at;
    unsigned stream_us;
    int stream_err;
};

static struct mem_store *to_mem(struct store *s)
{
    return (struct mem_store *)s;
}

static void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q)
        abort(); /* a test store: out of memory ends the test */
    return q;
}

/* 1 if path is a non-empty key made of non-empty components other than "."
 * and "..", without a leading or trailing '/' (the store namespace). */
static int key_ok(const char *path)
{
    if (!*path)
        return 0;
    for (const char *p = path;;) {
        const char *slash = strchr(p, '/');
        size_t n = slash ? (size_t)(slash - p) : strlen(p);
        if (n == 0 || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.'))
            return 0;
        if (!slash)
            return 1;
        p = slash + 1;
    }
}

/* Content etag: FNV-1a 64 of data; multipart ones end in "-<parts>" as S3's. */
static void make_etag(const unsigned char *data, size_t len, size_t parts, char *etag)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++)
        h = (h ^ data[i]) * 0x100000001b3ull;
    if (parts)
        snprintf(etag, STORE_ETAG_MAX, "%016" PRIx64 "-%zu", h, parts);
    else
        snprintf(etag, STORE_ETAG_MAX, "%016" PRIx64, h);
}

/* The object at path, or NULL. Lock held. */
static struct mem_obj *find_obj(struct mem_store *m, const char *path)
{
    for (size_t i = 0; i < m->nobjs; i++)
        if (strcmp(m->objs[i].path, path) == 0)
            return &m->objs[i];
    return NULL;
}

/* 1 if some key starts with "dir/" ("" = the root: any key). Lock held. */
static int has_prefix(struct mem_store *m, const char *dir)
{
    size_t n = strlen(dir);
    for (size_t i = 0; i < m->nobjs; i++)
        if (n == 0 || (strncmp(m->objs[i].path, dir, n) == 0 && m->objs[i].path[n] == '/'))
            return 1;
    return 0;
}

/* Makes data (taken over, malloc'd) the object at path with etag. Lock held. */
static void set_obj(struct mem_store *m, const char *path, unsigned char *data, size_t len,
                    const char *etag)
{
    struct mem_obj *o = find_obj(m, path);
    if (o) {
        free(o->data);
    } else {
        if (m->nobjs == m->capobjs) {
            m->capobjs = m->capobjs ? 2 * m->capobjs : 16;
            m->objs = xrealloc(m->objs, m->capobjs * sizeof *m->objs);
        }
        o = &m->objs[m->nobjs++];
        o->path = strdup(path);
        if (!o->path)
            abort();
    }
    o->data = data;
    o->size = len;
    o->mtime_ns = (int64_t)time(NULL) * 1000000000;
    snprintf(o->etag, sizeof o->etag, "%s", etag);
}

/* Deletes the object o. Lock held. */
static void drop_obj(struct mem_store *m, struct mem_obj *o)
{
    free(o->path);
    free(o->data);
    *o = m->objs[--m->nobjs];
}

/* The upload id for path, or NULL. Lock held. */
static struct mem_upload *find_upload(struct mem_store *m, const char *path, const char *id)
{
    for (size_t i = 0; i < m->nups; i++)
        if (strcmp(m->ups[i].id, id) == 0 && strcmp(m->ups[i].path, path) == 0)
            return &m->ups[i];
    return NULL;
}

/* Deletes upload u and its parts. Lock held. */
static void drop_upload(struct mem_store *m, struct mem_upload *u)
{
    for (size_t i = 0; i < u->nparts; i++)
        free(u->parts[i].data);
    free(u->parts);
    free(u->path);
    *u = m->ups[--m->nups];
}

static void fill(const struct mem_obj *o, struct store_stat *st)
{
    memset(st, 0, sizeof *st);
    st->size = o->size;
    st->mtime_ns = o->mtime_ns;
    snprintf(st->etag, sizeof st->etag, "%s", o->etag);
}

/* Starts a call: counts it, runs the hook, sleeps the delay and takes one
 * injected failure. Returns the error to fail with now, or 0; *lost gets the
 * error to return after the call has taken effect (0 for none). */
static int enter(struct mem_store *m, const struct mem_call *c, int *lost)
{
    pthread_mutex_lock(&m->lock);
    m->calls[c->op]++;
    mem_store_hook_fn hook = m->hook;
    void *arg = m->hook_arg;
    unsigned delay = m->delay_us[c->op];
    pthread_mutex_unlock(&m->lock);
    if (hook)
        hook(arg, c);
    if (delay)
        usleep(delay);
    pthread_mutex_lock(&m->lock);
    struct mem_fault *f = &m->faults[c->op];
    int err = 0, after = 0;
    if (f->err && f->times != 0) {
        err = f->err;
        after = f->after;
        if (f->times > 0)
            f->times--;
    }
    pthread_mutex_unlock(&m->lock);
    *lost = after ? err : 0;
    return after ? 0 : err;
}

/* Ends a call: a lost answer replaces success; failures count as errors. */
static int leave(struct mem_store *m, int rc, int lost)
{
    if (rc == 0 && lost)
        rc = lost;
    if (rc < 0)
        atomic_fetch_add(&m->base.counters.errors, 1);
    return rc;
}

/* len bytes of fd at off in a new buffer (spare byte), or NULL with *rc. */
static unsigned char *read_fd(int fd, uint64_t off, uint64_t len, int *rc)
{
    unsigned char *b = malloc(len + 1);
    if (!b) {
        *rc = -ENOMEM;
        return NULL;
    }
    for (uint64_t done = 0; done < len;) {
        ssize_t n = pread(fd, b + done, len - done, (off_t)(off + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            *rc = n < 0 ? -errno : -EIO; /* short staging file */
            free(b);
            return NULL;
        }
        done += (uint64_t)n;
    }
    *rc = 0;
    return b;
}

static int64_t newest_below_locked(struct mem_store *m, const char *dir);

static int mem_stat(struct store *s, const char *path, struct store_stat *st)
{
    struct mem_store *m = to_mem(s);
    struct mem_call c = {.op = MEM_OP_STAT, .path = path};
    int lost, rc = enter(m, &c, &lost);
    atomic_fetch_add(&s->counters.head_requests, 1);
    if (rc == 0 && *path && !key_ok(path))
        rc = -EINVAL;
    if (rc == 0) {
        pthread_mutex_lock(&m->lock);
        struct mem_obj *o = *path ? find_obj(m, path) : NULL;
        if (o) {
            fill(o, st);
        } else if (!*path || has_prefix(m, path)) {
            memset(st, 0, sizeof *st);
            st->is_dir = 1;
            if (m->s3_listings)
                st->mtime_ns = newest_below_locked(m, path);
        } else {
            rc = -ENOENT;
        }
        pthread_mutex_unlock(&m->lock);
    }
    return leave(m, rc, lost);
}

struct entry {
    char *name;
    struct store_stat st;
};

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const struct entry *)a)->name, ((const struct entry *)b)->name);
}

/* The keys below dir ("" = all), relative to it ("" for dir's own marker),
 * in key order; *n their count. Lock held; the caller frees names and array. */
static struct entry *keys_below_locked(struct mem_store *m, const char *dir, size_t *n)
{
    size_t dlen = strlen(dir);
    struct entry *e = xrealloc(NULL, (m->nobjs + 1) * sizeof *e);
    *n = 0;
    for (size_t i = 0; i < m->nobjs; i++) {
        const char *k = m->objs[i].path;
        if (dlen && (strncmp(k, dir, dlen) != 0 || k[dlen] != '/'))
            continue;
        e[*n].name = strdup(k + dlen + (dlen ? 1 : 0));
        if (!e[*n].name)
            abort();
        fill(&m->objs[i], &e[*n].st);
        (*n)++;
    }
    qsort(e, *n, sizeof *e, cmp_entry);
    return e;
}

/* A prefix's time by store.h's rule (the S3 store's probe). Lock held. */
static int64_t newest_below_locked(struct mem_store *m, const char *dir)
{
    size_t n;
    struct entry *e = keys_below_locked(m, dir, &n);
    int64_t newest = 0;
    for (size_t i = 0; i < n; i++) {
        if (i < STORE_DIR_TIME_KEYS && e[i].st.mtime_ns > newest)
            newest = e[i].st.mtime_ns;
        free(e[i].name);
    }
    free(e);
    return newest;
}

static int mem_list_below(struct store *s, const char *dir, store_list_fn fn, void *arg)
{
    struct mem_store *m = to_mem(s);
    struct mem_call c = {.op = MEM_OP_LIST, .path = dir};
    int lost, rc = enter(m, &c, &lost);
    if (rc < 0) {
        atomic_fetch_add(&s->counters.list_requests, 1);
        return leave(m, rc, 0);
    }
    size_t n;
    pthread_mutex_lock(&m->lock);
    struct entry *e = keys_below_locked(m, dir, &n);
    pthread_mutex_unlock(&m->lock);
    size_t i = 0, pages = 0;
    for (; i < n && rc == 0; i++) {
        if (i % 1000 == 0)
            pages++; /* one ListObjectsV2 page per 1000 keys, fetched as reached */
        rc = fn(arg, e[i].name, &e[i].st) != 0;
    }
    atomic_fetch_add(&s->counters.list_requests, pages ? pages : 1);
    for (i = 0; i < n; i++)
        free(e[i].name);
    free(e);
    return leave(m, 0, lost);
}

static int mem_list(struct store *s, const char *dir, store_list_fn fn, void *arg)
{
    struct mem_store *m = to_mem(s);
    struct mem_call c = {.op = MEM_OP_LIST, .path = dir};
    int lost, rc = enter(m, &c, &lost);
    if (rc == 0 && *dir && !key_ok(dir))
        rc = -EINVAL;
    if (rc < 0) {
        atomic_fetch_add(&s->counters.list_requests, 1);
        return leave(m, rc, 0);
    }
    struct entry *e = NULL;
    size_t n = 0, dlen = strlen(dir);
    int under = 0; /* keys below dir, markers included */
    pthread_mutex_lock(&m->lock);
    e = xrealloc(NULL, (m->nobjs + 1) * sizeof *e);
    for (size_t i = 0; i < m->nobjs; i++) {
        const char *k = m->objs[i].path;
        if (dlen && (strncmp(k, dir, dlen) != 0 || k[dlen] != '/'))
            continue;
        under = 1;
        const char *rest = k + dlen + (dlen ? 1 : 0);
        const char *slash = strchr(rest, '/');
        if (!*rest)
            continue; /* dir's own marker */
        size_t len = slash ? (size_t)(slash - rest) : strlen(rest);
        int dup = 0;
        for (size_t j = 0; j < n && !dup; j++)
            dup = e[j].st.is_dir == !!slash && strlen(e[j].name) == len &&
                  memcmp(e[j].name, rest, len) == 0;
        if (dup)
            continue;
        e[n].name = strndup(rest, len);
        if (!e[n].name)
            abort();
        if (slash) {
            memset(&e[n].st, 0, sizeof e[n].st);
            e[n].st.is_dir = 1;
        } else {
            fill(&m->objs[i], &e[n].st);
        }
        n++;
    }
    if (dlen && !under)
        rc = find_obj(m, dir) ? -ENOTDIR : -ENOENT;
    pthread_mutex_unlock(&m->lock);
    /* One ListObjectsV2 page per 1000 keys and prefixes, as S3 pages. */
    atomic_fetch_add(&s->counters.list_requests, n > 1000 ? (n + 999) / 1000 : 1);
    for (size_t i = 0; i < n; i++) {
        if (rc == 0 && fn(arg, e[i].name, &e[i].st) != 0)
            rc = 1;
        free(e[i].name);
    }
    free(e);
    return leave(m, rc > 0 ? 0 : rc, lost);
}

static int mem_read(struct store *s, const char *path, const char *etag, uint64_t off, size_t len,
                    void *buf, size_t *nread)
{
    struct mem_store *m = to_mem(s);
    struct mem_call c = {.op = MEM_OP_READ, .path = path, .off = off, .len = len};
    *nread = 0;
    int lost, rc = enter(m, &c, &lost);
    atomic_fetch_add(&s->counters.get_requests, 1);
    if (rc == 0 && !key_ok(path))
        rc = -EINVAL;
    if (rc == 0) {
        pthread_mutex_lock(&m->lock);
        struct mem_obj *o = find_obj(m, path);
        if (!o) {
            rc = -ENOENT; /* also for a prefix: S3 answers NoSuchKey */
        } else if (etag && *etag && strcmp(etag, o->etag) != 0) {
            rc = -ESTALE;
        } else {
            size_t n = off >= o->size ? 0 : (o->size - off < len ? o->size - off : len);
            memcpy(buf, o->data + off, n);
            *nread = n;
        }
        pthread_mutex_unlock(&m->lock);
        atomic_fetch_add(&s->counters.get_bytes, *nread);
    }
    return leave(m, rc, lost);
}

/* read_progressive: the read, then its bytes handed out as they "arrive"
 * (mem_store_stream), or all at once. */
static int mem_read_progressive(struct store *s, const char *path, const char *etag, uint64_t off,
                                size_t len, void *buf, size_t *nread, store_progress_fn progress,
                                void *arg)
{
    struct mem_store *m = to_mem(s);
    int rc = mem_read(s, path, etag, off, len, buf, nread);
    if (rc < 0 || !progress)
        return rc;
    pthread_mutex_lock(&m->lock);
    size_t chunk = m->stream_chunk ? m->stream_chunk : *nread;
    size_t fail_at = m->stream_err ? m->stream_fail_at : SIZE_MAX;
    unsigned us = m->stream_us;
    int err = m->stream_err;
    pthread_mutex_unlock(&m->lock);
    for (size_t ready = 0; ready < *nread;) {
        if (ready >= fail_at) {
            *nread = 0;
            return err;
        }
        if (us)
            usleep(us);
        ready = *nread - ready < chunk ? *nread : ready + chunk;
        progress(arg, ready < fail_at ? ready : fail_at);
    }
    return 0;
}

static int mem_put(struct store *s, const char *path, int fd, uint64_t len,
                   char etag[STORE_ETAG_MAX])
{
    struct mem_store *m = to_mem(s);
    struct mem_call c = {.op = MEM_OP_PUT, .path = path, .len = len};
    int lost, rc = enter(m, &c, &lost);
    atomic_fetch_add(&s->counters.put_requests, 1);
    if (rc == 0 && !key_ok(path))
        rc = -EINVAL;
    if (rc == 0 && len > STORE_MAX_PART)
        rc = -EFBIG;
    unsigned char *data = rc == 0 ? read_fd(fd, 0, len, &rc) : NULL;
    if (data) {
        char tag[STORE_ETAG_MAX];
        make_etag(data, len, 0, tag);
        pthread_mutex_lock(&m->lock);
        set_obj(m, path, data, len, tag);
        pthread_mutex_unlock(&m->lock);
        atomic_fetch_add(&s->counters.put_bytes, len);
        if (!lost)
            memcpy(etag, tag, STORE_ETAG_MAX);
    }
    return leave(m, rc, lost);
}

static int mem_mpu_begin(struct store *s, const char *path, char upload_id[STORE_UPLOAD_ID_MAX])
{
    struct mem_store *m = to_mem(s);
    struct mem_call c = {.op = MEM_OP_MPU_BEGIN, .path = path};
    int lost, rc = enter(m, &c, &lost);
    atomic_fetch_add(&s->counters.mpu_begin_requests, 1);
    if (rc == 0 && !key_ok(path))
        rc = -EINVAL;
    if (rc == 0) {
        pthread_mutex_lock(&m->lock);
        if (m->nups == m->capups) {
            m->capups = m->capups ? 2 * m->capups : 8;
            m->ups = xrealloc(m->ups, m->capups * sizeof *m->ups);
        }
        struct mem_upload *u = &m->ups[m->nups++];
        memset(u, 0, sizeof *u);
        snprintf(u->id, sizeof u->id, "mem-upload-%" PRIu64, ++m->next_upload);
        if (!(u->path = strdup(path)))
            abort();
        if (!lost)
            snprintf(upload_id, STORE_UPLOAD_ID_MAX, "%s", u->id);
        pthread_mutex_unlock(&m->lock);
    }
    return leave(m, rc, lost);
}

static int mem_mpu_part(struct store *s, const char *path, const char *upload_id,
                        struct store_part *part, int fd)
{
    struct mem_store *m = to_mem(s);
    struct mem_call c = {.op = MEM_OP_MPU_PART,
                         .path = path,
                         .upload_id = upload_id,
                         .off = part->offset,
                         .len = part->length,
                         .part = part->number};
    int lost, rc = enter(m, &c, &lost);
    atomic_fetch_add(&s->counters.part_requests, 1);
    if (rc == 0 && (part->number < 1 || part->number > STORE_MAX_PARTS))
        rc = -EINVAL;
    if (rc == 0 && part->length > STORE_MAX_PART)
        rc = -EFBIG;
    if (rc == 0) {
        pthread_mutex_lock(&m->lock);
        if (!find_upload(m, path, upload_id))
            rc = -ENOENT; /* NoSuchUpload */
        pthread_mutex_unlock(&m->lock);
    }
    unsigned char *data = rc == 0 ? read_fd(fd, part->offset, part->length, &rc) : NULL;
    if (!data)
        return leave(m, rc, lost);
    char tag[STORE_ETAG_MAX];
    make_etag(data, part->length, 0, tag);
    pthread_mutex_lock(&m->lock);
    struct mem_upload *u = find_upload(m, path, upload_id);
    if (!u) {
        rc = -ENOENT; /* aborted while the part was read */
        free(data);
    } else {
        struct mem_part *p = NULL;
        for (size_t i = 0; i < u->nparts && !p; i++)
            if (u->parts[i].number == part->number)
                p = &u->parts[i];
        if (p) {
            free(p->data); /* sent again: replaces it */
        } else {
            u->parts = xrealloc(u->parts, (u->nparts + 1) * sizeof *u->parts);
            p = &u->parts[u->nparts++];
            p->number = part->number;
        }
        p->data = data;
        p->len = part->length;
        memcpy(p->etag, tag, sizeof tag);
        atomic_fetch_add(&s->counters.put_bytes, part->length);
        if (!lost)
            memcpy(part->etag, tag, sizeof tag);
    }
    pthread_mutex_unlock(&m->lock);
    return leave(m, rc, lost);
}

/* The uploaded part numbered n of u, or NULL. Lock held. */
static struct mem_part *find_part(struct mem_upload *u, uint32_t n)
{
    for (size_t i = 0; i < u->nparts; i++)
        if (u->parts[i].number == n)
            return &u->parts[i];
    return NULL;
}

/* 0 if parts[0..n) may complete u into size bytes, as S3 checks them
 * (InvalidPart, InvalidPartOrder, EntityTooSmall: -EINVAL). Lock held. */
static int check_parts(struct mem_store *m, struct mem_upload *u, const struct store_part *parts,
                       size_t n, uint64_t size)
{
    uint64_t end = 0;
    if (n == 0)
        return -EINVAL;
    for (size_t i = 0; i < n; i++) {
        struct mem_part *p = find_part(u, parts[i].number);
        if (!p || strcmp(p->etag, parts[i].etag) != 0 || p->len != parts[i].length)
            return -EINVAL; /* not uploaded, or another version of it */
        if (i > 0 && parts[i].number <= parts[i - 1].number)
            return -EINVAL;
        if (parts[i].offset != end || (i + 1 < n && p->len < m->min_part))
            return -EINVAL;
        end += p->len;
    }
    return end == size ? 0 : -EINVAL;
}

static int mem_mpu_complete(struct store *s, const char *path, const char *upload_id,
                            const struct store_part *parts, size_t n, uint64_t size,
                            char etag[STORE_ETAG_MAX])
{
    struct mem_store *m = to_mem(s);
    struct mem_call c = {.op = MEM_OP_MPU_COMPLETE,
                         .path = path,
                         .upload_id = upload_id,
                         .len = size,
                         .part = (uint32_t)n};
    int lost, rc = enter(m, &c, &lost);
    atomic_fetch_add(&s->counters.complete_requests, 1);
    if (rc < 0)
        return leave(m, rc, lost);
    pthread_mutex_lock(&m->lock);
    struct mem_upload *u = find_upload(m, path, upload_id);
    struct mem_obj *o;
    if (!u) {
        /* A retried completion whose first answer was lost. */
        if ((o = find_obj(m, path)) && o->size == size) {
            if (!lost)
                memcpy(etag, o->etag, STORE_ETAG_MAX);
        } else {
            rc = -ENOENT;
        }
    } else if ((rc = check_parts(m, u, parts, n, size)) == 0) {
        unsigned char *data = malloc(size + 1);
        if (!data)
            abort();
        for (size_t i = 0; i < n; i++)
            memcpy(data + parts[i].offset, find_part(u, parts[i].number)->data, parts[i].length);
        char tag[STORE_ETAG_MAX];
        make_etag(data, size, n, tag);
        set_obj(m, path, data, size, tag);
        drop_upload(m, u);
        if (!lost)
            memcpy(etag, tag, STORE_ETAG_MAX);
    }
    pthread_mutex_unlock(&m->lock);
    return leave(m, rc, lost);
}

static int mem_mpu_abort(struct store *s, const char *path, const char *upload_id)
{
    struct mem_store *m = to_mem(s);
    struct mem_call c = {.op = MEM_OP_MPU_ABORT, .path = path, .upload_id = upload_id};
    int lost, rc = enter(m, &c, &lost);
    atomic_fetch_add(&s->counters.abort_requests, 1);
    if (rc == 0) {
        pthread_mutex_lock(&m->lock);
        struct mem_upload *u = find_upload(m, path, upload_id);
        if (u)
            drop_upload(m, u);
        pthread_mutex_unlock(&m->lock);
    }
    return leave(m, rc, lost);
}

static int mem_mpu_list(struct store *s, const char *path, store_upload_fn fn, void *arg)
{
    struct mem_store *m = to_mem(s);
    struct mem_call c = {.op = MEM_OP_MPU_LIST, .path = path};
    int lost, rc = enter(m, &c, &lost);
    atomic_fetch_add(&s->counters.upload_list_requests, 1);
    if (rc == 0 && !key_ok(path))
        rc = -EINVAL;
    if (rc < 0)
        return leave(m, rc, 0);
    pthread_mutex_lock(&m->lock);
    char(*ids)[64] = xrealloc(NULL, (m->nups + 1) * sizeof *ids);
    size_t n = 0;
    for (size_t i = 0; i < m->nups; i++)
        if (strcmp(m->ups[i].path, path) == 0)
            memcpy(ids[n++], m->ups[i].id, sizeof ids[0]);
    pthread_mutex_unlock(&m->lock);
    for (size_t i = 0; i < n; i++)
        if (fn(arg, ids[i]) != 0)
            break;
    free(ids);
    return leave(m, 0, lost);
}

static int mem_copy(struct store *s, const char *from, const char *etag, uint64_t size,
                    const char *to, char etag_out[STORE_ETAG_MAX])
{
    struct mem_store *m = to_mem(s);
    struct mem_call c = {.op = MEM_OP_COPY, .path = from, .to = to, .len = size};
    int lost, rc = enter(m, &c, &lost);
    atomic_fetch_add(&s->counters.copy_requests, 1);
    if (rc == 0 && (!key_ok(from) || !key_ok(to)))
        rc = -EINVAL;
    if (rc < 0)
        return leave(m, rc, lost);
    pthread_mutex_lock(&m->lock);
    struct mem_obj *o = find_obj(m, from);
    if (!o) {
        rc = -ENOENT;
    } else if ((etag && *etag && strcmp(etag, o->etag) != 0) || o->size != size) {
        rc = -ESTALE;
    } else {
        unsigned char *data = malloc(o->size + 1);
        if (!data)
            abort();
        memcpy(data, o->data, o->size);
        char tag[STORE_ETAG_MAX];
        make_etag(data, o->size, 0, tag); /* CopyObject: a new single-part etag */
        set_obj(m, to, data, size, tag);
        if (!lost)
            memcpy(etag_out, tag, STORE_ETAG_MAX);
    }
    pthread_mutex_unlock(&m->lock);
    return leave(m, rc, lost);
}

static int mem_remove(struct store *s, const char *path)
{
    struct mem_store *m = to_mem(s);
    struct mem_call c = {.op = MEM_OP_REMOVE, .path = path};
    int lost, rc = enter(m, &c, &lost);
    atomic_fetch_add(&s->counters.delete_requests, 1);
    if (rc == 0 && !key_ok(path))
        rc = -EINVAL;
    if (rc == 0) {
        pthread_mutex_lock(&m->lock);
        struct mem_obj *o = find_obj(m, path);
        if (o)
            drop_obj(m, o);
        else
            rc = has_prefix(m, path) ? -EISDIR : -ENOENT;
        pthread_mutex_unlock(&m->lock);
    }
    return leave(m, rc, lost);
}

/* The key of path's directory marker, "path/" (the caller frees). */
static char *marker_of(const char *path)
{
    size_t n = strlen(path);
    char *marker = xrealloc(NULL, n + 2);
    memcpy(marker, path, n);
    memcpy(marker + n, "/", 2);
    return marker;
}

/* mkdir: an empty "dir/" marker object, as the S3 store makes. */
static int mem_mkdir(struct store *s, const char *path)
{
    struct mem_store *m = to_mem(s);
    struct mem_call c = {.op = MEM_OP_MKDIR, .path = path};
    int lost, rc = enter(m, &c, &lost);
    atomic_fetch_add(&s->counters.put_requests, 1);
    if (rc == 0 && !key_ok(path))
        rc = -EINVAL;
    if (rc == 0) {
        char *marker = marker_of(path);
        pthread_mutex_lock(&m->lock);
        if (find_obj(m, path) || has_prefix(m, path))
            rc = -EEXIST;
        else
            set_obj(m, marker, xrealloc(NULL, 1), 0, "\"marker\"");
        pthread_mutex_unlock(&m->lock);
        free(marker);
    }
    return leave(m, rc, lost);
}

/* rmdir: a directory is a prefix; it can go only when nothing but its own
 * "dir/" marker is under it, and going means deleting the marker. */
static int mem_rmdir(struct store *s, const char *path)
{
    struct mem_store *m = to_mem(s);
    struct mem_call c = {.op = MEM_OP_RMDIR, .path = path};
    int lost, rc = enter(m, &c, &lost);
    atomic_fetch_add(&s->counters.delete_requests, 1);
    if (rc == 0 && !key_ok(path))
        rc = -EINVAL;
    if (rc == 0) {
        size_t n = strlen(path);
        char *marker = marker_of(path);
        pthread_mutex_lock(&m->lock);
        struct mem_obj *mk = find_obj(m, marker);
        int others = 0;
        for (size_t i = 0; i < m->nobjs && !others; i++)
            others = &m->objs[i] != mk && strncmp(m->objs[i].path, marker, n + 1) == 0;
        if (others)
            rc = -ENOTEMPTY;
        else if (mk)
            drop_obj(m, mk);
        else
            rc = find_obj(m, path) ? -ENOTDIR : -ENOENT;
        pthread_mutex_unlock(&m->lock);
        free(marker);
    }
    return leave(m, rc, lost);
}

static void mem_destroy(struct store *s)
{
    struct mem_store *m = to_mem(s);
    while (m->nobjs)
        drop_obj(m, &m->objs[0]);
    while (m->nups)
        drop_upload(m, &m->ups[0]);
    free(m->objs);
    free(m->ups);
    free(s->description);
    pthread_mutex_destroy(&m->lock);
    free(m);
}

static const struct store_ops mem_ops = {
    .scheme = "mem",
    .stat = mem_stat,
    .list = mem_list,
    .read = mem_read,
    .read_progressive = mem_read_progressive,
    .put = mem_put,
    .mpu_begin = mem_mpu_begin,
    .mpu_part = mem_mpu_part,
    .mpu_complete = mem_mpu_complete,
    .mpu_abort = mem_mpu_abort,
    .mpu_list = mem_mpu_list,
    .copy = mem_copy,
    .remove = mem_remove,
    .mkdir = mem_mkdir,
    .rmdir = mem_rmdir,
    .destroy = mem_destroy,
};

struct mem_store *mem_store_new(void)
{
    struct mem_store *m = calloc(1, sizeof *m);
    if (!m || !(m->base.description = strdup("mem://")))
        abort();
    m->base.ops = &mem_ops;
    m->min_part = STORE_MIN_PART;
    pthread_mutex_init(&m->lock, NULL);
    return m;
}

struct store *mem_store_base(struct mem_store *m)
{
    return &m->base;
}

void mem_store_free(struct mem_store *m)
{
    if (m)
        mem_destroy(&m->base);
}

void mem_store_s3_listings(struct mem_store *m)
{
    pthread_mutex_lock(&m->lock);
    m->s3_listings = 1;
    m->s3_ops = mem_ops;
    m->s3_ops.list_below = mem_list_below;
    m->base.ops = &m->s3_ops;
    pthread_mutex_unlock(&m->lock);
}

int mem_store_set_mtime(struct mem_store *m, const char *path, int64_t mtime_ns)
{
    pthread_mutex_lock(&m->lock);
    struct mem_obj *o = find_obj(m, path);
    if (o)
        o->mtime_ns = mtime_ns;
    pthread_mutex_unlock(&m->lock);
    return o ? 0 : -ENOENT;
}

int mem_store_set(struct mem_store *m, const char *path, const void *data, size_t len, char *etag)
{
    unsigned char *copy = malloc(len + 1);
    if (!copy)
        return -ENOMEM;
    memcpy(copy, data, len);
    char tag[STORE_ETAG_MAX];
    make_etag(copy, len, 0, tag);
    pthread_mutex_lock(&m->lock);
    set_obj(m, path, copy, len, tag);
    pthread_mutex_unlock(&m->lock);
    if (etag)
        memcpy(etag, tag, STORE_ETAG_MAX);
    return 0;
}

void *mem_store_get(struct mem_store *m, const char *path, size_t *len)
{
    void *copy = NULL;
    pthread_mutex_lock(&m->lock);
    struct mem_obj *o = find_obj(m, path);
    if (o && (copy = malloc(o->size + 1))) {
        memcpy(copy, o->data, o->size);
        *len = o->size;
    }
    pthread_mutex_unlock(&m->lock);
    return copy;
}

size_t mem_store_objects(struct mem_store *m)
{
    pthread_mutex_lock(&m->lock);
    size_t n = m->nobjs;
    pthread_mutex_unlock(&m->lock);
    return n;
}

size_t mem_store_uploads_in_progress(struct mem_store *m)
{
    pthread_mutex_lock(&m->lock);
    size_t n = m->nups;
    pthread_mutex_unlock(&m->lock);
    return n;
}

uint64_t mem_store_calls(struct mem_store *m, enum mem_op op)
{
    pthread_mutex_lock(&m->lock);
    uint64_t n = op < MEM_OP_COUNT ? m->calls[op] : 0;
    pthread_mutex_unlock(&m->lock);
    return n;
}

/* Sets the fault of op (or of every op). */
static void set_fault(struct mem_store *m, enum mem_op op, int err, int times, int after)
{
    pthread_mutex_lock(&m->lock);
    for (int i = 0; i < MEM_OP_COUNT; i++)
        if (op == MEM_OP_ALL || (int)op == i)
            m->faults[i] =
                (struct mem_fault){.err = times ? err : 0, .times = times, .after = after};
    pthread_mutex_unlock(&m->lock);
}

void mem_store_fail(struct mem_store *m, enum mem_op op, int err, int times)
{
    set_fault(m, op, err, times, 0);
}

void mem_store_lose_answer(struct mem_store *m, enum mem_op op, int err, int times)
{
    set_fault(m, op, err, times, 1);
}

void mem_store_delay(struct mem_store *m, enum mem_op op, unsigned usec)
{
    pthread_mutex_lock(&m->lock);
    for (int i = 0; i < MEM_OP_COUNT; i++)
        if (op == MEM_OP_ALL || (int)op == i)
            m->delay_us[i] = usec;
    pthread_mutex_unlock(&m->lock);
}

void mem_store_stream(struct mem_store *m, size_t chunk, unsigned usec, size_t fail_at, int err)
{
    pthread_mutex_lock(&m->lock);
    m->stream_chunk = chunk;
    m->stream_us = usec;
    m->stream_fail_at = fail_at;
    m->stream_err = err;
    pthread_mutex_unlock(&m->lock);
}

void mem_store_set_hook(struct mem_store *m, mem_store_hook_fn fn, void *arg)
{
    pthread_mutex_lock(&m->lock);
    m->hook = fn;
    m->hook_arg = arg;
    pthread_mutex_unlock(&m->lock);
}

void mem_store_set_min_part(struct mem_store *m, uint64_t bytes)
{
    pthread_mutex_lock(&m->lock);
    m->min_part = bytes;
    pthread_mutex_unlock(&m->lock);
}
