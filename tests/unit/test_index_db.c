/*
 * tests/unit/test_index_db.c - the LMDB index (index/idxdb.c): offset
 * lookups at every boundary (item start, last byte, end, gaps, zero-length
 * items, neighbouring checkpoints), layout-order iteration, name lookups,
 * rebuild idempotency, schema version mismatch, map growth, snapshots.
 */
#include <criterion/criterion.h>
#include <lmdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dcp.h"
#include "idxdb.h"

static char dir[64];
static char envdir[128];

static void setup(void)
{
    strcpy(dir, "/tmp/ckptfs-idxdb-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    snprintf(envdir, sizeof(envdir), "%s/index", dir);
}

static void teardown(void)
{
    char p[256];
    snprintf(p, sizeof(p), "%s/data.mdb", envdir);
    unlink(p);
    snprintf(p, sizeof(p), "%s/lock.mdb", envdir);
    unlink(p);
    rmdir(envdir);
    rmdir(dir);
}

TestSuite(idxdb, .init = setup, .fini = teardown);

/* A synthetic checkpoint:
 *   a.distcp: A [0,100)  Z [100,100) (empty)  B [100,150)  gap  C [200,260)
 *   b.distcp: D [0,10)
 * one 1-D tensor per item ("t.A" ...) plus a bytes entry "x" = D. */
static struct ckpt *synth(void)
{
    struct ckpt *c = ckpt_new(CKPT_FORMAT_DCP, 0);
    struct arena *A = &c->arena;
    static const struct {
        const char *fqn;
        uint32_t file;
        uint64_t off, len;
    } def[] = {{"t.A", 0, 0, 100},
               {"t.Z", 0, 100, 0},
               {"t.C", 0, 200, 60},
               {"t.B", 0, 100, 50},
               {"x", 1, 0, 10}};
    c->nfiles = 2;
    c->files = arena_zalloc(A, 2 * sizeof(*c->files));
    c->files[0].name = "a.distcp";
    c->files[1].name = "__3_0.distcp";
    for (int f = 0; f < 2; f++) {
        c->files[f].rank = ckpt_rank_of(c->files[f].name);
        c->files[f].size = 1000;
        c->files[f].present = 1;
    }
    c->items = arena_zalloc(A, 5 * sizeof(*c->items));
    c->nitems = 5;
    c->tensors = arena_zalloc(A, 4 * sizeof(*c->tensors));
    c->bytes = arena_zalloc(A, sizeof(*c->bytes));
    static const char *zstd[] = {"stream.zstd/1"};
    for (uint32_t i = 0; i < 5; i++) {
        struct ckpt_item *it = &c->items[i];
        it->fqn = def[i].fqn;
        it->file = def[i].file;
        it->offset = def[i].off;
        it->length = def[i].len;
        it->index_hint = i == 4 ? -1 : 0;
        if (i == 4) {
            it->kind = CKPT_ITEM_BYTES;
            it->tensor = it->chunk = CKPT_NONE;
            it->bytes = 0;
            c->bytes[0].fqn = "x";
            c->bytes[0].item = 4;
            c->nbytes = 1;
            continue;
        }
        it->kind = CKPT_ITEM_TENSOR;
        it->tensor = c->ntensors;
        it->chunk = 0;
        it->bytes = CKPT_NONE;
        if (i == 2) {
            it->has_transforms = 1;
            it->ntransforms = 1;
            it->transforms = zstd;
        }
        struct ckpt_tensor *t = &c->tensors[c->ntensors++];
        int64_t *size = arena_alloc(A, sizeof(int64_t)), *off = arena_alloc(A, sizeof(int64_t));
        int64_t *one = arena_alloc(A, sizeof(int64_t));
        size[0] = 7;
        off[0] = (int64_t)i;
        one[0] = 1;
        t->fqn = def[i].fqn;
        t->dtype = "float32";
        t->elem_bits = 32;
        t->ndim = 1;
        t->size = size;
        t->nchunks = 1;
        t->chunks = arena_zalloc(A, sizeof(*t->chunks));
        t->chunks[0].offsets = off;
        t->chunks[0].sizes = one;
        t->chunks[0].item = i;
    }
    struct ckpt_err err;
    ckpt_err_clear(&err);
    cr_assert_eq(ckpt_finish(c, &err), 0, "%s", err.msg);
    return c;
}

static struct idxdb *open_db(unsigned flags)
{
    struct idxdb_options o;
    idxdb_options_default(&o);
    o.flags = flags;
    struct idxdb *db;
    struct ckpt_err err;
    int rc = idxdb_open(envdir, &o, &db, &err);
    cr_assert_eq(rc, 0, "%s", err.msg);
    return db;
}

static uint64_t put(struct idxdb *db, const char *key, const struct ckpt *c)
{
    uint64_t id;
    struct ckpt_err err;
    cr_assert_eq(idxdb_put(db, key, "etag-1", c, &id, &err), 0, "%s", err.msg);
    return id;
}

#define AT(t, id, f, off, want)                                                                    \
    do {                                                                                           \
        struct idxdb_span s_;                                                                      \
        int rc_ = idxdb_item_at(t, id, f, off, &s_);                                               \
        if ((want) == CKPT_NONE)                                                                   \
            cr_assert_eq(rc_, CKPT_NOTFOUND, "byte %llu of file %u: found item %u",                \
                         (unsigned long long)(off), f, s_.item);                                   \
        else {                                                                                     \
            cr_assert_eq(rc_, 0, "byte %llu of file %u: rc %d", (unsigned long long)(off), f,      \
                         rc_);                                                                     \
            cr_assert_eq(s_.item, (want), "byte %llu: item %u", (unsigned long long)(off),         \
                         s_.item);                                                                 \
        }                                                                                          \
    } while (0)

Test(idxdb, offset_boundaries)
{
    struct ckpt *c = synth();
    struct idxdb *db = open_db(0);
    uint64_t id1 = put(db, "/ckpt/one", c);
    uint64_t id2 = put(db, "/ckpt/two", c); /* a neighbour right after in key order */
    struct idxdb_txn *t;
    struct ckpt_err err;
    cr_assert_eq(idxdb_begin(db, &t, &err), 0);
    uint64_t ids[] = {id1, id2};
    for (int k = 0; k < 2; k++) {
        uint64_t id = ids[k];
        AT(t, id, 0, 0, 0);
        AT(t, id, 0, 99, 0);
        AT(t, id, 0, 100, 3); /* B, not the empty Z at the same offset */
        AT(t, id, 0, 149, 3);
        AT(t, id, 0, 150, CKPT_NONE); /* gap */
        AT(t, id, 0, 199, CKPT_NONE);
        AT(t, id, 0, 200, 2);
        AT(t, id, 0, 259, 2);
        AT(t, id, 0, 260, CKPT_NONE); /* past the last item of the file */
        AT(t, id, 0, UINT64_MAX, CKPT_NONE);
        AT(t, id, 1, 0, 4);
        AT(t, id, 1, 9, 4);
        AT(t, id, 1, 10, CKPT_NONE);
        AT(t, id, 2, 0, CKPT_NONE); /* no such file */
    }
    AT(t, id1 + 100, 0, 0, CKPT_NONE); /* no such checkpoint */
    /* agrees with the in-memory model at every byte */
    for (uint32_t f = 0; f < 2; f++)
        for (uint64_t off = 0; off < 300; off++)
            AT(t, id1, f, off, ckpt_item_at(c, f, off));
    idxdb_end(t);
    idxdb_close(db);
    ckpt_free(c);
}

Test(idxdb, layout_order)
{
    struct ckpt *c = synth();
    struct idxdb *db = open_db(0);
    uint64_t id = put(db, "/ckpt/one", c);
    put(db, "/ckpt/two", c);
    struct idxdb_txn *t;
    struct ckpt_err err;
    cr_assert_eq(idxdb_begin(db, &t, &err), 0);
    struct idxdb_span s;
    cr_assert_eq(idxdb_item_at(t, id, 0, 50, &s), 0);
    uint32_t want[] = {1, 3, 2}; /* Z (empty), B, C; then the end of a.distcp */
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(idxdb_layout_next(t, &s), 0);
        cr_assert_eq(s.item, want[i]);
        cr_assert_eq(s.file, 0);
    }
    cr_assert_eq(idxdb_layout_next(t, &s), CKPT_NOTFOUND);
    cr_assert_eq(idxdb_layout_next(t, &s), CKPT_NOTFOUND);
    cr_assert_eq(idxdb_item_from(t, id, 0, 150, &s), 0);
    cr_assert_eq(s.item, 2);
    cr_assert_eq(s.offset, 200);
    cr_assert_eq(s.length, 60);
    cr_assert_eq(idxdb_item_from(t, id, 0, 201, &s), CKPT_NOTFOUND);
    cr_assert_eq(idxdb_layout_next(t, &s), CKPT_NOTFOUND);
    /* last file of the checkpoint: the neighbour's records must not leak in */
    cr_assert_eq(idxdb_item_from(t, id, 1, 0, &s), 0);
    cr_assert_eq(idxdb_layout_next(t, &s), CKPT_NOTFOUND);
    idxdb_end(t);
    idxdb_close(db);
    ckpt_free(c);
}

static int collect_files(void *arg, const struct idxdb_file *f)
{
    int *n = arg;
    cr_assert_eq(f->file, (uint32_t)*n);
    (*n)++;
    return 0;
}

Test(idxdb, records_and_names)
{
    struct ckpt *c = synth();
    struct idxdb *db = open_db(0);
    uint64_t id = put(db, "/ckpt/one", c);
    struct idxdb_txn *t;
    struct ckpt_err err;
    cr_assert_eq(idxdb_begin(db, &t, &err), 0);
    struct idxdb_ckpt ck;
    cr_assert_eq(idxdb_ckpt_get(t, "/ckpt/one", &ck), 0);
    cr_assert_eq(ck.id, id);
    cr_assert_eq(ck.nitems, 5);
    cr_assert_eq(ck.ntensors, 4);
    cr_assert_eq(ck.nbytes, 1);
    cr_assert_eq(ck.fingerprint_len, 6);
    cr_assert(memcmp(ck.fingerprint, "etag-1", 6) == 0);
    cr_assert_eq(idxdb_ckpt_get(t, "/ckpt/none", &ck), CKPT_NOTFOUND);
    uint32_t f;
    cr_assert_eq(idxdb_file_find(t, id, "__3_0.distcp", &f), 0);
    cr_assert_eq(f, 1);
    cr_assert_eq(idxdb_file_find(t, id, "nope", &f), CKPT_NOTFOUND);
    struct idxdb_file fi;
    cr_assert_eq(idxdb_file_get(t, id, 1, &fi), 0);
    cr_assert_eq(fi.rank, 3);
    cr_assert_eq(fi.size, 1000);
    cr_assert_eq(fi.nitems, 1);
    int n = 0;
    cr_assert_eq(idxdb_files(t, id, collect_files, &n), 0);
    cr_assert_eq(n, 2);
    struct idxdb_item it;
    cr_assert_eq(idxdb_item_get(t, id, 2, &it), 0);
    cr_assert_eq(it.fqn_len, 3);
    cr_assert(memcmp(it.fqn, "t.C", 3) == 0);
    cr_assert_eq(it.offset, 200);
    cr_assert_eq(it.ndim, 1);
    cr_assert_eq(idxdb_i64(it.chunk_offsets, 0), 2);
    cr_assert_eq(it.has_transforms, 1);
    cr_assert_str_eq(it.transforms, "stream.zstd/1");
    enum ckpt_item_kind kind;
    uint32_t idx;
    cr_assert_eq(idxdb_fqn_find(t, id, "t.B", &kind, &idx), 0);
    cr_assert_eq(kind, CKPT_ITEM_TENSOR);
    struct idxdb_tensor tt;
    cr_assert_eq(idxdb_tensor_get(t, id, idx, &tt), 0);
    cr_assert_eq(tt.nchunks, 1);
    cr_assert_eq(idxdb_u32(tt.chunk_items, 0), 3);
    cr_assert_eq(idxdb_i64(tt.size, 0), 7);
    cr_assert(memcmp(tt.dtype, "float32", tt.dtype_len) == 0);
    cr_assert_eq(idxdb_fqn_find(t, id, "x", &kind, &idx), 0);
    cr_assert_eq(kind, CKPT_ITEM_BYTES);
    cr_assert_eq(idx, 4);
    cr_assert_eq(idxdb_fqn_find(t, id, "t.none", &kind, &idx), CKPT_NOTFOUND);
    idxdb_end(t);
    idxdb_close(db);
    ckpt_free(c);
}

static int count_ckpts(void *arg, const struct idxdb_ckpt *c)
{
    (void)c;
    (*(int *)arg)++;
    return 0;
}

Test(idxdb, rebuild_is_idempotent)
{
    struct ckpt *c = synth();
    struct idxdb *db = open_db(0);
    uint64_t id1 = put(db, "/ckpt/one", c);
    uint64_t id2 = put(db, "/ckpt/one", c);
    cr_assert_neq(id1, id2);
    struct idxdb_txn *t;
    struct ckpt_err err;
    cr_assert_eq(idxdb_begin(db, &t, &err), 0);
    int n = 0;
    idxdb_ckpt_list(t, count_ckpts, &n);
    cr_assert_eq(n, 1);
    struct idxdb_item a;
    cr_assert_eq(idxdb_item_get(t, id1, 0, &a), CKPT_NOTFOUND); /* old version gone */
    struct idxdb_span s;
    cr_assert_eq(idxdb_item_at(t, id1, 0, 0, &s), CKPT_NOTFOUND);
    struct idxdb_ckpt ck;
    cr_assert_eq(idxdb_ckpt_get(t, "/ckpt/one", &ck), 0);
    cr_assert_eq(ck.id, id2);
    for (uint32_t i = 0; i < 5; i++) {
        cr_assert_eq(idxdb_item_get(t, id2, i, &a), 0);
        cr_assert_eq(a.offset, c->items[i].offset);
        cr_assert_eq(a.length, c->items[i].length);
        cr_assert_eq(a.file, c->items[i].file);
    }
    cr_assert_eq(idxdb_item_get(t, id2, 5, &a), CKPT_NOTFOUND);
    idxdb_end(t);
    /* rebuilding reuses freed pages: the file stops growing after a few */
    uint64_t used1, used2, map;
    for (int i = 0; i < 10; i++)
        put(db, "/ckpt/one", c);
    idxdb_stat(db, &used1, &map);
    for (int i = 0; i < 50; i++)
        put(db, "/ckpt/one", c);
    idxdb_stat(db, &used2, &map);
    cr_assert_eq(used2, used1, "index grew from %llu to %llu bytes on rebuilds",
                 (unsigned long long)used1, (unsigned long long)used2);
    cr_assert_eq(idxdb_drop(db, "/ckpt/one", &err), 0);
    cr_assert_eq(idxdb_drop(db, "/ckpt/one", &err), CKPT_NOTFOUND);
    idxdb_close(db);
    ckpt_free(c);
}

static void set_schema(uint32_t v)
{
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
    cr_assert_eq(mdb_env_create(&env), 0);
    mdb_env_set_maxdbs(env, 16);
    cr_assert_eq(mdb_env_open(env, envdir, 0, 0644), 0);
    cr_assert_eq(mdb_txn_begin(env, NULL, 0, &txn), 0);
    cr_assert_eq(mdb_dbi_open(txn, "meta", 0, &dbi), 0);
    unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8), 0, 0};
    MDB_val k = {6, "schema"}, val = {4, b};
    cr_assert_eq(mdb_put(txn, dbi, &k, &val, 0), 0);
    cr_assert_eq(mdb_txn_commit(txn), 0);
    mdb_env_close(env);
}

Test(idxdb, version_mismatch)
{
    struct ckpt *c = synth();
    struct idxdb *db = open_db(0);
    put(db, "/ckpt/one", c);
    idxdb_close(db);
    set_schema(999);
    struct idxdb_options o;
    idxdb_options_default(&o);
    struct ckpt_err err;
    cr_assert_eq(idxdb_open(envdir, &o, &db, &err), CKPT_EVERSION);
    cr_assert_null(db);
    cr_assert(strstr(err.msg, "999") != NULL, "%s", err.msg);
    o.flags = IDXDB_RDONLY;
    cr_assert_eq(idxdb_open(envdir, &o, &db, &err), CKPT_EVERSION);
    o.flags = IDXDB_RESET;
    cr_assert_eq(idxdb_open(envdir, &o, &db, &err), 0, "%s", err.msg);
    struct idxdb_txn *t;
    cr_assert_eq(idxdb_begin(db, &t, &err), 0);
    int n = 0;
    idxdb_ckpt_list(t, count_ckpts, &n);
    cr_assert_eq(n, 0);
    idxdb_end(t);
    put(db, "/ckpt/one", c);
    idxdb_close(db);
    db = open_db(IDXDB_RDONLY);
    idxdb_close(db);
    ckpt_free(c);
}

Test(idxdb, snapshots_and_refresh)
{
    struct ckpt *c = synth();
    struct idxdb *db = open_db(0);
    struct idxdb_txn *t;
    struct ckpt_err err;
    cr_assert_eq(idxdb_begin(db, &t, &err), 0);
    put(db, "/ckpt/late", c);
    struct idxdb_ckpt ck;
    cr_assert_eq(idxdb_ckpt_get(t, "/ckpt/late", &ck), CKPT_NOTFOUND);
    cr_assert_eq(idxdb_refresh(t), 0);
    cr_assert_eq(idxdb_ckpt_get(t, "/ckpt/late", &ck), 0);
    struct idxdb_span s;
    cr_assert_eq(idxdb_item_at(t, ck.id, 0, 120, &s), 0);
    cr_assert_eq(s.item, 3);
    idxdb_end(t);
    idxdb_close(db);
    ckpt_free(c);
}

Test(idxdb, key_limits)
{
    struct ckpt *c = synth();
    struct idxdb *db = open_db(0);
    char key[IDXDB_KEY_MAX + 2];
    memset(key, 'k', sizeof(key) - 1);
    key[sizeof(key) - 1] = '\0';
    struct ckpt_err err;
    cr_assert_lt(idxdb_put(db, key, "", c, NULL, &err), 0);
    cr_assert_lt(idxdb_put(db, "", "", c, NULL, &err), 0);
    key[IDXDB_KEY_MAX] = '\0';
    cr_assert_eq(idxdb_put(db, key, NULL, c, NULL, &err), 0, "%s", err.msg);
    idxdb_close(db);
    ckpt_free(c);
}

/* The large torch 2.9 stub checkpoint, parsed. */
static struct ckpt *large_fixture(void)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/dcp-stub/torch2.9+.p4.large.metadata", CKPTFS_FIXTURES);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n);
    cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    struct ckpt *c;
    struct ckpt_err err;
    cr_assert_eq(dcp_parse(b, (size_t)n, NULL, &c, &err), 0, "%s", err.msg);
    free(b);
    return c;
}

Test(idxdb, real_checkpoint_and_map_growth)
{
    struct ckpt *c = large_fixture();
    struct ckpt_err err;
    struct idxdb_options o;
    idxdb_options_default(&o);
    o.map_size = 256 * 1024; /* far too small: forces growth */
    struct idxdb *db;
    cr_assert_eq(idxdb_open(envdir, &o, &db, &err), 0, "%s", err.msg);
    uint64_t id;
    cr_assert_eq(idxdb_put(db, "s3://bucket/large", "", c, &id, &err), 0, "%s", err.msg);
    struct idxdb_txn *t;
    cr_assert_eq(idxdb_begin(db, &t, &err), 0);
    for (uint32_t i = 0; i < c->nitems; i++) {
        const struct ckpt_item *it = &c->items[i];
        if (!it->length)
            continue;
        AT(t, id, it->file, it->offset, i);
        AT(t, id, it->file, it->offset + it->length - 1, i);
    }
    idxdb_end(t);
    idxdb_close(db);
    ckpt_free(c);
}

Test(idxdb, overlapping_items)
{
    /* never written by torch, but allowed: P [0,100) holds Q [10,20) */
    struct ckpt *c = ckpt_new(CKPT_FORMAT_DCP, 0);
    struct arena *A = &c->arena;
    c->nfiles = 1;
    c->files = arena_zalloc(A, sizeof(*c->files));
    c->files[0].name = "f";
    c->files[0].rank = -1;
    c->nitems = c->nbytes = 2;
    c->items = arena_zalloc(A, 2 * sizeof(*c->items));
    c->bytes = arena_zalloc(A, 2 * sizeof(*c->bytes));
    const char *names[] = {"P", "Q"};
    uint64_t off[] = {0, 10}, len[] = {100, 10};
    for (uint32_t i = 0; i < 2; i++) {
        c->items[i] = (struct ckpt_item){.fqn = names[i],
                                         .kind = CKPT_ITEM_BYTES,
                                         .tensor = CKPT_NONE,
                                         .chunk = CKPT_NONE,
                                         .bytes = i,
                                         .offset = off[i],
                                         .length = len[i],
                                         .index_hint = -1};
        c->bytes[i].fqn = names[i];
        c->bytes[i].item = i;
    }
    struct ckpt_err err;
    ckpt_err_clear(&err);
    cr_assert_eq(ckpt_finish(c, &err), 0);
    cr_assert(c->files[0].overlapping);
    cr_assert_eq(ckpt_item_at(c, 0, 5), 0);
    cr_assert_eq(ckpt_item_at(c, 0, 15), 1);
    cr_assert_eq(ckpt_item_at(c, 0, 50), 0);
    cr_assert_eq(ckpt_item_at(c, 0, 100), CKPT_NONE);
    struct idxdb *db = open_db(0);
    uint64_t id = put(db, "/o", c);
    struct idxdb_txn *t;
    cr_assert_eq(idxdb_begin(db, &t, &err), 0);
    for (uint64_t b = 0; b < 110; b++)
        AT(t, id, 0, b, ckpt_item_at(c, 0, b));
    idxdb_end(t);
    idxdb_close(db);
    ckpt_free(c);
}

struct grower {
    struct idxdb *db;
    struct ckpt *c;
    int rc;
};

static void *grow_by_a_build(void *arg)
{
    struct grower *g = arg;
    struct ckpt_err err;
    g->rc = idxdb_put(g->db, "s3://bucket/large", "", g->c, NULL, &err);
    return NULL;
}

Test(idxdb, the_map_grows_only_between_lookups)
{
    /* The mount looks items up (a read transaction, a cursor) while another
     * thread's build may grow the map; LMDB may remap only while no
     * transaction of the process is open, so the build waits for the lookup
     * instead of pulling the memory out from under its cursor. */
    struct ckpt *c = synth(), *big = large_fixture();
    struct idxdb_options o;
    idxdb_options_default(&o);
    o.map_size = 256 * 1024; /* the large build must grow it */
    struct idxdb *db;
    struct ckpt_err err;
    cr_assert_eq(idxdb_open(envdir, &o, &db, &err), 0, "%s", err.msg);
    uint64_t id, map_before, map_after, used;
    cr_assert_eq(idxdb_put(db, "/ckpt/one", "", c, &id, &err), 0, "%s", err.msg);
    cr_assert_eq(idxdb_stat(db, &used, &map_before), 0);
    struct idxdb_txn *t;
    cr_assert_eq(idxdb_begin(db, &t, &err), 0);
    struct idxdb_span s;
    cr_assert_eq(idxdb_item_at(t, id, 0, 0, &s), 0); /* a lookup's cursor is placed */
    struct grower g = {db, big, -1};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, grow_by_a_build, &g), 0);
    usleep(300 * 1000); /* time enough for the build to reach its growth */
    cr_assert_eq(idxdb_layout_next(t, &s), 0, "the lookup's cursor broke");
    cr_assert_eq(s.offset, 100);
    idxdb_end(t);
    cr_assert_eq(pthread_join(th, NULL), 0);
    cr_assert_eq(g.rc, 0, "the build failed");
    cr_assert_eq(idxdb_stat(db, &used, &map_after), 0);
    cr_assert_gt(map_after, map_before, "the map did not grow");
    idxdb_close(db);
    ckpt_free(c);
    ckpt_free(big);
}
