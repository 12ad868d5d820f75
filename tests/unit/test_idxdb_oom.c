/*
 * tests/unit/test_idxdb_oom.c - index/idxdb.c when memory runs out: a failed
 * allocation while a checkpoint record is encoded returns -ENOMEM and frees
 * what it had allocated. realloc and free of the code under test are wrapped
 * (-Wl,--wrap, see CMakeLists.txt) to fail on demand and to track blocks.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "idxdb.h"

void *__real_realloc(void *p, size_t n);
void __real_free(void *p);

/* While armed: fresh blocks from realloc(NULL, n) are recorded, growing an
 * existing block fails, and free() forgets recorded blocks. */
static int armed;
static void *live[64];
static int nlive;

void *__wrap_realloc(void *p, size_t n)
{
    if (armed && p)
        return NULL;
    void *q = __real_realloc(p, n);
    if (armed && q && nlive < 64)
        live[nlive++] = q;
    return q;
}

void __wrap_free(void *p)
{
    for (int i = 0; p && i < nlive; i++)
        if (live[i] == p) {
            live[i] = live[--nlive];
            break;
        }
    __real_free(p);
}

Test(idxdb_oom, failed_growth_of_the_record_frees_it)
{
    char dir[] = "/tmp/ckptfs-idxdb-oom-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char envdir[64];
    snprintf(envdir, sizeof envdir, "%s/index", dir);
    struct idxdb_options o;
    idxdb_options_default(&o);
    struct idxdb *db;
    struct ckpt_err err;
    cr_assert_eq(idxdb_open(envdir, &o, &db, &err), 0, "%s", err.msg);
    struct ckpt *c = ckpt_new(CKPT_FORMAT_DCP, 0);
    cr_assert_eq(ckpt_finish(c, &err), 0, "%s", err.msg);

    /* A fingerprint longer than the record's first buffer (256 bytes), so
     * encoding the record must grow it: that growth fails. */
    char fp[IDXDB_FP_MAX + 1];
    memset(fp, 'f', IDXDB_FP_MAX);
    fp[IDXDB_FP_MAX] = '\0';
    uint64_t id = 0;
    armed = 1;
    int rc = idxdb_put(db, "/ckpt", fp, c, &id, &err);
    armed = 0;
    cr_assert_eq(rc, -ENOMEM, "idxdb_put: %d (%s)", rc, err.msg);
    cr_assert_eq(nlive, 0, "%d block(s) allocated by idxdb_put not freed", nlive);

    /* Nothing was written, and the next put works. */
    cr_assert_eq(idxdb_put(db, "/ckpt", "etag=1", c, &id, &err), 0, "%s", err.msg);
    ckpt_free(c);
    idxdb_close(db);
    char p[128];
    snprintf(p, sizeof p, "%s/data.mdb", envdir);
    unlink(p);
    snprintf(p, sizeof p, "%s/lock.mdb", envdir);
    unlink(p);
    rmdir(envdir);
    rmdir(dir);
}
