/*
 * tests/fuzz/fuzz_pickle.c - libFuzzer target for the pickle reader.
 * Every input is parsed twice (DCP defaults, and protocol 0/1 allowed with
 * small limits so limit paths are reached); accepted documents are rendered
 * with pkl_repr under a node budget. Each parse is repeated in fold mode
 * (pkl_options.fold, dcp.c's fast path), which may accept only what the
 * plain parse accepts, with the same value count. Any crash, sanitizer report, leak or inconsistent
 * error is a bug.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pickle.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Parse and check; returns the result code, *nvalues the values made. */
static int check_one(const uint8_t *data, size_t size, const struct pkl_options *o, size_t *nvalues)
{
    struct pkl_doc *doc = NULL;
    struct ckpt_err err;
    int rc = pkl_parse(data, size, o, &doc, &err);
    *nvalues = 0;
    if (rc) {
        if (doc || err.code != rc || !err.msg[0] || (err.pos != CKPT_NOPOS && err.pos > size))
            abort();
        return rc;
    }
    *nvalues = doc->nvalues;
    if (!doc || !doc->root || doc->end > size || doc->end == 0)
        abort();
    char buf[2048];
    pkl_repr(doc->root, buf, sizeof(buf), 64, 4096);
    if (strlen(buf) >= sizeof(buf))
        abort();
    pkl_free(doc);
    return 0;
}

static void check(const uint8_t *data, size_t size, struct pkl_options *o)
{
    size_t n0, n1;
    o->fold = 0;
    int r0 = check_one(data, size, o, &n0);
    o->fold = 1;
    int r1 = check_one(data, size, o, &n1);
    o->fold = 0;
    /* what fold mode accepts, the plain parse accepts, with as many values
     * (except that fold mode needs less memory than max_memory counts);
     * fold mode refuses to change a folded record (BUILD, APPEND, SETITEM
     * on it: CKPT_ETYPE), which the plain parse would do */
    if (r1 == 0 && r0 != CKPT_ELIMIT && (r0 != 0 || n0 != n1))
        abort();
    if (r1 != 0 && r0 == 0 && r1 != CKPT_ETYPE)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct pkl_options o;
    pkl_options_default(&o);
    check(data, size, &o);
    o.lim.min_protocol = 0;
    o.lim.max_stack = 256;
    o.lim.max_marks = 16;
    o.lim.max_memo = 1024;
    o.lim.max_container = 512;
    o.lim.max_memory = 8u << 20;
    o.lim.max_globals = 8;
    o.lim.allow_trailing = 0;
    check(data, size, &o);
    return 0;
}
