/*
 * fs/write/journal.h - the crash journal of the write path, kept in LMDB.
 *
 * One record per staged file: where its bytes are (the staging file id),
 * the store path it will be published as, whether the writer has sealed it
 * (closed or fsynced, and unchanged since) and whether that content was made
 * durable on local disk, and the state of its upload (the key and id of a
 * multipart upload in progress, the parts already on the store with their
 * ETags). After kill -9 or a reboot, the next mount with the same cache
 * directory reads the records back and finishes (or cleans up) what they
 * describe. LMDB gives crash-safe transactions; commits skip the metadata
 * sync (MDB_NOMETASYNC: integrity is kept, a system crash may lose the last
 * commits) and journal_sync() forces everything to disk for fsync.
 *
 * A record carries a sequence number; a put with a sequence number not
 * above the stored one is ignored, so updates prepared under the stager's
 * lock may be written after it is dropped, in any order, and the newest
 * wins. Thread-safe.
 */
#ifndef CKPTFS_JOURNAL_H
#define CKPTFS_JOURNAL_H

#include "store.h"

#include <stddef.h>
#include <stdint.h>

#define JOURNAL_SEALED 0x1  /* the staged content is what the writer published (close/fsync) */
#define JOURNAL_DURABLE 0x2 /* ... and it was fdatasync'ed to the staging disk */
#define JOURNAL_DISCARD 0x4 /* unlinked: only its multipart upload is left to abort */
#define JOURNAL_LINK 0x8    /* a symbolic link: the content is its target (stage_symlink) */

struct journal;

struct journal_part {
    uint32_t number;
    uint64_t offset, length;
    char etag[STORE_ETAG_MAX];
};

struct journal_rec {
    uint64_t id;  /* staging file id (the key) */
    uint64_t seq; /* newer records have larger numbers */
    uint32_t flags;
    uint64_t size;          /* bytes of the sealed content */
    const char *boot_id;    /* kernel boot id when written (durability across reboots) */
    const char *store;      /* the store's canonical name, e.g. s3://bucket/prefix */
    const char *path;       /* store path to publish under */
    const char *upload_key; /* key of the multipart upload in progress, or "" */
    const char *upload_id;  /* its id, or "" (begun but id not known yet: look it up) */
    uint32_t nparts;        /* parts on the store that hold the sealed content */
    const struct journal_part *parts;
};

/* Open (creating) the journal in directory dir. 0, or a negative errno with a
 * one-line reason in err. */
int journal_open(const char *dir, struct journal **out, char *err, size_t errlen);

/* Close it (NULL is a no-op). */
void journal_close(struct journal *j);

/* Store r under r->id unless a record with a sequence number >= r->seq is
 * there already. 0 or a negative errno. */
int journal_put(struct journal *j, const struct journal_rec *r);

/* Remove the record of id (absent is not an error). 0 or a negative errno. */
int journal_del(struct journal *j, uint64_t id);

/* Force every committed record to disk. 0 or a negative errno. */
int journal_sync(struct journal *j);

/* journal_sync calls so far (for tests and statistics). */
uint64_t journal_sync_count(struct journal *j);

/* A staging file id never handed out before by this journal. */
int journal_new_id(struct journal *j, uint64_t *id);

/* Call fn once per record, in id order; the record (and its strings) is valid
 * only during the call. A record that cannot be decoded is reported through
 * bad (its id) and skipped. fn returning non-zero stops the walk. */
int journal_foreach(struct journal *j, int (*fn)(void *arg, const struct journal_rec *r),
                    void (*bad)(void *arg, uint64_t id), void *arg);

/* ---- directory renames on a store of keys (dirmv.h) ----
 * A second kind of record, in a database of its own: a rename of a directory
 * whose objects are being copied to the new name (docs/semantics.md,
 * "Renaming a directory on the store"). It names the two directories and the
 * phase reached; the objects are listed again from the store when needed. */

#define JOURNAL_DIRMV_COPYING 1  /* copying from's objects to to; from is whole */
#define JOURNAL_DIRMV_DELETING 2 /* every object is at to; deleting from's */
#define JOURNAL_DIRMV_UNDOING 3  /* the copy failed: deleting what was copied to to */

#define JOURNAL_DIRMV_TO_EXISTED 0x1 /* to was an (empty) directory before: keep its marker */

struct journal_dirmv {
    uint64_t id;       /* from journal_new_id (the key) */
    uint32_t phase;    /* JOURNAL_DIRMV_* */
    uint32_t flags;    /* JOURNAL_DIRMV_TO_EXISTED */
    const char *store; /* the store's canonical name */
    const char *from;  /* store paths of the two directories */
    const char *to;
};

/* Store (replace) the directory rename record r->id and force it to disk:
 * it is written before the first object moves. 0 or a negative errno. */
int journal_dirmv_put(struct journal *j, const struct journal_dirmv *r);

/* Remove directory rename record id (absent is not an error). */
int journal_dirmv_del(struct journal *j, uint64_t id);

/* Call fn once per directory rename record, in id order (valid only during
 * the call; fn may write to the journal); undecodable ones are skipped with
 * an error logged by the caller through bad. Non-zero from fn stops. */
int journal_dirmv_foreach(struct journal *j, int (*fn)(void *arg, const struct journal_dirmv *r),
                          void (*bad)(void *arg, uint64_t id), void *arg);

/* Encoding of a directory rename record (for the unit tests): the bytes
 * written into buf (cap >= journal_dirmv_encoded_size), and the decoding,
 * strings pointing into scratch (>= len + 8 bytes); -EINVAL if malformed. */
size_t journal_dirmv_encoded_size(const struct journal_dirmv *r);
size_t journal_dirmv_encode(const struct journal_dirmv *r, unsigned char *buf, size_t cap);
int journal_dirmv_decode(const unsigned char *buf, size_t len, struct journal_dirmv *r,
                         char *scratch, size_t scratch_len);

/* ---- record encoding (exposed for the unit tests) ---- */

/* Bytes journal_encode needs for r. */
size_t journal_encoded_size(const struct journal_rec *r);

/* Encode r into buf (cap >= journal_encoded_size(r)); returns the length. */
size_t journal_encode(const struct journal_rec *r, unsigned char *buf, size_t cap);

/* Decode len bytes into *r, with strings and parts pointing into scratch
 * (a buffer of at least len + 64 bytes the caller keeps while r is used).
 * 0, or -EINVAL if malformed (truncated, lengths beyond the bounds, unknown
 * format). Never allocates. */
int journal_decode(const unsigned char *buf, size_t len, struct journal_rec *r,
                   struct journal_part *parts, size_t max_parts, char *scratch, size_t scratch_len);

#endif
