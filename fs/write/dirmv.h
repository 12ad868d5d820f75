/*
 * fs/write/dirmv.h - renaming a directory on a store of keys (S3), where a
 * directory is only a prefix: every object below it is copied to the new
 * name server-side, commit files (.metadata, *.metadata, an HF index json)
 * last, then the old keys are deleted, commit files first. A journal record
 * (journal.h, JOURNAL_DIRMV_*) written before the first copy carries the
 * rename across kill -9: the next mount finishes it (dirmv_resume_all).
 * docs/semantics.md, "Renaming a directory on the store", states the rules.
 *
 * A middle layer of fs/write: calls the journal, the store and the names of
 * commit files (wfile.h) only; stage_names.c and recover.c call it.
 */
#ifndef CKPTFS_DIRMV_H
#define CKPTFS_DIRMV_H

#include "store.h"

#include <stddef.h>
#include <stdint.h>

struct journal;

#define DIRMV_PARALLEL 8 /* copies (or deletes) in flight at once */

struct dirmv_env {
    struct store *store;
    struct journal *journal;
    const char *store_name; /* the store's canonical name (journal records) */
    uint64_t max_objects;   /* more objects below the directory: -EXDEV; 0 = no limit */
    int parallel;           /* requests at once; 0 = DIRMV_PARALLEL */
    /* Optional: called before a copy of size bytes to store path `to`
     * (a multipart copy above STORE_MAX_PART may wait for recovery's sweep). */
    void (*before_copy)(void *arg, const char *to, uint64_t size);
    void *arg;
};

/* What an object below the directory is, by its path relative to it. */
enum dirmv_kind {
    DIRMV_MARKER, /* "" (the directory's own marker) or "sub/" */
    DIRMV_DATA,   /* any other object */
    DIRMV_COMMIT, /* a commit file (.metadata, *.metadata, *.safetensors.index.json) */
};

struct dirmv_item {
    char *rel; /* path relative to the directory ("sub/file", "sub/", "") */
    uint64_t size;
    char etag[STORE_ETAG_MAX];
    enum dirmv_kind kind;
};

/* The kind of the object at rel (relative to the renamed directory). */
enum dirmv_kind dirmv_kind_of(const char *rel);

/* The step (0, 1, 2) in which item moves: copying (deleting = 0): markers
 * (shallow first), then data, then commit files; deleting: commit files,
 * then data, then markers (deepest first). Items of one step run in
 * parallel (but markers go one by one); a step starts when the
 * previous one is done. */
int dirmv_step_of(const struct dirmv_item *item, int deleting);

/* Sort items[0..n) into that order (stable within a step by rel). */
void dirmv_order(struct dirmv_item *items, size_t n, int deleting);

/* Rename directory from to to on the store (both store paths, from has
 * objects on the store, to does not exist or is an empty directory, with a
 * marker if to_existed): journal, copy, delete, clear the journal. Blocks
 * until done, logging progress. 0; -EXDEV (more than max_objects, or a
 * store without list_below); or a negative errno: a failed copy is undone
 * (from is left whole); a failed delete leaves its record for the next mount
 * to finish (to is complete). */
int dirmv_run(const struct dirmv_env *e, const char *from, const char *to, int to_existed);

/* Finish (or undo) every directory rename of this store that the journal
 * says was interrupted. Called at mount by recovery; logs what it does.
 * Returns how many were finished. */
int dirmv_resume_all(const struct dirmv_env *e);

#endif
