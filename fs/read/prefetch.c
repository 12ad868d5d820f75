/*
 * fs/read/prefetch.c - the index-guided item prefetch rule (see prefetch.h).
 */
#include "prefetch.h"

#include <assert.h>
#include <stddef.h>

#define PAGE_GUESS 4096u /* the kernel reads whole pages, at least */

void prefetch_init(struct prefetch *p, uint64_t max_item, uint64_t overshoot)
{
    *p = (struct prefetch){.max_item = max_item, .overshoot = overshoot};
}

static int inside(const struct prefetch *p, uint64_t off)
{
    return p->item_end > 0 && off >= p->item_start && off < p->item_end;
}

uint64_t prefetch_stream_before(const struct prefetch *p, uint64_t off, uint64_t within)
{
    uint64_t best = 0;
    for (int i = 0; i < PREFETCH_ENDS; i++)
        if (p->ends[i] > 0 && p->ends[i] < off && off - p->ends[i] <= within && p->ends[i] > best)
            best = p->ends[i];
    return best;
}

int prefetch_leaves_item(const struct prefetch *p, uint64_t off)
{
    return !inside(p, off) || p->tentative;
}

int prefetch_is_end(const struct prefetch *p, uint64_t end)
{
    for (int i = 0; i < PREFETCH_ENDS; i++)
        if (end > 0 && p->ends[i] == end)
            return 1;
    return 0;
}

void prefetch_adopt_end(struct prefetch *p, uint64_t end)
{
    if (end == 0 || prefetch_is_end(p, end))
        return;
    p->ends[p->next_end] = end;
    p->next_end = (p->next_end + 1) % PREFETCH_ENDS;
}

int prefetch_read(struct prefetch *p, uint64_t off, uint64_t len, uint64_t *probe)
{
    return prefetch_read_after(p, off, len, off, probe);
}

int prefetch_read_after(struct prefetch *p, uint64_t off, uint64_t len, uint64_t from,
                        uint64_t *probe)
{
    assert(len > 0 && from <= off);
    /* One slot per stream: a read that continues one moves its end. */
    int slot = -1;
    for (int i = 0; i < PREFETCH_ENDS && slot < 0; i++)
        if (from > 0 && p->ends[i] == from)
            slot = i;
    p->sequential = slot >= 0;
    if (slot < 0) {
        slot = (int)p->next_end;
        p->next_end = (p->next_end + 1) % PREFETCH_ENDS;
    }
    p->ends[slot] = off + len;
    /* A read whose first page ends the item being read is for that item
     * (its end); otherwise it is for the item after that page's end. */
    *probe = inside(p, off) ? off : off + (len < PAGE_GUESS ? len : PAGE_GUESS) - 1;
    if (!inside(p, *probe))
        return 1;
    if (!p->tentative)
        return 0;
    /* A tentative item is confirmed by a read that does not continue the
     * previous one, or that goes further into it than readers overshoot. */
    return !p->sequential || off + len - p->item_start > p->overshoot;
}

int prefetch_ambiguous(uint64_t off, struct prefetch_span at, struct prefetch_span cur)
{
    if (at.offset == cur.offset && at.length == cur.length)
        return 0; /* the page is in one item */
    return at.offset >= off || at.offset + at.length < cur.offset;
}

int prefetch_planned(const struct prefetch *p)
{
    return p->planned;
}

int prefetch_confirmed(const struct prefetch *p)
{
    return p->planned && !p->tentative;
}

/* 1 if cur is the item after the one last entered, in layout order. */
static int continues_run(const struct prefetch *p, struct prefetch_span cur)
{
    return p->item_end > 0 && cur.offset >= p->item_end && cur.offset - p->item_end <= PREFETCH_GAP;
}

static int same_item(const struct prefetch *p, struct prefetch_span cur)
{
    return p->item_end > 0 && cur.offset == p->item_start && cur.offset + cur.length == p->item_end;
}

uint64_t prefetch_budget(const struct prefetch *p, struct prefetch_span cur)
{
    if (cur.length > p->max_item)
        return 0;
    /* At most what prefetch_enter() will allow: cur counted into the run. */
    uint64_t run = (continues_run(p, cur) || same_item(p, cur) ? p->run_bytes : 0) + cur.length;
    uint64_t budget = run / PREFETCH_SPEC_DIV;
    return budget < p->max_item ? budget : p->max_item;
}

int prefetch_enter(struct prefetch *p, struct prefetch_span cur, const struct prefetch_span *next,
                   int n, struct prefetch_span *out)
{
    int fresh = !same_item(p, cur); /* else: a tentative item confirmed */
    if (fresh) {
        if (!continues_run(p, cur)) {
            /* A jump (or the first item): what was speculated for the old
             * run is abandoned, and the new run has consumed nothing yet. */
            p->run_bytes = 0;
            p->ahead_end = 0;
        }
        p->item_start = cur.offset;
        p->item_end = cur.offset + cur.length;
        p->tentative = 0;
    }
    assert(p->item_end >= p->item_start);
    if (cur.length > p->max_item) {
        p->planned = 0; /* a huge item: the readahead streams it */
        p->tentative = 0;
        p->ahead_end = 0;
        return 0;
    }
    p->planned = 1;
    if (fresh && p->sequential) {
        /* Maybe a reader's overshoot: the read fetches its own bytes, and
         * the item counts as consumed only once confirmed. */
        p->tentative = 1;
        return 0;
    }
    p->tentative = 0;
    p->run_bytes += cur.length;
    uint64_t budget = p->run_bytes / PREFETCH_SPEC_DIV;
    if (budget > p->max_item)
        budget = p->max_item;
    int k = 0;
    uint64_t ahead = p->ahead_end > cur.offset ? p->ahead_end : cur.offset;
    if (p->item_end > ahead) {
        out[k++] = (struct prefetch_span){ahead, p->item_end - ahead};
        ahead = p->item_end;
    }
    uint64_t total = 0;
    for (int i = 0; i < n; i++) {
        uint64_t a = next[i].offset, b = next[i].offset + next[i].length;
        assert(a >= cur.offset);
        total += next[i].length;
        if (total > budget)
            break; /* whole items only */
        if (b <= ahead)
            continue; /* already requested for this run */
        out[k++] = (struct prefetch_span){a > ahead ? a : ahead, b - (a > ahead ? a : ahead)};
        ahead = b;
    }
    p->ahead_end = ahead;
    assert(k <= n + 1);
    return k;
}
