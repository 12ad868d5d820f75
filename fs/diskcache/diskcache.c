/*
 * fs/diskcache/diskcache.c - the persistent cache of object versions: the
 * catalogue (LMDB), the data files, checksums and the bounds (see
 * diskcache.h), and the list of files held for reads in place (their lookup,
 * release and freeing; dcfile.c opens and checks them, through what
 * diskcache_internal.h shares). Write transactions and the in-memory totals
 * are serialised by one mutex; reads use LMDB read transactions and run in
 * parallel.
 */
#include "diskcache.h"
#include "diskcache_internal.h"

#include "crc32c.h"
#include "fdio.h"
#include "lmdbenv.h"
#include "log.h"

#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <lmdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define CATALOG_MAP_SIZE (1ull << 30) /* virtual: ~20 M chunks of catalogue */

/* Idle looked-up versions kept at most (each an open fd and a chunk map). */
#define IDLE_FILES_MAX 256

static void forget_file(struct diskcache *dc, uint64_t id);
static void free_files(struct diskcache *dc);

void dc_cache_lock(struct diskcache *dc)
{
    pthread_mutex_lock(&dc->lock);
    dc->owner = pthread_self();
}

void dc_cache_unlock(struct diskcache *dc)
{
    assert(pthread_equal(dc->owner, pthread_self()));
    dc->owner = (pthread_t)0;
    pthread_mutex_unlock(&dc->lock);
}

#define assert_locked(dc) assert(pthread_equal((dc)->owner, pthread_self()))

/* Take held bytes and one object off the totals (a removed object). */
static void forget_object(struct diskcache *dc, uint64_t held)
{
    assert_locked(dc);
    assert(dc->st.held_bytes >= held && dc->st.objects > 0);
    dc->st.held_bytes -= held;
    dc->st.objects--;
}

/* ---- identities and keys ------------------------------------------------- */

static uint64_t fnv1a(uint64_t h, const void *p, size_t n)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ c[i]) * 0x100000001b3ull;
    return h;
}

/* v with its ETag in one spelling (no W/ prefix, no quotes): a store's
 * listing and its answer to an upload may quote the same ETag differently.
 * buf holds the etag of the result. */
struct diskcache_version dc_plain_version(const struct diskcache_version *v, char *buf, size_t n)
{
    const char *e = v->etag;
    if (strncmp(e, "W/", 2) == 0)
        e += 2;
    size_t len = strlen(e);
    if (len >= 2 && e[0] == '"' && e[len - 1] == '"')
        e++, len -= 2;
    if (len >= n)
        len = n - 1;
    memcpy(buf, e, len);
    buf[len] = '\0';
    return (struct diskcache_version){.path = v->path, .etag = buf, .size = v->size};
}

uint64_t dc_version_id(const struct diskcache_version *v)
{
    uint64_t h = fnv1a(0xcbf29ce484222325ull, v->path, strlen(v->path) + 1);
    h = fnv1a(h, v->etag, strlen(v->etag) + 1);
    return fnv1a(h, &v->size, sizeof v->size);
}

static void be64(unsigned char *out, uint64_t x)
{
    for (int i = 7; i >= 0; i--, x >>= 8)
        out[i] = (unsigned char)x;
}

static void be32(unsigned char *out, uint32_t x)
{
    for (int i = 3; i >= 0; i--, x >>= 8)
        out[i] = (unsigned char)x;
}

/* Last-use times: wall-clock nanoseconds (they order the lru across restarts). */
uint64_t dc_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void dc_data_path(const struct diskcache *dc, uint64_t id, char *out, size_t n)
{
    snprintf(out, n, "%s/data/%016" PRIx64, dc->dir, id);
}

int dc_mdb_errno(int rc)
{
    if (rc == 0)
        return 0;
    if (rc == MDB_MAP_FULL)
        return -ENOSPC;
    if (rc == MDB_NOTFOUND)
        return -ENOENT;
    return rc > 0 ? -rc : -EIO;
}

/* ---- catalogue records --------------------------------------------------- */

/* The record of id in txn: 0 and *h if it is version v, -ENOENT if there is
 * none, -EEXIST if another version has the same id. */
int dc_obj_get(struct diskcache *dc, MDB_txn *txn, uint64_t id, const struct diskcache_version *v,
               struct obj_head *h)
{
    MDB_val k = {sizeof id, &id}, val;
    int rc = mdb_get(txn, dc->objs, &k, &val);
    if (rc != 0)
        return dc_mdb_errno(rc);
    if (val.mv_size < sizeof *h)
        return -EEXIST;
    memcpy(h, val.mv_data, sizeof *h);
    const char *names = (const char *)val.mv_data + sizeof *h;
    if (!v)
        return 0;
    size_t pl = strlen(v->path), el = strlen(v->etag);
    if (h->size != v->size || h->path_len != pl || h->etag_len != el ||
        val.mv_size != sizeof *h + pl + el || memcmp(names, v->path, pl) != 0 ||
        memcmp(names + pl, v->etag, el) != 0)
        return -EEXIST;
    return 0;
}

static int obj_put(struct diskcache *dc, MDB_txn *txn, uint64_t id,
                   const struct diskcache_version *v, const struct obj_head *h)
{
    size_t pl = strlen(v->path), el = strlen(v->etag);
    MDB_val k = {sizeof id, &id}, val = {sizeof *h + pl + el, NULL};
    int rc = mdb_put(txn, dc->objs, &k, &val, MDB_RESERVE);
    if (rc != 0)
        return dc_mdb_errno(rc);
    struct obj_head copy = *h;
    copy.path_len = (uint32_t)pl;
    copy.etag_len = (uint32_t)el;
    memcpy(val.mv_data, &copy, sizeof copy);
    memcpy((char *)val.mv_data + sizeof copy, v->path, pl);
    memcpy((char *)val.mv_data + sizeof copy + pl, v->etag, el);
    return 0;
}

/* Move id's place in the lru order from old_use to new_use (old_use 0: none). */
static int lru_move(struct diskcache *dc, MDB_txn *txn, uint64_t id, uint64_t old_use,
                    uint64_t new_use)
{
    unsigned char key[16];
    be64(key + 8, id);
    MDB_val k = {sizeof key, key}, empty = {0, ""};
    if (old_use) {
        be64(key, old_use);
        int rc = mdb_del(txn, dc->lru, &k, NULL);
        if (rc != 0 && rc != MDB_NOTFOUND)
            return dc_mdb_errno(rc);
    }
    if (!new_use)
        return 0;
    be64(key, new_use);
    return dc_mdb_errno(mdb_put(txn, dc->lru, &k, &empty, 0));
}

void dc_chunk_key(unsigned char key[12], uint64_t id, uint32_t index)
{
    be64(key, id);
    be32(key + 8, index);
}

/* Delete id's object, chunks and lru place in txn; *held: the bytes it held. */
static int obj_delete(struct diskcache *dc, MDB_txn *txn, uint64_t id, uint64_t *held)
{
    struct obj_head h;
    int rc = dc_obj_get(dc, txn, id, NULL, &h);
    if (rc != 0)
        return rc;
    *held = h.held;
    MDB_cursor *cur;
    if ((rc = mdb_cursor_open(txn, dc->chunks, &cur)) != 0)
        return dc_mdb_errno(rc);
    unsigned char key[12];
    dc_chunk_key(key, id, 0);
    for (;;) { /* the first chunk of id left, until there is none */
        MDB_val k = {sizeof key, key}, val;
        rc = mdb_cursor_get(cur, &k, &val, MDB_SET_RANGE);
        if (rc != 0 || k.mv_size != sizeof key || memcmp(k.mv_data, key, 8) != 0)
            break;
        if ((rc = mdb_cursor_del(cur, 0)) != 0)
            break;
    }
    mdb_cursor_close(cur);
    if (rc != 0 && rc != MDB_NOTFOUND)
        return dc_mdb_errno(rc);
    MDB_val ok = {sizeof id, &id};
    if ((rc = mdb_del(txn, dc->objs, &ok, NULL)) != 0)
        return dc_mdb_errno(rc);
    return lru_move(dc, txn, id, h.last_use, 0);
}

/* ---- bounds -------------------------------------------------------------- */

/* Bytes that may still be added under the free-space floor. */
static uint64_t room_above_floor(const struct diskcache *dc)
{
    struct statvfs fs;
    if (statvfs(dc->dir, &fs) != 0)
        return 0;
    uint64_t total = (uint64_t)fs.f_blocks * fs.f_frsize;
    uint64_t avail = (uint64_t)fs.f_bavail * fs.f_frsize;
    uint64_t floor = total / 100 * dc->cfg.floor_percent;
    return avail > floor ? avail - floor : 0;
}

/* Drop the least recently used object that is not keep: 1 if one went, 0 if
 * none is left, -errno. Caller holds dc->lock. */
static int evict_one(struct diskcache *dc, uint64_t keep)
{
    assert_locked(dc);
    MDB_txn *txn;
    int rc = mdb_txn_begin(dc->env, NULL, 0, &txn);
    if (rc != 0)
        return dc_mdb_errno(rc);
    MDB_cursor *cur;
    uint64_t victim = 0;
    if ((rc = mdb_cursor_open(txn, dc->lru, &cur)) == 0) {
        MDB_val k, val;
        for (rc = mdb_cursor_get(cur, &k, &val, MDB_FIRST); rc == 0;
             rc = mdb_cursor_get(cur, &k, &val, MDB_NEXT)) {
            uint64_t id = 0;
            for (int i = 8; i < 16; i++)
                id = id << 8 | ((unsigned char *)k.mv_data)[i];
            if (id != keep) {
                victim = id;
                break;
            }
        }
        mdb_cursor_close(cur);
    }
    uint64_t held = 0;
    if (victim == 0) {
        mdb_txn_abort(txn);
        return rc == MDB_NOTFOUND || rc == 0 ? 0 : dc_mdb_errno(rc);
    }
    rc = obj_delete(dc, txn, victim, &held);
    if (rc != 0) {
        mdb_txn_abort(txn);
        return rc;
    }
    if ((rc = dc_mdb_errno(mdb_txn_commit(txn))) != 0) /* the transaction is freed either way */
        return rc;
    char path[4096];
    dc_data_path(dc, victim, path, sizeof path);
    unlink(path);
    forget_file(dc, victim); /* its fd would keep the bytes on disk */
    dc->st.evictions++;
    dc->st.evicted_bytes += held;
    forget_object(dc, held);
    return 1;
}

/* Evict until need more bytes fit under the capacity and above the floor
 * (keep is never evicted): 0, or -ENOSPC. Caller holds dc->lock. */
static int make_room(struct diskcache *dc, uint64_t need, uint64_t keep)
{
    assert_locked(dc);
    for (;;) {
        int fits = dc->st.held_bytes + need <= dc->cfg.capacity && room_above_floor(dc) >= need;
        if (fits)
            return 0;
        int rc = evict_one(dc, keep);
        if (rc <= 0)
            return rc < 0 ? rc : -ENOSPC;
    }
}

static void note_put_failure(struct diskcache *dc, const struct diskcache_version *v, int rc)
{
    assert_locked(dc);
    dc->st.put_failures++;
    if (!dc->put_failure_logged) {
        dc->put_failure_logged = 1;
        log_warn("disk cache: cannot keep %s (%s); reads go to the store (logged once)", v->path,
                 strerror(-rc));
    }
}

/* ---- open, close --------------------------------------------------------- */

static int make_dirs(const char *dir)
{
    char sub[4096];
    const char *names[] = {"", "/data", "/catalog"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        snprintf(sub, sizeof sub, "%s%s", dir, names[i]);
        if (mkdir(sub, 0700) != 0 && errno != EEXIST)
            return -errno;
    }
    return 0;
}

static int take_lock(struct diskcache *dc, char *err, size_t errlen)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/lock", dc->dir);
    dc->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (dc->lock_fd < 0) {
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return -errno;
    }
    if (flock(dc->lock_fd, LOCK_EX | LOCK_NB) != 0) {
        char pid[32] = "";
        ssize_t n = pread(dc->lock_fd, pid, sizeof pid - 1, 0);
        pid[n > 0 ? n : 0] = '\0';
        pid[strcspn(pid, "\n")] = '\0';
        snprintf(err, errlen,
                 "disk cache %s is in use by another ckptfs (pid %s): give each mount its "
                 "own --cache-dir",
                 dc->dir, *pid ? pid : "?");
        return -EBUSY;
    }
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
    if (ftruncate(dc->lock_fd, 0) != 0 || pwrite(dc->lock_fd, pid, (size_t)n, 0) != n)
        log_warn("disk cache: cannot write %s: %s", path, strerror(errno));
    return 0;
}

/* Count what the catalogue holds (held_bytes, objects) at open. */
static int load_totals(struct diskcache *dc, MDB_txn *txn)
{
    MDB_cursor *cur;
    int rc = mdb_cursor_open(txn, dc->objs, &cur);
    if (rc != 0)
        return dc_mdb_errno(rc);
    MDB_val k, val;
    for (rc = mdb_cursor_get(cur, &k, &val, MDB_FIRST); rc == 0;
         rc = mdb_cursor_get(cur, &k, &val, MDB_NEXT)) {
        struct obj_head h;
        if (val.mv_size < sizeof h)
            continue;
        memcpy(&h, val.mv_data, sizeof h);
        dc->st.held_bytes += h.held;
        dc->st.objects++;
    }
    mdb_cursor_close(cur);
    return rc == MDB_NOTFOUND ? 0 : dc_mdb_errno(rc);
}

static int open_catalog(struct diskcache *dc, char *err, size_t errlen)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/catalog", dc->dir);
    int rc = mdb_env_create(&dc->env);
    if (rc == 0)
        rc = mdb_env_set_maxdbs(dc->env, 4);
    if (rc == 0)
        rc = mdb_env_set_mapsize(dc->env, CATALOG_MAP_SIZE);
    if (rc == 0)
        /* No fsync per commit (one per hit's lru touch and per chunk kept
         * would cost a disk flush each): the catalogue is synced at close,
         * and one that a power cut left unreadable is started afresh
         * (diskcache_open); a chunk listed whose bytes were lost fails its
         * checksum. */
        rc = lmdbenv_open(dc->env, path, MDB_NOTLS | MDB_NOSYNC, 0600);
    MDB_txn *txn = NULL;
    if (rc == 0)
        rc = mdb_txn_begin(dc->env, NULL, 0, &txn);
    if (rc == 0)
        rc = mdb_dbi_open(txn, "objects", MDB_CREATE, &dc->objs);
    if (rc == 0)
        rc = mdb_dbi_open(txn, "chunks", MDB_CREATE, &dc->chunks);
    if (rc == 0)
        rc = mdb_dbi_open(txn, "lru", MDB_CREATE, &dc->lru);
    int e = rc != 0 ? dc_mdb_errno(rc) : load_totals(dc, txn);
    if (e == 0 && txn) {
        e = dc_mdb_errno(mdb_txn_commit(txn));
        txn = NULL;
    }
    if (txn)
        mdb_txn_abort(txn);
    char why[160];
    if (e != 0)
        snprintf(err, errlen, "disk cache catalogue %s: %s", path,
                 lmdbenv_strerror(rc != 0 ? rc : -e, path, why, sizeof why));
    return e;
}

/* Remove the catalogue and every data file under dir (the lock stays). */
static void empty_cache(const char *dir)
{
    char path[4096];
    const char *files[] = {"catalog/data.mdb", "catalog/lock.mdb"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        unlink(path);
    }
    snprintf(path, sizeof path, "%s/data", dir);
    DIR *d = opendir(path);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(path, sizeof path, "%s/data/%s", dir, e->d_name);
        unlink(path);
    }
    if (d)
        closedir(d);
}

int diskcache_open(const char *dir, const struct diskcache_config *cfg, struct diskcache **out,
                   char *err, size_t errlen)
{
    struct diskcache *dc = calloc(1, sizeof *dc);
    if (!dc || !(dc->dir = strdup(dir))) {
        free(dc);
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    dc->cfg = *cfg;
    dc->lock_fd = -1;
    pthread_mutex_init(&dc->lock, NULL);
    pthread_mutex_init(&dc->files_lock, NULL);
    int rc = make_dirs(dir);
    if (rc != 0)
        snprintf(err, errlen, "disk cache %s: %s", dir, strerror(-rc));
    if (rc == 0)
        rc = take_lock(dc, err, errlen);
    if (rc == 0)
        rc = open_catalog(dc, err, errlen);
    if (rc != 0 && rc != -EBUSY && dc->lock_fd >= 0) {
        log_warn("%s: emptying the disk cache", err);
        if (dc->env)
            mdb_env_close(dc->env);
        dc->env = NULL;
        empty_cache(dir);
        rc = open_catalog(dc, err, errlen);
    }
    if (rc != 0) {
        diskcache_close(dc);
        return rc;
    }
    *out = dc;
    return 0;
}

void diskcache_close(struct diskcache *dc)
{
    if (!dc)
        return;
    if (dc->env) {
        mdb_env_sync(dc->env, 1); /* the commits were not synced (open_catalog) */
        mdb_env_close(dc->env);
    }
    if (dc->lock_fd >= 0)
        close(dc->lock_fd); /* releases the flock */
    free_files(dc);
    pthread_mutex_destroy(&dc->files_lock);
    pthread_mutex_destroy(&dc->lock);
    free(dc->dir);
    free(dc);
}

/* ---- reads --------------------------------------------------------------- */

/* Drop one chunk whose bytes failed their checksum. */
void dc_drop_chunk(struct diskcache *dc, const struct diskcache_version *v, uint64_t id,
                   uint32_t index)
{
    dc_cache_lock(dc);
    dc->st.checksum_failures++;
    MDB_txn *txn;
    if (mdb_txn_begin(dc->env, NULL, 0, &txn) == 0) {
        unsigned char key[12];
        dc_chunk_key(key, id, index);
        MDB_val k = {sizeof key, key}, val;
        struct obj_head h;
        int rc = dc_obj_get(dc, txn, id, v, &h);
        if (rc == 0 && mdb_get(txn, dc->chunks, &k, &val) == 0 && val.mv_size == 8) {
            struct chunk_rec c;
            memcpy(&c, val.mv_data, sizeof c);
            h.held -= c.len;
            rc = dc_mdb_errno(mdb_del(txn, dc->chunks, &k, NULL));
            if (rc == 0)
                rc = obj_put(dc, txn, id, v, &h);
            if (rc == 0) {
                int committed = mdb_txn_commit(txn) == 0; /* frees txn either way */
                txn = NULL;
                if (committed) {
                    assert(dc->st.held_bytes >= c.len);
                    dc->st.held_bytes -= c.len;
                }
            }
        }
        if (txn)
            mdb_txn_abort(txn);
    }
    dc_cache_unlock(dc);
    log_warn("disk cache: chunk %u of %s (%s) failed its checksum: dropped, fetched again", index,
             v->path, v->etag);
}

/* The records of whichever of chunks [first, last] of id are listed (the
 * others' len left 0): 1 if version v has a record, 0 if not, -errno. */
static int lookup_held(struct diskcache *dc, const struct diskcache_version *v, uint64_t id,
                       uint32_t first, uint32_t last, struct chunk_rec *recs, uint64_t *last_use)
{
    MDB_txn *txn;
    int rc = mdb_txn_begin(dc->env, NULL, MDB_RDONLY, &txn);
    if (rc != 0)
        return dc_mdb_errno(rc);
    struct obj_head h;
    int found = dc_obj_get(dc, txn, id, v, &h) == 0;
    *last_use = found ? h.last_use : 0;
    for (uint32_t i = first; found && i <= last; i++) {
        unsigned char key[12];
        dc_chunk_key(key, id, i);
        MDB_val k = {sizeof key, key}, val;
        if (mdb_get(txn, dc->chunks, &k, &val) == 0 && val.mv_size == sizeof *recs)
            memcpy(&recs[i - first], val.mv_data, sizeof *recs);
    }
    mdb_txn_abort(txn);
    return found;
}

/* Note a hit's use in the lru order, at most every TOUCH_EVERY_NS per object. */
void dc_touch(struct diskcache *dc, const struct diskcache_version *v, uint64_t id,
              uint64_t last_use)
{
    uint64_t now = dc_now_ns();
    if (last_use + TOUCH_EVERY_NS > now)
        return;
    dc_cache_lock(dc);
    MDB_txn *txn;
    if (mdb_txn_begin(dc->env, NULL, 0, &txn) == 0) {
        struct obj_head h;
        int rc = dc_obj_get(dc, txn, id, v, &h);
        if (rc == 0 && h.last_use < now) {
            rc = lru_move(dc, txn, id, h.last_use, now);
            h.last_use = now;
            if (rc == 0)
                rc = obj_put(dc, txn, id, v, &h);
        }
        if (rc == 0)
            mdb_txn_commit(txn);
        else
            mdb_txn_abort(txn);
    }
    dc_cache_unlock(dc);
}

/* Copy the part of chunk i of the version (record c, data file fd) that falls
 * in [off, off + len) to buf (which holds that range), checked: 1, or 0 (not
 * held, or its bytes failed: then dropped). scratch: a chunk's room, or NULL. */
static int read_piece(struct diskcache *dc, const struct diskcache_version *v, uint64_t id, int fd,
                      uint32_t i, struct chunk_rec c, uint64_t off, size_t len, char *buf,
                      unsigned char **scratch)
{
    uint64_t base = (uint64_t)i * DISKCACHE_CHUNK;
    uint64_t want = v->size - base < DISKCACHE_CHUNK ? v->size - base : DISKCACHE_CHUNK;
    if (fd < 0 || c.len == 0 || c.len != want)
        return 0;
    uint64_t from = off > base ? off - base : 0;
    uint64_t to = off + len < base + c.len ? off + len - base : c.len;
    int whole = from == 0 && to == c.len; /* read in place, no copy */
    if (!whole && !*scratch && !(*scratch = malloc(DISKCACHE_CHUNK)))
        return 0;
    unsigned char *at = whole ? (unsigned char *)buf + (base - off) : *scratch;
    if (pread_exact(fd, at, c.len, base) != 0 || crc32c(0, at, c.len) != c.crc) {
        dc_drop_chunk(dc, v, id, i);
        return 0;
    }
    if (!whole)
        memcpy(buf + (base + from - off), *scratch + from, to - from);
    return 1;
}

int diskcache_read_held(struct diskcache *dc, const struct diskcache_version *v, uint64_t off,
                        size_t len, void *buf, size_t *lo, size_t *hi)
{
    char etag_buf[256];
    struct diskcache_version plain = dc_plain_version(v, etag_buf, sizeof etag_buf);
    v = &plain;
    *lo = 0;
    *hi = len;
    if (len == 0 || off + len > v->size)
        return len == 0;
    uint64_t id = dc_version_id(v), last_use = 0;
    uint32_t first = (uint32_t)(off / DISKCACHE_CHUNK);
    uint32_t last = (uint32_t)((off + len - 1) / DISKCACHE_CHUNK);
    struct chunk_rec *recs = calloc(last - first + 1, sizeof *recs);
    int rc = recs ? lookup_held(dc, v, id, first, last, recs, &last_use) : -ENOMEM;
    int fd = -1;
    if (rc == 1) {
        char path[4096];
        dc_data_path(dc, id, path, sizeof path);
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd >= 0 && last > first) /* the disk reads them all at once, not one by one */
            (void)posix_fadvise(fd, (off_t)first * DISKCACHE_CHUNK,
                                (off_t)(last - first + 1) * DISKCACHE_CHUNK, POSIX_FADV_WILLNEED);
    }
    unsigned char *scratch = NULL;
    size_t first_miss = len, miss_end = 0;
    for (uint32_t i = first; rc >= 0 && i <= last; i++) {
        uint64_t base = (uint64_t)i * DISKCACHE_CHUNK;
        size_t at = base > off ? (size_t)(base - off) : 0;
        size_t end =
            base + DISKCACHE_CHUNK - off < len ? (size_t)(base + DISKCACHE_CHUNK - off) : len;
        if (rc == 1 && read_piece(dc, v, id, fd, i, recs[i - first], off, len, buf, &scratch))
            continue;
        if (first_miss == len)
            first_miss = at;
        miss_end = end;
    }
    if (fd >= 0)
        close(fd);
    free(recs);
    free(scratch);
    if (rc < 0)
        return rc;
    *lo = first_miss == len ? len : first_miss;
    *hi = first_miss == len ? len : miss_end;
    int all = *lo == *hi;
    dc_cache_lock(dc);
    if (all) {
        dc->st.hits++;
        dc->st.hit_bytes += len;
    } else {
        dc->st.misses++; /* one per read, however many of its chunks were missing */
    }
    dc_cache_unlock(dc);
    if (all || *lo > 0 || *hi < len)
        dc_touch(dc, v, id, last_use);
    return all;
}

int diskcache_read(struct diskcache *dc, const struct diskcache_version *v, uint64_t off,
                   size_t len, void *buf)
{
    size_t lo, hi;
    return diskcache_read_held(dc, v, off, len, buf, &lo, &hi);
}

/* ---- the list of files held for reads in place (dcfile.c opens them) --- */

void dc_free_file(struct diskcache_file *f)
{
    if (f->map != MAP_FAILED)
        munmap(f->map, f->map_len);
    if (f->fd >= 0)
        close(f->fd);
    free(f->path);
    free(f->etag);
    free(f->recs);
    free((void *)f->state);
    pthread_cond_destroy(&f->checked);
    pthread_mutex_destroy(&f->lock);
    free(f);
}

/* Free every listed copy: all closed (at diskcache_close). */
static void free_files(struct diskcache *dc)
{
    while (dc->files) {
        struct diskcache_file *f = dc->files;
        assert(f->refs == 0);
        dc->files = f->next;
        dc_free_file(f);
    }
}

/* Take f off dc->files (files_lock held). */
static void unlist_file(struct diskcache *dc, struct diskcache_file *f)
{
    struct diskcache_file **pp = &dc->files;
    while (*pp != f)
        pp = &(*pp)->next;
    *pp = f->next;
    f->listed = 0;
    if (f->refs == 0)
        dc->idle_files--;
}

/* id's listed copy, if any, is out of date (its chunks changed, or it went):
 * the next open looks it up afresh; one in use is freed at its last close. */
static void forget_file(struct diskcache *dc, uint64_t id)
{
    pthread_mutex_lock(&dc->files_lock);
    struct diskcache_file *f = dc->files;
    while (f && f->id != id)
        f = f->next;
    if (f) {
        unlist_file(dc, f);
        if (f->refs == 0)
            dc_free_file(f);
    }
    pthread_mutex_unlock(&dc->files_lock);
}

/* The listed copy of version v (id), with one more reference, or NULL. */
struct diskcache_file *dc_find_file(struct diskcache *dc, uint64_t id,
                                    const struct diskcache_version *v)
{
    pthread_mutex_lock(&dc->files_lock);
    struct diskcache_file **pp = &dc->files, *f;
    while ((f = *pp) && !(f->id == id && f->size == v->size && strcmp(f->path, v->path) == 0 &&
                          strcmp(f->etag, v->etag) == 0))
        pp = &f->next;
    if (f) {
        if (f->refs++ == 0)
            dc->idle_files--;
        *pp = f->next; /* to the front: most recently used */
        f->next = dc->files;
        dc->files = f;
    }
    pthread_mutex_unlock(&dc->files_lock);
    return f;
}

/* Put f, just opened (one reference), on dc->files, most recently used. */
void dc_list_file(struct diskcache *dc, struct diskcache_file *f)
{
    pthread_mutex_lock(&dc->files_lock);
    f->next = dc->files;
    dc->files = f;
    f->listed = 1;
    pthread_mutex_unlock(&dc->files_lock);
}

void diskcache_file_close(struct diskcache_file *f)
{
    if (!f)
        return;
    struct diskcache *dc = f->dc;
    pthread_mutex_lock(&dc->files_lock);
    assert(f->refs > 0);
    struct diskcache_file *gone = NULL;
    if (--f->refs == 0) {
        if (!f->listed) {
            gone = f;
        } else if (++dc->idle_files > IDLE_FILES_MAX) { /* the least recently used idle one goes */
            struct diskcache_file *last = NULL;
            for (struct diskcache_file *g = dc->files; g; g = g->next)
                if (g->refs == 0)
                    last = g;
            unlist_file(dc, last);
            gone = last;
        }
    }
    pthread_mutex_unlock(&dc->files_lock);
    if (gone)
        dc_free_file(gone);
}
/* ---- puts ---------------------------------------------------------------- */

/* Record chunks [first, first + n) of id with their checksums (recs) in one
 * transaction; *added: the bytes not held before. Caller holds dc->lock. */
static int record_chunks(struct diskcache *dc, const struct diskcache_version *v, uint64_t id,
                         uint32_t first, const struct chunk_rec *recs, uint32_t n, uint64_t *added)
{
    assert_locked(dc);
    MDB_txn *txn;
    int rc = dc_mdb_errno(mdb_txn_begin(dc->env, NULL, 0, &txn));
    if (rc != 0)
        return rc;
    struct obj_head h = {0};
    rc = dc_obj_get(dc, txn, id, v, &h);
    int fresh = rc == -ENOENT;
    if (fresh) {
        h = (struct obj_head){.size = v->size};
        rc = 0;
    }
    *added = 0;
    for (uint32_t i = 0; rc == 0 && i < n; i++) {
        unsigned char key[12];
        dc_chunk_key(key, id, first + i);
        MDB_val k = {sizeof key, key}, val;
        if (mdb_get(txn, dc->chunks, &k, &val) == MDB_NOTFOUND)
            *added += recs[i].len;
        val = (MDB_val){sizeof recs[i], (void *)&recs[i]};
        rc = dc_mdb_errno(mdb_put(txn, dc->chunks, &k, &val, 0));
    }
    uint64_t now = dc_now_ns();
    if (rc == 0)
        rc = lru_move(dc, txn, id, fresh ? 0 : h.last_use, now);
    h.held += *added;
    h.last_use = now;
    if (rc == 0)
        rc = obj_put(dc, txn, id, v, &h);
    if (rc == 0)
        rc = dc_mdb_errno(mdb_txn_commit(txn));
    else
        mdb_txn_abort(txn);
    if (rc == 0) {
        dc->st.held_bytes += *added;
        dc->st.objects += fresh;
    }
    return rc;
}

/* Whether every piece is DISKCACHE_DIRECT_ALIGN-aligned, start and length. */
static int pieces_aligned(const struct iovec *pieces, int n)
{
    for (int i = 0; i < n; i++)
        if ((uintptr_t)pieces[i].iov_base % DISKCACHE_DIRECT_ALIGN ||
            pieces[i].iov_len % DISKCACHE_DIRECT_ALIGN)
            return 0;
    return 1;
}

/* Write pieces[0 .. n) end to end at off of id's data file (created if new):
 * 0 or -errno. Aligned pieces go with O_DIRECT: a fill's bytes skip the page
 * cache (they are not read again until a restart, whose page cache is cold
 * anyway), so they neither crowd out the job's pages nor pile up as dirty
 * pages that throttle the job's own writes; and a buffered write's copy into
 * fresh page-cache pages was the writer's whole cost (on a 2-core VM 136-409
 * MB/s buffered vs 2.3 GB/s direct: most of a 1 GiB load's chunks were
 * dropped from its full queue). A file system without O_DIRECT (or with
 * stricter alignment rules) gets a buffered write. */
static int write_data(struct diskcache *dc, uint64_t id, uint64_t off, const struct iovec *pieces,
                      int n, size_t len)
{
    char path[4096];
    dc_data_path(dc, id, path, sizeof path);
    int direct = !atomic_load(&dc->no_direct) && off % DISKCACHE_DIRECT_ALIGN == 0 &&
                 pieces_aligned(pieces, n);
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC | (direct ? O_DIRECT : 0), 0600);
    if (fd < 0 && direct && errno == EINVAL) { /* no O_DIRECT here */
        atomic_store(&dc->no_direct, 1);
        return write_data(dc, id, off, pieces, n, len);
    }
    if (fd < 0)
        return -errno;
    ssize_t w = pwritev(fd, pieces, n, (off_t)off);
    if (w < 0 && direct && errno == EINVAL) { /* alignment rules stricter than ours */
        atomic_store(&dc->no_direct, 1);
        close(fd);
        return write_data(dc, id, off, pieces, n, len);
    }
    int rc = w == (ssize_t)len ? 0 : w < 0 ? -errno : -ENOSPC;
    close(fd);
    return rc;
}

/* CRC-32C of bytes [at, at + len) of pieces[0 .. n) laid end to end. */
static uint32_t pieces_crc(const struct iovec *pieces, int n, size_t at, size_t len)
{
    uint32_t crc = 0;
    for (int i = 0; i < n && len > 0; i++) {
        if (at >= pieces[i].iov_len) {
            at -= pieces[i].iov_len;
            continue;
        }
        size_t take = pieces[i].iov_len - at < len ? pieces[i].iov_len - at : len;
        crc = crc32c(crc, (const char *)pieces[i].iov_base + at, take);
        len -= take;
        at = 0;
    }
    return crc;
}

int diskcache_put(struct diskcache *dc, const struct diskcache_version *v, uint64_t off,
                  const void *buf, size_t len)
{
    struct iovec one = {.iov_base = (void *)buf, .iov_len = len};
    return diskcache_put_pieces(dc, v, off, &one, 1);
}

int diskcache_put_pieces(struct diskcache *dc, const struct diskcache_version *v, uint64_t off,
                         const struct iovec *pieces, int npieces)
{
    size_t len = 0;
    for (int i = 0; i < npieces; i++)
        len += pieces[i].iov_len;
    char etag_buf[256];
    struct diskcache_version plain = dc_plain_version(v, etag_buf, sizeof etag_buf);
    v = &plain;
    if (len == 0 || off % DISKCACHE_CHUNK != 0 || off + len > v->size ||
        (len % DISKCACHE_CHUNK != 0 && off + len != v->size))
        return -EINVAL;
    uint64_t id = dc_version_id(v);
    uint32_t first = (uint32_t)(off / DISKCACHE_CHUNK);
    uint32_t n = (uint32_t)((len + DISKCACHE_CHUNK - 1) / DISKCACHE_CHUNK);
    struct chunk_rec *recs = calloc(n, sizeof *recs);
    if (!recs)
        return -ENOMEM;
    for (uint32_t i = 0; i < n; i++) {
        size_t at = (size_t)i * DISKCACHE_CHUNK;
        recs[i].len = (uint32_t)(len - at < DISKCACHE_CHUNK ? len - at : DISKCACHE_CHUNK);
        recs[i].crc = pieces_crc(pieces, npieces, at, recs[i].len);
    }
    dc_cache_lock(dc);
    int rc = make_room(dc, len, id);
    if (rc == 0)
        rc = write_data(dc, id, off, pieces, npieces, len);
    uint64_t added = 0;
    if (rc == 0) /* the bytes are written: now they may be listed */
        rc = record_chunks(dc, v, id, first, recs, n, &added);
    if (rc == 0) {
        forget_file(dc, id); /* the next open sees the new chunks */
        dc->st.stored_chunks += n;
        dc->st.stored_bytes += len;
    } else {
        note_put_failure(dc, v, rc);
    }
    dc_cache_unlock(dc);
    free(recs);
    return rc;
}

/* ---- whole files --------------------------------------------------------- */

/* Copy src to dst (created): 0 or -errno (dst removed). */
static int copy_file(const char *src, const char *dst)
{
    int in = open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0)
        return -errno;
    int out = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    int rc = out < 0 ? -errno : 0;
    char *buf = rc == 0 ? malloc(DISKCACHE_CHUNK) : NULL;
    if (rc == 0 && !buf)
        rc = -ENOMEM;
    for (uint64_t off = 0; rc == 0;) {
        size_t got = 0;
        rc = pread_full(in, buf, DISKCACHE_CHUNK, off, &got);
        if (rc != 0 || got == 0)
            break;
        if (pwrite(out, buf, got, (off_t)off) != (ssize_t)got)
            rc = errno ? -errno : -ENOSPC;
        off += got;
    }
    free(buf);
    close(in);
    if (out >= 0)
        close(out);
    if (rc != 0)
        unlink(dst);
    return rc;
}

/* The checksums of every chunk of the file at path, which holds size bytes. */
static int checksum_file(const char *path, uint64_t size, struct chunk_rec *recs)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    unsigned char *buf = malloc(DISKCACHE_CHUNK);
    int rc = buf ? 0 : -ENOMEM;
    for (uint64_t off = 0, i = 0; rc == 0 && off < size; off += DISKCACHE_CHUNK, i++) {
        uint32_t n = (uint32_t)(size - off < DISKCACHE_CHUNK ? size - off : DISKCACHE_CHUNK);
        rc = pread_exact(fd, buf, n, off);
        recs[i] = (struct chunk_rec){crc32c(0, buf, n), n};
    }
    free(buf);
    close(fd);
    return rc;
}

int diskcache_adopt(struct diskcache *dc, const struct diskcache_version *v, const char *src)
{
    char etag_buf[256];
    struct diskcache_version plain = dc_plain_version(v, etag_buf, sizeof etag_buf);
    v = &plain;
    struct stat st;
    if (stat(src, &st) != 0)
        return -errno;
    if ((uint64_t)st.st_size != v->size || v->size == 0)
        return -EINVAL;
    uint64_t id = dc_version_id(v);
    uint32_t n = (uint32_t)((v->size + DISKCACHE_CHUNK - 1) / DISKCACHE_CHUNK);
    struct chunk_rec *recs = calloc(n, sizeof *recs);
    if (!recs)
        return -ENOMEM;
    int rc = checksum_file(src, v->size, recs);
    char path[4096];
    dc_data_path(dc, id, path, sizeof path);
    dc_cache_lock(dc);
    if (rc == 0)
        rc = make_room(dc, v->size, id);
    int moved = 0, copied = 0;
    if (rc == 0) {
        uint64_t held = 0;
        MDB_txn *txn; /* an older copy of the same version goes first */
        if (mdb_txn_begin(dc->env, NULL, 0, &txn) == 0) {
            if (obj_delete(dc, txn, id, &held) != 0)
                mdb_txn_abort(txn);
            else if (mdb_txn_commit(txn) == 0) /* frees txn either way */
                forget_object(dc, held);
        }
        if (rename(src, path) == 0)
            moved = 1;
        else if (errno == EXDEV && (rc = copy_file(src, path)) == 0)
            copied = 1;
        else if (rc == 0)
            rc = -errno;
    }
    uint64_t added = 0;
    if (rc == 0)
        rc = record_chunks(dc, v, id, 0, recs, n, &added);
    if (rc == 0) {
        forget_file(dc, id);
        dc->st.adopted_files++;
        dc->st.adopted_bytes += v->size;
        if (copied)
            unlink(src);
    } else {
        if (moved && rename(path, src) != 0)
            unlink(path);
        if (copied)
            unlink(path);
        note_put_failure(dc, v, rc);
    }
    dc_cache_unlock(dc);
    free(recs);
    return rc;
}

int diskcache_drop(struct diskcache *dc, const struct diskcache_version *v)
{
    char etag_buf[256];
    struct diskcache_version plain = dc_plain_version(v, etag_buf, sizeof etag_buf);
    v = &plain;
    uint64_t id = dc_version_id(v), held = 0;
    dc_cache_lock(dc);
    MDB_txn *txn;
    int rc = dc_mdb_errno(mdb_txn_begin(dc->env, NULL, 0, &txn));
    if (rc == 0) {
        struct obj_head h;
        rc = dc_obj_get(dc, txn, id, v, &h);
        if (rc == 0)
            rc = obj_delete(dc, txn, id, &held);
        if (rc == 0)
            rc = dc_mdb_errno(mdb_txn_commit(txn));
        else
            mdb_txn_abort(txn);
    }
    if (rc == 0) {
        char path[4096];
        dc_data_path(dc, id, path, sizeof path);
        unlink(path);
        forget_file(dc, id);
        forget_object(dc, held);
    }
    dc_cache_unlock(dc);
    return rc == -ENOENT || rc == -EEXIST ? 0 : rc;
}

void diskcache_get_stats(struct diskcache *dc, struct diskcache_stats *out)
{
    dc_cache_lock(dc);
    *out = dc->st;
    dc_cache_unlock(dc);
    out->checked_chunks = atomic_load(&dc->checked_chunks);
}
