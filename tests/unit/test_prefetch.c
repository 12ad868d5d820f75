/* tests/unit/test_prefetch.c - the item prefetch rule (fs/read/prefetch.c) against
 * simulated loads: a file of equal items back to back, read the way torch.load
 * reads an item (header page, a seek to the item's end, then the data),
 * sometimes followed by the kernel reading past it. Counts the bytes the rule
 * asks for against the bytes the load needs. */
#include "prefetch.h"

#include <criterion/criterion.h>
#include <string.h>

#define KiB (1ull << 10)
#define MiB (1ull << 20)
#define NITEMS 256
#define ITEM (500459ull) /* not a multiple of a page, like DCP items */
#define OVERSHOOT (256 * KiB)

struct sim {
    struct prefetch pf;
    unsigned char fetched[NITEMS]; /* items the rule asked for whole */
    uint64_t bytes;                /* bytes the rule asked for */
    uint64_t demand;               /* bytes of reads the rule left to fetch themselves */
};

static struct prefetch_span item(unsigned i)
{
    return (struct prefetch_span){i * ITEM, ITEM};
}

static void sim_init(struct sim *s)
{
    memset(s, 0, sizeof *s);
    prefetch_init(&s->pf, 256 * MiB, OVERSHOOT);
}

/* One read as the core does it: the rule, then the index, then the rule. */
static void sim_read(struct sim *s, uint64_t off, uint64_t len)
{
    uint64_t probe;
    if (!prefetch_read(&s->pf, off, len, &probe))
        return;
    unsigned i = (unsigned)(probe / ITEM);
    cr_assert_lt(i, NITEMS);
    struct prefetch_span cur = item(i), next[64], out[65];
    /* More items than the budget: the rule must hold its own bound. */
    cr_assert_leq(prefetch_budget(&s->pf, cur), 64 * ITEM);
    int n = 0;
    while (n < 64 && i + 1 + n < NITEMS) {
        next[n] = item(i + 1 + (unsigned)n);
        n++;
    }
    int k = prefetch_enter(&s->pf, cur, next, n, out);
    cr_assert_leq(k, n + 1);
    if (k == 0)
        s->demand += len;
    for (int j = 0; j < k; j++) {
        s->bytes += out[j].length;
        for (uint64_t b = out[j].offset / ITEM; b * ITEM < out[j].offset + out[j].length; b++)
            s->fetched[b] = 1;
    }
    cr_assert(prefetch_planned(&s->pf));
}

static uint64_t page_down(uint64_t x)
{
    return x & ~4095ull;
}

/* torch.load of item i: the header page, the zip directory at the end, the
 * records; with overshoot, the kernel then reads on into the next item. */
static void load_item(struct sim *s, unsigned i, int overshoot)
{
    uint64_t a = i * ITEM, b = a + ITEM;
    sim_read(s, page_down(a), 12 * KiB);
    sim_read(s, page_down(b - 300), 12 * KiB);
    uint64_t data = page_down(a) + 12 * KiB;
    sim_read(s, data, page_down(b - 300) - data);
    if (overshoot)
        sim_read(s, page_down(b - 300) + 12 * KiB, 192 * KiB);
}

static void check_ratio(const struct sim *s, uint64_t needed, double limit)
{
    double ratio = (double)s->bytes / (double)needed;
    cr_assert_leq(ratio, limit, "asked for %.3fx what the load needs", ratio);
}

Test(prefetch, item_entered_is_fetched_whole_once)
{
    struct sim s;
    sim_init(&s);
    load_item(&s, 10, 0);
    cr_assert(s.fetched[10]);
    cr_assert_eq(s.bytes, ITEM, "%llu", (unsigned long long)s.bytes);
    cr_assert(!s.fetched[9] && !s.fetched[11]);
}

Test(prefetch, first_page_of_a_read_belongs_to_the_next_item)
{
    struct sim s;
    sim_init(&s);
    /* A read of item 3's header starts in the page holding item 2's end. */
    sim_read(&s, page_down(3 * ITEM), 12 * KiB);
    cr_assert(s.fetched[3]);
    cr_assert(!s.fetched[2]);
}

Test(prefetch, partial_run_with_overshoot_stays_within_ten_percent)
{
    /* Runs of every length from 1 to 64 items, each ended by the kernel
     * reading past the last item: never more than 1.10x (speculation is at
     * most 1/16 of the run, the overshoot fetches no item whole). */
    for (unsigned len = 1; len <= 64; len++) {
        struct sim s;
        sim_init(&s);
        for (unsigned i = 20; i < 20 + len; i++)
            load_item(&s, i, 1);
        check_ratio(&s, len * ITEM, 1.0 + 1.0 / PREFETCH_SPEC_DIV);
        unsigned past = 0;
        for (unsigned i = 20 + len; i < NITEMS; i++)
            past += s.fetched[i];
        cr_assert_leq(past, len / PREFETCH_SPEC_DIV, "run of %u: %u items past its end", len, past);
    }
}

Test(prefetch, long_runs_fetch_ahead)
{
    struct sim s;
    sim_init(&s);
    for (unsigned i = 0; i < 128; i++)
        load_item(&s, i, 1);
    /* By the end, the items ahead of the reader are requested before it
     * gets there: a run of 128 items may speculate 8. */
    cr_assert(s.fetched[128] && s.fetched[130], "no speculation on a long run");
    cr_assert(!s.fetched[137]);
    check_ratio(&s, 128 * ITEM, 1.0 + 1.0 / PREFETCH_SPEC_DIV);
}

Test(prefetch, jump_starts_a_new_run_without_speculation)
{
    struct sim s;
    sim_init(&s);
    for (unsigned i = 0; i < 64; i++)
        load_item(&s, i, 0);
    uint64_t before = s.bytes;
    load_item(&s, 200, 0);
    cr_assert_eq(s.bytes - before, ITEM, "a jump speculated");
    cr_assert(!s.fetched[201]);
}

Test(prefetch, shuffled_items_fetch_exactly_what_is_read)
{
    unsigned order[] = {40, 7, 33, 12, 90, 3, 61, 18, 77, 25, 50, 9};
    struct sim s;
    sim_init(&s);
    for (size_t j = 0; j < sizeof order / sizeof order[0]; j++)
        load_item(&s, order[j], 1);
    cr_assert_eq(s.bytes, 12 * ITEM);
}

Test(prefetch, sequential_overshoot_is_tentative_until_confirmed)
{
    struct sim s;
    sim_init(&s);
    load_item(&s, 5, 0);
    uint64_t before = s.bytes;
    /* The kernel continues the last read into item 6: its own bytes only. */
    sim_read(&s, page_down(6 * ITEM - 300) + 12 * KiB, 192 * KiB);
    cr_assert_eq(s.bytes, before);
    cr_assert_gt(s.demand, 0);
    /* torch seeks to item 6's end: now it is fetched whole. */
    sim_read(&s, page_down(7 * ITEM - 300), 12 * KiB);
    cr_assert(s.fetched[6]);
    cr_assert_eq(s.bytes - before, ITEM);
}

Test(prefetch, whole_file_reader_confirms_past_the_overshoot)
{
    struct sim s;
    sim_init(&s);
    for (uint64_t off = 0; off < 16 * ITEM; off += 256 * KiB)
        sim_read(&s, off, 256 * KiB);
    /* An item entered by a read that ends within the overshoot of its end
     * is read on demand (one read); the others are fetched whole. */
    unsigned whole = 0;
    for (unsigned i = 0; i < 16; i++)
        whole += s.fetched[i];
    cr_assert_geq(whole, 12, "%u of 16 items of a sequential read fetched whole", whole);
    cr_assert_leq(s.bytes, 16 * ITEM);
}

Test(prefetch, huge_items_are_left_to_the_readahead)
{
    struct prefetch pf;
    prefetch_init(&pf, 4 * MiB, OVERSHOOT);
    uint64_t probe;
    cr_assert(prefetch_read(&pf, 0, 4096, &probe));
    struct prefetch_span cur = {0, 64 * MiB}, out[1];
    cr_assert_eq(prefetch_budget(&pf, cur), 0);
    cr_assert_eq(prefetch_enter(&pf, cur, NULL, 0, out), 0);
    cr_assert(!prefetch_planned(&pf));
}

Test(prefetch, readahead_stream_resumed_after_other_reads_is_tentative)
{
    /* torch reads an item's directory at its end (the kernel reads on past
     * it), then the data in many reads; when the reader stops, the kernel
     * resumes the first stream into the next item. Only its bytes: the
     * next item is not wanted. */
    struct sim s;
    sim_init(&s);
    uint64_t a = 40 * ITEM, b = a + ITEM;
    sim_read(&s, page_down(a), 12 * KiB);
    uint64_t dir = page_down(b - 8000);
    sim_read(&s, dir, 12 * KiB);
    for (uint64_t off = page_down(a) + 12 * KiB; off < dir; off += 16 * KiB)
        sim_read(&s, off, dir - off < 16 * KiB ? dir - off : 16 * KiB);
    sim_read(&s, dir + 12 * KiB, 112 * KiB);
    cr_assert(!s.fetched[41], "the resumed readahead stream fetched the next item whole");
    cr_assert_eq(s.bytes, ITEM);
}

/* torch 2.x saves a norm weight of a few KiB between large tensors: a read of
 * the norm's page-aligned start also reaches into the large tensor after it.
 * Which of the two the reader is after is unknown: nothing is fetched whole. */
Test(prefetch, page_holding_a_small_item_and_the_next_start_is_ambiguous)
{
    struct prefetch_span before = {0, 13636208}; /* ends 3.4 KiB into the page */
    struct prefetch_span norm = {13636208, 3228};
    struct prefetch_span next = {13639436, 1049756};
    uint64_t page = 13635584;                          /* the page of norm's start */
    cr_assert(prefetch_ambiguous(page, before, next)); /* norm lies between them */
    /* a small item at the page start, the next item at the page end */
    cr_assert(prefetch_ambiguous(13639680, (struct prefetch_span){13639680, 1000},
                                 (struct prefetch_span){13640680, 1u << 20}));
    /* the page of an item's start holds the end of the item before it: that item */
    cr_assert_not(prefetch_ambiguous(page, before, norm));
    cr_assert_not(prefetch_ambiguous(page, next, next));
}

/* Ranks share the page cache: when another rank's read brought in the pages
 * after this reader's stream end, the kernel's next read for this reader
 * starts past them. prefetch_stream_before() finds that stream; a read that
 * continues it past the skipped bytes is tentative like any overshoot. */
Test(prefetch, read_past_pages_another_reader_brought_in_continues_the_stream)
{
    struct prefetch p;
    prefetch_init(&p, 256 * MiB, OVERSHOOT);
    uint64_t probe, end = 5 * ITEM - 4 * KiB;
    cr_assert(prefetch_read(&p, 5 * ITEM - 8 * KiB, 4 * KiB, &probe)); /* item 4's end */
    struct prefetch_span none[1];
    prefetch_enter(&p, item(4), none, 0, none);
    cr_assert_eq(prefetch_stream_before(&p, end + 132 * KiB, OVERSHOOT), end);
    cr_assert_eq(prefetch_stream_before(&p, end + OVERSHOOT + 1, OVERSHOOT), 0);
    cr_assert_eq(prefetch_stream_before(&p, end - 1, OVERSHOOT), 0);
    /* continues the stream (the 132 KiB between are cached): item 5 is tentative */
    cr_assert(prefetch_read_after(&p, end + 132 * KiB, 128 * KiB, end, &probe));
    struct prefetch_span out[2];
    cr_assert_eq(prefetch_enter(&p, item(5), none, 0, out), 0);
    cr_assert_not(prefetch_confirmed(&p));
    /* the same read taken as a jump enters item 5 and fetches it whole */
    struct prefetch q;
    prefetch_init(&q, 256 * MiB, OVERSHOOT);
    cr_assert(prefetch_read(&q, 5 * ITEM - 8 * KiB, 4 * KiB, &probe));
    prefetch_enter(&q, item(4), none, 0, none);
    cr_assert(prefetch_read(&q, end + 132 * KiB, 128 * KiB, &probe));
    cr_assert_eq(prefetch_enter(&q, item(5), none, 0, out), 1);
}

/* The page cache is the file's: the kernel continues a readahead stream with
 * reads on the handle of whichever rank hit its mark, not always the handle
 * whose read the stream began with. A stream another handle ended, adopted
 * with prefetch_adopt_end(), makes a read continuing it tentative on this
 * handle too (its own bytes, not the item whole), as on the first handle. */
Test(prefetch, a_stream_another_handle_ended_is_continued_tentatively)
{
    struct prefetch p;
    prefetch_init(&p, 256 * MiB, OVERSHOOT);
    uint64_t probe, end = 5 * ITEM + 4 * KiB; /* another rank's read of item 4's tail ended */
    struct prefetch_span none[1], out[2];
    /* this handle read the start of item 2 and nothing near item 5 */
    cr_assert(prefetch_read(&p, 2 * ITEM, 4 * KiB, &probe));
    cr_assert_eq(prefetch_enter(&p, item(2), none, 0, out), 1);
    cr_assert(prefetch_leaves_item(&p, end));
    cr_assert_not(prefetch_leaves_item(&p, 2 * ITEM + 8 * KiB));
    cr_assert_not(prefetch_is_end(&p, end));
    prefetch_adopt_end(&p, end);
    cr_assert(prefetch_is_end(&p, end));
    cr_assert(prefetch_read_after(&p, end, 128 * KiB, end, &probe));
    cr_assert_eq(prefetch_enter(&p, item(5), none, 0, out), 0, "tentative: its own bytes");
    cr_assert_not(prefetch_confirmed(&p));
    /* without the adopted end, the same read is a jump: item 5 fetched whole */
    struct prefetch q;
    prefetch_init(&q, 256 * MiB, OVERSHOOT);
    cr_assert(prefetch_read(&q, 2 * ITEM, 4 * KiB, &probe));
    cr_assert_eq(prefetch_enter(&q, item(2), none, 0, out), 1);
    cr_assert(prefetch_read(&q, end, 128 * KiB, &probe));
    cr_assert_eq(prefetch_enter(&q, item(5), none, 0, out), 1);
}
