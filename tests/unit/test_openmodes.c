/*
 * tests/unit/test_openmodes.c - the table of open paths and their read mode
 * (fs/fuse/openmodes.c): one decision per set of overlapping opens, who may
 * join a passthrough set, renames and unlinks.
 */
#include "openmodes.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

static atomic_int decisions;
static int next_id = 7;
static atomic_int closed_id;

static int decide_id(void *arg)
{
    (void)arg;
    atomic_fetch_add(&decisions, 1);
    usleep(20000); /* a check that reads the file: others arrive meanwhile */
    return next_id;
}

static void note_close(int id)
{
    atomic_store(&closed_id, id);
}

static const int version_a = 1, version_b = 2;

static struct openmode_want reader(const void *version)
{
    return (struct openmode_want){
        .version = version, .size = 100, .decide = decide_id, .close_backing = note_close};
}

/* An open that writes: never in passthrough. */
static struct openmode_want writer(void)
{
    return (struct openmode_want){.decide = decide_id, .close_backing = note_close};
}

static void *open_a(void *arg)
{
    struct openmode **out = arg;
    struct openmode_want w = reader(&version_a);
    int id = -1;
    cr_assert_eq(openmodes_open("/t/a", &w, out, &id), 0);
    cr_assert_eq(id, 7);
    return NULL;
}

Test(openmodes, overlapping_opens_decide_once_and_share_the_backing_id)
{
    atomic_store(&decisions, 0);
    pthread_t t[8];
    struct openmode *m[8];
    for (int i = 0; i < 8; i++)
        pthread_create(&t[i], NULL, open_a, &m[i]);
    for (int i = 0; i < 8; i++)
        pthread_join(t[i], NULL);
    cr_assert_eq(atomic_load(&decisions), 1);
    atomic_store(&closed_id, 0);
    for (int i = 0; i < 7; i++)
        openmodes_close(m[i], note_close);
    cr_assert_eq(atomic_load(&closed_id), 0, "closed while a handle is open");
    openmodes_close(m[7], note_close);
    cr_assert_eq(atomic_load(&closed_id), 7);
}

Test(openmodes, writers_and_other_versions_cannot_join_passthrough)
{
    struct openmode *m, *other;
    int id;
    struct openmode_want w = reader(&version_a);
    cr_assert_eq(openmodes_open("/t/w", &w, &m, &id), 0);
    cr_assert_eq(id, 7);
    struct openmode_want w_writer = writer();
    cr_assert_eq(openmodes_open("/t/w", &w_writer, &other, &id), -ETXTBSY);
    struct openmode_want newer = reader(&version_b);
    cr_assert_eq(openmodes_open("/t/w", &newer, &other, &id), -ETXTBSY);
    openmodes_close(m, note_close);
    cr_assert_eq(openmodes_open("/t/w", &w_writer, &other, &id), 0);
    cr_assert_eq(id, 0);
    openmodes_close(other, note_close);
}

Test(openmodes, a_set_read_through_the_daemon_keeps_later_opens_out_of_passthrough)
{
    struct openmode *m, *later;
    int id;
    struct openmode_want w_writer = writer();
    cr_assert_eq(openmodes_open("/t/c", &w_writer, &m, &id), 0);
    atomic_store(&decisions, 0);
    struct openmode_want w = reader(&version_a);
    cr_assert_eq(openmodes_open("/t/c", &w, &later, &id), 0);
    cr_assert_eq(id, 0);
    cr_assert_eq(atomic_load(&decisions), 0);
    openmodes_close(m, note_close);
    openmodes_close(later, note_close);
}

Test(openmodes, renamed_set_takes_opens_of_its_new_name_of_the_same_size)
{
    struct openmode *m, *joined, *bad;
    int id;
    struct openmode_want w = reader(&version_a);
    cr_assert_eq(openmodes_open("/t/dir/r", &w, &m, &id), 0);
    openmodes_rename("/t/dir", "/t/dir2");
    struct openmode_want renamed = reader(&version_b); /* the new path's own version */
    cr_assert_eq(openmodes_open("/t/dir2/r", &renamed, &joined, &id), 0);
    cr_assert_eq(id, 7);
    renamed.size = 99;
    cr_assert_eq(openmodes_open("/t/dir2/r", &renamed, &bad, &id), -ETXTBSY);
    openmodes_close(joined, note_close);
    openmodes_close(m, note_close);
}

Test(openmodes, forgotten_path_decides_afresh)
{
    struct openmode *m, *fresh;
    int id;
    struct openmode_want w = reader(&version_a);
    cr_assert_eq(openmodes_open("/t/u", &w, &m, &id), 0);
    openmodes_forget("/t/u"); /* unlinked: a new file of that name is another inode */
    struct openmode_want w_writer = writer();
    cr_assert_eq(openmodes_open("/t/u", &w_writer, &fresh, &id), 0);
    cr_assert_eq(id, 0);
    atomic_store(&closed_id, 0);
    openmodes_close(m, note_close);
    cr_assert_eq(atomic_load(&closed_id), 7);
    openmodes_close(fresh, note_close);
}

Test(openmodes, clear_frees_entries_of_handles_never_closed)
{
    struct openmode *listed, *gone;
    int id;
    struct openmode_want w = reader(&version_a);
    cr_assert_eq(openmodes_open("/t/left-open", &w, &listed, &id), 0);
    cr_assert_eq(openmodes_open("/t/left-unlinked", &w, &gone, &id), 0);
    openmodes_forget("/t/left-unlinked");
    openmodes_clear(); /* the unmount */
    struct openmode *fresh;
    struct openmode_want w_writer = writer();
    cr_assert_eq(openmodes_open("/t/left-open", &w_writer, &fresh, &id), 0);
    cr_assert_eq(id, 0, "the cleared set is gone: a fresh decision");
    openmodes_close(fresh, note_close);
}

/* Opens one reader of /t/race and closes it at once. */
static void *open_and_close(void *arg)
{
    (void)arg;
    struct openmode *m;
    int id;
    struct openmode_want w = reader(&version_a);
    cr_assert_eq(openmodes_open("/t/race", &w, &m, &id), 0);
    openmodes_close(m, note_close);
    return NULL;
}

Test(openmodes, an_open_waiting_for_a_decision_outlives_the_deciders_close)
{
    /* The decider's handle may close (its RELEASE) before an open that waited for the
     * decision wakes up: the waiter must still find the set (it once read freed memory
     * and was refused with ETXTBSY). */
    for (int round = 0; round < 50; round++) {
        atomic_store(&decisions, 0);
        atomic_store(&closed_id, 0);
        pthread_t t;
        pthread_create(&t, NULL, open_and_close, NULL);
        while (atomic_load(&decisions) == 0)
            usleep(100); /* the decider is deciding: this open waits for it */
        struct openmode *m;
        int id = -1;
        struct openmode_want w = reader(&version_a);
        cr_assert_eq(openmodes_open("/t/race", &w, &m, &id), 0, "round %d", round);
        cr_assert_eq(id, 7, "round %d", round);
        pthread_join(t, NULL);
        cr_assert_eq(atomic_load(&decisions), 1, "round %d", round);
        openmodes_close(m, note_close);
        cr_assert_eq(atomic_load(&closed_id), 7, "round %d: the last close", round);
    }
}
