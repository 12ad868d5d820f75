/* tests/unit/test_bufpool.c - the I/O buffer pool: sizes in whole units,
 * reuse by size, smaller requests cut from larger spares, the bound on
 * spare bytes (small spares make way for a larger buffer), oversized
 * buffers never pooled, concurrent use. */
#include "bufpool.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#define UNIT (64u * 1024)

/* The pool's counters are maps, reuses, splits and spare units. */
static void expect_pool(struct bufpool *p, uint64_t maps, uint64_t reuses, uint64_t splits,
                        uint64_t spare_units)
{
    struct bufpool_stats st;
    bufpool_get_stats(p, &st);
    cr_assert_eq(st.maps, maps);
    cr_assert_eq(st.reuses, reuses);
    cr_assert_eq(st.splits, splits);
    cr_assert_eq(st.spare_bytes, spare_units * UNIT);
}

Test(bufpool, rejects_bad_units)
{
    struct bufpool *p;
    cr_assert_eq(bufpool_create(0, 4, UNIT, &p), -EINVAL);
    cr_assert_eq(bufpool_create(UNIT + 1, 4, UNIT, &p), -EINVAL);
    cr_assert_eq(bufpool_create(UNIT, 0, UNIT, &p), -EINVAL);
}

Test(bufpool, reuses_by_size_and_writes_whole_units)
{
    struct bufpool *p;
    cr_assert_eq(bufpool_create(UNIT, 4, 8 * UNIT, &p), 0);
    char *a = bufpool_get(p, 3 * UNIT - 10); /* three units */
    cr_assert_not_null(a);
    cr_assert_eq((uintptr_t)a % (uintptr_t)sysconf(_SC_PAGESIZE), 0);
    memset(a, 0xab, 3 * UNIT);
    bufpool_put(p, a, 3 * UNIT - 10);
    char *b = bufpool_get(p, 4 * UNIT); /* larger than any spare: a fresh mapping */
    cr_assert_neq(b, a);
    char *c = bufpool_get(p, 2 * UNIT + 1); /* three units again: a comes back */
    cr_assert_eq(c, a);
    expect_pool(p, 2, 1, 0, 0);
    bufpool_put(p, b, 4 * UNIT);
    bufpool_put(p, c, 2 * UNIT + 1);
    expect_pool(p, 2, 1, 0, 7);
    bufpool_destroy(p);
}

Test(bufpool, a_smaller_request_is_cut_from_a_larger_spare)
{
    /* Fetch sizes vary (items, readahead windows): a freed 4-unit buffer
     * serves a 1-unit and then a 3-unit request without new mappings. */
    struct bufpool *p;
    cr_assert_eq(bufpool_create(UNIT, 4, 8 * UNIT, &p), 0);
    char *a = bufpool_get(p, 4 * UNIT);
    memset(a, 0x5a, 4 * UNIT);
    bufpool_put(p, a, 4 * UNIT);
    char *one = bufpool_get(p, UNIT);
    cr_assert_eq(one, a, "the front of the spare");
    char *three = bufpool_get(p, 3 * UNIT);
    cr_assert_eq(three, a + UNIT, "the rest of it");
    memset(three, 1, 3 * UNIT); /* mapped and writable */
    expect_pool(p, 1, 2, 1, 0);
    /* The pieces go back (and are unmapped at destroy) one by one. */
    bufpool_put(p, one, UNIT);
    bufpool_put(p, three, 3 * UNIT);
    expect_pool(p, 1, 2, 1, 4);
    cr_assert_eq(bufpool_get(p, 2 * UNIT), three, "the smallest spare that fits");
    bufpool_put(p, three, 2 * UNIT);
    bufpool_destroy(p);
}

Test(bufpool, a_full_pool_unmaps_small_spares_to_keep_a_larger_buffer)
{
    struct bufpool *p;
    cr_assert_eq(bufpool_create(UNIT, 4, 4 * UNIT, &p), 0);
    void *s1 = bufpool_get(p, UNIT), *s2 = bufpool_get(p, UNIT), *big = bufpool_get(p, 3 * UNIT);
    bufpool_put(p, s1, UNIT);
    bufpool_put(p, s2, UNIT);
    bufpool_put(p, big, 3 * UNIT); /* 5 units would be spare: one small one goes */
    struct bufpool_stats st;
    bufpool_get_stats(p, &st);
    cr_assert_eq(st.spare_bytes, 4 * UNIT);
    cr_assert_eq(st.unmaps, 1);
    cr_assert_eq(bufpool_get(p, 3 * UNIT), big, "the larger buffer was kept");
    void *big2 = bufpool_get(p, 4 * UNIT);
    bufpool_put(p, big, 3 * UNIT);
    bufpool_put(p, big2, 4 * UNIT); /* the 1- and 3-unit spares make way */
    bufpool_get_stats(p, &st);
    cr_assert_eq(st.unmaps, 3);
    cr_assert_eq(st.spare_bytes, 4 * UNIT);
    void *two = bufpool_get(p, 2 * UNIT); /* cut from big2: 2 units stay spare */
    cr_assert_eq(two, big2);
    void *other = bufpool_get(p, 3 * UNIT);
    bufpool_put(p, other, 3 * UNIT); /* the 2-unit rest makes way */
    bufpool_get_stats(p, &st);
    cr_assert_eq(st.unmaps, 4);
    cr_assert_eq(st.spare_bytes, 3 * UNIT);
    bufpool_put(p, two, 2 * UNIT); /* no smaller spare to drop: this one goes */
    bufpool_get_stats(p, &st);
    cr_assert_eq(st.unmaps, 5);
    cr_assert_eq(st.spare_bytes, 3 * UNIT);
    cr_assert_eq(bufpool_get(p, 3 * UNIT), other);
    bufpool_put(p, other, 3 * UNIT);
    bufpool_destroy(p);
}

Test(bufpool, keeps_at_most_spare_max)
{
    struct bufpool *p;
    cr_assert_eq(bufpool_create(UNIT, 4, 5 * UNIT, &p), 0);
    void *a = bufpool_get(p, 4 * UNIT), *b = bufpool_get(p, 4 * UNIT);
    bufpool_put(p, a, 4 * UNIT);
    bufpool_put(p, b, 4 * UNIT); /* would make 8 units spare: unmapped */
    struct bufpool_stats st;
    bufpool_get_stats(p, &st);
    cr_assert_eq(st.spare_bytes, 4 * UNIT);
    cr_assert_eq(st.unmaps, 1);
    bufpool_destroy(p);
}

Test(bufpool, oversized_buffers_are_not_pooled)
{
    struct bufpool *p;
    cr_assert_eq(bufpool_create(UNIT, 2, 64 * UNIT, &p), 0);
    char *a = bufpool_get(p, 5 * UNIT);
    cr_assert_not_null(a);
    a[5 * UNIT - 1] = 1;
    bufpool_put(p, a, 5 * UNIT);
    struct bufpool_stats st;
    bufpool_get_stats(p, &st);
    cr_assert_eq(st.spare_bytes, 0);
    cr_assert_eq(st.unmaps, 1);
    bufpool_destroy(p);
}

static struct bufpool *shared_pool;

static void *churn(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    for (int i = 0; i < 2000; i++) {
        size_t len = (size_t)(rand_r(&seed) % (4 * UNIT)) + 1;
        unsigned char *b = bufpool_get(shared_pool, len);
        cr_assert_not_null(b);
        memset(b, (int)seed, len);
        cr_assert_eq(b[len - 1], (unsigned char)seed);
        bufpool_put(shared_pool, b, len);
    }
    return NULL;
}

Test(bufpool, concurrent_get_put)
{
    /* At most 4 buffers of each of the 4 sizes exist at once (40 units), so
     * with room for 64 spare units nothing is unmapped and at most 16 are mapped. */
    cr_assert_eq(bufpool_create(UNIT, 4, 64 * UNIT, &shared_pool), 0);
    pthread_t t[4];
    for (uintptr_t i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, churn, (void *)(i + 1));
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    struct bufpool_stats st;
    bufpool_get_stats(shared_pool, &st);
    cr_assert_leq(st.maps, 16);
    cr_assert_eq(st.maps + st.reuses, 8000);
    cr_assert_eq(st.unmaps, 0);
    bufpool_destroy(shared_pool);
}
