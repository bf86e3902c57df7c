// registry.cpp: see registry.hpp for the rules.
#include "core/registry.hpp"

#include "backends/select.hpp"
#include "core/memory_map.hpp"

#include <pthread.h>

#include <cerrno>

#include <cstdio>
#include <string>

namespace hostreg {
namespace {

std::string hex(uintptr_t p) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "0x%zx", static_cast<size_t>(p));
    return buf;
}

}  // namespace

Registry& Registry::instance() {
    static Registry* r = [] {
        auto* reg = new Registry();  // intentionally leaked: usable during exit
        pthread_atfork(
            [] {
                instance().mu_.lock();
                instance().pages_.before_fork();
            },
            [] {
                instance().pages_.after_fork_in_parent();
                instance().mu_.unlock();
            },
            [] { instance().after_fork_in_child(); });
        return reg;
    }();
    return *r;
}

void Registry::after_fork_in_child() {
    for (const auto& [base, e] : map_)
        inherited_.insert(base);
    map_.clear();
    pages_.after_fork_in_child();
    mu_.unlock();  // locked by the prepare handler in the (now only) forking thread
}

std::map<uintptr_t, Registry::Entry>::const_iterator Registry::overlapping(uintptr_t lo, uintptr_t hi) const {
    auto it = map_.lower_bound(lo);
    if (it != map_.end() && it->first < hi) return it;
    if (it != map_.begin()) {
        auto prev = std::prev(it);
        if (prev->first + prev->second.reg.bytes > lo) return prev;
    }
    return map_.end();
}

Status Registry::host_register(void* ptr, size_t bytes, unsigned flags) {
    const auto lo = reinterpret_cast<uintptr_t>(ptr);
    if (Status s = check_range(ptr, bytes); !s.is_ok()) return s;
    if (flags & ~HOSTREG_HOST_REGISTER_ALL_FLAGS)
        return Status::error(hostregErrorInvalidValue,
                             "unknown flag bits " + hex(flags & ~HOSTREG_HOST_REGISTER_ALL_FLAGS) +
                                 " (known: Portable 0x1, Mapped 0x2, IoMemory 0x4, ReadOnly 0x8)");
    // Checked here, not left to each runtime (they answer 1, 2 or crash differently).
    if (!range_mapped(lo, bytes))
        return Status::error(hostregErrorInvalidValue,
                             "range " + hex(lo) + "+" + std::to_string(bytes) + " is not (fully) mapped memory",
                             ENOMEM);  // what mincore(2) answered
    Status why;
    const Backend* be = active_backend(&why);
    if (be == nullptr) return why;
    const Capabilities& caps = be->probe().caps;
    if (flags & ~caps.flags)
        return Status::error(hostregErrorNotSupported, "flags " + hex(flags & ~caps.flags) +
                                                           " are not supported by the " + be->name +
                                                           " backend (it honours " + hex(caps.flags) + ")");
    const uintptr_t hi = lo + bytes;
    {
        std::lock_guard<std::mutex> g(mu_);
        auto it = overlapping(lo, hi);
        if (it != map_.end()) {
            const auto& r = it->second.reg;
            return Status::error(hostregErrorHostMemoryAlreadyRegistered,
                                 "range " + hex(lo) + "+" + std::to_string(bytes) + " overlaps the registration " +
                                     hex(r.base) + "+" + std::to_string(r.bytes));
        }
        map_.emplace(lo, Entry{Registration{lo, bytes, flags, nullptr, be, caps.granule, {}}, State::Pending});
    }
    Piece piece;
    void* dev = nullptr;
    Status s;
    if (caps.granule > 1) {
        s = pages_.acquire(*be, lo, bytes, flags, caps.granule, &piece, &dev);
    } else {
        s = be->host_register(ptr, bytes, flags, &piece);
        dev = piece.device;
    }
    std::lock_guard<std::mutex> g(mu_);
    auto it = map_.find(lo);
    if (!s.is_ok()) {
        map_.erase(it);
        return s;
    }
    it->second.reg.device_ptr = dev;
    it->second.reg.piece = piece;
    it->second.state = State::Live;
    return s;
}

Status Registry::host_unregister(void* ptr) {
    const auto base = reinterpret_cast<uintptr_t>(ptr);
    Registration reg;
    {
        std::lock_guard<std::mutex> g(mu_);
        auto it = map_.find(base);
        if (it == map_.end() && inherited_.erase(base)) return Status::ok();  // see registry.hpp
        if (it == map_.end() || it->second.state != State::Live) {
            auto inside = overlapping(base, base + 1);
            std::string why = "pointer " + hex(base) + " is not the base of a live registration";
            if (it == map_.end() && inside != map_.end())
                why += " (it lies inside " + hex(inside->first) + "+" + std::to_string(inside->second.reg.bytes) + ")";
            return Status::error(hostregErrorHostMemoryNotRegistered, why);
        }
        it->second.state = State::Releasing;
        reg = it->second.reg;
    }
    bool released = false;  // whether the runtime no longer holds the range, failure or not
    Status s;
    if (reg.granule > 1) {
        s = pages_.release(*reg.backend, base, reg.bytes, reg.granule, reg.piece, &released);
    } else {
        s = reg.backend->host_unregister(ptr, reg.bytes, reg.piece);
        released = s.is_ok();
    }
    // A runtime that answers "not registered" (713) no longer holds the range either: keeping
    // the entry would answer 712 for that memory for ever.
    released = released || s.code == hostregErrorHostMemoryNotRegistered;
    std::lock_guard<std::mutex> g(mu_);
    auto it = map_.find(base);
    if (!released) {
        it->second.state = State::Live;  // still registered; the caller may retry
        return s;
    }
    map_.erase(it);
    return s;
}

bool Registry::find(const void* ptr, Registration* out) const {
    const auto p = reinterpret_cast<uintptr_t>(ptr);
    std::lock_guard<std::mutex> g(mu_);
    auto it = overlapping(p, p + 1);
    if (it == map_.end() || it->second.state != State::Live) return false;
    if (out) *out = it->second.reg;
    return true;
}

std::vector<Registration> Registry::list() const {
    std::lock_guard<std::mutex> g(mu_);
    std::vector<Registration> v;
    v.reserve(map_.size());
    for (const auto& [base, e] : map_)
        if (e.state == State::Live) v.push_back(e.reg);
    return v;
}

Registry::Stats Registry::stats() const {
    const uintptr_t page = page_size();
    Stats st;
    uintptr_t covered_to = 0;  // end of the last page already counted
    std::lock_guard<std::mutex> g(mu_);
    for (const auto& [base, e] : map_) {
        if (e.state != State::Live) continue;
        ++st.registrations;
        st.bytes_registered += e.reg.bytes;
        uintptr_t first = base & ~(page - 1);
        const uintptr_t end = (base + e.reg.bytes + page - 1) & ~(page - 1);
        if (first < covered_to) first = covered_to;  // page shared with the previous range
        if (end > first) st.bytes_locked += end - first;
        if (end > covered_to) covered_to = end;
    }
    return st;
}

}  // namespace hostreg
