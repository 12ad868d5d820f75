/*
 * fs/write/commit.h - when a commit file (.metadata) may reach the store
 * (commit.c says how it is checked). A middle layer of fs/write: calls the
 * records (wfile.h), the index's parser and the store, never upload.c or
 * stage.c; a file its check finds ready is handed to the caller's callback.
 * It moves wfile.commit (wfile.h) through NONE, WAITING, READY and BLOCKED.
 */
#ifndef CKPTFS_COMMIT_H
#define CKPTFS_COMMIT_H

#include <stdint.h>

struct stage;
struct wfile;
struct stage_commit_snapshot;

/* 1 if sealed wf may be published now (lock held): it is no commit file, or
 * its current version was found ready. Otherwise it is (still) waiting:
 * the first ask for a version starts its wait (NONE -> WAITING, with
 * --commit-timeout from now) and wakes the supervisor to check it. */
int commit_allows(struct stage *st, struct wfile *wf);

/* Work on every sealed commit file that waits: check the files it names,
 * mark it ready or blocked (lock held; unlocks while reading the staged file
 * and listing the store). ready(st, wf) is called, lock and a reference
 * held, for each file found ready, at once. Returns the monotonic time of
 * the next check, or 0. */
double commit_check_all(struct stage *st, void (*ready)(struct stage *st, struct wfile *wf));

/* Forget what a previous check of wf found (its content changed). */
void commit_reset(struct wfile *wf);

/* A commit file that waited --commit-timeout in vain waits again from now
 * (a sync, an fsync or a close asks for it; lock held). */
void commit_retry(struct wfile *wf);

/* A file at path reached the store: commit files in its directory are
 * checked again at once (lock held). */
void commit_wake(struct stage *st, const char *path);

/* What the index needs of commit file wf, whose version `version` (of
 * `size` bytes) just landed: its bytes and the files its check found, or
 * NULL (not parsed, too large, or rewritten meanwhile). Lock held; unlocks
 * to read the staging file. Free with commit_snapshot_free(). */
struct stage_commit_snapshot *commit_snapshot(struct stage *st, struct wfile *wf, uint64_t version,
                                              uint64_t size);
void commit_snapshot_free(struct stage_commit_snapshot *s);

#endif
