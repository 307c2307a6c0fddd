/* The C functions the guest shares with kvcxl/cxl/ring.py (hand-written: code, not tables);
 * the numbers are in the generated kvcxl_ring.h, included here. */
#ifndef KVCXL_PATTERN_H
#define KVCXL_PATTERN_H

#include "kvcxl_ring.h"

/* Byte pattern of KV entry `id` (and of the data-path areas): 64-bit word k.  The Python
 * side is kvcxl.cxl.ring.pattern (tests/test_qemu_ring.py compares the two). */
static inline uint64_t kvcxl_pattern(uint32_t seed, uint32_t id, uint64_t k)
{
    uint64_t z = ((uint64_t)seed << 32 | id) * 0x9e3779b97f4a7c15ull + k * 0xd1b54a32d192ed03ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

#endif
