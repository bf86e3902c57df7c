// posix.cpp: the no-accelerator backend. Page-locks with mlock(2).
//
// This is honest OS page-locking: the pages are resident and stay resident (VmLck in
// /proc/self/status counts them). It is NOT DMA registration for a GPU: a device copy engine
// gains little from mlock alone (H200 D2H into mlock'd memory 14-16 GB/s vs 52-55 GB/s into
// registered memory, DeepSpeed PR #8283, vendor-abi.md "POSIX page-locking").
//
// Facts used (vendor-abi.md, mlock(2)): Linux rounds the address down to a page; errno
// ENOMEM means the range is not fully mapped or the lock would pass RLIMIT_MEMLOCK without
// CAP_IPC_LOCK; EAGAIN means some pages could not be locked; locks do not nest: one munlock
// unlocks a page however often it was locked.
//
// Because locks do not nest, two registrations that share a page (neither is page-aligned)
// must not unlock each other's page. Registrations never overlap byte-wise (the registry
// enforces it), so only the first and last page of a registration can be shared; pages in
// between belong to it alone. Those edge pages are reference-counted here; interior pages
// are locked and unlocked without any lock held.
#include <pthread.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/backend.hpp"
#include "core/memory_map.hpp"

namespace hostreg {
namespace {

// mlock(2) / munlock(2) as system calls: sanitizer runtimes (ASan, TSan) replace the libc
// wrappers with no-ops, which would make every success here a lie under a sanitizer build.
int lock_pages(uintptr_t addr, size_t len) {
    return static_cast<int>(syscall(SYS_mlock, addr, len));
}
int unlock_pages(uintptr_t addr, size_t len) {
    return static_cast<int>(syscall(SYS_munlock, addr, len));
}

// Does this process hold CAP_IPC_LOCK (bit 14 of CapEff)?
bool has_cap_ipc_lock() {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line)) {
        if (line.rfind("CapEff:", 0) == 0) {
            unsigned long long caps = std::strtoull(line.c_str() + 7, nullptr, 16);
            return (caps >> 14) & 1ULL;
        }
    }
    return false;
}

// The Status for a failed mlock of [first, first+len), explaining the cause.
Status lock_failure(int err, uintptr_t first, size_t len) {
    char range[64];
    std::snprintf(range, sizeof range, "0x%zx+%zu", static_cast<size_t>(first), len);
    std::string what = std::string("mlock(") + range + ") failed: " + std::strerror(err);
    if (err == ENOMEM) {
        if (!range_mapped(first, len))
            return Status::error(hostregErrorInvalidValue,
                                 what + ": the range is not (fully) mapped memory", err);
        if (range_has_no_access_pages(first, len))
            return Status::error(hostregErrorInvalidValue,
                                 what + ": the range includes pages with no access (PROT_NONE)", err);
        struct rlimit rl {};
        getrlimit(RLIMIT_MEMLOCK, &rl);
        if (!has_cap_ipc_lock() && rl.rlim_cur != RLIM_INFINITY)
            return Status::error(
                hostregErrorMemoryAllocation,
                what + ": locking it would exceed RLIMIT_MEMLOCK (" +
                    std::to_string(rl.rlim_cur / 1024) +
                    " KiB, see `ulimit -l`) and the process lacks CAP_IPC_LOCK; raise the "
                    "limit (ulimit -l unlimited, docker --ulimit memlock=-1) or grant "
                    "CAP_IPC_LOCK",
                err);
        return Status::error(hostregErrorMemoryAllocation, what + ": the kernel is out of memory",
                             err);
    }
    if (err == EPERM)
        return Status::error(hostregErrorNotPermitted, what + ": not permitted", err);
    if (err == EINVAL) return Status::error(hostregErrorInvalidValue, what, err);
    return Status::error(hostregErrorMemoryAllocation, what + ": some pages could not be locked",
                         err);
}

// Reference counts of the pages that registrations may share (their first and last page).
// Leaked on purpose, like the registry: finalizers may unregister during process exit.
struct EdgePages {
    std::mutex mu;
    std::unordered_map<uintptr_t, unsigned> refs;
};
EdgePages& edges() {
    static EdgePages* e = [] {
        auto* p = new EdgePages();
        // A forked child inherits no memory lock (mlock(2)): it starts with no edge page held.
        pthread_atfork([] { edges().mu.lock(); }, [] { edges().mu.unlock(); },
                       [] {
                           edges().refs.clear();
                           edges().mu.unlock();
                       });
        return p;
    }();
    return *e;
}

// Pages of a registration: the first and last page (equal for a one-page range) and the
// exclusively owned interior between them.
struct Pages {
    uintptr_t first, last;  // page starts, first <= last
    uintptr_t interior() const { return first + page_size(); }
    size_t interior_len() const { return last > first ? last - first - page_size() : 0; }
};

Pages pages_of(void* ptr, size_t bytes) {
    const auto lo = reinterpret_cast<uintptr_t>(ptr);
    const uintptr_t mask = ~(page_size() - 1);
    return Pages{lo & mask, (lo + bytes - 1) & mask};
}

// Drops one reference to each edge page; unlocks those no registration holds any more.
// Caller holds edges().mu.
void release_edges(const Pages& p) {
    for (uintptr_t pg : {p.first, p.last}) {
        auto it = edges().refs.find(pg);
        if (--it->second == 0) {
            unlock_pages(pg, page_size());  // ENOMEM if unmapped: no lock left
            edges().refs.erase(it);
        }
        if (p.first == p.last) break;
    }
}

Status posix_probe() { return Status::ok(); }

std::string posix_describe() {
    struct rlimit rl {};
    getrlimit(RLIMIT_MEMLOCK, &rl);
    return std::string("mlock(2); RLIMIT_MEMLOCK ") +
           (rl.rlim_cur == RLIM_INFINITY ? "unlimited" : std::to_string(rl.rlim_cur / 1024) + " KiB") +
           (has_cap_ipc_lock() ? ", CAP_IPC_LOCK held" : ", no CAP_IPC_LOCK");
}

Status posix_register(void* ptr, size_t bytes, unsigned /*flags*/, void** device_ptr) {
    const Pages p = pages_of(ptr, bytes);
    if (p.interior_len() && lock_pages(p.interior(), p.interior_len()) != 0) {
        const int err = errno;
        // Linux locks the mapped pages before a hole, then answers ENOMEM: undo that (the
        // registry checked the range was mapped, so a hole means it was unmapped meanwhile).
        // Other failures (RLIMIT_MEMLOCK) lock nothing, and the caller's own locks stay.
        if (!range_mapped(p.interior(), p.interior_len()))
            unlock_pages(p.interior(), p.interior_len());
        return lock_failure(err, p.interior(), p.interior_len());
    }
    {
        std::lock_guard<std::mutex> g(edges().mu);
        for (uintptr_t pg : {p.first, p.last}) {
            // Locked even when another registration already holds the page: mlock is
            // idempotent, and that holder may be stale (memory unmapped while registered).
            if (lock_pages(pg, page_size()) != 0) {
                const int err = errno;
                if (pg == p.last && p.last != p.first) release_edges(Pages{p.first, p.first});
                if (p.interior_len()) unlock_pages(p.interior(), p.interior_len());
                return lock_failure(err, pg, page_size());
            }
            ++edges().refs[pg];
            if (p.first == p.last) break;
        }
    }
    *device_ptr = ptr;  // the CPU is the device: its address is the host address
    return Status::ok();
}

Status posix_unregister(void* ptr, size_t bytes) {
    const Pages p = pages_of(ptr, bytes);
    // munlock fails with ENOMEM only where the memory was unmapped meanwhile, which already
    // dropped its lock; the registration is gone either way.
    if (p.interior_len()) unlock_pages(p.interior(), p.interior_len());
    std::lock_guard<std::mutex> g(edges().mu);
    release_edges(p);
    return Status::ok();
}

}  // namespace

extern const Backend kPosixBackend = {
    /*name=*/"posix",
    /*supported=*/HOSTREG_HOST_REGISTER_PORTABLE | HOSTREG_HOST_REGISTER_MAPPED |
        HOSTREG_HOST_REGISTER_READ_ONLY,
    /*max_registration=*/SIZE_MAX,
    /*probe=*/posix_probe,
    /*describe=*/posix_describe,
    /*host_register=*/posix_register,
    /*host_unregister=*/posix_unregister,
};

}  // namespace hostreg
