/* tests/unit/test_bufpool.c - the I/O buffer pool: sizes in whole units,
 * reuse by size, the bound on spare bytes, oversized buffers never pooled,
 * concurrent use. */
#include "bufpool.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#define UNIT (64u * 1024)

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
    char *b = bufpool_get(p, UNIT); /* other size: a fresh mapping */
    cr_assert_neq(b, a);
    char *c = bufpool_get(p, 2 * UNIT + 1); /* three units again: a comes back */
    cr_assert_eq(c, a);
    struct bufpool_stats st;
    bufpool_get_stats(p, &st);
    cr_assert_eq(st.maps, 2);
    cr_assert_eq(st.reuses, 1);
    cr_assert_eq(st.spare_bytes, 0);
    bufpool_put(p, b, UNIT);
    bufpool_put(p, c, 2 * UNIT + 1);
    bufpool_get_stats(p, &st);
    cr_assert_eq(st.spare_bytes, 4 * UNIT);
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
