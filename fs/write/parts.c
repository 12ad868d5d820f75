/*
 * fs/write/parts.c - multipart geometry: tiers of 1000 parts, sizes doubling per
 * tier up to the 5 GiB part limit (see parts.h).
 */
#include "parts.h"

#include "store.h"

static uint64_t tier_part_size(uint64_t base, uint32_t tier)
{
    uint64_t size = base;
    for (uint32_t t = 0; t < tier && size < STORE_MAX_PART; t++)
        size *= 2;
    return size < STORE_MAX_PART ? size : STORE_MAX_PART;
}

uint64_t parts_size(uint64_t base, uint32_t number)
{
    return tier_part_size(base, (number - 1) / PARTS_PER_TIER);
}

uint64_t parts_offset(uint64_t base, uint32_t number)
{
    uint32_t tier = (number - 1) / PARTS_PER_TIER;
    uint64_t off = 0;
    for (uint32_t t = 0; t < tier; t++)
        off += PARTS_PER_TIER * tier_part_size(base, t);
    return off + (uint64_t)((number - 1) % PARTS_PER_TIER) * tier_part_size(base, tier);
}

uint32_t parts_at(uint64_t base, uint64_t off)
{
    uint32_t tier = 0;
    for (;;) {
        uint64_t span = PARTS_PER_TIER * tier_part_size(base, tier);
        if (off < span)
            return tier * PARTS_PER_TIER + (uint32_t)(off / tier_part_size(base, tier)) + 1;
        off -= span;
        tier++;
    }
}

uint32_t parts_count(uint64_t base, uint64_t size)
{
    return size ? parts_at(base, size - 1) : 0;
}

uint64_t parts_max_object(uint64_t base)
{
    return parts_offset(base, STORE_MAX_PARTS) + parts_size(base, STORE_MAX_PARTS);
}
