/*
 * fs/core/subtree.c - the subdirectories a listing lists whole on the way:
 * a stack of the current key's directories, each holding its entries until
 * its keys end (subtree.h).
 */
#include "subtree.h"

#include <assert.h>
#include <stdlib.h>
#include <string.h>

void subtree_init(struct subtree *t, const struct subtree_ops *ops, void *arg)
{
    memset(t, 0, sizeof *t);
    t->ops = ops;
    t->arg = arg;
}

static void free_held(struct subtree_level *lv)
{
    for (size_t i = 0; i < lv->nheld; i++)
        free(lv->held[i].name);
    free(lv->held);
    lv->held = NULL;
    lv->nheld = lv->held_cap = 0;
}

/* Hold entry name of level lv until its keys end; lv stops being whole
 * when it has too many or memory runs out. */
static void hold(struct subtree_level *lv, const char *name, const struct store_stat *st)
{
    if (!lv->whole)
        return;
    if (lv->nheld == lv->held_cap) {
        size_t cap = lv->held_cap ? 2 * lv->held_cap : 16;
        struct subtree_entry *grown =
            cap <= SUBTREE_HELD_MAX ? realloc(lv->held, cap * sizeof *grown) : NULL;
        if (!grown) {
            lv->whole = 0;
            free_held(lv);
            return;
        }
        lv->held = grown;
        lv->held_cap = cap;
    }
    struct subtree_entry *e = &lv->held[lv->nheld];
    if (!(e->name = strdup(name))) {
        lv->whole = 0;
        free_held(lv);
        return;
    }
    e->st = *st;
    lv->nheld++;
}

/* The deepest level's keys ended; complete: all of them came. It is an
 * entry of its parent (two or more levels down; the listing reports the
 * first level's own subdirectories itself). */
static void pop_level(struct subtree *t, int complete)
{
    assert(t->depth > 0);
    struct subtree_level *lv = &t->level[--t->depth];
    t->path[lv->end] = '\0';
    if (complete && t->depth > 0) {
        struct subtree_level *up = &t->level[t->depth - 1];
        hold(up, t->path + up->end + 1, &(struct store_stat){.is_dir = 1, .mtime_ns = lv->newest});
    }
    if (complete && lv->whole) {
        for (size_t i = 0; i < lv->nheld; i++)
            t->ops->entry(t->arg, t->path, lv->held[i].name, &lv->held[i].st);
        t->ops->whole(t->arg, t->path, lv->newest, lv->keys, &lv->scan);
    } else {
        ckindex_scan_drop(&lv->scan);
    }
    free_held(lv);
    if (t->depth > 0)
        t->path[t->level[t->depth - 1].end] = '\0';
}

/* How many followed levels hold the key rel whose directory part is
 * rel[0..dirlen): those whose path is a prefix of it, up to a '/'. */
static size_t levels_holding(const struct subtree *t, const char *rel, size_t dirlen)
{
    size_t n = 0;
    while (n < t->depth) {
        size_t end = t->level[n].end;
        if (end > dirlen || rel[end] != '/' || memcmp(t->path, rel, end) != 0)
            break;
        n++;
    }
    return n;
}

/* Follow the directories of rel[0..dirlen) below the held levels. */
static void push_levels(struct subtree *t, const char *rel, size_t dirlen)
{
    size_t from = t->depth ? t->level[t->depth - 1].end + 1 : 0;
    while (from <= dirlen) {
        const char *slash = memchr(rel + from, '/', dirlen + 1 - from);
        size_t end = slash ? (size_t)(slash - rel) : dirlen;
        if (end == from || t->depth == SUBTREE_DEPTH || end >= sizeof t->path) {
            /* An empty name, too deep or too long: its parent's entries are
             * not all known. */
            if (t->depth) {
                t->level[t->depth - 1].whole = 0;
                free_held(&t->level[t->depth - 1]);
            }
            return;
        }
        if (from > 0)
            t->path[from - 1] = '/';
        memcpy(t->path + from, rel + from, end - from);
        t->path[end] = '\0';
        t->level[t->depth++] = (struct subtree_level){.end = end, .whole = 1};
        from = end + 1;
    }
}

void subtree_key(struct subtree *t, const char *rel, const struct store_stat *st)
{
    const char *last = strrchr(rel, '/');
    size_t dirlen = last ? (size_t)(last - rel) : 0;
    size_t held = last ? levels_holding(t, rel, dirlen) : 0;
    while (t->depth > held)
        pop_level(t, 1);
    if (!last)
        return; /* a file of the listed directory itself */
    push_levels(t, rel, dirlen);
    for (size_t i = 0; i < t->depth; i++) {
        struct subtree_level *lv = &t->level[i];
        if (++lv->keys <= STORE_DIR_TIME_KEYS && st->mtime_ns > lv->newest)
            lv->newest = st->mtime_ns;
    }
    struct subtree_level *deepest = t->depth ? &t->level[t->depth - 1] : NULL;
    if (!deepest || deepest->end != dirlen || !last[1])
        return; /* deeper than followed, or a directory marker (its time only) */
    hold(deepest, last + 1, st);
    ckindex_scan_add(&deepest->scan, last + 1, st);
}

void subtree_end(struct subtree *t, int complete)
{
    while (t->depth > 0)
        pop_level(t, complete);
}
