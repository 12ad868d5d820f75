/*
 * tests/unit/stage_fixture.h - the staging fixture the stage tests share
 * (test_stage.c, test_stage_replace.c): a stage over the in-memory store in
 * a scratch directory, 64 KiB parts (the mem store is told to accept them),
 * a CPU pressure the test sets, helpers to write staged files, and the
 * torch 1.13 per-item fixture checkpoint, staged or put on the store.
 * Header-only: every test is its own executable.
 */
#ifndef CKPTFS_STAGE_FIXTURE_H
#define CKPTFS_STAGE_FIXTURE_H

#include "mem_store.h"
#include "stage.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#define KiB 1024u
#define CKPT CKPTFS_FIXTURES "/dcp-torch1.13/per_item"
#define PART (64 * KiB)

static char dir[] = "/tmp/ckptfs-test-stage-XXXXXX";
static struct mem_store *mem;
static struct stage *st;
static struct stage_config cfg;

/* The CPU pressure the stager sees (staged mode's uploads yield to writers
 * at 0.2 and above); 0 unless a test sets it. */
static _Atomic double pressure_now;

static inline double test_pressure(void *arg, double t)
{
    (void)arg;
    (void)t;
    return pressure_now;
}

/* (Re)open the stage on dir with cfg. */
static inline void open_stage(void)
{
    char err[256] = "";
    cr_assert_eq(stage_open(mem_store_base(mem), "mem://test", &cfg, &st, err, sizeof err), 0, "%s",
                 err);
}

static inline void stage_setup(void)
{
    cr_assert_not_null(mkdtemp(dir));
    pressure_now = 0;
    mem = mem_store_new();
    mem_store_set_min_part(mem, 0);
    stage_config_defaults(&cfg);
    cfg.dir = dir;
    cfg.part_size = PART;
    cfg.upload_workers = 4;
    cfg.hold_seconds = 0.2;
    cfg.retry_max_delay = 0.05;
    cfg.commit_timeout = 20;
    cfg.cpu_pressure = test_pressure; /* not the machine's: tests set it */
    open_stage();
}

static inline void stage_teardown(void)
{
    stage_close(st);
    mem_store_free(mem);
    rm_tree(dir);
}

/* n bytes of a pattern that differs with seed (malloc'd; one spare byte). */
static inline unsigned char *pattern(size_t n, unsigned seed)
{
    unsigned char *b = malloc(n + 1);
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)((i * 2654435761u + seed * 40503u) >> 11);
    return b;
}

/* Write data to a new staged file at path in chunks, then close it:
 * close() must return flush_rc. */
static inline void write_closing(const char *path, const unsigned char *data, size_t n,
                                 size_t chunk, int flush_rc)
{
    struct wfile *wf;
    cr_assert_eq(stage_create(st, path, &wf), 0);
    stage_writer_open(st, wf);
    for (size_t off = 0; off < n; off += chunk) {
        size_t len = n - off < chunk ? n - off : chunk;
        cr_assert_eq(stage_write(st, wf, data + off, len, off), (ssize_t)len);
    }
    cr_assert_eq(stage_flush(st, wf), flush_rc);
    stage_writer_close(st, wf);
    stage_put(st, wf);
}

static inline void write_whole(const char *path, const unsigned char *data, size_t n, size_t chunk)
{
    write_closing(path, data, n, chunk, 0);
}

/* 1 if the store holds an object at path. */
static inline int stored(const char *path)
{
    size_t len;
    void *b = mem_store_get(mem, path, &len);
    free(b);
    return b != NULL;
}

/* The fixture checkpoint's file name at key: staged through the stage, or
 * put on the store directly. */
static inline void put_fixture(const char *name, const char *key, int staged)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", CKPT, name);
    size_t n;
    char *b = slurp(path, &n);
    if (staged)
        write_whole(key, (unsigned char *)b, n, 4096);
    else
        mem_store_set(mem, key, b, n, NULL);
    free(b);
}

/* Every shard of the fixture checkpoint on the store under ck/, but except. */
static inline void store_shards_except(const char *except)
{
    DIR *d = opendir(CKPT);
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strstr(e->d_name, ".distcp") || (except && strcmp(e->d_name, except) == 0))
            continue;
        char key[512];
        snprintf(key, sizeof key, "ck/%s", e->d_name);
        put_fixture(e->d_name, key, 0);
    }
    closedir(d);
}

#endif
