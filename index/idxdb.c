/*
 * index/idxdb.c - LMDB checkpoint index (see idxdb.h for the schema).
 *
 * Writes happen in one write transaction per checkpoint. A checkpoint that
 * is (re)indexed always gets a fresh id, larger than every id in use, so
 * all its keys sort after everything else and can be written with
 * MDB_APPEND in key order: building a 100,000-item index is a sequential
 * append, not 300,000 tree searches. Records are fixed little-endian
 * headers followed by variable-length strings; keys are big-endian so LMDB's
 * byte order is numeric order.
 *
 * Threads share one environment: every transaction holds map_lock shared,
 * and the map grows (mdb_env_set_mapsize, which LMDB allows only while no
 * transaction of the process is active) with it held exclusively.
 */
#include "idxdb.h"

#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <lmdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "lmdbenv.h"
#include "strmap.h"

struct idxdb {
    MDB_env *env;
    MDB_dbi meta, ckpt, ckid, file, fname, item, layout, tensor, fqn;
    unsigned flags;
    size_t map_size, max_map_size; /* map_size: changed only with map_lock exclusive */
    pthread_rwlock_t map_lock;     /* shared by every transaction; exclusive to resize */
};

struct idxdb_txn {
    struct idxdb *db;
    MDB_txn *txn;
    MDB_cursor *lay; /* layout cursor, opened on first use */
    uint64_t lay_id;
    uint32_t lay_file;
    int lay_valid; /* lay is on a record of (lay_id, lay_file): only with lay open */
};

/* ---- encoding --------------------------------------------------------- */

static void be32(unsigned char *p, uint32_t v)
{
    for (int i = 3; i >= 0; i--, v >>= 8)
        p[i] = (unsigned char)v;
}

static void be64(unsigned char *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--, v >>= 8)
        p[i] = (unsigned char)v;
}

static uint32_t rbe32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint64_t rbe64(const unsigned char *p)
{
    return (uint64_t)rbe32(p) << 32 | rbe32(p + 4);
}

static uint64_t rle(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

int64_t idxdb_i64(const unsigned char *p, uint32_t i)
{
    return (int64_t)rle(p + 8 * (size_t)i, 8);
}

uint32_t idxdb_u32(const unsigned char *p, uint32_t i)
{
    return (uint32_t)rle(p + 4 * (size_t)i, 4);
}

struct buf {
    unsigned char *p;
    size_t len, cap;
    int oom;
};

static void put(struct buf *b, const void *src, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n > b->cap) {
        size_t ncap = b->cap ? b->cap : 256;
        while (ncap < b->len + n)
            ncap *= 2;
        unsigned char *p = realloc(b->p, ncap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = ncap;
    }
    if (n)
        memcpy(b->p + b->len, src, n);
    b->len += n;
}

static void put_le(struct buf *b, uint64_t v, int n)
{
    unsigned char t[8];
    for (int i = 0; i < n; i++, v >>= 8)
        t[i] = (unsigned char)v;
    put(b, t, (size_t)n);
}

/* ---- errors ----------------------------------------------------------- */

static int dberr(struct ckpt_err *err, int rc, const char *what)
{
    if (rc == MDB_NOTFOUND)
        return CKPT_NOTFOUND;
    if (rc > 0) {
        ckpt_err_set(err, -rc, CKPT_NOPOS, "index: %s: %s", what, strerror(rc));
        return -rc;
    }
    ckpt_err_set(err, CKPT_EDB, CKPT_NOPOS, "index: %s: %s", what, mdb_strerror(rc));
    return CKPT_EDB;
}

static int corrupt(struct ckpt_err *err, const char *what)
{
    return ckpt_err_set(err, CKPT_EDB, CKPT_NOPOS, "index: corrupt %s record", what);
}

/* ---- open / close ----------------------------------------------------- */

void idxdb_options_default(struct idxdb_options *o)
{
    o->map_size = (size_t)1 << 30;
    o->max_map_size = (size_t)256 << 30;
    o->flags = 0;
}

static const char *const dbnames[] = {"meta", "ckpt",   "ckid",   "file", "fname",
                                      "item", "layout", "tensor", "fqn"};

static MDB_dbi *dbi_slot(struct idxdb *db, int i)
{
    MDB_dbi *slots[] = {&db->meta, &db->ckpt,   &db->ckid,   &db->file, &db->fname,
                        &db->item, &db->layout, &db->tensor, &db->fqn};
    return slots[i];
}

static int check_schema(struct idxdb *db, MDB_txn *txn, const char *dir, struct ckpt_err *err)
{
    MDB_val k = {6, "schema"}, v;
    int rc = mdb_get(txn, db->meta, &k, &v);
    uint32_t have = 0;
    if (rc == 0) {
        if (v.mv_size != 4)
            return corrupt(err, "schema");
        have = (uint32_t)rle(v.mv_data, 4);
        if (have == IDXDB_SCHEMA_VERSION)
            return 0;
    } else if (rc != MDB_NOTFOUND) {
        return dberr(err, rc, "reading the schema version");
    } else {
        MDB_stat st;
        if ((rc = mdb_stat(txn, db->ckpt, &st)))
            return dberr(err, rc, "stat");
        if (st.ms_entries == 0 && !(db->flags & IDXDB_RDONLY)) {
            unsigned char b[4] = {IDXDB_SCHEMA_VERSION & 0xff, 0, 0, 0};
            MDB_val nv = {4, b};
            rc = mdb_put(txn, db->meta, &k, &nv, 0);
            return rc ? dberr(err, rc, "writing the schema version") : 0;
        }
    }
    if ((db->flags & IDXDB_RESET) && !(db->flags & IDXDB_RDONLY)) {
        for (int i = 0; i < 9; i++)
            if ((rc = mdb_drop(txn, *dbi_slot(db, i), 0)))
                return dberr(err, rc, "emptying the index");
        unsigned char b[4] = {IDXDB_SCHEMA_VERSION & 0xff, 0, 0, 0};
        MDB_val nv = {4, b};
        rc = mdb_put(txn, db->meta, &k, &nv, 0);
        return rc ? dberr(err, rc, "writing the schema version") : 0;
    }
    return ckpt_err_set(err, CKPT_EVERSION, CKPT_NOPOS,
                        "index at %s has schema version %u, this build uses %u; rebuild it "
                        "(ckptfs-admin index rebuild)",
                        dir, have, IDXDB_SCHEMA_VERSION);
}

/* Resize the map to at least size bytes (0: adopt the size another process
 * grew it to) with no transaction of this process active: 0 or LMDB's error. */
static int resize_map(struct idxdb *db, size_t size)
{
    pthread_rwlock_wrlock(&db->map_lock);
    int rc = 0;
    if (size == 0 || size > db->map_size) { /* another thread may have grown it meanwhile */
        MDB_envinfo info;
        rc = mdb_env_set_mapsize(db->env, size);
        if (rc == 0 && mdb_env_info(db->env, &info) == 0)
            db->map_size = info.me_mapsize;
    }
    pthread_rwlock_unlock(&db->map_lock);
    return rc;
}

/* Begin a transaction with map_lock held shared (txn_end releases it). */
static int txn_begin(struct idxdb *db, unsigned flags, MDB_txn **txn)
{
    for (;;) {
        pthread_rwlock_rdlock(&db->map_lock);
        int rc = mdb_txn_begin(db->env, NULL, flags, txn);
        if (rc == 0)
            return 0;
        pthread_rwlock_unlock(&db->map_lock);
        if (rc != MDB_MAP_RESIZED || (rc = resize_map(db, 0)) != 0)
            return rc;
    }
}

/* Commit (or, with abort set, abort) txn and release map_lock: 0 or LMDB's error. */
static int txn_end(struct idxdb *db, MDB_txn *txn, int abort)
{
    int rc = 0;
    if (abort)
        mdb_txn_abort(txn);
    else
        rc = mdb_txn_commit(txn);
    pthread_rwlock_unlock(&db->map_lock);
    return rc;
}

int idxdb_open(const char *dir, const struct idxdb_options *opt, struct idxdb **out,
               struct ckpt_err *err)
{
    struct idxdb_options defaults;
    if (!opt) {
        idxdb_options_default(&defaults);
        opt = &defaults;
    }
    *out = NULL;
    ckpt_err_clear(err);
    int ro = (opt->flags & IDXDB_RDONLY) != 0;
    if (!ro && mkdir(dir, 0755) && errno != EEXIST)
        return ckpt_err_set(err, -errno, CKPT_NOPOS, "index: cannot create %s: %s", dir,
                            strerror(errno));
    struct idxdb *db = calloc(1, sizeof(*db));
    if (!db)
        return ckpt_err_set(err, -ENOMEM, CKPT_NOPOS, "out of memory");
    db->flags = opt->flags;
    pthread_rwlockattr_t ra;
    pthread_rwlockattr_init(&ra);
    /* A stream of lookups must not starve a build waiting to grow the map
     * (no thread holds two transactions, so no recursive read locks). */
    pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&db->map_lock, &ra);
    pthread_rwlockattr_destroy(&ra);
    db->map_size = opt->map_size ? opt->map_size : ((size_t)1 << 30);
    db->max_map_size = opt->max_map_size ? opt->max_map_size : db->map_size;
    int rc = mdb_env_create(&db->env);
    if (rc) {
        pthread_rwlock_destroy(&db->map_lock);
        free(db);
        return dberr(err, rc, "mdb_env_create");
    }
    MDB_txn *txn = NULL;
    if ((rc = mdb_env_set_maxdbs(db->env, 16)) ||
        (rc = mdb_env_set_mapsize(db->env, db->map_size)) ||
        (rc = lmdbenv_open(db->env, dir, MDB_NOTLS | (ro ? MDB_RDONLY : 0), 0644))) {
        rc = dberr(err, rc, dir);
        goto fail;
    }
    MDB_envinfo info;
    if (mdb_env_info(db->env, &info) == 0 && info.me_mapsize > db->map_size)
        db->map_size = info.me_mapsize;
    if ((rc = mdb_txn_begin(db->env, NULL, ro ? MDB_RDONLY : 0, &txn))) {
        rc = dberr(err, rc, "begin");
        goto fail;
    }
    for (int i = 0; i < 9; i++)
        if ((rc = mdb_dbi_open(txn, dbnames[i], ro ? 0 : MDB_CREATE, dbi_slot(db, i)))) {
            if (ro && rc == MDB_NOTFOUND)
                rc =
                    ckpt_err_set(err, CKPT_EVERSION, CKPT_NOPOS,
                                 "index at %s is not initialised (no '%s' table)", dir, dbnames[i]);
            else
                rc = dberr(err, rc, "opening tables");
            goto fail;
        }
    if ((rc = check_schema(db, txn, dir, err)))
        goto fail;
    if ((rc = mdb_txn_commit(txn))) {
        txn = NULL;
        rc = dberr(err, rc, "commit");
        goto fail;
    }
    *out = db;
    return 0;
fail:
    if (txn)
        mdb_txn_abort(txn);
    mdb_env_close(db->env);
    pthread_rwlock_destroy(&db->map_lock);
    free(db);
    return rc;
}

void idxdb_close(struct idxdb *db)
{
    if (!db)
        return;
    mdb_env_close(db->env);
    pthread_rwlock_destroy(&db->map_lock);
    free(db);
}

int idxdb_stat(struct idxdb *db, uint64_t *bytes_used, uint64_t *map_size)
{
    MDB_envinfo info;
    MDB_stat st;
    if (mdb_env_info(db->env, &info) || mdb_env_stat(db->env, &st))
        return CKPT_EDB;
    *bytes_used = (uint64_t)(info.me_last_pgno + 1) * st.ms_psize;
    *map_size = info.me_mapsize;
    return 0;
}

/* ---- writing ---------------------------------------------------------- */

static int del_prefix(MDB_txn *txn, MDB_dbi dbi, const unsigned char *prefix, size_t plen)
{
    MDB_cursor *cur;
    int rc = mdb_cursor_open(txn, dbi, &cur);
    if (rc)
        return rc;
    for (;;) {
        MDB_val k = {plen, (void *)prefix}, v;
        rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
        if (rc == MDB_NOTFOUND) {
            rc = 0;
            break;
        }
        if (rc)
            break;
        if (k.mv_size < plen || memcmp(k.mv_data, prefix, plen) != 0)
            break;
        if ((rc = mdb_cursor_del(cur, 0)))
            break;
    }
    mdb_cursor_close(cur);
    return rc;
}

struct hkey {
    uint64_t hash;
    uint32_t idx;
    uint8_t kind;
};

static int hkey_cmp(const void *a, const void *b)
{
    const struct hkey *x = a, *y = b;
    if (x->hash != y->hash)
        return x->hash < y->hash ? -1 : 1;
    return x->idx < y->idx ? -1 : (x->idx > y->idx);
}

struct lkey {
    uint64_t offset;
    uint32_t file, item;
};

static int lkey_cmp(const void *a, const void *b)
{
    const struct lkey *x = a, *y = b;
    if (x->file != y->file)
        return x->file < y->file ? -1 : 1;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    return x->item < y->item ? -1 : (x->item > y->item);
}

/* Append (hash -> entries) groups to dbi under id. */
static int put_hashed(MDB_cursor *cur, uint64_t id, struct hkey *h, size_t n, int with_kind,
                      struct buf *b)
{
    qsort(h, n, sizeof(*h), hkey_cmp);
    for (size_t i = 0; i < n;) {
        size_t j = i;
        b->len = 0;
        while (j < n && h[j].hash == h[i].hash) {
            if (with_kind)
                put_le(b, h[j].kind, 1);
            put_le(b, h[j].idx, 4);
            j++;
        }
        if (b->oom)
            return ENOMEM;
        unsigned char kb[16];
        be64(kb, id);
        be64(kb + 8, h[i].hash);
        MDB_val k = {16, kb}, v = {b->len, b->p};
        int rc = mdb_cursor_put(cur, &k, &v, MDB_APPEND);
        if (rc)
            return rc;
        i = j;
    }
    return 0;
}

/* Delete every record of the version of the checkpoint stored under k, if there is one:
 * 0 or LMDB's error (MDB_CORRUPTED for a short ckpt record). */
static int drop_version(struct idxdb *db, MDB_txn *txn, MDB_val *k)
{
    MDB_val v;
    unsigned char kb[8];
    int rc = mdb_get(txn, db->ckpt, k, &v);
    if (rc == MDB_NOTFOUND)
        return 0;
    if (rc)
        return rc;
    if (v.mv_size < 8)
        return MDB_CORRUPTED;
    uint64_t old = rle(v.mv_data, 8);
    be64(kb, old);
    MDB_dbi per_id[] = {db->file, db->fname, db->item, db->layout, db->tensor, db->fqn};
    for (size_t i = 0; i < sizeof(per_id) / sizeof(per_id[0]); i++)
        if ((rc = del_prefix(txn, per_id[i], kb, 8)))
            return rc;
    MDB_val ik = {8, kb};
    if ((rc = mdb_del(txn, db->ckid, &ik, NULL)) && rc != MDB_NOTFOUND)
        return rc;
    return 0;
}

/* Take the next checkpoint id (above every id in use) into *id and store its successor as
 * meta "next_id": 0 or LMDB's error. */
static int take_fresh_id(struct idxdb *db, MDB_txn *txn, uint64_t *id)
{
    MDB_val nk = {7, "next_id"}, v;
    int rc;
    *id = 1;
    if ((rc = mdb_get(txn, db->meta, &nk, &v)) == 0 && v.mv_size == 8)
        *id = rle(v.mv_data, 8);
    else if (rc && rc != MDB_NOTFOUND)
        return rc;
    unsigned char nb[8];
    for (int i = 0; i < 8; i++)
        nb[i] = (unsigned char)((*id + 1) >> (8 * i));
    MDB_val nv = {8, nb};
    return mdb_put(txn, db->meta, &nk, &nv, 0);
}

/* Store the ckpt record (key -> id, counts, build time, fingerprint) and the ckid record
 * (id -> key), encoding into b: 0, ENOMEM or LMDB's error. */
static int put_ckpt_record(struct idxdb *db, MDB_txn *txn, MDB_val *k, const char *fp,
                           const struct ckpt *c, uint64_t id, struct buf *b)
{
    size_t fplen = strlen(fp);
    int rc;
    put_le(b, id, 8);
    put_le(b, (uint64_t)c->format, 4);
    put_le(b, c->nfiles, 4);
    put_le(b, c->ntensors, 4);
    put_le(b, c->nitems, 4);
    put_le(b, c->nbytes, 4);
    put_le(b, (uint64_t)time(NULL), 8);
    put_le(b, fplen, 4);
    put(b, fp, fplen);
    if (b->oom)
        return ENOMEM;
    MDB_val v = {b->len, b->p};
    if ((rc = mdb_put(txn, db->ckpt, k, &v, 0)))
        return rc;
    unsigned char kb[8];
    be64(kb, id);
    MDB_val ik = {8, kb}, iv = {k->mv_size, k->mv_data};
    return mdb_put(txn, db->ckid, &ik, &iv, MDB_APPEND);
}

/* Append b's record under the 12-byte key id|n with cur: 0, ENOMEM if b ran out of memory,
 * or LMDB's error. */
static int append_numbered(MDB_cursor *cur, uint64_t id, uint32_t n, const struct buf *b)
{
    if (b->oom)
        return ENOMEM;
    unsigned char kb[12];
    be64(kb, id);
    be32(kb + 8, n);
    MDB_val k = {12, kb}, v = {b->len, b->p};
    return mdb_cursor_put(cur, &k, &v, MDB_APPEND);
}

/* Append the file records of c under id, filling h[0..nfiles) with their name hashes:
 * 0, ENOMEM or LMDB's error. */
static int put_files(MDB_cursor *cur, uint64_t id, const struct ckpt *c, struct hkey *h,
                     struct buf *b)
{
    for (uint32_t f = 0; f < c->nfiles; f++) {
        const struct ckpt_file *fi = &c->files[f];
        assert(fi->nitems <= c->nitems);
        size_t nl = strlen(fi->name);
        b->len = 0;
        put_le(b, fi->size, 8);
        put_le(b, (uint64_t)(int64_t)fi->rank, 4);
        put_le(b, (uint64_t)(int64_t)fi->present, 1);
        put_le(b, (uint64_t)fi->overlapping, 1);
        put_le(b, 0, 2);
        put_le(b, fi->nitems, 4);
        put_le(b, nl, 4);
        put(b, fi->name, nl);
        int rc = append_numbered(cur, id, f, b);
        if (rc)
            return rc;
        h[f].hash = strmap_hash(fi->name, nl);
        h[f].idx = f;
        h[f].kind = 0;
    }
    return 0;
}

/* Encode item i of c into b (the item record's layout, see idxdb.h). */
static void encode_item(const struct ckpt *c, uint32_t i, struct buf *b)
{
    const struct ckpt_item *it = &c->items[i];
    /* a finished model: every item in a file, every tensor item a chunk of its tensor */
    assert(i < c->nitems && it->file < c->nfiles);
    assert(it->kind != CKPT_ITEM_TENSOR ||
           (it->tensor < c->ntensors && it->chunk < c->tensors[it->tensor].nchunks));
    const struct ckpt_tensor *t = it->kind == CKPT_ITEM_TENSOR ? &c->tensors[it->tensor] : NULL;
    uint32_t ndim = t ? t->ndim : 0;
    size_t fl = strlen(it->fqn), tl = 0;
    for (uint32_t k = 0; k < it->ntransforms; k++)
        tl += strlen(it->transforms[k]) + 1;
    b->len = 0;
    put_le(b, it->file, 4);
    put_le(b, it->offset, 8);
    put_le(b, it->length, 8);
    put_le(b, it->tensor, 4);
    put_le(b, it->chunk, 4);
    put_le(b, (uint64_t)it->index_hint, 8);
    put_le(b, (uint64_t)it->kind, 1);
    put_le(b, (uint64_t)it->has_transforms, 1);
    put_le(b, ndim, 2);
    put_le(b, fl, 4);
    put_le(b, it->ntransforms, 4);
    put_le(b, tl, 4);
    put(b, it->fqn, fl);
    for (uint32_t d = 0; d < ndim; d++)
        put_le(b, (uint64_t)t->chunks[it->chunk].offsets[d], 8);
    for (uint32_t k = 0; k < it->ntransforms; k++)
        put(b, it->transforms[k], strlen(it->transforms[k]) + 1);
}

/* Append the item records of c under id, filling lk[0..nitems) with their places:
 * 0, ENOMEM or LMDB's error. */
static int put_items(MDB_cursor *cur, uint64_t id, const struct ckpt *c, struct lkey *lk,
                     struct buf *b)
{
    for (uint32_t i = 0; i < c->nitems; i++) {
        encode_item(c, i, b);
        int rc = append_numbered(cur, id, i, b);
        if (rc)
            return rc;
        lk[i].file = c->items[i].file;
        lk[i].offset = c->items[i].offset;
        lk[i].item = i;
    }
    return 0;
}

/* Sort lk (the items' places) and append the layout records of c under id: 0 or LMDB's
 * error. */
static int put_layout(MDB_cursor *cur, uint64_t id, const struct ckpt *c, struct lkey *lk)
{
    qsort(lk, c->nitems, sizeof(*lk), lkey_cmp);
    for (uint32_t i = 0; i < c->nitems; i++) {
        assert(lk[i].item < c->nitems && (i == 0 || lkey_cmp(&lk[i - 1], &lk[i]) < 0));
        unsigned char kb[24];
        be64(kb, id);
        be32(kb + 8, lk[i].file);
        be64(kb + 12, lk[i].offset);
        be32(kb + 20, lk[i].item);
        unsigned char lb[8];
        uint64_t len = c->items[lk[i].item].length;
        for (int q = 0; q < 8; q++)
            lb[q] = (unsigned char)(len >> (8 * q));
        MDB_val k = {24, kb}, v = {8, lb};
        int rc = mdb_cursor_put(cur, &k, &v, MDB_APPEND);
        if (rc)
            return rc;
    }
    return 0;
}

/* Append the tensor records of c under id, filling h[0..ntensors) with their fqn hashes:
 * 0, ENOMEM or LMDB's error. */
static int put_tensors(MDB_cursor *cur, uint64_t id, const struct ckpt *c, struct hkey *h,
                       struct buf *b)
{
    for (uint32_t t = 0; t < c->ntensors; t++) {
        const struct ckpt_tensor *tt = &c->tensors[t];
        size_t fl = strlen(tt->fqn), dl = strlen(tt->dtype);
        b->len = 0;
        put_le(b, tt->elem_bits, 4);
        put_le(b, tt->ndim, 4);
        put_le(b, tt->nchunks, 4);
        put_le(b, fl, 4);
        put_le(b, dl, 4);
        for (uint32_t d = 0; d < tt->ndim; d++)
            put_le(b, (uint64_t)tt->size[d], 8);
        for (uint32_t q = 0; q < tt->nchunks; q++) {
            assert(tt->chunks[q].item < c->nitems);
            put_le(b, tt->chunks[q].item, 4);
        }
        put(b, tt->fqn, fl);
        put(b, tt->dtype, dl);
        int rc = append_numbered(cur, id, t, b);
        if (rc)
            return rc;
        h[t].hash = strmap_hash(tt->fqn, fl);
        h[t].idx = t;
        h[t].kind = CKPT_ITEM_TENSOR;
    }
    return 0;
}

/* Fill h[ntensors..ntensors+nbytes) with the fqn hashes of c's bytes entries. */
static void hash_bytes(const struct ckpt *c, struct hkey *h)
{
    for (uint32_t q = 0; q < c->nbytes; q++) {
        struct hkey *e = &h[c->ntensors + q];
        assert(c->bytes[q].item < c->nitems);
        e->hash = strmap_hash(c->bytes[q].fqn, strlen(c->bytes[q].fqn));
        e->idx = c->bytes[q].item;
        e->kind = CKPT_ITEM_BYTES;
    }
}

/* Close *cur if it is open and open a cursor on dbi in its place: 0 or LMDB's error. */
static int open_cursor(MDB_txn *txn, MDB_dbi dbi, MDB_cursor **cur)
{
    if (*cur)
        mdb_cursor_close(*cur);
    *cur = NULL;
    return mdb_cursor_open(txn, dbi, cur);
}

/* Write every record of checkpoint c under key (a fresh id into *idout), replacing the
 * version stored there, in txn: 0, ENOMEM, MDB_CORRUPTED or LMDB's error. */
static int write_ckpt(struct idxdb *db, MDB_txn *txn, const char *key, const char *fp,
                      const struct ckpt *c, uint64_t *idout)
{
    struct buf b = {0};
    MDB_cursor *cur = NULL;
    struct hkey *h = NULL;
    struct lkey *lk = NULL;
    MDB_val k = {strlen(key), (void *)key};
    uint64_t id;
    int rc;
    /* idxdb_put refused the rest: a write transaction on a writable index, key and
     * fingerprint within their limits */
    assert(!(db->flags & IDXDB_RDONLY) && mdb_txn_env(txn) == db->env);
    assert(k.mv_size >= 1 && k.mv_size <= IDXDB_KEY_MAX && strlen(fp) <= IDXDB_FP_MAX);

    if ((rc = drop_version(db, txn, &k)) || (rc = take_fresh_id(db, txn, &id)))
        return rc;
    *idout = id;
    if ((rc = put_ckpt_record(db, txn, &k, fp, c, id, &b)))
        goto out;
    if ((rc = open_cursor(txn, db->file, &cur)))
        goto out;
    size_t nh = c->nfiles > c->ntensors + c->nbytes ? c->nfiles : c->ntensors + c->nbytes;
    h = malloc((nh + 1) * sizeof(*h));
    lk = malloc(((size_t)c->nitems + 1) * sizeof(*lk));
    if (!h || !lk) {
        rc = ENOMEM;
        goto out;
    }
    if ((rc = put_files(cur, id, c, h, &b)) || (rc = open_cursor(txn, db->fname, &cur)) ||
        (rc = put_hashed(cur, id, h, c->nfiles, 0, &b)) ||
        (rc = open_cursor(txn, db->item, &cur)) || (rc = put_items(cur, id, c, lk, &b)) ||
        (rc = open_cursor(txn, db->layout, &cur)) || (rc = put_layout(cur, id, c, lk)) ||
        (rc = open_cursor(txn, db->tensor, &cur)) || (rc = put_tensors(cur, id, c, h, &b)))
        goto out;
    hash_bytes(c, h);
    if (!(rc = open_cursor(txn, db->fqn, &cur)))
        rc = put_hashed(cur, id, h, (size_t)c->ntensors + c->nbytes, 1, &b);
out:
    if (cur)
        mdb_cursor_close(cur);
    free(h);
    free(lk);
    free(b.p);
    return rc;
}

int idxdb_put(struct idxdb *db, const char *key, const char *fingerprint, const struct ckpt *c,
              uint64_t *id, struct ckpt_err *err)
{
    ckpt_err_clear(err);
    if (db->flags & IDXDB_RDONLY)
        return ckpt_err_set(err, -EROFS, CKPT_NOPOS, "index: opened read-only");
    if (!*key || strlen(key) > IDXDB_KEY_MAX)
        return ckpt_err_set(err, -ENAMETOOLONG, CKPT_NOPOS,
                            "index: checkpoint key must be 1..%d bytes", IDXDB_KEY_MAX);
    if (!fingerprint)
        fingerprint = "";
    if (strlen(fingerprint) > IDXDB_FP_MAX)
        return ckpt_err_set(err, -ENAMETOOLONG, CKPT_NOPOS, "index: fingerprint too long");
    for (;;) {
        MDB_txn *txn;
        uint64_t newid = 0;
        int rc = txn_begin(db, 0, &txn);
        if (rc)
            return dberr(err, rc, "begin");
        size_t map = db->map_size; /* read with map_lock held */
        rc = write_ckpt(db, txn, key, fingerprint, c, &newid);
        int ended = txn_end(db, txn, rc != 0);
        if (rc == 0)
            rc = ended;
        if (rc == 0) {
            if (id)
                *id = newid;
            return 0;
        }
        if (rc != MDB_MAP_FULL || map >= db->max_map_size)
            return dberr(err, rc, "writing the checkpoint");
        size_t grow = map * 2;
        if (grow > db->max_map_size)
            grow = db->max_map_size;
        if ((rc = resize_map(db, grow)))
            return dberr(err, rc, "growing the map");
    }
}

int idxdb_drop(struct idxdb *db, const char *key, struct ckpt_err *err)
{
    ckpt_err_clear(err);
    MDB_txn *txn;
    int rc = txn_begin(db, 0, &txn);
    if (rc)
        return dberr(err, rc, "begin");
    MDB_val k = {strlen(key), (void *)key}, v;
    rc = mdb_get(txn, db->ckpt, &k, &v);
    if (rc == 0 && v.mv_size >= 8) {
        unsigned char kb[8];
        be64(kb, rle(v.mv_data, 8));
        MDB_dbi per_id[] = {db->file, db->fname, db->item, db->layout, db->tensor, db->fqn};
        for (size_t i = 0; !rc && i < sizeof(per_id) / sizeof(per_id[0]); i++)
            rc = del_prefix(txn, per_id[i], kb, 8);
        MDB_val ik = {8, kb};
        if (!rc)
            rc = mdb_del(txn, db->ckid, &ik, NULL);
        if (!rc)
            rc = mdb_del(txn, db->ckpt, &k, NULL);
    }
    if (rc) {
        txn_end(db, txn, 1);
        return rc == MDB_NOTFOUND ? CKPT_NOTFOUND : dberr(err, rc, "dropping");
    }
    rc = txn_end(db, txn, 0);
    return rc ? dberr(err, rc, "commit") : 0;
}

/* ---- reading ---------------------------------------------------------- */

int idxdb_begin(struct idxdb *db, struct idxdb_txn **out, struct ckpt_err *err)
{
    *out = NULL;
    struct idxdb_txn *t = calloc(1, sizeof(*t));
    if (!t)
        return ckpt_err_set(err, -ENOMEM, CKPT_NOPOS, "out of memory");
    t->db = db;
    int rc = txn_begin(db, MDB_RDONLY, &t->txn);
    if (rc) {
        free(t);
        return dberr(err, rc, "begin read");
    }
    *out = t;
    return 0;
}

void idxdb_end(struct idxdb_txn *t)
{
    if (!t)
        return;
    assert(t->txn && (!t->lay_valid || t->lay));
    if (t->lay)
        mdb_cursor_close(t->lay);
    txn_end(t->db, t->txn, 1);
    free(t);
}

int idxdb_refresh(struct idxdb_txn *t)
{
    assert(t->txn && (!t->lay_valid || t->lay));
    mdb_txn_reset(t->txn);
    int rc = mdb_txn_renew(t->txn);
    if (!rc && t->lay)
        rc = mdb_cursor_renew(t->txn, t->lay);
    t->lay_valid = 0;
    return rc ? dberr(NULL, rc, "renew") : 0;
}

static int decode_ckpt(const MDB_val *k, const MDB_val *v, struct idxdb_ckpt *out)
{
    const unsigned char *p = v->mv_data;
    if (v->mv_size < 40)
        return CKPT_EDB;
    out->id = rle(p, 8);
    out->format = (uint32_t)rle(p + 8, 4);
    out->nfiles = (uint32_t)rle(p + 12, 4);
    out->ntensors = (uint32_t)rle(p + 16, 4);
    out->nitems = (uint32_t)rle(p + 20, 4);
    out->nbytes = (uint32_t)rle(p + 24, 4);
    out->built_at = rle(p + 28, 8);
    uint32_t fl = (uint32_t)rle(p + 36, 4);
    if (v->mv_size < 40 + (size_t)fl)
        return CKPT_EDB;
    out->fingerprint = (const char *)p + 40;
    out->fingerprint_len = fl;
    out->key = k->mv_data;
    out->key_len = k->mv_size;
    return 0;
}

int idxdb_ckpt_get(struct idxdb_txn *t, const char *key, struct idxdb_ckpt *out)
{
    MDB_val k = {strlen(key), (void *)key}, v;
    int rc = mdb_get(t->txn, t->db->ckpt, &k, &v);
    if (rc)
        return dberr(NULL, rc, "get");
    return decode_ckpt(&k, &v, out);
}

int idxdb_ckpt_list(struct idxdb_txn *t, int (*fn)(void *arg, const struct idxdb_ckpt *c),
                    void *arg)
{
    MDB_cursor *cur;
    int rc = mdb_cursor_open(t->txn, t->db->ckpt, &cur);
    if (rc)
        return dberr(NULL, rc, "cursor");
    MDB_val k, v;
    for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
         rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        struct idxdb_ckpt c;
        if (decode_ckpt(&k, &v, &c)) {
            rc = CKPT_EDB;
            break;
        }
        if (fn(arg, &c))
            break;
    }
    mdb_cursor_close(cur);
    if (rc == 0 || rc == MDB_NOTFOUND)
        return 0;
    return rc == CKPT_EDB ? rc : dberr(NULL, rc, "cursor");
}

static int decode_file(uint32_t f, const MDB_val *v, struct idxdb_file *out)
{
    const unsigned char *p = v->mv_data;
    if (v->mv_size < 24)
        return CKPT_EDB;
    out->file = f;
    out->size = rle(p, 8);
    out->rank = (int32_t)(uint32_t)rle(p + 8, 4);
    out->present = (int8_t)p[12];
    out->overlapping = p[13];
    out->nitems = (uint32_t)rle(p + 16, 4);
    uint32_t nl = (uint32_t)rle(p + 20, 4);
    if (v->mv_size < 24 + (size_t)nl)
        return CKPT_EDB;
    out->name = (const char *)p + 24;
    out->name_len = nl;
    return 0;
}

/* The record of table dbi under (id, n): 0, CKPT_NOTFOUND or the error. */
static int get_record(struct idxdb_txn *t, MDB_dbi dbi, uint64_t id, uint32_t n, MDB_val *v)
{
    unsigned char kb[12];
    be64(kb, id);
    be32(kb + 8, n);
    MDB_val k = {12, kb};
    int rc = mdb_get(t->txn, dbi, &k, v);
    return rc ? dberr(NULL, rc, "get") : 0;
}

int idxdb_file_get(struct idxdb_txn *t, uint64_t id, uint32_t file, struct idxdb_file *out)
{
    MDB_val v;
    int rc = get_record(t, t->db->file, id, file, &v);
    return rc ? rc : decode_file(file, &v, out);
}

int idxdb_file_find(struct idxdb_txn *t, uint64_t id, const char *name, uint32_t *file)
{
    size_t nl = strlen(name);
    unsigned char kb[16];
    be64(kb, id);
    be64(kb + 8, strmap_hash(name, nl));
    MDB_val k = {16, kb}, v;
    int rc = mdb_get(t->txn, t->db->fname, &k, &v);
    if (rc)
        return dberr(NULL, rc, "get");
    for (size_t i = 0; i + 4 <= v.mv_size; i += 4) {
        uint32_t f = (uint32_t)rle((const unsigned char *)v.mv_data + i, 4);
        struct idxdb_file fi;
        if ((rc = idxdb_file_get(t, id, f, &fi)))
            return rc;
        if (fi.name_len == nl && memcmp(fi.name, name, nl) == 0) {
            *file = f;
            return 0;
        }
    }
    return CKPT_NOTFOUND;
}

int idxdb_files(struct idxdb_txn *t, uint64_t id, int (*fn)(void *arg, const struct idxdb_file *f),
                void *arg)
{
    MDB_cursor *cur;
    int rc = mdb_cursor_open(t->txn, t->db->file, &cur);
    if (rc)
        return dberr(NULL, rc, "cursor");
    unsigned char kb[12];
    be64(kb, id);
    be32(kb + 8, 0);
    MDB_val k = {12, kb}, v;
    for (rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE); rc == 0;
         rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        if (k.mv_size != 12 || rbe64(k.mv_data) != id)
            break;
        struct idxdb_file f;
        if (decode_file(rbe32((const unsigned char *)k.mv_data + 8), &v, &f)) {
            rc = CKPT_EDB;
            break;
        }
        if (fn(arg, &f))
            break;
    }
    mdb_cursor_close(cur);
    return rc == 0 || rc == MDB_NOTFOUND ? 0 : rc == CKPT_EDB ? rc : dberr(NULL, rc, "cursor");
}

/* Decode the layout record under the cursor if it belongs to (id, file). */
static int lay_decode(struct idxdb_txn *t, const MDB_val *k, const MDB_val *v,
                      struct idxdb_span *out)
{
    assert(t->lay);
    const unsigned char *p = k->mv_data;
    if (k->mv_size != 24 || v->mv_size != 8)
        return CKPT_EDB;
    if (rbe64(p) != t->lay_id || rbe32(p + 8) != t->lay_file)
        return CKPT_NOTFOUND;
    out->file = t->lay_file;
    out->offset = rbe64(p + 12);
    out->item = rbe32(p + 20);
    out->length = rle(v->mv_data, 8);
    return 0;
}

static int lay_seek(struct idxdb_txn *t, uint64_t id, uint32_t file, uint64_t off, uint32_t item,
                    MDB_val *k, MDB_val *v, unsigned char kb[24])
{
    if (!t->lay) {
        int rc = mdb_cursor_open(t->txn, t->db->layout, &t->lay);
        if (rc)
            return rc;
    }
    t->lay_id = id;
    t->lay_file = file;
    t->lay_valid = 0;
    be64(kb, id);
    be32(kb + 8, file);
    be64(kb + 12, off);
    be32(kb + 20, item);
    k->mv_size = 24;
    k->mv_data = kb;
    return mdb_cursor_get(t->lay, k, v, MDB_SET_RANGE);
}

int idxdb_item_at(struct idxdb_txn *t, uint64_t id, uint32_t file, uint64_t off,
                  struct idxdb_span *out)
{
    unsigned char kb[24];
    MDB_val k, v;
    int rc = lay_seek(t, id, file, off, UINT32_MAX, &k, &v, kb);
    /* now at the first item starting after off (or past the end): step back */
    if (rc == MDB_NOTFOUND)
        rc = mdb_cursor_get(t->lay, &k, &v, MDB_LAST);
    else if (rc == 0)
        rc = mdb_cursor_get(t->lay, &k, &v, MDB_PREV);
    int overlapping = -1; /* looked up only when needed */
    while (rc == 0) {
        int d = lay_decode(t, &k, &v, out);
        if (d)
            return d;
        if (out->length) {
            if (off - out->offset < out->length) {
                t->lay_valid = 1;
                return 0;
            }
            if (overlapping < 0) {
                /* reading the file record moves no cursor */
                struct idxdb_file fi;
                overlapping = idxdb_file_get(t, id, file, &fi) == 0 && fi.overlapping;
            }
            if (!overlapping)
                return CKPT_NOTFOUND;
        }
        rc = mdb_cursor_get(t->lay, &k, &v, MDB_PREV);
    }
    return rc == MDB_NOTFOUND ? CKPT_NOTFOUND : dberr(NULL, rc, "layout");
}

int idxdb_item_from(struct idxdb_txn *t, uint64_t id, uint32_t file, uint64_t off,
                    struct idxdb_span *out)
{
    unsigned char kb[24];
    MDB_val k, v;
    int rc = lay_seek(t, id, file, off, 0, &k, &v, kb);
    if (rc)
        return rc == MDB_NOTFOUND ? CKPT_NOTFOUND : dberr(NULL, rc, "layout");
    rc = lay_decode(t, &k, &v, out);
    t->lay_valid = rc == 0;
    return rc;
}

int idxdb_layout_next(struct idxdb_txn *t, struct idxdb_span *out)
{
    assert(!t->lay_valid || t->lay);
    if (!t->lay || !t->lay_valid)
        return CKPT_NOTFOUND;
    MDB_val k, v;
    int rc = mdb_cursor_get(t->lay, &k, &v, MDB_NEXT);
    if (rc) {
        t->lay_valid = 0;
        return rc == MDB_NOTFOUND ? CKPT_NOTFOUND : dberr(NULL, rc, "layout");
    }
    rc = lay_decode(t, &k, &v, out);
    if (rc)
        t->lay_valid = 0;
    return rc;
}

int idxdb_item_get(struct idxdb_txn *t, uint64_t id, uint32_t item, struct idxdb_item *out)
{
    MDB_val v;
    int rc = get_record(t, t->db->item, id, item, &v);
    if (rc)
        return rc;
    const unsigned char *p = v.mv_data;
    if (v.mv_size < 52)
        return CKPT_EDB;
    out->item = item;
    out->file = (uint32_t)rle(p, 4);
    out->offset = rle(p + 4, 8);
    out->length = rle(p + 12, 8);
    out->tensor = (uint32_t)rle(p + 20, 4);
    out->chunk = (uint32_t)rle(p + 24, 4);
    out->index_hint = (int64_t)rle(p + 28, 8);
    out->kind = (enum ckpt_item_kind)p[36];
    out->has_transforms = p[37];
    out->ndim = (uint32_t)rle(p + 38, 2);
    uint32_t fl = (uint32_t)rle(p + 40, 4);
    out->ntransforms = (uint32_t)rle(p + 44, 4);
    uint32_t tl = (uint32_t)rle(p + 48, 4);
    if (v.mv_size != 52 + (size_t)fl + 8 * (size_t)out->ndim + tl)
        return CKPT_EDB;
    out->fqn = (const char *)p + 52;
    out->fqn_len = fl;
    out->chunk_offsets = p + 52 + fl;
    out->transforms = (const char *)p + 52 + fl + 8 * out->ndim;
    return 0;
}

int idxdb_tensor_get(struct idxdb_txn *t, uint64_t id, uint32_t tensor, struct idxdb_tensor *out)
{
    MDB_val v;
    int rc = get_record(t, t->db->tensor, id, tensor, &v);
    if (rc)
        return rc;
    const unsigned char *p = v.mv_data;
    if (v.mv_size < 20)
        return CKPT_EDB;
    out->tensor = tensor;
    out->elem_bits = (uint32_t)rle(p, 4);
    out->ndim = (uint32_t)rle(p + 4, 4);
    out->nchunks = (uint32_t)rle(p + 8, 4);
    uint32_t fl = (uint32_t)rle(p + 12, 4), dl = (uint32_t)rle(p + 16, 4);
    size_t need = 20 + 8 * (size_t)out->ndim + 4 * (size_t)out->nchunks + fl + dl;
    if (v.mv_size != need)
        return CKPT_EDB;
    out->size = p + 20;
    out->chunk_items = out->size + 8 * (size_t)out->ndim;
    out->fqn = (const char *)out->chunk_items + 4 * (size_t)out->nchunks;
    out->fqn_len = fl;
    out->dtype = out->fqn + fl;
    out->dtype_len = dl;
    return 0;
}

int idxdb_fqn_find(struct idxdb_txn *t, uint64_t id, const char *fqn, enum ckpt_item_kind *kind,
                   uint32_t *index)
{
    size_t fl = strlen(fqn);
    unsigned char kb[16];
    be64(kb, id);
    be64(kb + 8, strmap_hash(fqn, fl));
    MDB_val k = {16, kb}, v;
    int rc = mdb_get(t->txn, t->db->fqn, &k, &v);
    if (rc)
        return dberr(NULL, rc, "get");
    for (size_t i = 0; i + 5 <= v.mv_size; i += 5) {
        const unsigned char *e = (const unsigned char *)v.mv_data + i;
        uint32_t idx = (uint32_t)rle(e + 1, 4);
        const char *name;
        size_t nl;
        if (e[0] == CKPT_ITEM_TENSOR) {
            struct idxdb_tensor tt;
            if ((rc = idxdb_tensor_get(t, id, idx, &tt)))
                return rc;
            name = tt.fqn;
            nl = tt.fqn_len;
        } else {
            struct idxdb_item it;
            if ((rc = idxdb_item_get(t, id, idx, &it)))
                return rc;
            name = it.fqn;
            nl = it.fqn_len;
        }
        if (nl == fl && memcmp(name, fqn, fl) == 0) {
            *kind = (enum ckpt_item_kind)e[0];
            *index = idx;
            return 0;
        }
    }
    return CKPT_NOTFOUND;
}
