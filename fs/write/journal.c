/*
 * fs/write/journal.c - the write path's crash journal in LMDB (see journal.h).
 *
 * Three databases: "meta" holds the next staging file id, "files" one record
 * per staged file under its id (8 bytes, big-endian, so LMDB's order is
 * numeric), "dirmv" one record per directory rename in progress (same keys). A record is a fixed
 * little-endian header, five length-prefixed strings and the parts; decoding checks every length
 * against the bytes present and fixed bounds, so a damaged record is refused, never trusted.
 *
 * Writes are a group commit: callers queue their change and wait; one writer
 * thread applies everything queued in a single transaction (one fdatasync
 * however many ranks' files changed meanwhile) and wakes them. Staging file
 * ids come from memory, with a bound a block ahead persisted, so creating a
 * file costs no commit.
 */
#include "journal.h"

#include "lmdbenv.h"

#include <errno.h>
#include <lmdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define JOURNAL_FORMAT 1
#define JOURNAL_MAP_SIZE (256ull << 20)
#define JOURNAL_STR_MAX 8192 /* path, key, store, id, boot id */
#define HEADER_SIZE (1 + 1 + 2 + 8 + 8 + 8 + 4 + 5 * 4)
#define PART_FIXED (4 + 8 + 8 + 1)

/* ---- encoding ---------------------------------------------------------- */

static void put_le(unsigned char *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++, v >>= 8)
        p[i] = (unsigned char)v;
}

static uint64_t get_le(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static void key_of(uint64_t id, unsigned char k[8])
{
    for (int i = 7; i >= 0; i--, id >>= 8)
        k[i] = (unsigned char)id;
}

static const char *str_or_empty(const char *s)
{
    return s ? s : "";
}

/* Write the n strings of strs: each length as 4 bytes little-endian at
 * lens + 4 * i, the bytes (no NUL) one after the other from p. Returns the
 * end of the last. */
static unsigned char *put_strings(unsigned char *lens, unsigned char *p, const char *const strs[],
                                  int n)
{
    for (int i = 0; i < n; i++) {
        size_t len = strlen(strs[i]);
        put_le(lens + 4 * i, len, 4);
        memcpy(p, strs[i], len);
        p += len;
    }
    return p;
}

/* Read back what put_strings wrote (p up to end): each string copied into
 * scratch with a NUL, *strs[i] pointed at it. Returns the end of the last,
 * or NULL if one is too long, runs past end or holds a NUL. */
static const unsigned char *get_strings(const unsigned char *lens, const unsigned char *p,
                                        const unsigned char *end, const char **const strs[], int n,
                                        char *scratch)
{
    for (int i = 0; i < n; i++) {
        uint64_t len = get_le(lens + 4 * i, 4);
        if (len > JOURNAL_STR_MAX || len > (uint64_t)(end - p) || memchr(p, 0, len))
            return NULL;
        memcpy(scratch, p, len);
        scratch[len] = '\0';
        *strs[i] = scratch;
        scratch += len + 1;
        p += len;
    }
    return p;
}

size_t journal_encoded_size(const struct journal_rec *r)
{
    size_t n = HEADER_SIZE + strlen(str_or_empty(r->boot_id)) + strlen(str_or_empty(r->store)) +
               strlen(str_or_empty(r->path)) + strlen(str_or_empty(r->upload_key)) +
               strlen(str_or_empty(r->upload_id));
    for (uint32_t i = 0; i < r->nparts; i++)
        n += PART_FIXED + strlen(r->parts[i].etag);
    return n;
}

size_t journal_encode(const struct journal_rec *r, unsigned char *buf, size_t cap)
{
    size_t need = journal_encoded_size(r);
    if (cap < need)
        return 0;
    const char *strs[5] = {str_or_empty(r->boot_id), str_or_empty(r->store), str_or_empty(r->path),
                           str_or_empty(r->upload_key), str_or_empty(r->upload_id)};
    unsigned char *p = buf;
    p[0] = JOURNAL_FORMAT;
    p[1] = (unsigned char)r->flags;
    put_le(p + 2, 0, 2);
    put_le(p + 4, r->id, 8);
    put_le(p + 12, r->seq, 8);
    put_le(p + 20, r->size, 8);
    put_le(p + 28, r->nparts, 4);
    p = put_strings(p + 32, p + HEADER_SIZE, strs, 5);
    for (uint32_t i = 0; i < r->nparts; i++) {
        const struct journal_part *pt = &r->parts[i];
        size_t n = strlen(pt->etag);
        put_le(p, pt->number, 4);
        put_le(p + 4, pt->offset, 8);
        put_le(p + 12, pt->length, 8);
        p[20] = (unsigned char)n;
        memcpy(p + PART_FIXED, pt->etag, n);
        p += PART_FIXED + n;
    }
    return (size_t)(p - buf);
}

int journal_decode(const unsigned char *buf, size_t len, struct journal_rec *r,
                   struct journal_part *parts, size_t max_parts, char *scratch, size_t scratch_len)
{
    memset(r, 0, sizeof *r);
    if (len < HEADER_SIZE || buf[0] != JOURNAL_FORMAT || buf[2] || buf[3] || scratch_len < len + 8)
        return -EINVAL; /* not ours, or reserved bytes set by something newer */
    r->flags = buf[1];
    r->id = get_le(buf + 4, 8);
    r->seq = get_le(buf + 12, 8);
    r->size = get_le(buf + 20, 8);
    r->nparts = (uint32_t)get_le(buf + 28, 4);
    if (r->nparts > STORE_MAX_PARTS || r->nparts > max_parts)
        return -EINVAL;
    const unsigned char *end = buf + len;
    const char **strs[5] = {&r->boot_id, &r->store, &r->path, &r->upload_key, &r->upload_id};
    const unsigned char *p = get_strings(buf + 32, buf + HEADER_SIZE, end, strs, 5, scratch);
    if (!p || strlen(r->upload_id) >= STORE_UPLOAD_ID_MAX)
        return -EINVAL;
    for (uint32_t i = 0; i < r->nparts; i++) {
        if ((size_t)(end - p) < PART_FIXED)
            return -EINVAL;
        size_t n = p[20];
        if (n >= STORE_ETAG_MAX || n > (size_t)(end - p) - PART_FIXED ||
            memchr(p + PART_FIXED, 0, n))
            return -EINVAL;
        struct journal_part *pt = &parts[i];
        pt->number = (uint32_t)get_le(p, 4);
        pt->offset = get_le(p + 4, 8);
        pt->length = get_le(p + 12, 8);
        if (pt->number < 1 || pt->number > STORE_MAX_PARTS || pt->offset > UINT64_MAX - pt->length)
            return -EINVAL;
        memcpy(pt->etag, p + PART_FIXED, n);
        pt->etag[n] = '\0';
        p += PART_FIXED + n;
    }
    if (p != end)
        return -EINVAL;
    r->parts = parts;
    return 0;
}

/* ---- LMDB and the group commit ---------------------------------------- */

/* One change waiting for the writer thread. */
struct jop {
    struct jop *next;
    enum { OP_PUT, OP_DEL, OP_SYNC, OP_META, OP_DIRMV_PUT, OP_DIRMV_DEL } kind;
    uint64_t id, seq;   /* OP_PUT, OP_DEL: the record; OP_META: next_id's new value */
    unsigned char *buf; /* OP_PUT: the encoded record */
    size_t len;
    int done, rc;
};

struct journal {
    MDB_env *env;
    MDB_dbi meta, files, dirmv;
    pthread_mutex_t lock;
    pthread_cond_t work;     /* signalled when ops are queued or on close */
    pthread_cond_t finished; /* broadcast after each batch */
    struct jop *head, *tail; /* protected by lock */
    int stopping;            /* protected by lock */
    pthread_t writer;
    uint64_t next_id, id_limit; /* ids handed out, and the bound persisted (lock) */
    atomic_uint_fast64_t syncs; /* journal_sync calls */
};

#define ID_BLOCK 4096 /* ids reserved per persisted bump of next_id */

static int lmdb_errno(int rc)
{
    if (rc == 0)
        return 0;
    if (rc == MDB_MAP_FULL)
        return -ENOSPC;
    return rc > 0 ? -rc : -EIO;
}

/* Apply one op inside the batch's write transaction. */
static int apply(struct journal *j, MDB_txn *txn, struct jop *op)
{
    unsigned char k[8];
    MDB_val key = {8, k}, val;
    switch (op->kind) {
    case OP_PUT: {
        key_of(op->id, k);
        int rc = mdb_get(txn, j->files, &key, &val);
        if (rc == 0 && val.mv_size >= HEADER_SIZE &&
            get_le((unsigned char *)val.mv_data + 12, 8) >= op->seq)
            return 0; /* a newer state is already recorded */
        val = (MDB_val){op->len, op->buf};
        return mdb_put(txn, j->files, &key, &val, 0);
    }
    case OP_DEL: {
        key_of(op->id, k);
        int rc = mdb_del(txn, j->files, &key, NULL);
        return rc == MDB_NOTFOUND ? 0 : rc;
    }
    case OP_META: {
        unsigned char b[8];
        put_le(b, op->id, 8);
        MDB_val mk = {7, "next_id"}, mv = {8, b};
        return mdb_put(txn, j->meta, &mk, &mv, 0);
    }
    case OP_DIRMV_PUT:
        key_of(op->id, k);
        val = (MDB_val){op->len, op->buf};
        return mdb_put(txn, j->dirmv, &key, &val, 0);
    case OP_DIRMV_DEL: {
        key_of(op->id, k);
        int rc = mdb_del(txn, j->dirmv, &key, NULL);
        return rc == MDB_NOTFOUND ? 0 : rc;
    }
    case OP_SYNC:
        return 0;
    }
    return EINVAL;
}

/* Commit everything queued in one transaction (one fdatasync for all the
 * threads that wrote meanwhile), sync if asked, wake the waiters. */
static void *writer_main(void *arg)
{
    struct journal *j = arg;
    pthread_mutex_lock(&j->lock);
    for (;;) {
        while (!j->head && !j->stopping)
            pthread_cond_wait(&j->work, &j->lock);
        if (!j->head)
            break;
        struct jop *batch = j->head;
        j->head = j->tail = NULL;
        pthread_mutex_unlock(&j->lock);

        MDB_txn *txn;
        int rc = mdb_txn_begin(j->env, NULL, 0, &txn), sync = 0;
        for (struct jop *op = batch; op; op = op->next) {
            op->rc = rc ? rc : apply(j, txn, op);
            sync |= op->kind == OP_SYNC || op->kind == OP_DIRMV_PUT;
        }
        int commit = rc ? rc : mdb_txn_commit(txn);
        if (commit == 0 && sync)
            commit = mdb_env_sync(j->env, 1);

        pthread_mutex_lock(&j->lock);
        for (struct jop *op = batch; op; op = op->next) {
            op->rc = lmdb_errno(op->rc ? op->rc : commit);
            op->done = 1;
        }
        pthread_cond_broadcast(&j->finished);
    }
    pthread_mutex_unlock(&j->lock);
    return NULL;
}

/* Queue op and wait until it is committed: op->rc. */
static int submit(struct journal *j, struct jop *op)
{
    op->next = NULL;
    op->done = 0;
    pthread_mutex_lock(&j->lock);
    if (j->stopping) {
        pthread_mutex_unlock(&j->lock);
        return -ESHUTDOWN;
    }
    if (j->tail)
        j->tail->next = op;
    else
        j->head = op;
    j->tail = op;
    pthread_cond_signal(&j->work);
    while (!op->done)
        pthread_cond_wait(&j->finished, &j->lock);
    pthread_mutex_unlock(&j->lock);
    return op->rc;
}

static int read_next_id(struct journal *j, uint64_t *out)
{
    MDB_txn *txn;
    int rc = mdb_txn_begin(j->env, NULL, MDB_RDONLY, &txn);
    if (rc)
        return rc;
    MDB_val key = {7, "next_id"}, val;
    *out = 1;
    if (mdb_get(txn, j->meta, &key, &val) == 0 && val.mv_size == 8)
        *out = get_le(val.mv_data, 8);
    mdb_txn_abort(txn);
    return 0;
}

int journal_open(const char *dir, struct journal **out, char *err, size_t errlen)
{
    *out = NULL;
    if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
        int e = errno;
        snprintf(err, errlen, "cannot create the journal directory %s: %s", dir, strerror(e));
        return -e;
    }
    struct journal *j = calloc(1, sizeof *j);
    if (!j) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    MDB_txn *txn = NULL;
    int rc = mdb_env_create(&j->env);
    if (!rc)
        rc = mdb_env_set_maxdbs(j->env, 4);
    if (!rc)
        rc = mdb_env_set_mapsize(j->env, JOURNAL_MAP_SIZE);
    if (!rc)
        rc = lmdbenv_open(j->env, dir, MDB_NOTLS | MDB_NOMETASYNC, 0600);
    if (!rc)
        rc = mdb_txn_begin(j->env, NULL, 0, &txn);
    if (!rc)
        rc = mdb_dbi_open(txn, "meta", MDB_CREATE, &j->meta);
    if (!rc)
        rc = mdb_dbi_open(txn, "files", MDB_CREATE, &j->files);
    if (!rc)
        rc = mdb_dbi_open(txn, "dirmv", MDB_CREATE, &j->dirmv);
    if (!rc) {
        rc = mdb_txn_commit(txn);
        txn = NULL;
    }
    if (!rc)
        rc = read_next_id(j, &j->next_id);
    if (rc) {
        char why[160];
        snprintf(err, errlen, "cannot open the journal in %s: %s%s", dir,
                 lmdbenv_strerror(rc, dir, why, sizeof why),
                 rc == ENOSPC || rc == EDQUOT
                     ? ": writes need room there; free some, give --cache-dir a folder on "
                       "another disk, or mount --read-only"
                     : "");
        if (txn)
            mdb_txn_abort(txn);
        mdb_env_close(j->env);
        free(j);
        return lmdb_errno(rc);
    }
    j->id_limit = j->next_id; /* nothing reserved yet */
    pthread_mutex_init(&j->lock, NULL);
    pthread_cond_init(&j->work, NULL);
    pthread_cond_init(&j->finished, NULL);
    if ((rc = pthread_create(&j->writer, NULL, writer_main, j)) != 0) {
        snprintf(err, errlen, "cannot start the journal writer: %s", strerror(rc));
        mdb_env_close(j->env);
        free(j);
        return -rc;
    }
    *out = j;
    return 0;
}

void journal_close(struct journal *j)
{
    if (!j)
        return;
    pthread_mutex_lock(&j->lock);
    j->stopping = 1; /* the writer commits what is queued, then ends */
    pthread_cond_signal(&j->work);
    pthread_mutex_unlock(&j->lock);
    pthread_join(j->writer, NULL);
    mdb_env_sync(j->env, 1);
    mdb_env_close(j->env);
    pthread_cond_destroy(&j->finished);
    pthread_cond_destroy(&j->work);
    pthread_mutex_destroy(&j->lock);
    free(j);
}

int journal_put(struct journal *j, const struct journal_rec *r)
{
    struct jop op = {.kind = OP_PUT, .id = r->id, .seq = r->seq};
    op.len = journal_encoded_size(r);
    op.buf = malloc(op.len);
    if (!op.buf)
        return -ENOMEM;
    journal_encode(r, op.buf, op.len);
    int rc = submit(j, &op);
    free(op.buf);
    return rc;
}

int journal_del(struct journal *j, uint64_t id)
{
    struct jop op = {.kind = OP_DEL, .id = id};
    return submit(j, &op);
}

int journal_sync(struct journal *j)
{
    struct jop op = {.kind = OP_SYNC};
    atomic_fetch_add(&j->syncs, 1);
    return submit(j, &op);
}

uint64_t journal_sync_count(struct journal *j)
{
    return atomic_load(&j->syncs);
}

int journal_new_id(struct journal *j, uint64_t *id)
{
    pthread_mutex_lock(&j->lock);
    int rc = 0;
    if (j->next_id >= j->id_limit) {
        /* Persist a bound a block ahead: ids below it are never handed out
         * again, even after a crash (unused ones are skipped). */
        uint64_t limit = j->next_id + ID_BLOCK;
        pthread_mutex_unlock(&j->lock);
        struct jop op = {.kind = OP_META, .id = limit};
        rc = submit(j, &op);
        pthread_mutex_lock(&j->lock);
        if (rc == 0 && limit > j->id_limit)
            j->id_limit = limit;
    }
    if (rc == 0)
        *id = j->next_id++;
    pthread_mutex_unlock(&j->lock);
    return rc;
}

/* A record copied out of the journal: its id and encoded bytes. */
struct blob {
    uint64_t id;
    size_t len;
    unsigned char *data;
};

/* Copy every record of table dbi out (in key order) into *out, *n of them,
 * so a caller may write to the journal while it goes through them: 0 or an
 * LMDB/errno code (what was copied stays in *out; free with free_blobs). */
static int copy_out(struct journal *j, MDB_dbi dbi, struct blob **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    MDB_txn *txn;
    int rc = mdb_txn_begin(j->env, NULL, MDB_RDONLY, &txn);
    if (rc)
        return rc;
    MDB_cursor *cur;
    rc = mdb_cursor_open(txn, dbi, &cur);
    if (rc) {
        mdb_txn_abort(txn);
        return rc;
    }
    size_t cap = 0;
    MDB_val k, v;
    int op = MDB_FIRST;
    while ((rc = mdb_cursor_get(cur, &k, &v, op)) == 0) {
        op = MDB_NEXT;
        if (*n == cap) {
            cap = cap ? 2 * cap : 64;
            struct blob *nb = realloc(*out, cap * sizeof *nb);
            if (!nb) {
                rc = ENOMEM;
                break;
            }
            *out = nb;
        }
        unsigned char *d = malloc(v.mv_size ? v.mv_size : 1);
        if (!d) {
            rc = ENOMEM;
            break;
        }
        uint64_t id = 0;
        for (size_t i = 0; i < k.mv_size && i < 8; i++)
            id = id << 8 | ((unsigned char *)k.mv_data)[i];
        memcpy(d, v.mv_data, v.mv_size);
        (*out)[(*n)++] = (struct blob){id, v.mv_size, d};
    }
    mdb_cursor_close(cur);
    mdb_txn_abort(txn);
    return rc == MDB_NOTFOUND ? 0 : rc;
}

static void free_blobs(struct blob *blobs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(blobs[i].data);
    free(blobs);
}

int journal_foreach(struct journal *j, int (*fn)(void *arg, const struct journal_rec *r),
                    void (*bad)(void *arg, uint64_t id), void *arg)
{
    /* Copy the records out first: fn may write to the journal. */
    struct blob *blobs;
    size_t n;
    int rc = copy_out(j, j->files, &blobs, &n);
    struct journal_part *parts = rc ? NULL : malloc(STORE_MAX_PARTS * sizeof *parts);
    if (!rc && !parts)
        rc = ENOMEM;
    int stop = 0;
    for (size_t i = 0; i < n; i++) {
        if (!rc && !stop) {
            char *scratch = malloc(blobs[i].len + 64);
            struct journal_rec r;
            if (!scratch) {
                rc = ENOMEM;
            } else if (journal_decode(blobs[i].data, blobs[i].len, &r, parts, STORE_MAX_PARTS,
                                      scratch, blobs[i].len + 64) != 0 ||
                       r.id != blobs[i].id) {
                if (bad)
                    bad(arg, blobs[i].id);
            } else {
                stop = fn(arg, &r);
            }
            free(scratch);
        }
    }
    free_blobs(blobs, n);
    free(parts);
    return lmdb_errno(rc);
}

/* ---- directory rename records ------------------------------------------ */

#define DIRMV_FORMAT 1
#define DIRMV_HEADER (1 + 1 + 1 + 1 + 8 + 3 * 4)

size_t journal_dirmv_encoded_size(const struct journal_dirmv *r)
{
    return DIRMV_HEADER + strlen(str_or_empty(r->store)) + strlen(str_or_empty(r->from)) +
           strlen(str_or_empty(r->to));
}

size_t journal_dirmv_encode(const struct journal_dirmv *r, unsigned char *buf, size_t cap)
{
    size_t need = journal_dirmv_encoded_size(r);
    if (cap < need)
        return 0;
    const char *strs[3] = {str_or_empty(r->store), str_or_empty(r->from), str_or_empty(r->to)};
    buf[0] = DIRMV_FORMAT;
    buf[1] = (unsigned char)r->phase;
    buf[2] = (unsigned char)r->flags;
    buf[3] = 0;
    put_le(buf + 4, r->id, 8);
    return (size_t)(put_strings(buf + 12, buf + DIRMV_HEADER, strs, 3) - buf);
}

int journal_dirmv_decode(const unsigned char *buf, size_t len, struct journal_dirmv *r,
                         char *scratch, size_t scratch_len)
{
    memset(r, 0, sizeof *r);
    if (len < DIRMV_HEADER || buf[0] != DIRMV_FORMAT || buf[3] || scratch_len < len + 8)
        return -EINVAL;
    r->phase = buf[1];
    r->flags = buf[2];
    r->id = get_le(buf + 4, 8);
    if (r->phase < JOURNAL_DIRMV_COPYING || r->phase > JOURNAL_DIRMV_UNDOING)
        return -EINVAL;
    const unsigned char *end = buf + len;
    const char **strs[3] = {&r->store, &r->from, &r->to};
    const unsigned char *p = get_strings(buf + 12, buf + DIRMV_HEADER, end, strs, 3, scratch);
    return p == end && *r->from && *r->to ? 0 : -EINVAL;
}

int journal_dirmv_put(struct journal *j, const struct journal_dirmv *r)
{
    struct jop op = {.kind = OP_DIRMV_PUT, .id = r->id};
    op.len = journal_dirmv_encoded_size(r);
    op.buf = malloc(op.len);
    if (!op.buf)
        return -ENOMEM;
    journal_dirmv_encode(r, op.buf, op.len);
    int rc = submit(j, &op); /* the batch is synced: the record is on disk */
    free(op.buf);
    return rc;
}

int journal_dirmv_del(struct journal *j, uint64_t id)
{
    struct jop op = {.kind = OP_DIRMV_DEL, .id = id};
    return submit(j, &op);
}

int journal_dirmv_foreach(struct journal *j, int (*fn)(void *arg, const struct journal_dirmv *r),
                          void (*bad)(void *arg, uint64_t id), void *arg)
{
    /* Copy the records out first (a handful): fn writes to the journal. */
    struct blob *blobs;
    size_t n;
    int rc = copy_out(j, j->dirmv, &blobs, &n);
    int stop = 0;
    for (size_t i = 0; i < n; i++) {
        char *scratch = !rc && !stop ? malloc(blobs[i].len + 8) : NULL;
        struct journal_dirmv r;
        if (!rc && !stop && !scratch)
            rc = ENOMEM;
        else if (scratch && (journal_dirmv_decode(blobs[i].data, blobs[i].len, &r, scratch,
                                                  blobs[i].len + 8) != 0 ||
                             r.id != blobs[i].id)) {
            if (bad)
                bad(arg, blobs[i].id);
        } else if (scratch) {
            stop = fn(arg, &r);
        }
        free(scratch);
    }
    free_blobs(blobs, n);
    return lmdb_errno(rc);
}
