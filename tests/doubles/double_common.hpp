// double_common.hpp: machinery shared by hostreg's vendor TEST DOUBLES.
//
// A test double is a small shared library that exports a vendor runtime's documented C ABI
// (CUDA driver, HIP, AscendCL, MUSA) and enforces that vendor's documented rules strictly,
// so that hostreg's backends can be tested on a machine with no accelerator. It is NOT the
// vendor's library. Facts come from /work/shared/reference/vendor-abi.md; each double names
// the vendor header behind its rules.
//
// What lives here (each double is one translation unit that includes this header once):
//   - knobs: HOSTREG_DOUBLE_DEVICES (device count, default 1), read from the environment
//     at every call so that tests can change it with setenv;
//   - Registry: the double's live registrations (base -> bytes, raw flags, device address,
//     kind), thread-safe, with overlap detection (any shared byte) and REAL locking: mlock
//     of the page-rounded range on register; on unregister munlock of only those pages that
//     no other live registration of this double still covers (mlock locks do not nest);
//   - Recorder: how often each exported vendor function was called, and the raw flags of
//     every register call;
//   - the inspection API every double exports for tests (extern "C", see the end).
//
// Each double is its own shared library built with -fvisibility=hidden: everything here is
// private to it, so two doubles loaded into one process keep separate state. They do share
// the process's page locks, though: tests give each double its own buffers.
#pragma once

#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <vector>

// Marks a symbol the double exports (everything else is hidden).
#define HRD_EXPORT extern "C" __attribute__((visibility("default")))

namespace hostreg_double {

// ---------------------------------------------------------------------------------------
// Pages

inline uintptr_t page_size() {
    static const uintptr_t size = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    return size;
}
inline uintptr_t page_down(uintptr_t a) { return a & ~(page_size() - 1); }
inline uintptr_t page_up(uintptr_t a) { return page_down(a + page_size() - 1); }

// mlock(2)/munlock(2) through syscall(2): ASan/TSan/MSan intercept the libc wrappers and
// turn them into no-ops, which would make a sanitizer build of the double lie about
// locking. Both return 0 or -1 with errno set.
inline int lock_pages(uintptr_t lo, uintptr_t hi) {
    return static_cast<int>(syscall(SYS_mlock, lo, hi - lo));
}
inline int unlock_pages(uintptr_t lo, uintptr_t hi) {
    return static_cast<int>(syscall(SYS_munlock, lo, hi - lo));
}

// True when [base, base + bytes) runs past the end of the address space (or so close to it
// that rounding the end up to a page would).
inline bool wraps(uintptr_t base, size_t bytes) {
    const uintptr_t max = UINTPTR_MAX;
    return bytes > max - base || base + bytes > max - page_size();
}

// ---------------------------------------------------------------------------------------
// Knobs

constexpr int kMaxDevices = 64;

// HOSTREG_DOUBLE_DEVICES: how many devices the double pretends to have. Default 1 (unset,
// empty or not a number); clamped to [0, kMaxDevices]. Read at every call.
inline int knob_devices() {
    const char* text = std::getenv("HOSTREG_DOUBLE_DEVICES");
    if (!text || !*text) return 1;
    char* end = nullptr;
    long n = std::strtol(text, &end, 10);
    if (*end != '\0') return 1;
    if (n < 0) return 0;
    return n > kMaxDevices ? kMaxDevices : static_cast<int>(n);
}

// A boolean knob: set to "1".
inline bool knob_on(const char* name) {
    const char* text = std::getenv(name);
    return text && text[0] == '1' && text[1] == '\0';
}

// ---------------------------------------------------------------------------------------
// Call recording

class Recorder {
public:
    void call(const char* function) {
        std::lock_guard<std::mutex> lock(mu_);
        ++calls_[function];
    }
    // The raw flags (or AscendCL V1 type) a register call received, valid or not.
    void register_flags(unsigned flags) {
        std::lock_guard<std::mutex> lock(mu_);
        last_flags_ = flags;
        flags_log_.push_back(flags);
    }
    // Calls of one function, or of all functions when function is NULL.
    long calls(const char* function) const {
        std::lock_guard<std::mutex> lock(mu_);
        if (!function) {
            long total = 0;
            for (const auto& entry : calls_) total += entry.second;
            return total;
        }
        auto it = calls_.find(function);
        return it == calls_.end() ? 0 : it->second;
    }
    unsigned last_flags() const {
        std::lock_guard<std::mutex> lock(mu_);
        return last_flags_;
    }
    long flags_log(unsigned* out, long capacity) const {
        std::lock_guard<std::mutex> lock(mu_);
        for (long i = 0; out && i < capacity && i < static_cast<long>(flags_log_.size()); ++i)
            out[i] = flags_log_[static_cast<size_t>(i)];
        return static_cast<long>(flags_log_.size());
    }
    void reset() {
        std::lock_guard<std::mutex> lock(mu_);
        calls_.clear();
        last_flags_ = 0;
        flags_log_.clear();
    }

private:
    mutable std::mutex mu_;
    std::map<std::string, long> calls_;
    unsigned last_flags_ = 0;
    std::vector<unsigned> flags_log_;
};

// The double's one recorder; never destroyed, so calls during process exit still work.
inline Recorder& recorder() {
    static Recorder* r = new Recorder;
    return *r;
}

// First statement of every exported vendor function: counts the call under its own name.
#define HRD_RECORD_CALL() ::hostreg_double::recorder().call(__func__)

// ---------------------------------------------------------------------------------------
// Registrations

struct Registration {
    uintptr_t base = 0;
    size_t bytes = 0;
    unsigned flags = 0;      // raw flags (or V1 type) as the vendor call received them
    uintptr_t device = 0;    // device address of base; 0 when the vendor maps none
    const char* kind = "";   // static text, e.g. "coarse-grained" (HIP), "pinned" (ACL)
};

class Registry {
public:
    enum class Result {
        Ok,
        Overlap,     // some byte of the range is already registered
        LockFailed,  // mlock failed; errno in *error
        NotLive,     // remove: not the base of a live registration
    };

    // Records reg and locks its pages. The caller has rejected NULL, 0 bytes and ranges
    // that wrap. The lock is held across mlock so that no concurrent remove() can decide
    // to unlock a page this registration is about to share.
    Result add(const Registration& reg, int* error) {
        std::lock_guard<std::mutex> lock(mu_);
        const uintptr_t end = reg.base + reg.bytes;
        auto below_end = regs_.lower_bound(end);  // first registration starting at/after end
        if (below_end != regs_.begin()) {
            // Registrations never overlap, so the last one starting below end also ends
            // last: the range is free iff that one ends at or before base.
            const Registration& prev = std::prev(below_end)->second;
            if (prev.base + prev.bytes > reg.base) return Result::Overlap;
        }
        const uintptr_t lo = page_down(reg.base), hi = page_up(end);
        if (lock_pages(lo, hi) != 0) {
            if (error) *error = errno;
            // Linux may lock part of the range before it fails (e.g. at a hole): undo
            // that, sparing pages the neighbours hold.
            unlock_unshared(reg.base, reg.bytes);
            return Result::LockFailed;
        }
        regs_.emplace(reg.base, reg);
        return Result::Ok;
    }

    // Forgets the registration whose base is exactly base and unlocks its pages that no
    // other registration covers.
    Result remove(uintptr_t base) {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = regs_.find(base);
        if (it == regs_.end()) return Result::NotLive;
        const size_t bytes = it->second.bytes;
        regs_.erase(it);
        unlock_unshared(base, bytes);
        return Result::Ok;
    }

    // The live registration containing address p (any byte of it).
    bool find(uintptr_t p, Registration* out) const {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = regs_.upper_bound(p);
        if (it == regs_.begin()) return false;
        --it;
        if (p - it->second.base >= it->second.bytes) return false;
        if (out) *out = it->second;
        return true;
    }

    long live() const {
        std::lock_guard<std::mutex> lock(mu_);
        return static_cast<long>(regs_.size());
    }

private:
    // munlock the pages of [base, base + bytes), a range not (or no longer) in regs_,
    // except a first or last page that a neighbouring registration also touches. Since
    // registrations never share a byte, only the nearest neighbour on each side can share
    // an edge page. Called with mu_ held.
    void unlock_unshared(uintptr_t base, size_t bytes) {
        uintptr_t lo = page_down(base), hi = page_up(base + bytes);
        auto next = regs_.lower_bound(base);
        if (next != regs_.begin()) {
            const Registration& prev = std::prev(next)->second;
            if (page_down(prev.base + prev.bytes - 1) == lo) lo += page_size();
        }
        if (next != regs_.end() && page_down(next->second.base) == hi - page_size())
            hi -= page_size();
        if (lo < hi) unlock_pages(lo, hi);  // ENOMEM at a hole: nothing was locked there
    }

    mutable std::mutex mu_;
    std::map<uintptr_t, Registration> regs_;  // base -> registration; never intersecting
};

// The double's one registry; never destroyed.
inline Registry& registry() {
    static Registry* r = new Registry;
    return *r;
}

}  // namespace hostreg_double

// ---------------------------------------------------------------------------------------
// Inspection API for tests (not part of any vendor ABI). Defined here because every double
// is one translation unit that includes this header exactly once.

// How many times the exported vendor function `symbol` was called since the last reset
// (all vendor functions together when symbol is NULL).
HRD_EXPORT long hostreg_double_calls(const char* symbol) {
    return hostreg_double::recorder().calls(symbol);
}

// The raw flags (AscendCL V1: the type) of the last register call, valid or not; 0 if none
// since the last reset.
HRD_EXPORT unsigned hostreg_double_last_flags(void) {
    return hostreg_double::recorder().last_flags();
}

// Live registrations in the double.
HRD_EXPORT long hostreg_double_live(void) { return hostreg_double::registry().live(); }

// Zeroes the call counters and forgets the recorded flags; registrations stay.
HRD_EXPORT void hostreg_double_reset(void) { hostreg_double::recorder().reset(); }

// Extra: the raw flags of every register call since the last reset, oldest first. Copies up
// to capacity of them into out (may be NULL) and returns how many there are.
HRD_EXPORT long hostreg_double_flags_log(unsigned* out, long capacity) {
    return hostreg_double::recorder().flags_log(out, capacity);
}

// Extra: the kind the double recorded for the live registration containing ptr ("" when the
// vendor has no such notion; "coarse-grained"/"fine-grained" for HIP; "mapped", "pinned" or
// "pinned+mapped" for AscendCL), or NULL when ptr is not registered.
HRD_EXPORT const char* hostreg_double_kind(const void* ptr) {
    hostreg_double::Registration reg;
    if (!hostreg_double::registry().find(reinterpret_cast<uintptr_t>(ptr), &reg)) return nullptr;
    return reg.kind;
}
