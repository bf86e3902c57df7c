// memory_map.hpp: what the kernel says about an address range of this process.
#pragma once

#include <cstddef>
#include <cstdint>

namespace hostreg {

size_t page_size();

// Is every page of [lo, lo + bytes) mapped? (mincore answers ENOMEM for a hole.)
bool range_mapped(uintptr_t lo, size_t bytes);

// Does [lo, lo + bytes) include pages mapped without any access (PROT_NONE)? Reads
// /proc/self/maps: for explaining failures only, not for hot paths.
bool range_has_no_access_pages(uintptr_t lo, size_t bytes);

}  // namespace hostreg
