/*
 * fs/write/recover.h - taking over the journal at mount, and the sweeps of
 * multipart uploads nobody will complete (recover.c says what becomes of
 * each record). A middle layer of fs/write: calls the records (wfile.h),
 * the journal, the store and dirmv.c; never upload.c or stage.c.
 */
#ifndef CKPTFS_RECOVER_H
#define CKPTFS_RECOVER_H

struct stage;

/* Take over the journal's records after a crash or restart: re-stage the
 * sealed files (sealed, not uploading: the caller starts their uploads);
 * move unsealed or untrustworthy data to CACHE_DIR/recovered; abort
 * multipart uploads nobody will complete; finish interrupted directory
 * renames (dirmv.h). Called once from stage_open,
 * before the workers run and the mount serves requests (lock not held). */
void recover_journal(struct stage *st);

/* The second sweep of the multipart uploads recovery cleaned (lock held,
 * dropped for each request; the supervisor calls it): once its time has
 * come, list each key's uploads again and abort those no live file of this
 * mount holds - requests the dead daemon had sent may reach the store after
 * the first sweep. A key this mount is uploading is left alone; stopping
 * ends the sweep between keys. Returns when it is due (monotonic), or 0
 * once done or if none is pending. */
double recover_sweep_again(struct stage *st);

/* List key's multipart uploads and abort those no live file of this mount
 * holds, unless a file of this mount is uploading key (lock held, dropped for
 * the requests): the leftovers of a begin whose answer was lost. */
void recover_sweep_key(struct stage *st, const char *key);

/* 1 if the second sweep is still to pass key (lock held). */
int recover_sweep_pending(const struct stage *st, const char *key);

/* Drop a pending second sweep without making it (lock held, or the
 * supervisor joined: stage_close). */
void recover_sweep_forget(struct stage *st);

#endif
