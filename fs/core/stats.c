/*
 * fs/core/stats.c - the mount's statistics: the JSON of the stats xattr
 * (ckptfs-admin stats) and the counters of the transfer summaries.
 */
#include "core_internal.h"

#include "clock.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

int core_stats_json(struct core *core, char *buf, size_t len)
{
    struct cache_stats cs;
    cache_get_stats(core->cache, &cs);
    pthread_mutex_lock(&core->files_lock);
    int open_files = core->open_files;
    pthread_mutex_unlock(&core->files_lock);
    struct ckindex_stats is = {0};
    if (core->index)
        ckindex_get_stats(core->index, &is);
    struct stage_stats ws = {0};
    if (core->stage)
        stage_get_stats(core->stage, &ws);
    const struct store_counters *sc = &core->store->counters;
#define U(x) (unsigned long long)(x)
#define A(x) U(atomic_load(&sc->x))
    char writes[1536];
    snprintf(writes, sizeof writes,
             "\"write\": {\"enabled\": %s, \"fsync\": \"%s\", \"write_bytes\": %llu, "
             "\"writeback_starts\": %llu, "
             "\"files_staged\": %llu, \"files_published\": %llu, \"bytes_uploaded\": %llu, "
             "\"pending_files\": %llu, \"pending_bytes\": %llu, \"staged_bytes\": %llu, "
             "\"upload_failures\": %llu, \"commits\": %llu, \"commit_timeouts\": %llu, "
             "\"budget_waits\": %llu, \"upload_yields\": %llu, \"upload_yield_s\": %.3f, "
             "\"recovered_files\": %llu, \"put_requests\": %llu, "
             "\"put_bytes\": %llu, \"mpu_begin_requests\": %llu, \"part_requests\": %llu, "
             "\"complete_requests\": %llu, \"abort_requests\": %llu, "
             "\"upload_list_requests\": %llu, \"copy_requests\": %llu, "
             "\"delete_requests\": %llu, \"last_publish\": %.3f}",
             core->stage ? "true" : "false", core->cfg.stage.fsync_remote ? "remote" : "staged",
             U(ws.write_bytes), U(ws.writeback_starts), U(ws.files_staged), U(ws.files_published),
             U(ws.bytes_uploaded), U(ws.pending_files), U(ws.pending_bytes), U(ws.staged_bytes),
             U(ws.upload_failures), U(ws.commits), U(ws.commit_timeouts), U(ws.budget_waits),
             U(ws.upload_yields), ws.upload_yield_seconds, U(ws.recovered_files), A(put_requests),
             A(put_bytes), A(mpu_begin_requests), A(part_requests), A(complete_requests),
             A(abort_requests), A(upload_list_requests), A(copy_requests), A(delete_requests),
             ws.last_publish);
    struct diskcache_stats ds = {0};
    if (core->disk)
        diskcache_get_stats(core->disk, &ds);
    char disk[1536];
    snprintf(disk, sizeof disk,
             "\"disk_cache\": {\"enabled\": %s, \"capacity\": %llu, \"hits\": %llu, "
             "\"hit_bytes\": %llu, \"misses\": %llu, \"stored_chunks\": %llu, "
             "\"stored_bytes\": %llu, \"adopted_files\": %llu, \"adopted_bytes\": %llu, "
             "\"evictions\": %llu, \"evicted_bytes\": %llu, \"checksum_failures\": %llu, "
             "\"checked_chunks\": %llu, \"put_failures\": %llu, \"fill_dropped\": %llu, "
             "\"held_bytes\": %llu, "
             "\"objects\": %llu, \"in_place_reads\": %llu, \"passthrough_opens\": %llu}",
             core->disk ? "true" : "false", U(core->disk ? core->cfg.disk_cache_size : 0),
             U(ds.hits), U(ds.hit_bytes), U(ds.misses), U(ds.stored_chunks), U(ds.stored_bytes),
             U(ds.adopted_files), U(ds.adopted_bytes), U(ds.evictions), U(ds.evicted_bytes),
             U(ds.checksum_failures), U(ds.checked_chunks), U(ds.put_failures),
             U(core->fill ? diskfill_dropped(core->fill) : 0), U(ds.held_bytes), U(ds.objects),
             U(atomic_load(&core->disk_reads)), U(atomic_load(&core->passthrough_opens)));
#undef A
#undef U
    return snprintf(
        buf, len,
        "{\"store\": \"%s\", \"uptime_s\": %.3f, \"open_files\": %d, \"opens\": %llu, "
        "\"read_bytes\": %llu, \"get_requests\": %llu, \"get_bytes\": %llu, "
        "\"head_requests\": %llu, \"list_requests\": %llu, \"listed_keys\": %llu, "
        "\"listing_waits\": %llu, "
        "\"retries\": %llu, \"errors\": %llu, "
        "\"cache\": {\"hits\": %llu, \"misses\": %llu, \"shared\": %llu, \"taken_over\": %llu, "
        "\"prefetched\": %llu, "
        "\"prefetch_skipped\": %llu, \"prefetched_bytes\": %llu, \"prefetch_unused_bytes\": %llu, "
        "\"prefetch_unread_bytes\": %llu, \"evictions\": %llu, \"evicted_unread\": %llu, "
        "\"recycled\": %llu, \"ahead_deferred\": %llu, \"released\": %llu, "
        "\"fetch_errors\": %llu, \"failed_fast\": %llu, "
        "\"bytes_cached\": %llu, \"buffer_bytes\": %llu, \"capacity\": %llu, \"block_size\": %u, "
        "\"buffers_mapped\": "
        "%llu, \"buffers_reused\": %llu}, "
        "\"index\": {\"enabled\": %s, \"ready\": %llu, \"built\": %llu, \"reused\": %llu, "
        "\"failed\": %llu, \"lookups\": %llu, \"item_prefetches\": %llu, "
        "\"sibling_prefetches\": %llu}, %s, %s}\n",
        core->store->ops->scheme, mono_seconds() - core->started, open_files,
        (unsigned long long)atomic_load(&core->opens),
        (unsigned long long)atomic_load(&core->read_bytes),
        (unsigned long long)atomic_load(&sc->get_requests),
        (unsigned long long)atomic_load(&sc->get_bytes),
        (unsigned long long)atomic_load(&sc->head_requests),
        (unsigned long long)atomic_load(&sc->list_requests),
        (unsigned long long)atomic_load(&sc->listed_keys),
        (unsigned long long)atomic_load(&core->listing_waits),
        (unsigned long long)atomic_load(&sc->retries), (unsigned long long)atomic_load(&sc->errors),
        (unsigned long long)cs.hits, (unsigned long long)cs.misses, (unsigned long long)cs.shared,
        (unsigned long long)cs.taken_over, (unsigned long long)cs.prefetched,
        (unsigned long long)cs.prefetch_skipped, (unsigned long long)cs.prefetched_bytes,
        (unsigned long long)cs.prefetch_unused_bytes, (unsigned long long)cs.prefetch_unread_bytes,
        (unsigned long long)cs.evictions, (unsigned long long)cs.evicted_unread,
        (unsigned long long)cs.recycled, (unsigned long long)cs.ahead_deferred,
        (unsigned long long)cs.released, (unsigned long long)cs.fetch_errors,
        (unsigned long long)cs.failed_fast, (unsigned long long)cs.bytes_cached,
        (unsigned long long)cs.buffer_bytes, (unsigned long long)cs.capacity, core->cfg.block_size,
        (unsigned long long)cs.buffers_mapped, (unsigned long long)cs.buffers_reused,
        core->index ? "true" : "false", (unsigned long long)is.ready, (unsigned long long)is.built,
        (unsigned long long)is.reused, (unsigned long long)is.failed,
        (unsigned long long)is.lookups, (unsigned long long)atomic_load(&core->item_prefetches),
        (unsigned long long)atomic_load(&core->sibling_prefetches), disk, writes);
}

/* The transfer summary's view of the counters (xferlog.h). */
void core_sample_counters(void *arg, struct xfer_counters *out)
{
    struct core *core = arg;
    struct cache_stats cs;
    cache_get_stats(core->cache, &cs);
    struct stage_stats ws = {0};
    if (core->stage)
        stage_get_stats(core->stage, &ws);
    const struct store_counters *sc = &core->store->counters;
    *out = (struct xfer_counters){
        .read_bytes = atomic_load(&core->read_bytes),
        .get_requests = atomic_load(&sc->get_requests),
        .get_bytes = atomic_load(&sc->get_bytes),
        .hits = cs.hits,
        .misses = cs.misses,
        .shared = cs.shared,
        .write_bytes = ws.write_bytes,
        .put_requests = atomic_load(&sc->put_requests) + atomic_load(&sc->part_requests),
        .put_bytes = atomic_load(&sc->put_bytes),
        .errors = atomic_load(&sc->errors),
    };
}
