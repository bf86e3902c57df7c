// registry.hpp: the process-wide record of live host registrations.
//
// An interval map keyed by base address. It enforces CUDA's rules whatever the backend
// does (the runtimes differ: Level Zero answers success for a re-import of a range inside an
// imported one, HIP registers overlapping ranges, AscendCL has its own codes; see
// docs/vendors.md):
//   register:   1 for null / 0 bytes / wrap-around / unknown flag bits / memory that is not
//               mapped; 712 if any byte of the range is registered (or being registered or
//               released by another thread); 801 for flags the backend's capabilities do
//               not list; else the backend's answer.
//   unregister: 713 unless ptr is the base of a live registration.
// Backends that register only whole granules get them through PageShare
// (core/page_share.hpp), which shares partial edge granules between neighbours.
// After fork(2) the child holds no registration: memory locks are not inherited and vendor
// contexts do not survive a fork. Bases the parent had registered are remembered, and
// unregistering one of them in the child answers 0 (so finalizers that run there succeed);
// they do not block new registrations.
// The backend is called outside the registry's lock: a range is first reserved (Pending),
// then locked by the backend, then made Live; unregister marks it Releasing, unlocks, then
// erases it. No other thread can touch a reserved range meanwhile.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <vector>

#include "core/backend.hpp"
#include "core/page_share.hpp"

namespace hostreg {

struct Registration {
    uintptr_t base = 0;
    size_t bytes = 0;
    unsigned flags = 0;
    void* device_ptr = nullptr;  // device address of base; nullptr when the runtime gave none
    const Backend* backend = nullptr;
    size_t granule = 1;  // the backend's granule when it was registered (1: one piece)
    Piece piece;         // the backend's record: the whole range, or (granule > 1) the middle
};

class Registry {
  public:
    // The one registry of this process. Never destroyed, so finalizers that unregister
    // during interpreter or process exit still find it.
    static Registry& instance();

    Status host_register(void* ptr, size_t bytes, unsigned flags);
    Status host_unregister(void* ptr);

    // The live registration containing ptr, if any.
    bool find(const void* ptr, Registration* out) const;
    std::vector<Registration> list() const;

    struct Stats {
        size_t registrations = 0;
        size_t bytes_registered = 0;
        size_t bytes_locked = 0;  // distinct whole pages covered
    };
    Stats stats() const;

  private:
    enum class State { Pending, Live, Releasing };
    struct Entry {
        Registration reg;
        State state;
    };
    // Entry whose range intersects [lo, hi), or end().
    std::map<uintptr_t, Entry>::const_iterator overlapping(uintptr_t lo, uintptr_t hi) const;

    void after_fork_in_child();

    mutable std::mutex mu_;
    std::map<uintptr_t, Entry> map_;  // base -> entry; ranges never intersect
    PageShare pages_;                 // edge granules of granule > 1 backends
    std::set<uintptr_t> inherited_;   // bases registered by the parent before fork
};

}  // namespace hostreg
