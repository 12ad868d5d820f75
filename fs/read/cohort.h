/*
 * fs/read/cohort.h - which saved ranks' shards of which checkpoints are being
 * loaded on this mount.
 *
 * One mount serves every rank of a node. A sharded tensor is saved as one
 * chunk per rank, each in its own rank's files (`__R_N.distcp`), and a load
 * of that tensor reads every chunk some loading rank overlaps. When one
 * loader enters a chunk, the others' chunks of the same tensor are wanted
 * too, but only if this mount serves the loaders of those chunks: on a node
 * whose ranks load what ranks 0-1 saved, the chunks ranks 2-3 saved are
 * another node's business. The cohort answers that: saved rank R of
 * checkpoint directory D is being loaded here if a read entered a chunk of a
 * sharded tensor in one of R's files less than linger seconds ago. (Opening
 * R's files is not enough: every rank reads the plain tensors rank 0 saved.)
 *
 * A fixed table of slots keyed by (hash of D, R), under its own lock (a
 * leaf); when full, the slot touched longest ago is reused. A rank not in
 * the table counts as not being loaded: the cost is a prefetch not made.
 */
#ifndef CKPTFS_COHORT_H
#define CKPTFS_COHORT_H

#include <stddef.h>

#define COHORT_SLOTS 256

struct cohort;

/* A new, empty table; ranks count as loaded for linger seconds after a read
 * entered one of their chunks. NULL when out of memory. */
struct cohort *cohort_create(double linger);
void cohort_destroy(struct cohort *c);

/* A read entered a chunk of a sharded tensor in a file of saved rank in
 * directory dir[0..dir_len), at now (seconds, any monotonic clock). */
void cohort_touch(struct cohort *c, const char *dir, size_t dir_len, int rank, double now);

/* 1 if rank in dir was touched less than linger seconds before now. */
int cohort_active(struct cohort *c, const char *dir, size_t dir_len, int rank, double now);

#endif
