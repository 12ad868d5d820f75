/*
 * fs/read/prefetch.h - the index-guided item prefetch rule.
 *
 * Pure logic, one state per open file, like readahead.h: the core tells it
 * which checkpoint item a read entered (from the index) and which items
 * follow it in layout order; it says which byte ranges to fetch. It owns the
 * speculation rule and nothing else (no I/O, no locks, no index).
 *
 * The rule: the item a read enters is fetched whole (torch.load of an item
 * seeks between its header, its end and its records: one round trip for all
 * of it). Items after it are speculation, and speculation is paid for by
 * consumption: while reads move from item to item in layout order (a run),
 * the items ahead of the reader may total at most 1/PREFETCH_SPEC_DIV of the
 * bytes of the run's items consumed so far, in whole items. A run that ends
 * (the reader jumps, or stops) has fetched at most that fraction more than it
 * used, whatever its length; a jump starts a new run with no speculation.
 *
 * Readers read past what they want: the kernel's readahead (and a reader's
 * own buffer) continue a sequential read into the next item even when the
 * load stops before it. So a read that enters an item where a read stream
 * ended is tentative: it fetches only its own bytes, and the item does not
 * count as consumed. The item is fetched whole when a read in it does not
 * continue a stream (torch seeks to the item's end), or when sequential
 * reads have gone further into it than the overshoot (a whole-file reader).
 */
#ifndef CKPTFS_PREFETCH_H
#define CKPTFS_PREFETCH_H

#include <stdint.h>

/* Speculation ahead of a run <= run bytes / PREFETCH_SPEC_DIV. */
#define PREFETCH_SPEC_DIV 32
/* An item starting this close after the end of the previous one continues
 * the run (layouts may pad between items). */
#define PREFETCH_GAP (64u << 10)

/* Read streams remembered (where each ended): the kernel continues a
 * readahead stream from where it left it, with other reads (another stream
 * of the same reader) in between. */
#define PREFETCH_ENDS 8

struct prefetch_span {
    uint64_t offset, length;
};

struct prefetch {
    uint64_t item_start, item_end; /* the item last entered (end 0: none) */
    uint64_t run_bytes;            /* bytes of the current run's confirmed items */
    uint64_t ahead_end;            /* the run's items are requested up to here */
    uint64_t max_item;             /* larger items are left to the readahead */
    uint64_t overshoot;            /* how far readers read past what they want */
    uint64_t ends[PREFETCH_ENDS];  /* where recent read streams ended (0: none) */
    unsigned next_end;             /* the slot of ends to write next */
    int sequential;                /* the read being planned starts at one of ends */
    int planned;                   /* the current item is handled here (not too large) */
    int tentative;                 /* ... entered sequentially, not fetched whole yet */
};

/* A fresh state; items longer than max_item are not fetched whole; readers
 * may read up to overshoot bytes past what they want (kernel readahead). */
void prefetch_init(struct prefetch *p, uint64_t max_item, uint64_t overshoot);

/* A read of [off, off + len) arrives; *probe is set to the offset whose item
 * the read enters (kernel reads are whole pages: the first page of a read
 * for an item's start often ends the item before; unless that is the item
 * being read, the read is taken for the next). Returns 1 if the item
 * holding *probe must be looked up and given to prefetch_enter(), 0 if the
 * read stays in the item last entered and nothing changes
 * (prefetch_planned() says who handles it). */
int prefetch_read(struct prefetch *p, uint64_t off, uint64_t len, uint64_t *probe);

/* The read prefetch_read() announced at off (page-aligned by the kernel) starts
 * in item at and its first page reaches into item cur (the item holding the
 * probe). Returns 1 if that page may be for an item other than cur: one
 * starts at off (at itself, smaller than a page) or between at's end and
 * cur's start (a small item wholly inside the page, e.g. a norm weight's
 * few KiB saved by torch 2.x between large tensors). Then which item the
 * reader is after is unknown: the read fetches its own bytes and enters
 * nothing (the reader's next read, e.g. torch's seek to the item's end,
 * says). 0 for the page of an item's start holding the end of the item
 * before it (at ends where cur begins). */
int prefetch_ambiguous(uint64_t off, struct prefetch_span at, struct prefetch_span cur);

/* The nearest end of a remembered read stream before off, at most within
 * bytes before it (0: none). If the bytes between are cached, the kernel
 * skipped them (another reader of the file brought them into the page cache)
 * and a read at off continues that stream: see prefetch_read_after(). */
uint64_t prefetch_stream_before(const struct prefetch *p, uint64_t off, uint64_t within);

/* 1 if a read at off would leave the item last entered (or that item is
 * tentative): only then does whether the read continues a stream matter. */
int prefetch_leaves_item(const struct prefetch *p, uint64_t off);

/* 1 if a read stream of p ended at end. */
int prefetch_is_end(const struct prefetch *p, uint64_t end);

/* A read stream of another handle of the same file ended at end: the page
 * cache is the file's, so the kernel continues that stream with reads it
 * sends on any handle (the one whose reader hit the readahead mark). Remember
 * it as one of p's streams, so a read continuing it is taken as an overshoot
 * (tentative), not as a reader's jump into a new item (fetched whole). */
void prefetch_adopt_end(struct prefetch *p, uint64_t end);

/* prefetch_read() of a read at off that continues the stream that ended at
 * from (from <= off; from == off: prefetch_read()). */
int prefetch_read_after(struct prefetch *p, uint64_t off, uint64_t len, uint64_t from,
                        uint64_t *probe);

/* 1 if the item last entered was fetched here (the readahead is not needed). */
int prefetch_planned(const struct prefetch *p);

/* 1 if the item last entered is handled here and a read is surely in it
 * (not a tentative entry that may be a reader's overshoot). */
int prefetch_confirmed(const struct prefetch *p);

/* How many bytes of the items after cur may be fetched if a read enters cur
 * now: the caller asks the index for that many. Does not change p. */
uint64_t prefetch_budget(const struct prefetch *p, struct prefetch_span cur);

/* The read prefetch_read() announced is in item cur; next[0..n) are the
 * items after it in layout order (those within prefetch_budget() bytes are
 * enough; more are ignored). Writes
 * the ranges to fetch to out (at most n + 1) and returns how many (0: none,
 * the read fetches its own bytes, or cur is left to the readahead). */
int prefetch_enter(struct prefetch *p, struct prefetch_span cur, const struct prefetch_span *next,
                   int n, struct prefetch_span *out);

#endif
