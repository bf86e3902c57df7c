// memory_map.hpp: what the kernel says about an address range of this process.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/status.hpp"

namespace hostreg {

size_t page_size();

// CUDA's first rule for a host range, for every call that takes one: ok, or 1
// (cudaErrorInvalidValue) naming the fault: a NULL pointer, 0 bytes, or a range that wraps
// past the end of the address space.
Status check_range(const void* ptr, size_t bytes);

// Is every page of [lo, lo + bytes) mapped? (mincore answers ENOMEM for a hole.)
bool range_mapped(uintptr_t lo, size_t bytes);

// The functions below read /proc/self/maps or smaps: for explaining and undoing failures
// only, not for hot paths.

// Does [lo, lo + bytes) include pages mapped without any access (PROT_NONE)?
bool range_has_no_access_pages(uintptr_t lo, size_t bytes);

// Does [lo, lo + bytes) include pages of a file mapping that lie past the end of the file
// (where any access is a SIGBUS)?
bool range_past_file_end(uintptr_t lo, size_t bytes);

// Does any mapping (VMA) that [lo, lo + bytes) touches carry VM_LOCKED ("lo" in VmFlags)?
// mlock marks the VMAs of its range before it faults pages in, and a failure part-way leaves
// the marks (and the pages it locked) behind.
bool range_vm_locked(uintptr_t lo, size_t bytes);

}  // namespace hostreg
