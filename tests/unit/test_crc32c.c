/*
 * tests/unit/test_crc32c.c - CRC-32C: the standard check value, the
 * instruction and the table agree, and a checksum continues across pieces.
 */
#include "crc32c.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

/* "123456789" has the CRC-32C check value 0xE3069283 (RFC 3720, B.4) */
Test(crc32c, check_value)
{
    cr_assert_eq(crc32c(0, "123456789", 9), 0xE3069283u);
    cr_assert_eq(crc32c_portable(0, "123456789", 9), 0xE3069283u);
    cr_assert_eq(crc32c(0, "", 0), 0u);
}

/* 32 zero bytes: 0x8A9136AA (RFC 3720, B.4) */
Test(crc32c, zeros)
{
    unsigned char z[32] = {0};
    cr_assert_eq(crc32c(0, z, sizeof z), 0x8A9136AAu);
}

/* every length and alignment up to 64: the dispatched version equals the
 * table, and crc(a ++ b) == crc(crc(a), b) */
Test(crc32c, agree_and_continue)
{
    unsigned char buf[256];
    srand(7);
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (unsigned char)rand();
    for (size_t at = 0; at < 8; at++)
        for (size_t len = 0; len <= 64; len++) {
            uint32_t whole = crc32c_portable(0, buf + at, len);
            cr_assert_eq(crc32c(0, buf + at, len), whole, "at %zu len %zu", at, len);
            for (size_t cut = 0; cut <= len; cut += 5)
                cr_assert_eq(crc32c(crc32c(0, buf + at, cut), buf + at + cut, len - cut), whole);
        }
}

/* one flipped bit changes it */
Test(crc32c, detects_a_flipped_bit)
{
    unsigned char buf[4096];
    memset(buf, 0x5a, sizeof buf);
    uint32_t before = crc32c(0, buf, sizeof buf);
    buf[1234] ^= 0x10;
    cr_assert_neq(crc32c(0, buf, sizeof buf), before);
}

/* long buffers (the instruction's three streams of 2 KiB blocks, joined):
 * every length around the block multiples agrees with the table, and a
 * flipped bit in any of the three blocks changes it */
Test(crc32c, long_buffers_agree)
{
    size_t size = 3 * 6144 + 64 + 8; /* the longest length at the last offset */
    unsigned char *buf = malloc(size);
    cr_assert_not_null(buf);
    srand(11);
    for (size_t i = 0; i < size; i++)
        buf[i] = (unsigned char)rand();
    size_t lens[] = {6143, 6144, 6145, 6151, 12288, 12289, 18431, 18432, 18433, 18440, 18496};
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++)
        for (size_t at = 0; at < 3; at++) {
            uint32_t want = crc32c_portable(0x1234u, buf + at, lens[k]);
            cr_assert_eq(crc32c(0x1234u, buf + at, lens[k]), want, "len %zu at %zu", lens[k], at);
        }
    uint32_t before = crc32c(0, buf, 6144);
    for (size_t flip = 5; flip < 6144; flip += 2048) {
        buf[flip] ^= 0x40;
        cr_assert_neq(crc32c(0, buf, 6144), before, "flip at %zu", flip);
        buf[flip] ^= 0x40;
    }
    free(buf);
}
