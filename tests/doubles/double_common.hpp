// double_common.hpp: machinery shared by hostreg's vendor TEST DOUBLES.
//
// A test double is a small shared library that exports a vendor runtime's documented C ABI
// (CUDA driver, HIP, AscendCL, Level Zero, MUSA) and behaves as that vendor's published
// headers and runtime sources show, strictly where they are silent, so that hostreg's
// backends can be tested on a machine with no accelerator. It is NOT the vendor's library.
// Each double names the vendor files it models (docs/vendors.md collects the facts).
//
// What lives here (each double is one translation unit that includes this header once):
//   - knobs: HOSTREG_DOUBLE_DEVICES (device count, default 1), read from the environment
//     at every call so that tests can change it with setenv;
//   - Registry: the double's live registrations (base -> bytes, raw flags, device address,
//     owner, kind), thread-safe, with overlap detection (any shared byte; or overlaps kept,
//     as ROCr does) and REAL locking: mlock of the page-rounded range on register; on
//     unregister munlock of only those pages that no other live registration of this double
//     still covers (mlock locks do not nest); a Locking::None registration is only recorded,
//     as AscendCL records a PINNED-only range on drivers without pin-register support;
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

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <utility>
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
inline int lock_pages(uintptr_t lo, uintptr_t hi) { return static_cast<int>(syscall(SYS_mlock, lo, hi - lo)); }
inline int unlock_pages(uintptr_t lo, uintptr_t hi) { return static_cast<int>(syscall(SYS_munlock, lo, hi - lo)); }

// True when [base, base + bytes) runs past the end of the address space (or so close to it
// that rounding the end up to a page would).
inline bool wraps(uintptr_t base, size_t bytes) {
    const uintptr_t max = UINTPTR_MAX;
    return bytes > max - base || base + bytes > max - page_size();
}

// ---------------------------------------------------------------------------------------
// Knobs

constexpr int kMaxDevices = 64;

// One entry of a runtime's table of error names and texts (cuGetErrorName/String,
// hipGetErrorName/String, musaGetErrorName/String), as its headers and sources give them.
struct ErrorText {
    long long code;
    const char* name;
    const char* text;
};

// The entry of `table` for `code`, or nullptr when the table has none.
template <size_t N>
const ErrorText* find_error(const ErrorText (&table)[N], long long code) {
    for (const ErrorText& e : table)
        if (e.code == code) return &e;
    return nullptr;
}

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
            for (const auto& entry : calls_)
                total += entry.second;
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
    unsigned flags = 0;     // raw flags (or V1 type) as the vendor call received them
    uintptr_t device = 0;   // device address of base; 0 when the vendor maps none
    uintptr_t owner = 0;    // who made it (CUDA: the context); 0 if the vendor has no notion
    bool locked = true;     // false: recorded only, no page locked
    const char* kind = "";  // static text, e.g. "io-memory" (HIP), "pinned" (ACL)
};

class Registry {
  public:
    enum class Result {
        Ok,
        Overlap,     // some byte of the range is already registered
        LockFailed,  // mlock failed; errno in *error
        NotLive,     // remove: not the base of a live registration (of that owner)
    };
    enum class Overlaps { Refuse, Keep };

    // Records reg and, if reg.locked, locks its pages. The caller has rejected NULL, 0 bytes
    // and ranges that wrap. Overlaps::Keep records a range that overlaps others (ROCr keeps
    // overlapping locks); an identical base is then not recorded twice. The lock is held
    // across mlock so that no concurrent remove() can decide to unlock a page this
    // registration is about to share.
    Result add(const Registration& reg, int* error, Overlaps overlaps = Overlaps::Refuse) {
        std::lock_guard<std::mutex> lock(mu_);
        if (overlaps == Overlaps::Refuse && overlapping(reg.base, reg.base + reg.bytes)) return Result::Overlap;
        if (reg.locked && lock_pages(page_down(reg.base), page_up(reg.base + reg.bytes)) != 0) {
            if (error) *error = errno;
            // Linux may lock part of the range before it fails (e.g. at a hole): undo that,
            // sparing pages other registrations hold.
            unlock_unheld(reg.base, reg.bytes);
            return Result::LockFailed;
        }
        regs_.emplace(reg.base, reg);  // an existing identical base stays as it was
        return Result::Ok;
    }

    // Forgets the registration whose base is exactly base (made by owner, when owner is not
    // NULL) and unlocks its pages that no other registration covers.
    Result remove(uintptr_t base, const uintptr_t* owner = nullptr) {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = regs_.find(base);
        if (it == regs_.end() || (owner && it->second.owner != *owner)) return Result::NotLive;
        const Registration reg = it->second;
        regs_.erase(it);
        if (reg.locked) unlock_unheld(reg.base, reg.bytes);
        return Result::Ok;
    }

    // Forgets every registration made by owner (and unlocks their pages no other covers).
    long remove_owned(uintptr_t owner) {
        std::lock_guard<std::mutex> lock(mu_);
        long n = 0;
        for (auto it = regs_.begin(); it != regs_.end();) {
            if (it->second.owner != owner) {
                ++it;
                continue;
            }
            const Registration reg = it->second;
            it = regs_.erase(it);
            if (reg.locked) unlock_unheld(reg.base, reg.bytes);
            ++n;
        }
        return n;
    }

    // The live registration containing address p (any byte of it; the one with the highest
    // base below p when several overlap).
    bool find(uintptr_t p, Registration* out) const {
        std::lock_guard<std::mutex> lock(mu_);
        for (auto it = regs_.upper_bound(p); it != regs_.begin();) {
            --it;
            if (p - it->second.base < it->second.bytes) {
                if (out) *out = it->second;
                return true;
            }
        }
        return false;
    }

    long live() const {
        std::lock_guard<std::mutex> lock(mu_);
        return static_cast<long>(regs_.size());
    }

    // Does any live registration share a byte with [lo, hi)?
    bool overlaps(uintptr_t lo, uintptr_t hi) const {
        std::lock_guard<std::mutex> lock(mu_);
        return overlapping(lo, hi);
    }

  private:
    bool overlapping(uintptr_t lo, uintptr_t hi) const {
        for (const auto& [base, r] : regs_)
            if (base < hi && base + r.bytes > lo) return true;
        return false;
    }

    // munlock the pages of [base, base + bytes), a range not (or no longer) in regs_, except
    // those a locked registration still touches. Called with mu_ held.
    void unlock_unheld(uintptr_t base, size_t bytes) {
        const uintptr_t lo = page_down(base), hi = page_up(base + bytes);
        std::vector<std::pair<uintptr_t, uintptr_t>> held;  // page ranges still locked
        for (const auto& [b, r] : regs_) {
            if (!r.locked) continue;
            const uintptr_t rlo = page_down(b), rhi = page_up(b + r.bytes);
            if (rlo < hi && rhi > lo) held.emplace_back(rlo, rhi);
        }
        std::sort(held.begin(), held.end());
        uintptr_t at = lo;
        for (const auto& [hlo, hhi] : held) {
            if (hlo > at) unlock_pages(at, std::min(hlo, hi));  // ENOMEM at a hole: nothing locked there
            at = std::max(at, hhi);
        }
        if (at < hi) unlock_pages(at, hi);
    }

    mutable std::mutex mu_;
    std::map<uintptr_t, Registration> regs_;  // base -> registration
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
HRD_EXPORT long hostreg_double_calls(const char* symbol) { return hostreg_double::recorder().calls(symbol); }

// The raw flags (AscendCL V1: the type) of the last register call, valid or not; 0 if none
// since the last reset.
HRD_EXPORT unsigned hostreg_double_last_flags(void) { return hostreg_double::recorder().last_flags(); }

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
