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

// Locks [addr, addr + len) (whole pages), or answers why not with nothing left locked. mlock
// marks the mappings of the range VM_LOCKED before it faults pages in, and stops at the first
// page it cannot fault (a PROT_NONE page, a shared mapping past the end of its file, memory
// unmapped meanwhile), leaving the marks and the pages before it locked: when any mapping of
// the range is marked after a failure, the whole range is unlocked. (Locks do not nest: a lock
// the caller had on those pages itself goes with them, as it would on unregister.) Errors: 1 for
// memory that is not mapped, has no access or lies past the end of its file; 2 for
// RLIMIT_MEMLOCK (with the limit and the fix) or the kernel out of memory; 800 for EPERM.
// undo false: leave the range as it is on failure (it is already locked for someone else, as
// an edge page a neighbouring registration holds).
Status lock_range(uintptr_t addr, size_t len, bool undo = true);

// Whether len more bytes may be locked now: 2 (with the limit, what is locked and the fix)
// when RLIMIT_MEMLOCK would refuse them (the process lacks CAP_IPC_LOCK and VmLck plus len
// exceeds the soft limit), else ok. Nothing is locked: it answers before any memory is made.
Status lock_room(size_t len);

}  // namespace hostreg
