// memory_map.hpp: what the kernel says about an address range of this process.
#pragma once

#include <cstddef>
#include <cstdint>

namespace hostreg {

size_t page_size();

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
