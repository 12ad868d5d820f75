/*
 * fs/core/files.c - the open handles: every core_file from its creation to
 * its release (the list an unmount walks), and the count of sequential
 * streams sharing the cache.
 */
#include "core_internal.h"

#include "strutil.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A file of a checkpoint directory was closed: the load is still working
 * there (its read may have outlasted the listing, as a large .metadata read
 * from a busy store does), so the listing is kept from now on. */
static void keep_listing_after_close(struct core *core, const struct core_file *f)
{
    char dir[4096];
    if (f->in_checkpoint && f->obj && path_dir(cache_obj_path(f->obj), dir, sizeof dir) == 0)
        core_keep_listing(core, dir);
}

/* The kernel's readahead reads past what a partial load wants: a reader's
 * 128 KiB buffered read of an item's tail, after the item's body, makes the
 * kernel's context readahead ask for up to --kernel-readahead (1 MiB) from
 * there, into the next items (often another layer's), and ckptfs must fetch
 * what it asks to answer (a short reply would shrink the file). Handles
 * whose reads bypass the page cache get each read as the reader issues it,
 * no readahead: for a checkpoint's data files (*.distcp: DCP names them so)
 * read through the block cache, whose own item prefetch fetches each item
 * whole in parallel GETs. Not .metadata, other files, staged files, or a
 * local store's files (reads spliced from its fd; no bytes to save). Such
 * handles can be mapped privately (torch.load(mmap=True): the kernel maps
 * through the page cache) but not shared (libfuse 3.14 lacks
 * FUSE_DIRECT_IO_ALLOW_MMAP: mmap(MAP_SHARED) fails with ENODEV).
 *
 * The cost: bytes several ranks read cross FUSE once per rank instead of
 * once into the shared page cache. torch 2.x loads a whole tensor (and a
 * bytes item) on every rank, so a file of such items read direct crossed
 * FUSE 4.9 times for 4 ranks (docs/bench-load.md, "Direct reads of
 * checkpoint data files"); a chunk of a sharded tensor is read by the rank
 * that overlaps it. What the page cache costs a partial load is one kernel
 * readahead window (and a reader's buffer) past the last item it reads in
 * each file: next to an item of PAGE_CACHE_ITEM_WINDOWS windows or more that
 * is at most 1/16 (+ 128 KiB) of it, next to the 1-4 MiB tensors of a small
 * model 30-50% of a layer. So by default (sharded) a file keeps the page cache
 * only when more than 1/SHARED_MAX_PART of its item bytes are whole tensors
 * or bytes items every rank reads that are that long (the large weights of a
 * real model); the rest is read direct: chunks of sharded tensors, and files
 * of small whole tensors, whose full loads cross FUSE once per rank (the
 * price of partial loads within 1.10x). A file the index does not know (yet:
 * waited for up to 1 s, or failed) keeps the page cache, as before.
 * --direct-reads all/none override. Direct files still pay for torch's
 * re-reads of parts of an item (its zip directory, buffer refills after
 * seeks): 1.9-2.1x the bytes through FUSE for DTensor chunks, answered from
 * the block cache (no extra GETs). */
#define SHARED_MAX_PART 8
#define PAGE_CACHE_ITEM_WINDOWS 16

int core_file_direct_reads(const struct core *core, const struct core_file *f)
{
    static const char ext[] = ".distcp";
    int mode = core->cfg.direct_reads;
    if (mode == CORE_DIRECT_READS_NONE || !f->obj || f->wf || f->fd >= 0 || !f->in_checkpoint)
        return 0;
    const char *path = cache_obj_path(f->obj);
    const char *name = path_base(path);
    size_t n = strlen(name), k = sizeof ext - 1;
    if (n <= k || strcmp(name + n - k, ext) != 0)
        return 0;
    if (mode == CORE_DIRECT_READS_ALL)
        return 1;
    uint64_t shared, total;
    uint64_t large = PAGE_CACHE_ITEM_WINDOWS * (uint64_t)core->cfg.kernel_readahead;
    if (!core->index || ckindex_file_sharing(core->index, path, 1.0, large, &shared, &total) != 0)
        return 0;
    return shared <= total / SHARED_MAX_PART;
}

void core_file_set_tag(struct core_file *f, void *tag)
{
    f->tag = tag;
}

void *core_file_tag(const struct core_file *f)
{
    return f->tag;
}

struct core_file *core_file_new(void)
{
    struct core_file *f = calloc(1, sizeof *f);
    if (!f)
        return NULL;
    f->fd = -1;
    pthread_mutex_init(&f->ra_lock, NULL);
    return f;
}

int core_file_staged(struct core *core, struct wfile *wf, int writable, struct core_file **out)
{
    struct core_file *f = core_file_new();
    if (!f) {
        stage_put(core->stage, wf);
        return -ENOMEM;
    }
    f->wf = wf;
    f->writable = writable;
    if (writable)
        stage_writer_open(core->stage, wf);
    core_file_link(core, f);
    *out = f;
    return 0;
}

void core_file_link(struct core *core, struct core_file *f)
{
    atomic_fetch_add(&core->opens, 1);
    pthread_mutex_lock(&core->files_lock);
    f->next = core->files;
    if (f->next)
        f->next->prev = f;
    core->files = f;
    core->open_files++;
    pthread_mutex_unlock(&core->files_lock);
}

/* f's readahead window is open or not (f->ra_lock held): count it in the
 * streams that share the cache. */
void core_stream_note(struct core *core, struct core_file *f)
{
    int now = f->ra.window > 0;
    if (now == f->streaming)
        return;
    f->streaming = now;
    if (now) {
        atomic_fetch_add(&core->streams, 1);
    } else {
        assert(atomic_load(&core->streams) > 0);
        atomic_fetch_sub(&core->streams, 1);
    }
}

/* Release f; abandoned: the kernel never sent its RELEASE (the mount
 * ended), so a file it was writing is not sealed. */
void core_file_release(struct core *core, struct core_file *f, int abandoned)
{
    pthread_mutex_lock(&core->files_lock);
    if (f->prev)
        f->prev->next = f->next;
    else
        core->files = f->next;
    if (f->next)
        f->next->prev = f->prev;
    core->open_files--;
    pthread_mutex_unlock(&core->files_lock);
    if (f->fd >= 0)
        close(f->fd);
    if (!abandoned)
        keep_listing_after_close(core, f);
    if (f->wf) {
        if (f->writable && abandoned)
            stage_writer_abandon(core->stage, f->wf);
        else if (f->writable)
            stage_writer_close(core->stage, f->wf);
        stage_put(core->stage, f->wf);
    }
    if (f->obj)
        cache_obj_put(core->cache, f->obj);
    f->ra.window = 0; /* its stream ends: no other thread has f now */
    core_stream_note(core, f);
    pthread_mutex_destroy(&f->ra_lock);
    free(f);
}
