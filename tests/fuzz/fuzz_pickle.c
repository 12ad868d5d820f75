/*
 * tests/fuzz/fuzz_pickle.c - libFuzzer target for the pickle reader.
 * Every input is parsed twice (DCP defaults, and protocol 0/1 allowed with
 * small limits so limit paths are reached); accepted documents are rendered
 * with pkl_repr under a node budget. Any crash, sanitizer report, leak or
 * inconsistent error is a bug.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pickle.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(const uint8_t *data, size_t size, const struct pkl_options *o)
{
    struct pkl_doc *doc = NULL;
    struct ckpt_err err;
    int rc = pkl_parse(data, size, o, &doc, &err);
    if (rc) {
        if (doc || err.code != rc || !err.msg[0] || (err.pos != CKPT_NOPOS && err.pos > size))
            abort();
        return;
    }
    if (!doc || !doc->root || doc->end > size || doc->end == 0)
        abort();
    char buf[2048];
    pkl_repr(doc->root, buf, sizeof(buf), 64, 4096);
    if (strlen(buf) >= sizeof(buf))
        abort();
    pkl_free(doc);
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
