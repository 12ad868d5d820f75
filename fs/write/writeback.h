/*
 * fs/write/writeback.h - starting the disk writes of staged bytes early
 * (staged mode only; writeback.c says why). A middle layer of fs/write:
 * calls only the records (wfile.h).
 */
#ifndef CKPTFS_WRITEBACK_H
#define CKPTFS_WRITEBACK_H

#include <sys/types.h>

struct stage;
struct wfile;

/* A client wrote `written` bytes to wf (lock held): in staged mode, queue a
 * large write's file for the flusher to start its disk write. */
void writeback_note(struct stage *st, struct wfile *wf, ssize_t written);

/* Start the flusher (staged mode only): 0 or a negative errno. */
int writeback_start(struct stage *st);

/* Stop the flusher once st->stopping is set (lock not held); the jobs
 * still queued only drop their references. A no-op if it never started. */
void writeback_stop(struct stage *st);

#endif
