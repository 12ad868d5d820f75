/*
 * fs/write/upload.h - moving staged files to the store (upload.c says how).
 * A middle layer of fs/write: calls the records (wfile.h), the journal,
 * the store, commit.c (may a commit file go; a file landed) and recover.c
 * (sweep after a lost begin); never stage.c. It moves wfile.mpu (wfile.h)
 * through NONE, BEGINNING, ACTIVE and COMPLETING, and publishes: sets
 * synced_version when an upload lands under the file's current name.
 */
#ifndef CKPTFS_UPLOAD_H
#define CKPTFS_UPLOAD_H

struct stage;
struct wfile;

/* Start whatever upload work wf is ready for (lock held; never blocks). */
void upload_kick(struct stage *st, struct wfile *wf);

/* Abort wf's multipart upload, if any, after its in-flight parts (lock held). */
void upload_cancel(struct stage *st, struct wfile *wf);

/* Timers: retries after failures, held files whose time is up (lock held).
 * Returns the monotonic time of the next deadline, or 0. */
double upload_timers(struct stage *st);

#endif
