// page_lock.hpp: the OS's page-locking, for the backends that lock pages themselves (posix;
// ze, whose import does not promise the pages are pinned before the GPU first uses them).
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/status.hpp"

namespace hostreg {

// mlock(2) / munlock(2) of [addr, addr + len), as system calls: sanitizer runtimes (ASan,
// TSan) replace the libc wrappers with no-ops, which would make every success a lie under a
// sanitizer build. Return 0, or -1 with errno set.
int lock_pages(uintptr_t addr, size_t len);
int unlock_pages(uintptr_t addr, size_t len);

// Does this process hold CAP_IPC_LOCK (bit 14 of CapEff in /proc/self/status)?
bool has_cap_ipc_lock();

// The Status for mlock of [first, first + len) failing with errno err, naming the cause:
// 1 for memory that is not mapped or has no access (PROT_NONE), 2 for RLIMIT_MEMLOCK
// (with the limit and the fix) or the kernel out of memory, 800 for EPERM.
Status lock_failure(int err, uintptr_t first, size_t len);

}  // namespace hostreg
