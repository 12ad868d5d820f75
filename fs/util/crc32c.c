/*
 * fs/util/crc32c.c - CRC-32C, reflected polynomial 0x82F63B78: slicing by 8
 * tables built once, and the x86-64 crc32 instruction chosen at run time
 * (three streams at once over long buffers).
 */
#include "crc32c.h"

#include <pthread.h>
#include <string.h>

#define POLY 0x82F63B78u

static uint32_t table[8][256];
static pthread_once_t table_once = PTHREAD_ONCE_INIT;

static void build_table(void)
{
    for (uint32_t n = 0; n < 256; n++) {
        uint32_t c = n;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? (c >> 1) ^ POLY : c >> 1;
        table[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; n++)
        for (int t = 1; t < 8; t++)
            table[t][n] = (table[t - 1][n] >> 8) ^ table[0][table[t - 1][n] & 0xff];
}

uint32_t crc32c_portable(uint32_t crc, const void *buf, size_t len)
{
    pthread_once(&table_once, build_table);
    const unsigned char *p = buf;
    crc = ~crc;
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8); /* little-endian hosts only (x86-64, aarch64) */
        w ^= crc;
        crc = table[7][w & 0xff] ^ table[6][(w >> 8) & 0xff] ^ table[5][(w >> 16) & 0xff] ^
              table[4][(w >> 24) & 0xff] ^ table[3][(w >> 32) & 0xff] ^ table[2][(w >> 40) & 0xff] ^
              table[1][(w >> 48) & 0xff] ^ table[0][w >> 56];
        p += 8;
        len -= 8;
    }
    while (len--)
        crc = (crc >> 8) ^ table[0][(crc ^ *p++) & 0xff];
    return ~crc;
}

#if defined(__x86_64__)
/* The crc32 instruction takes 3 cycles and can start one a cycle: three
 * streams over three blocks of STREAM_BLOCK bytes run at once, then are
 * joined (a register advanced over a block's length of zero bytes is linear
 * in the register: shift_table). */
#define STREAM_BLOCK 2048

static uint32_t shift_table[4][256]; /* byte k of a register, advanced over STREAM_BLOCK zeros */
static pthread_once_t shift_once = PTHREAD_ONCE_INIT;

__attribute__((target("sse4.2"))) static uint64_t advance_zeros(uint64_t c)
{
    for (int i = 0; i < STREAM_BLOCK / 8; i++)
        c = __builtin_ia32_crc32di(c, 0);
    return c;
}

static void build_shift_table(void)
{
    for (int k = 0; k < 4; k++)
        for (uint32_t b = 0; b < 256; b++)
            shift_table[k][b] = (uint32_t)advance_zeros((uint64_t)b << (8 * k));
}

static uint64_t shift_block(uint64_t c)
{
    return shift_table[0][c & 0xff] ^ shift_table[1][(c >> 8) & 0xff] ^
           shift_table[2][(c >> 16) & 0xff] ^ shift_table[3][(c >> 24) & 0xff];
}

__attribute__((target("sse4.2"))) static uint32_t crc32c_sse42(uint32_t crc, const void *buf,
                                                               size_t len)
{
    const unsigned char *p = buf;
    uint64_t c = ~crc;
    if (len >= 3 * STREAM_BLOCK) {
        pthread_once(&shift_once, build_shift_table);
        while (len >= 3 * STREAM_BLOCK) {
            uint64_t c1 = 0, c2 = 0;
            for (int i = 0; i < STREAM_BLOCK; i += 8) {
                uint64_t w0, w1, w2;
                memcpy(&w0, p + i, 8);
                memcpy(&w1, p + STREAM_BLOCK + i, 8);
                memcpy(&w2, p + 2 * STREAM_BLOCK + i, 8);
                c = __builtin_ia32_crc32di(c, w0);
                c1 = __builtin_ia32_crc32di(c1, w1);
                c2 = __builtin_ia32_crc32di(c2, w2);
            }
            c = shift_block(shift_block(c) ^ c1) ^ c2;
            p += 3 * STREAM_BLOCK;
            len -= 3 * STREAM_BLOCK;
        }
    }
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        c = __builtin_ia32_crc32di(c, w);
        p += 8;
        len -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (len--)
        c32 = __builtin_ia32_crc32qi(c32, *p++);
    return ~c32;
}
#endif

uint32_t crc32c(uint32_t crc, const void *buf, size_t len)
{
#if defined(__x86_64__)
    if (__builtin_cpu_supports("sse4.2"))
        return crc32c_sse42(crc, buf, len);
#endif
    return crc32c_portable(crc, buf, len);
}
