/*
 * fs/util/crc32c.h - CRC-32C (Castagnoli), the checksum of the disk cache's
 * chunks: the SSE 4.2 instruction where the CPU has it, else a table.
 */
#ifndef CKPTFS_CRC32C_H
#define CKPTFS_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* The CRC-32C of len bytes at buf, continuing from crc (0 to start):
 * crc32c(crc32c(0, a), b) == crc32c(0, a followed by b). */
uint32_t crc32c(uint32_t crc, const void *buf, size_t len);

/* The table version, whatever the CPU has (the tests compare the two). */
uint32_t crc32c_portable(uint32_t crc, const void *buf, size_t len);

#endif
