/*
 * tests/unit/test_diskcache.c - the persistent disk cache in isolation, on a
 * fresh folder per test: exact versions only, checksums, survival of close
 * and of a killed writer, the bounds (capacity, free-space floor, lru), the
 * lock against a second user, adopting a staged file.
 */
#include "diskcache.h"

#include "test_util.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CH DISKCACHE_CHUNK

static char dir[256];
static char err[512];

static void setup(void)
{
    make_scratch_dir(dir, sizeof dir, "ckptfs-diskcache");
}

static void teardown(void)
{
    rm_tree(dir);
}

TestSuite(diskcache, .init = setup, .fini = teardown, .timeout = 120);

static struct diskcache *open_cache(uint64_t capacity, unsigned floor_percent)
{
    struct diskcache_config cfg = {.capacity = capacity, .floor_percent = floor_percent};
    struct diskcache *dc = NULL;
    int rc = diskcache_open(dir, &cfg, &dc, err, sizeof err);
    cr_assert_eq(rc, 0, "open: %d %s", rc, err);
    return dc;
}

/* deterministic bytes of an object named by seed */
static unsigned char *pattern(size_t n, unsigned seed)
{
    unsigned char *p = malloc(n);
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)((i * 2654435761u + seed) >> 7);
    return p;
}

static struct diskcache_stats stats(struct diskcache *dc)
{
    struct diskcache_stats st;
    diskcache_get_stats(dc, &st);
    return st;
}

/* bytes put are read back exactly, across chunk boundaries and in the short
 * last chunk; a range with a chunk never put is a miss */
Test(diskcache, put_then_read)
{
    struct diskcache *dc = open_cache(64ull << 20, 0);
    size_t size = 3 * CH + 1000;
    unsigned char *data = pattern(size, 1), *got = malloc(size);
    struct diskcache_version v = {"run/a.distcp", "\"e1\"", size};
    cr_assert_eq(diskcache_put(dc, &v, 0, data, 2 * CH), 0);
    cr_assert_eq(diskcache_put(dc, &v, 3 * CH, data + 3 * CH, 1000), 0);
    cr_assert_eq(diskcache_read(dc, &v, 100, CH + 200, got), 1);
    cr_assert_arr_eq(got, data + 100, CH + 200);
    cr_assert_eq(diskcache_read(dc, &v, 3 * CH + 10, 990, got), 1);
    cr_assert_arr_eq(got, data + 3 * CH + 10, 990);
    cr_assert_eq(diskcache_read(dc, &v, CH, 2 * CH, got), 0, "chunk 2 was never put");
    struct diskcache_stats st = stats(dc);
    cr_assert_eq(st.hits, 2);
    cr_assert_eq(st.misses, 1);
    cr_assert_eq(st.held_bytes, 2 * CH + 1000);
    cr_assert_eq(st.objects, 1);
    free(data);
    free(got);
    diskcache_close(dc);
}

/* Pages of the data file at path resident in the page cache. */
static size_t resident_pages(const char *path)
{
    int fd = open(path, O_RDONLY);
    cr_assert(fd >= 0, "%s", path);
    struct stat st;
    cr_assert_eq(fstat(fd, &st), 0);
    size_t page = (size_t)sysconf(_SC_PAGESIZE), n = ((size_t)st.st_size + page - 1) / page;
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    cr_assert_neq(map, MAP_FAILED);
    unsigned char *vec = malloc(n);
    cr_assert_eq(mincore(map, (size_t)st.st_size, vec), 0);
    size_t in = 0;
    for (size_t i = 0; i < n; i++)
        in += vec[i] & 1;
    free(vec);
    munmap(map, (size_t)st.st_size);
    close(fd);
    return in;
}

/* The only data file of the cache (one object put). */
static void only_data_file(char *out, size_t n)
{
    char data_dir[300];
    snprintf(data_dir, sizeof data_dir, "%s/data", dir);
    DIR *d = opendir(data_dir);
    cr_assert_not_null(d, "%s", data_dir);
    int found = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.')
            continue;
        snprintf(out, n, "%s/%s", data_dir, e->d_name);
        found++;
    }
    closedir(d);
    cr_assert_eq(found, 1);
}

/* An aligned buffer (as the background writer's) is written past the page
 * cache (O_DIRECT): none of its pages stay resident, and it reads back exactly;
 * an unaligned one is written through the page cache. */
Test(diskcache, aligned_puts_skip_the_page_cache)
{
    struct statfs fs;
    cr_assert_eq(statfs(dir, &fs), 0);
    if (fs.f_type == TMPFS_MAGIC)
        cr_skip_test("tmpfs: its pages are the page cache");
    struct diskcache *dc = open_cache(64ull << 20, 0);
    size_t size = 4 * CH;
    unsigned char *data = pattern(size, 7), *aligned = NULL, *got = malloc(size);
    cr_assert_eq(posix_memalign((void **)&aligned, DISKCACHE_DIRECT_ALIGN, 2 * CH), 0);
    memcpy(aligned, data, 2 * CH);
    struct diskcache_version v = {"run/d.distcp", "\"e1\"", size};
    cr_assert_eq(diskcache_put(dc, &v, 0, aligned, 2 * CH), 0);
    char path[600];
    only_data_file(path, sizeof path);
    cr_assert_eq(resident_pages(path), 0, "an O_DIRECT write left pages in the page cache");
    unsigned char *unaligned = malloc(2 * CH + 1);
    memcpy(unaligned + 1, data + 2 * CH, 2 * CH);
    cr_assert_eq(diskcache_put(dc, &v, 2 * CH, unaligned + 1, 2 * CH), 0);
    cr_assert_gt(resident_pages(path), 0, "a buffered write leaves its pages");
    cr_assert_eq(diskcache_read(dc, &v, 0, size, got), 1);
    cr_assert_arr_eq(got, data, size);
    free(unaligned);
    free(aligned);
    free(data);
    free(got);
    diskcache_close(dc);
}

/* puts must be whole chunks at chunk offsets (the last one may be short) */
Test(diskcache, put_needs_whole_chunks)
{
    struct diskcache *dc = open_cache(64ull << 20, 0);
    unsigned char *data = pattern(2 * CH, 2);
    struct diskcache_version v = {"a", "\"e\"", 2 * CH};
    cr_assert_eq(diskcache_put(dc, &v, 10, data, CH), -EINVAL);
    cr_assert_eq(diskcache_put(dc, &v, 0, data, CH - 1), -EINVAL);
    cr_assert_eq(diskcache_put(dc, &v, CH, data, 2 * CH), -EINVAL);
    cr_assert_eq(stats(dc).held_bytes, 0);
    free(data);
    diskcache_close(dc);
}

/* another version of the same path (new ETag, same size) is never served */
Test(diskcache, only_the_exact_version)
{
    struct diskcache *dc = open_cache(64ull << 20, 0);
    unsigned char *data = pattern(CH, 3), got[64];
    struct diskcache_version v1 = {"ck/x", "\"old\"", CH}, v2 = {"ck/x", "\"new\"", CH};
    struct diskcache_version v3 = {"ck/x", "\"old\"", CH - 1}, v4 = {"ck/y", "\"old\"", CH};
    cr_assert_eq(diskcache_put(dc, &v1, 0, data, CH), 0);
    cr_assert_eq(diskcache_read(dc, &v1, 0, sizeof got, got), 1);
    cr_assert_eq(diskcache_read(dc, &v2, 0, sizeof got, got), 0);
    cr_assert_eq(diskcache_read(dc, &v3, 0, sizeof got, got), 0);
    cr_assert_eq(diskcache_read(dc, &v4, 0, sizeof got, got), 0);
    free(data);
    diskcache_close(dc);
}

/* what was put is there after close and open (an unmount and a remount) */
Test(diskcache, survives_reopen)
{
    struct diskcache *dc = open_cache(64ull << 20, 0);
    unsigned char *data = pattern(2 * CH, 4), *got = malloc(2 * CH);
    struct diskcache_version v = {"s/f", "\"e\"", 2 * CH};
    cr_assert_eq(diskcache_put(dc, &v, 0, data, 2 * CH), 0);
    diskcache_close(dc);
    dc = open_cache(64ull << 20, 0);
    cr_assert_eq(stats(dc).held_bytes, 2 * CH, "totals recounted at open");
    cr_assert_eq(stats(dc).objects, 1);
    cr_assert_eq(diskcache_read(dc, &v, 0, 2 * CH, got), 1);
    cr_assert_arr_eq(got, data, 2 * CH);
    free(data);
    free(got);
    diskcache_close(dc);
}

/* Flip one bit of the byte at `at` of the one data file in the cache. */
static void flip_byte_of_only_data_file(off_t at)
{
    char data_dir[300], path[600] = "";
    snprintf(data_dir, sizeof data_dir, "%s/data", dir);
    DIR *d = opendir(data_dir);
    cr_assert_not_null(d);
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.')
            snprintf(path, sizeof path, "%s/%s", data_dir, e->d_name);
    closedir(d);
    cr_assert(*path, "no data file in %s", data_dir);
    int fd = open(path, O_RDWR);
    cr_assert_geq(fd, 0);
    unsigned char b;
    cr_assert_eq(pread(fd, &b, 1, at), 1);
    b ^= 0x01;
    cr_assert_eq(pwrite(fd, &b, 1, at), 1);
    close(fd);
}

/* a flipped byte in a cached chunk is caught by its checksum: a miss, the
 * chunk is dropped (counted), the other chunks still serve, and a new put
 * of the chunk serves again */
Test(diskcache, flipped_byte_is_a_miss_and_dropped)
{
    struct diskcache *dc = open_cache(64ull << 20, 0);
    unsigned char *data = pattern(2 * CH, 5), *got = malloc(2 * CH);
    struct diskcache_version v = {"c/f", "\"e\"", 2 * CH};
    cr_assert_eq(diskcache_put(dc, &v, 0, data, 2 * CH), 0);
    flip_byte_of_only_data_file(CH + 777);
    cr_assert_eq(diskcache_read(dc, &v, CH, 100, got), 0, "a bad chunk must not be served");
    struct diskcache_stats st = stats(dc);
    cr_assert_eq(st.checksum_failures, 1);
    cr_assert_eq(st.held_bytes, CH, "the bad chunk is no longer held");
    cr_assert_eq(diskcache_read(dc, &v, 0, CH, got), 1, "the good chunk still serves");
    cr_assert_arr_eq(got, data, CH);
    cr_assert_eq(diskcache_read(dc, &v, CH, 100, got), 0);
    cr_assert_eq(stats(dc).checksum_failures, 1, "dropped once, then simply missing");
    cr_assert_eq(diskcache_put(dc, &v, CH, data + CH, CH), 0);
    cr_assert_eq(diskcache_read(dc, &v, CH, CH, got), 1);
    cr_assert_arr_eq(got, data + CH, CH);
    free(data);
    free(got);
    diskcache_close(dc);
}

/* a second user of the same folder is refused with a clear error */
Test(diskcache, second_user_refused)
{
    struct diskcache *dc = open_cache(64ull << 20, 0);
    struct diskcache_config cfg = {.capacity = 1 << 20};
    struct diskcache *other = NULL;
    cr_assert_eq(diskcache_open(dir, &cfg, &other, err, sizeof err), -EBUSY);
    char pid[32];
    snprintf(pid, sizeof pid, "pid %d", (int)getpid());
    cr_assert(strstr(err, pid) && strstr(err, "--cache-dir"), "error: %s", err);
    diskcache_close(dc);
    cr_assert_eq(diskcache_open(dir, &cfg, &other, err, sizeof err), 0, "free after close");
    diskcache_close(other);
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* never more than the capacity: the least recently used object goes first,
 * and a read counts as a use */
Test(diskcache, capacity_evicts_least_recently_used)
{
    struct diskcache *dc = open_cache(3ull * CH, 0);
    unsigned char *data = pattern(CH, 6), got[16];
    struct diskcache_version v[4] = {
        {"l/0", "\"e\"", CH}, {"l/1", "\"e\"", CH}, {"l/2", "\"e\"", CH}, {"l/3", "\"e\"", CH}};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(diskcache_put(dc, &v[i], 0, data, CH), 0);
        sleep_ms(150);
    }
    cr_assert_eq(diskcache_read(dc, &v[0], 0, sizeof got, got), 1); /* 0 is now the newest */
    cr_assert_eq(diskcache_put(dc, &v[3], 0, data, CH), 0);
    struct diskcache_stats st = stats(dc);
    cr_assert_leq(st.held_bytes, 3ull * CH);
    cr_assert_eq(st.evictions, 1);
    cr_assert_eq(diskcache_read(dc, &v[1], 0, sizeof got, got), 0, "1 was the oldest");
    cr_assert_eq(diskcache_read(dc, &v[0], 0, sizeof got, got), 1, "0 was read: kept");
    cr_assert_eq(diskcache_read(dc, &v[2], 0, sizeof got, got), 1);
    cr_assert_eq(diskcache_read(dc, &v[3], 0, sizeof got, got), 1);
    free(data);
    diskcache_close(dc);
}

/* an object larger than the capacity is not kept, and nothing fails loudly */
Test(diskcache, too_large_is_refused)
{
    struct diskcache *dc = open_cache(CH, 0);
    unsigned char *data = pattern(2 * CH, 7), got[16];
    struct diskcache_version v = {"big", "\"e\"", 2 * CH};
    cr_assert_eq(diskcache_put(dc, &v, 0, data, 2 * CH), -ENOSPC);
    cr_assert_eq(diskcache_read(dc, &v, 0, sizeof got, got), 0);
    cr_assert_eq(stats(dc).put_failures, 1);
    cr_assert_eq(stats(dc).held_bytes, 0);
    free(data);
    diskcache_close(dc);
}

/* a disk above its free-space floor keeps nothing: puts fail (counted),
 * reads miss, nothing else breaks */
Test(diskcache, free_space_floor)
{
    struct diskcache *dc = open_cache(64ull << 20, 100);
    unsigned char *data = pattern(CH, 8), got[16];
    struct diskcache_version v = {"f", "\"e\"", CH};
    cr_assert_eq(diskcache_put(dc, &v, 0, data, CH), -ENOSPC);
    cr_assert_eq(diskcache_read(dc, &v, 0, sizeof got, got), 0);
    cr_assert_eq(stats(dc).put_failures, 1);
    free(data);
    diskcache_close(dc);
}

/* a staged file is taken whole (renamed in, src gone) and serves every
 * byte; a file of the wrong size is refused and left in place */
Test(diskcache, adopt_a_staged_file)
{
    struct diskcache *dc = open_cache(64ull << 20, 0);
    size_t size = 2 * CH + 5;
    unsigned char *data = pattern(size, 9), *got = malloc(size);
    char src[400];
    snprintf(src, sizeof src, "%s/staged", dir);
    int fd = open(src, O_WRONLY | O_CREAT, 0600);
    cr_assert_eq(write(fd, data, size), (ssize_t)size);
    close(fd);
    struct diskcache_version wrong = {"w", "\"e\"", size + 1};
    cr_assert_eq(diskcache_adopt(dc, &wrong, src), -EINVAL);
    cr_assert_eq(access(src, F_OK), 0, "src stays when refused");
    struct diskcache_version v = {"w", "\"e\"", size};
    cr_assert_eq(diskcache_adopt(dc, &v, src), 0);
    cr_assert_neq(access(src, F_OK), 0, "src was taken");
    cr_assert_eq(diskcache_read(dc, &v, 0, size, got), 1);
    cr_assert_arr_eq(got, data, size);
    struct diskcache_stats st = stats(dc);
    cr_assert_eq(st.adopted_files, 1);
    cr_assert_eq(st.held_bytes, size);
    free(data);
    free(got);
    diskcache_close(dc);
}

/* drop forgets a version and its bytes */
Test(diskcache, drop)
{
    struct diskcache *dc = open_cache(64ull << 20, 0);
    unsigned char *data = pattern(CH, 10), got[16];
    struct diskcache_version v = {"d", "\"e\"", CH};
    cr_assert_eq(diskcache_put(dc, &v, 0, data, CH), 0);
    cr_assert_eq(diskcache_drop(dc, &v), 0);
    cr_assert_eq(diskcache_read(dc, &v, 0, sizeof got, got), 0);
    cr_assert_eq(stats(dc).held_bytes, 0);
    cr_assert_eq(stats(dc).objects, 0);
    free(data);
    diskcache_close(dc);
}

/* a writer killed with SIGKILL while filling leaves a cache that serves only
 * complete chunks with the right bytes */
Test(diskcache, killed_writer_leaves_only_verified_chunks)
{
    enum { N = 64 };
    size_t size = (size_t)N * CH;
    struct diskcache_version v = {"k/f", "\"e\"", size};
    int ready[2];
    cr_assert_eq(pipe(ready), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        struct diskcache_config cfg = {.capacity = 1ull << 30};
        struct diskcache *dc = NULL;
        if (diskcache_open(dir, &cfg, &dc, err, sizeof err) != 0)
            _exit(3);
        unsigned char *data = pattern(size, 11);
        for (int round = 0;; round++) /* over and over, until killed */
            for (int i = 0; i < N; i++) {
                diskcache_put(dc, &v, (uint64_t)i * CH, data + (size_t)i * CH, CH);
                if (round == 0 && i == N / 2 && write(ready[1], "r", 1) != 1)
                    _exit(4);
            }
    }
    close(ready[1]);
    char r;
    cr_assert_eq(read(ready[0], &r, 1), 1, "the writer is filling the cache");
    close(ready[0]);
    sleep_ms(50);
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    cr_assert(WIFSIGNALED(status), "the writer ran until killed (status %d)", status);
    struct diskcache *dc = open_cache(1ull << 30, 0);
    unsigned char *want = pattern(size, 11), *got = malloc(CH);
    int served = 0;
    for (int i = 0; i < N; i++)
        if (diskcache_read(dc, &v, (uint64_t)i * CH, CH, got) == 1) {
            cr_assert_arr_eq(got, want + (size_t)i * CH, CH, "chunk %d", i);
            served++;
        }
    cr_assert_gt(served, 0, "the writer got some chunks in");
    cr_assert_eq(stats(dc).checksum_failures, 0);
    free(want);
    free(got);
    diskcache_close(dc);
}

/* A catalogue left unreadable (a power cut with unsynced commits): the cache
 * starts afresh, empty, instead of failing to open. */
Test(diskcache, unreadable_catalogue_starts_afresh)
{
    struct diskcache *dc = open_cache(64ull << 20, 0);
    unsigned char *data = pattern(CH, 5), *got = malloc(CH);
    struct diskcache_version v = {"s/f", "\"e\"", CH};
    cr_assert_eq(diskcache_put(dc, &v, 0, data, CH), 0);
    diskcache_close(dc);
    char path[512];
    snprintf(path, sizeof path, "%s/catalog/data.mdb", dir);
    int fd = open(path, O_WRONLY);
    cr_assert(fd >= 0);
    char junk[8192];
    memset(junk, 0x5a, sizeof junk);
    cr_assert_eq(pwrite(fd, junk, sizeof junk, 0), (ssize_t)sizeof junk);
    close(fd);
    dc = open_cache(64ull << 20, 0);
    cr_assert_eq(stats(dc).held_bytes, 0);
    cr_assert_eq(diskcache_read(dc, &v, 0, CH, got), 0);
    cr_assert_eq(diskcache_put(dc, &v, 0, data, CH), 0, "usable again");
    cr_assert_eq(diskcache_read(dc, &v, 0, CH, got), 1);
    free(data);
    free(got);
    diskcache_close(dc);
}

/* a fetch's range partly held: the held chunks are copied (checked), and
 * [lo, hi) spans the missing ones, from the first to the end of the last;
 * one miss counted, however many chunks were missing */
Test(diskcache, read_held_leaves_the_missing_span)
{
    struct diskcache *dc = open_cache(64ull << 20, 0);
    size_t size = 5 * CH;
    unsigned char *data = pattern(size, 20), *got = calloc(1, size);
    struct diskcache_version v = {"h/f", "\"e\"", size};
    cr_assert_eq(diskcache_put(dc, &v, 0, data, CH), 0);
    cr_assert_eq(diskcache_put(dc, &v, 2 * CH, data + 2 * CH, CH), 0);
    cr_assert_eq(diskcache_put(dc, &v, 4 * CH, data + 4 * CH, CH), 0);
    size_t lo, hi;
    cr_assert_eq(diskcache_read_held(dc, &v, 100, size - 200, got, &lo, &hi), 0);
    cr_assert_eq(lo, CH - 100);
    cr_assert_eq(hi, 4 * CH - 100, "to the end of the last missing chunk");
    cr_assert_arr_eq(got, data + 100, CH - 100);
    cr_assert_arr_eq(got + 4 * CH - 100, data + 4 * CH, CH - 100);
    cr_assert_eq(stats(dc).misses, 1);
    cr_assert_eq(stats(dc).hits, 0);
    cr_assert_eq(diskcache_read_held(dc, &v, 2 * CH + 5, 100, got, &lo, &hi), 1);
    cr_assert_eq(lo, hi);
    cr_assert_arr_eq(got, data + 2 * CH + 5, 100);
    cr_assert_eq(stats(dc).hits, 1);
    free(data);
    free(got);
    diskcache_close(dc);
}

/* a check reads a chunk in pieces: a byte flipped in its last piece (or in
 * any piece past the first) fails it as one in its first does */
Test(diskcache, file_check_covers_every_piece_of_a_chunk)
{
    struct diskcache *dc = open_cache(64ull << 20, 0);
    unsigned char *data = pattern(2 * CH, 23);
    struct diskcache_version v = {"q/f", "\"e\"", 2 * CH};
    cr_assert_eq(diskcache_put(dc, &v, 0, data, 2 * CH), 0);
    flip_byte_of_only_data_file(2 * CH - 1); /* chunk 1's last byte */
    flip_byte_of_only_data_file(CH / 2 + 5); /* a middle piece of chunk 0 */
    struct diskcache_file *f = NULL;
    cr_assert_eq(diskcache_file_open(dc, &v, &f), 1);
    cr_assert_eq(diskcache_file_verify(f, CH, 1), 0, "chunk 1's flipped last byte");
    cr_assert_eq(diskcache_file_verify(f, 0, 1), 0, "chunk 0's flipped middle byte");
    diskcache_file_close(f);
    cr_assert_eq(stats(dc).checksum_failures, 2);
    cr_assert_eq(stats(dc).held_bytes, 0);
    free(data);
    diskcache_close(dc);
}

/* a version looked up for reads in place: its held chunks are served from
 * its data file once checked; a chunk not held, or whose byte was flipped,
 * is not (the flipped one is dropped from the catalogue); the look-up is
 * shared by the next open (no second check of a checked chunk) */
Test(diskcache, file_serves_checked_chunks_in_place)
{
    struct diskcache *dc = open_cache(64ull << 20, 0);
    size_t size = 3 * CH + 10;
    unsigned char *data = pattern(size, 21), *got = malloc(size);
    struct diskcache_version v = {"p/f", "\"e\"", size};
    cr_assert_eq(diskcache_put(dc, &v, 0, data, 2 * CH), 0);
    cr_assert_eq(diskcache_put(dc, &v, 3 * CH, data + 3 * CH, 10), 0);
    struct diskcache_file *f = NULL;
    struct diskcache_version other = {"p/f", "\"x\"", size};
    cr_assert_eq(diskcache_file_open(dc, &other, &f), 0, "another version: nothing held");
    cr_assert_eq(diskcache_file_open(dc, &v, &f), 1);
    cr_assert_eq(diskcache_file_holds(f, 0, 2 * CH), 1);
    cr_assert_eq(diskcache_file_holds(f, CH, 2 * CH), 0, "chunk 2 was never put");
    cr_assert_eq(diskcache_file_verify(f, 5, 2 * CH - 10), 1);
    cr_assert_eq(pread(diskcache_file_fd(f), got, 2 * CH, 0), (ssize_t)(2 * CH));
    cr_assert_arr_eq(got, data, 2 * CH);
    cr_assert_eq(diskcache_file_verify(f, 3 * CH, 10), 1, "the short last chunk");
    cr_assert_eq(diskcache_file_verify(f, 2 * CH, 1), 0);
    cr_assert_eq(stats(dc).hit_bytes, 2 * CH + 10);
    diskcache_file_close(f);
    cr_assert_eq(diskcache_file_open(dc, &v, &f), 1);
    cr_assert_eq(diskcache_file_verify(f, 0, 2 * CH), 1);
    cr_assert_eq(stats(dc).hit_bytes, 2 * CH + 10, "checked chunks in the page cache: not again");
    flip_byte_of_only_data_file(CH + 3); /* a write: the data file's mtime moves */
    cr_assert_eq(diskcache_file_verify(f, CH, 10), 0, "a flipped byte is never served");
    cr_assert_eq(diskcache_file_holds(f, CH, 10), 0);
    diskcache_file_close(f);
    cr_assert_eq(stats(dc).checksum_failures, 1);
    cr_assert_eq(stats(dc).held_bytes, CH + 10, "the bad chunk is no longer held");
    free(data);
    free(got);
    diskcache_close(dc);
}
