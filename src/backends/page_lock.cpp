// page_lock.cpp: see page_lock.hpp.
#include "backends/page_lock.hpp"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "core/memory_map.hpp"

namespace hostreg {

// mlock(2) / munlock(2) as system calls: sanitizer runtimes (ASan, TSan) replace the libc
// wrappers with no-ops, which would make every success here a lie under a sanitizer build.
int lock_pages(uintptr_t addr, size_t len) { return static_cast<int>(syscall(SYS_mlock, addr, len)); }
int unlock_pages(uintptr_t addr, size_t len) { return static_cast<int>(syscall(SYS_munlock, addr, len)); }

namespace {

// The value of field `key` ("CapEff:", "VmLck:") in /proc/self/status, in `base`; 0 if absent.
unsigned long long status_field(const char* key, int base) {
    std::ifstream f("/proc/self/status");
    std::string line;
    const size_t n = std::strlen(key);
    while (std::getline(f, line))
        if (line.compare(0, n, key) == 0) return std::strtoull(line.c_str() + n, nullptr, base);
    return 0;
}

}  // namespace

// Does this process hold CAP_IPC_LOCK (bit 14 of CapEff)?
bool has_cap_ipc_lock() { return (status_field("CapEff:", 16) >> 14) & 1ULL; }

namespace {

// What to do about RLIMIT_MEMLOCK (limit: its soft value), the end of every message about it.
std::string memlock_advice(rlim_t limit) {
    return "RLIMIT_MEMLOCK (" + std::to_string(limit / 1024) +
           " KiB, see `ulimit -l`) and the process lacks CAP_IPC_LOCK; raise the "
           "limit (ulimit -l unlimited, docker --ulimit memlock=-1) or grant "
           "CAP_IPC_LOCK";
}

// The Status for a failed mlock of [first, first+len), explaining the cause.
Status lock_failure(int err, uintptr_t first, size_t len) {
    char range[64];
    std::snprintf(range, sizeof range, "0x%zx+%zu", static_cast<size_t>(first), len);
    std::string what = std::string("mlock(") + range + ") failed: " + std::strerror(err);
    if (err == ENOMEM) {
        if (!range_mapped(first, len))
            return Status::error(hostregErrorInvalidValue, what + ": the range is not (fully) mapped memory", err);
        if (range_has_no_access_pages(first, len))
            return Status::error(hostregErrorInvalidValue,
                                 what + ": the range includes pages with no access (PROT_NONE)", err);
        if (range_past_file_end(first, len))
            return Status::error(
                hostregErrorInvalidValue,
                what + ": the range maps a file past the end of the file (any access there is a SIGBUS)", err);
        struct rlimit rl{};
        getrlimit(RLIMIT_MEMLOCK, &rl);
        if (!has_cap_ipc_lock() && rl.rlim_cur != RLIM_INFINITY)
            return Status::error(hostregErrorMemoryAllocation,
                                 what + ": locking it would exceed " + memlock_advice(rl.rlim_cur), err);
        return Status::error(hostregErrorMemoryAllocation, what + ": the kernel is out of memory", err);
    }
    if (err == EPERM) return Status::error(hostregErrorNotPermitted, what + ": not permitted", err);
    if (err == EINVAL) return Status::error(hostregErrorInvalidValue, what, err);
    return Status::error(hostregErrorMemoryAllocation, what + ": some pages could not be locked", err);
}

}  // namespace

Status lock_room(size_t len) {
    struct rlimit rl{};
    if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY || has_cap_ipc_lock()) return Status::ok();
    const unsigned long long held = status_field("VmLck:", 10) * 1024, limit = rl.rlim_cur;  // kB there
    if (held <= limit && len <= limit - held) return Status::ok();
    return Status::error(hostregErrorMemoryAllocation,
                         "locking " + with_commas(len) + " more bytes (" + with_commas(held) +
                             " are locked already) would exceed " + memlock_advice(rl.rlim_cur),
                         ENOMEM);
}

Status lock_range(uintptr_t addr, size_t len, bool undo) {
    if (lock_pages(addr, len) == 0) return Status::ok();
    const int err = errno;
    if (undo && range_vm_locked(addr, len)) unlock_pages(addr, len);  // marked, maybe partly locked: undo
    return lock_failure(err, addr, len);
}

}  // namespace hostreg
