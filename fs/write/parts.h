/*
 * fs/write/parts.h - where the parts of a multipart upload lie in an object.
 *
 * Parts are cut from the start of the object by offset alone, so a part's
 * range is known before the file's final size is (the uploader streams
 * parts while the trainer is still writing). Sizes grow in tiers so that no
 * object needs more than STORE_MAX_PARTS parts: parts 1..1000 are `base`
 * bytes, 1001..2000 twice that, and so on, doubling every 1000 parts and
 * capped at STORE_MAX_PART. With the default base of 8 MiB an object of up
 * to ~8 TiB fits (S3 objects stop at 5 TiB); objects up to 7.8 GiB use
 * equal parts. Pure functions.
 */
#ifndef CKPTFS_PARTS_H
#define CKPTFS_PARTS_H

#include <stdint.h>

#define PARTS_PER_TIER 1000u

/* Size of part `number` (1-based) for the given base part size. */
uint64_t parts_size(uint64_t base, uint32_t number);

/* First byte of part `number` (1-based). */
uint64_t parts_offset(uint64_t base, uint32_t number);

/* The part holding byte off (1-based); may exceed STORE_MAX_PARTS when off is
 * beyond parts_max_object(). */
uint32_t parts_at(uint64_t base, uint64_t off);

/* Parts that an object of size bytes is cut into (0 for an empty object). */
uint32_t parts_count(uint64_t base, uint64_t size);

/* The largest object STORE_MAX_PARTS parts of this geometry hold. */
uint64_t parts_max_object(uint64_t base);

#endif
