/* tests/unit/test_journal.c - the crash journal: record encoding round
 * trips, refusal of damaged records, sequence ordering, ids, and records
 * surviving a close and reopen. */
#include "journal.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[] = "/tmp/ckptfs-test-journal-XXXXXX";
static struct journal *j;

static void setup(void)
{
    cr_assert_not_null(mkdtemp(dir));
    char err[256];
    cr_assert_eq(journal_open(dir, &j, err, sizeof err), 0, "%s", err);
}

static void teardown(void)
{
    journal_close(j);
    char p[512];
    snprintf(p, sizeof p, "%s/data.mdb", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/lock.mdb", dir);
    unlink(p);
    rmdir(dir);
}

TestSuite(journal, .init = setup, .fini = teardown);

static struct journal_part sample_parts[3] = {
    {1, 0, 8 << 20, "\"etag-1\""},
    {2, 8 << 20, 8 << 20, "\"etag-2\""},
    {3, 16 << 20, 123, "\"etag-3\""},
};

static struct journal_rec sample(uint64_t id, uint64_t seq)
{
    return (struct journal_rec){.id = id,
                                .seq = seq,
                                .flags = JOURNAL_SEALED | JOURNAL_DURABLE,
                                .size = (16 << 20) + 123,
                                .boot_id = "boot-1",
                                .store = "s3://bkt/prefix",
                                .path = "run/step_1/__0_0.distcp",
                                .upload_key = "prefix/run/step_1/__0_0.distcp",
                                .upload_id = "upload-xyz",
                                .nparts = 3,
                                .parts = sample_parts};
}

static void assert_same(const struct journal_rec *a, const struct journal_rec *b)
{
    cr_assert_eq(a->id, b->id);
    cr_assert_eq(a->seq, b->seq);
    cr_assert_eq(a->flags, b->flags);
    cr_assert_eq(a->size, b->size);
    cr_assert_str_eq(a->boot_id, b->boot_id);
    cr_assert_str_eq(a->store, b->store);
    cr_assert_str_eq(a->path, b->path);
    cr_assert_str_eq(a->upload_key, b->upload_key);
    cr_assert_str_eq(a->upload_id, b->upload_id);
    cr_assert_eq(a->nparts, b->nparts);
    for (uint32_t i = 0; i < a->nparts; i++) {
        cr_assert_eq(a->parts[i].number, b->parts[i].number);
        cr_assert_eq(a->parts[i].offset, b->parts[i].offset);
        cr_assert_eq(a->parts[i].length, b->parts[i].length);
        cr_assert_str_eq(a->parts[i].etag, b->parts[i].etag);
    }
}

Test(journal, encode_decode_round_trip)
{
    struct journal_rec r = sample(7, 3), d;
    size_t n = journal_encoded_size(&r);
    unsigned char *buf = malloc(n);
    cr_assert_eq(journal_encode(&r, buf, n), n);
    cr_assert_eq(journal_encode(&r, buf, n - 1), 0); /* refuses a short buffer */
    struct journal_part parts[8];
    char *scratch = malloc(n + 64);
    cr_assert_eq(journal_decode(buf, n, &d, parts, 8, scratch, n + 64), 0);
    assert_same(&r, &d);
    free(scratch);
    free(buf);
}

Test(journal, decode_refuses_damage)
{
    struct journal_rec r = sample(7, 3), d;
    size_t n = journal_encoded_size(&r);
    unsigned char *buf = malloc(n), *bad = malloc(n + 8);
    journal_encode(&r, buf, n);
    struct journal_part parts[8];
    char *scratch = malloc(n + 72);
    for (size_t cut = 0; cut < n; cut++) /* every truncation */
        cr_assert_eq(journal_decode(buf, cut, &d, parts, 8, scratch, n + 72), -EINVAL, "cut %zu",
                     cut);
    memcpy(bad, buf, n); /* trailing garbage */
    bad[n] = 1;
    cr_assert_eq(journal_decode(bad, n + 1, &d, parts, 8, scratch, n + 72), -EINVAL);
    memcpy(bad, buf, n); /* unknown format */
    bad[0] = 99;
    cr_assert_eq(journal_decode(bad, n, &d, parts, 8, scratch, n + 72), -EINVAL);
    memcpy(bad, buf, n); /* a string length far beyond the record */
    bad[32] = 0xff;
    bad[33] = 0xff;
    cr_assert_eq(journal_decode(bad, n, &d, parts, 8, scratch, n + 72), -EINVAL);
    memcpy(bad, buf, n); /* more parts than the caller has room for */
    cr_assert_eq(journal_decode(bad, n, &d, parts, 2, scratch, n + 72), -EINVAL);
    memcpy(bad, buf, n); /* reserved bytes set (found by fuzzing: would not round-trip) */
    bad[2] = 0x3f;
    cr_assert_eq(journal_decode(bad, n, &d, parts, 8, scratch, n + 72), -EINVAL);
    memcpy(bad, buf, n); /* a NUL inside a part's ETag (found by fuzzing, likewise) */
    bad[n - 2] = 0;
    cr_assert_eq(journal_decode(bad, n, &d, parts, 8, scratch, n + 72), -EINVAL);
    memcpy(bad, buf, n); /* a huge part count: refused before anything is read */
    bad[28] = bad[29] = bad[30] = 0xff;
    cr_assert_eq(journal_decode(bad, n, &d, parts, 8, scratch, n + 72), -EINVAL);
    free(scratch);
    free(bad);
    free(buf);
}

struct collected {
    int n;
    struct journal_rec last;
    char path[256];
    uint64_t seq, id;
    uint32_t nparts;
};

static int collect(void *arg, const struct journal_rec *r)
{
    struct collected *c = arg;
    c->n++;
    c->seq = r->seq;
    c->id = r->id;
    c->nparts = r->nparts;
    snprintf(c->path, sizeof c->path, "%s", r->path);
    return 0;
}

Test(journal, newer_sequence_wins_and_survives_reopen)
{
    struct journal_rec r = sample(42, 5);
    cr_assert_eq(journal_put(j, &r), 0);
    struct journal_rec older = sample(42, 4);
    older.path = "older/name";
    cr_assert_eq(journal_put(j, &older), 0); /* ignored: seq 4 < 5 */
    struct journal_rec newer = sample(42, 6);
    newer.path = "newer/name";
    newer.nparts = 1;
    cr_assert_eq(journal_put(j, &newer), 0);
    cr_assert_eq(journal_sync(j), 0);
    journal_close(j);
    char err[256];
    cr_assert_eq(journal_open(dir, &j, err, sizeof err), 0, "%s", err);
    struct collected c = {0};
    cr_assert_eq(journal_foreach(j, collect, NULL, &c), 0);
    cr_assert_eq(c.n, 1);
    cr_assert_eq(c.id, 42);
    cr_assert_eq(c.seq, 6);
    cr_assert_eq(c.nparts, 1);
    cr_assert_str_eq(c.path, "newer/name");
    cr_assert_eq(journal_del(j, 42), 0);
    cr_assert_eq(journal_del(j, 42), 0); /* absent: fine */
    struct collected none = {0};
    cr_assert_eq(journal_foreach(j, collect, NULL, &none), 0);
    cr_assert_eq(none.n, 0);
}

Test(journal, ids_are_unique_across_reopen)
{
    uint64_t a, b, c;
    cr_assert_eq(journal_new_id(j, &a), 0);
    cr_assert_eq(journal_new_id(j, &b), 0);
    cr_assert_neq(a, b);
    journal_close(j);
    char err[256];
    cr_assert_eq(journal_open(dir, &j, err, sizeof err), 0, "%s", err);
    cr_assert_eq(journal_new_id(j, &c), 0);
    cr_assert(c != a && c != b);
}
