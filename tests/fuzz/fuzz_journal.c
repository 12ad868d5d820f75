/*
 * tests/fuzz/fuzz_journal.c - libFuzzer target for the crash journal's
 * record decoder (fs/write/journal.c): a damaged record on disk must be refused,
 * never trusted or overrun. Every accepted record must encode back to the
 * very same bytes (so nothing in it was misread).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "journal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct journal_part parts[STORE_MAX_PARTS];
    char *scratch = malloc(size + 64);
    struct journal_rec r;
    if (!scratch)
        return 0;
    int rc = journal_decode(data, size, &r, parts, STORE_MAX_PARTS, scratch, size + 64);
    if (rc == 0) {
        size_t n = journal_encoded_size(&r);
        unsigned char *again = malloc(n ? n : 1);
        if (!again || n != size || journal_encode(&r, again, n) != n || memcmp(again, data, n) != 0)
            abort();
        free(again);
    } else if (rc != -22) { /* -EINVAL is the only refusal */
        abort();
    }
    free(scratch);
    return 0;
}
