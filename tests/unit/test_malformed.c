/*
 * tests/unit/test_malformed.c - every input of the shared
 * malformed/MANIFEST gives its expected outcome through the library entry
 * points (dcp_parse, st_parse, ckpt_load + range checks): an error code and
 * message, never a crash (run under ASan/UBSan in the sanitizer build).
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dcp.h"
#include "load.h"
#include "safetensors.h"
#include "test_util.h"

/* ---- a minimal local ckpt_io ------------------------------------------ */

static char *join(void *ctx, const char *p)
{
    return ckpt_path_join(ctx, p);
}

static int l_stat(void *ctx, const char *path, uint64_t *size, int *is_dir)
{
    char *p = join(ctx, path);
    struct stat st;
    int rc = stat(p, &st) ? -errno : 0;
    free(p);
    if (!rc) {
        *size = (uint64_t)st.st_size;
        *is_dir = S_ISDIR(st.st_mode);
    }
    return rc;
}

static int l_read(void *ctx, const char *path, uint64_t off, void *buf, size_t len, size_t *nr)
{
    char *p = join(ctx, path);
    int fd = open(p, O_RDONLY);
    free(p);
    if (fd < 0)
        return -errno;
    ssize_t n = pread(fd, buf, len, (off_t)off);
    close(fd);
    if (n < 0)
        return -EIO;
    *nr = (size_t)n;
    return 0;
}

static int l_list(void *ctx, const char *dir, ckpt_io_list_fn fn, void *arg)
{
    char *p = join(ctx, dir);
    DIR *d = opendir(p);
    if (!d) {
        free(p);
        return -errno;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' && (!e->d_name[1] || (e->d_name[1] == '.' && !e->d_name[2])))
            continue;
        char *q = ckpt_path_join(p, e->d_name);
        struct stat st;
        int ok = stat(q, &st) == 0;
        free(q);
        if (ok && fn(arg, e->d_name, S_ISDIR(st.st_mode), (uint64_t)st.st_size))
            break;
    }
    closedir(d);
    free(p);
    return 0;
}

/* 0 accepted, else the error code */
static int outcome(const char *dir, const char *name, struct ckpt_err *err)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    size_t l = strlen(name);
    if (name[l - 1] == '/') {
        struct ckpt_io io = {path, l_stat, l_read, l_list, NULL, NULL};
        struct ckpt *c;
        int rc = ckpt_load(&io, "", NULL, &c, err);
        if (rc)
            return rc;
        /* the directory cases fail the range/presence checks */
        int bad = 0;
        for (uint32_t f = 0; f < c->nfiles; f++) {
            const struct ckpt_file *fi = &c->files[f];
            if (fi->present != 1)
                bad = 1;
            for (uint32_t k = 0; k < fi->nitems && fi->present == 1; k++) {
                const struct ckpt_item *it = &c->items[fi->items[k]];
                if (it->offset + it->length > fi->size)
                    bad = 1;
            }
        }
        ckpt_free(c);
        return bad ? CKPT_EINVALID : 0;
    }
    size_t n;
    char *b = slurp(path, &n);
    char *exact = malloc(n ? n : 1); /* exact-size copy: ASan sees any overread */
    memcpy(exact, b, n);
    free(b);
    int rc;
    if (l > 12 && strcmp(name + l - 12, ".safetensors") == 0) {
        struct st_header *h = NULL;
        rc = st_parse(exact, n, n, &h, err);
        st_free(h);
    } else {
        struct ckpt *c = NULL;
        rc = dcp_parse(exact, n, NULL, &c, err);
        ckpt_free(c);
    }
    free(exact);
    return rc;
}

#define NO_OUTCOME 1

/* What the library does with the inputs the MANIFEST lets it accept or
 * reject: 0 = accepted, else the error code. */
static int documented_outcome(const char *name)
{
    static const struct {
        const char *name;
        int code;
    } table[] = {
        {"pkl_trailing_garbage.metadata", 0},         /* as pickle.load: bytes after STOP ignored */
        {"pkl_self_ref_list.metadata", CKPT_EFORMAT}, /* a list, not a Metadata */
        {"pkl_protocol0_metadata.metadata", CKPT_EOPCODE}, /* DCP writes protocol >= 2 only */
        {"pkl_protocol1_metadata.metadata", CKPT_EOPCODE},
        {"dcp_storage_orphan.metadata", CKPT_EINVALID},        /* storage for an unknown fqn */
        {"dcp_duplicate_storage_key.metadata", CKPT_EINVALID}, /* rejected, not last-wins */
        {"st_trailing_bytes.safetensors", CKPT_EINVALID},      /* bytes no tensor owns */
    };
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
        if (strcmp(name, table[i].name) == 0)
            return table[i].code;
    return NO_OUTCOME;
}

Test(malformed, manifest)
{
    char dir[512], mpath[600];
    snprintf(dir, sizeof(dir), "%s/malformed", CKPTFS_FIXTURES);
    snprintf(mpath, sizeof(mpath), "%s/MANIFEST", dir);
    FILE *m = fopen(mpath, "r");
    cr_assert_not_null(m);
    char line[1024];
    int n = 0;
    while (fgets(line, sizeof(line), m)) {
        if (line[0] == '#' || line[0] == '\n')
            continue;
        char *name = strtok(line, "\t"), *expect = strtok(NULL, "\t");
        cr_assert_not_null(expect);
        struct ckpt_err err;
        ckpt_err_clear(&err);
        int rc = outcome(dir, name, &err);
        if (strcmp(expect, "reject") == 0 || strcmp(expect, "reject-or-limit") == 0) {
            cr_assert(rc < 0, "%s was accepted", name);
            if (name[strlen(name) - 1] != '/')
                cr_assert(err.msg[0], "%s: no message", name);
        } else {
            /* "accept-or-reject" / "reject-or-last-wins": the MANIFEST allows
             * either; the library's choice is pinned here (and documented
             * by this table), so a change of it is noticed. */
            int want = documented_outcome(name);
            cr_assert_neq(want, NO_OUTCOME, "%s (%s): no documented outcome", name, expect);
            cr_assert_eq(rc, want, "%s (%s): %d, documented %d (%s)", name, expect, rc, want,
                         err.msg);
        }
        if (rc && err.code)
            cr_assert_eq(rc, err.code, "%s: rc %d vs err %d", name, rc, err.code);
        n++;
    }
    fclose(m);
    cr_assert_eq(n, 89, "MANIFEST has %d entries", n);
}

Test(malformed, specific_codes)
{
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/malformed", CKPTFS_FIXTURES);
    static const struct {
        const char *name;
        int code;
    } cases[] = {
        {"pkl_truncated_half.metadata", CKPT_ETRUNC},
        {"pkl_bad_opcode_ff.metadata", CKPT_EOPCODE},
        {"pkl_unknown_global.metadata", CKPT_EGLOBAL},
        {"pkl_nested_lists_100k.metadata", CKPT_ELIMIT},
        {"pkl_mark_flood.metadata", CKPT_ELIMIT},
        {"pkl_binget_undefined.metadata", CKPT_EMEMO},
        {"pkl_not_metadata_dict.metadata", CKPT_EFORMAT},
        {"dcp_path_traversal.metadata", CKPT_EINVALID},
        {"dcp_path_nul.metadata", CKPT_EINVALID},
        {"dcp_offset_length_overflow.metadata", CKPT_EINVALID},
        {"dcp_offset_huge_long.metadata", CKPT_EINVALID},
        {"dcp_chunk_out_of_bounds.metadata", CKPT_EINVALID},
        {"dcp_chunk_without_storage.metadata", CKPT_EINVALID},
        {"dcp_duplicate_storage_key.metadata", CKPT_EINVALID},
        {"dcp_storage_orphan.metadata", CKPT_EINVALID},
        {"dcp_properties_is_str.metadata", CKPT_ETYPE},
        {"dcp_unknown_dtype.metadata", CKPT_EGLOBAL},
        {"st_offsets_overlap.safetensors", CKPT_EINVALID},
        {"st_deep_json.safetensors", CKPT_EFORMAT},
        {"st_header_len_huge.safetensors", CKPT_ELIMIT},
        {"pkl_trailing_garbage.metadata", 0},
        {"dcp-missing-shard/", CKPT_EINVALID},
        {"dcp-offset-out-of-range/", CKPT_EINVALID},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct ckpt_err err;
        ckpt_err_clear(&err);
        int rc = outcome(dir, cases[i].name, &err);
        cr_assert_eq(rc, cases[i].code, "%s: %d (%s)", cases[i].name, rc, err.msg);
    }
}

/* Inputs the fuzzers once crashed on (tests/data/fuzz-regress): every
 * parser must now handle them without a sanitizer report. */
Test(malformed, fuzz_regressions)
{
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/fuzz-regress", CKPTFS_TEST_DATA);
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "%s", dir);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char path[1024];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        size_t len;
        char *b = slurp(path, &len);
        char *exact = malloc(len ? len : 1);
        memcpy(exact, b, len);
        free(b);
        struct ckpt_err err;
        struct pkl_options o;
        pkl_options_default(&o);
        o.lim.min_protocol = 0;
        struct pkl_doc *doc = NULL;
        if (pkl_parse(exact, len, &o, &doc, &err) == 0) {
            char out[256];
            pkl_repr(doc->root, out, sizeof(out), 32, 256);
            pkl_free(doc);
        }
        struct ckpt *c = NULL;
        if (dcp_parse(exact, len, NULL, &c, &err) == 0) {
            for (uint32_t i = 0; i < c->nitems; i++)
                if (c->items[i].length)
                    cr_assert_neq(ckpt_item_at(c, c->items[i].file, c->items[i].offset), CKPT_NONE,
                                  "%s", e->d_name);
            ckpt_free(c);
        }
        struct st_header *h = NULL;
        if (st_parse(exact, len, len, &h, &err) == 0) {
            /* accepted tensors hold exactly numel * itemsize bytes, the
             * product computed without wrapping (a shape could make a
             * 128-bit product wrap to the byte count) */
            for (uint32_t t = 0; t < h->ntensors; t++) {
                const struct st_tensor *x = &h->tensors[t];
                unsigned __int128 bits = x->elem_bits;
                int zero = 0, over = 0;
                for (uint32_t d = 0; d < x->ndim; d++) {
                    uint64_t u = (uint64_t)x->shape[d];
                    if (!u)
                        zero = 1;
                    else if (bits > ((unsigned __int128)1 << 68) / u)
                        over = 1;
                    else
                        bits *= u;
                }
                if (zero)
                    bits = 0;
                cr_assert(!(over && !zero) && bits % 8 == 0 && bits / 8 == x->end - x->begin,
                          "%s: '%s' byte count does not match its shape", e->d_name, x->name);
            }
            const char *name = "model.safetensors";
            struct ckpt *sc = NULL;
            if (st_build_ckpt(&name, &h, 1, NULL, &sc, &err) == 0)
                ckpt_free(sc);
            st_free(h);
        }
        struct st_index *ix = NULL;
        if (st_index_parse(exact, len, &ix, &err) == 0)
            st_index_free(ix);
        free(exact);
        n++;
    }
    closedir(d);
    cr_assert(n >= 2);
}

/* l_list, but the subdirectory "private" cannot be listed (EACCES). */
static int private_list(void *ctx, const char *dir, ckpt_io_list_fn fn, void *arg)
{
    return strcmp(dir, "private") == 0 ? -EACCES : l_list(ctx, dir, fn, arg);
}

static int count_found(void *arg, const char *dir, int format)
{
    (void)dir;
    (void)format;
    ++*(int *)arg;
    return 0;
}

Test(malformed, a_walk_skips_a_subdirectory_it_may_not_list)
{
    /* index rebuild over a tree with one private directory (lost+found, a
     * colleague's 0700 run) used to stop there and index nothing */
    char root[] = "/tmp/ckptfs-walk-XXXXXX", p[256];
    cr_assert_not_null(mkdtemp(root));
    snprintf(p, sizeof p, "%s/private", root);
    cr_assert_eq(mkdir(p, 0700), 0);
    snprintf(p, sizeof p, "%s/zz", root);
    cr_assert_eq(mkdir(p, 0700), 0);
    snprintf(p, sizeof p, "%s/zz/.metadata", root);
    int fd = open(p, O_CREAT | O_WRONLY, 0600);
    cr_assert(fd >= 0);
    close(fd);
    struct ckpt_io io = {root, l_stat, l_read, private_list, NULL, NULL};
    int found = 0;
    cr_assert_eq(ckpt_find(&io, "", 4, count_found, &found), 0);
    cr_assert_eq(found, 1, "the checkpoint after the private directory was not found");
    cr_assert_eq(ckpt_find(&io, "private", 4, count_found, &found), -EACCES,
                 "an unreadable root is an error");
    unlink(p);
    snprintf(p, sizeof p, "%s/zz", root);
    rmdir(p);
    snprintf(p, sizeof p, "%s/private", root);
    rmdir(p);
    rmdir(root);
}
