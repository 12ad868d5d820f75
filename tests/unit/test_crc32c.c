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
