// page_share.hpp: registering arbitrary byte ranges on a runtime that registers only whole
// granules (pages), without two neighbours undoing each other.
//
// CUDA accepts any pointer and size. Some runtimes do not: AscendCL needs 4 KiB-aligned
// addresses for every flag (CANN aclrtHostRegisterV2 docs; see docs/vendors.md), and
// mlock(2) works on whole pages whose locks do not nest (one munlock unlocks a page however
// often it was locked). For such a backend (Capabilities::granule > 1) a registration of
// [lo, hi) becomes up to three pieces, each a whole number of granules:
//   - the granules [lo, hi) covers entirely: one piece that belongs to it alone;
//   - a partial first and a partial last granule: "edge" pieces of one granule each, which a
//     neighbouring registration may share (registrations never share a byte, so only edge
//     granules can be shared). Each edge is registered with the runtime once, when its first
//     holder arrives, and unregistered when its last holder leaves.
// An aligned registration (every chunk of a chunked registration) is one piece: a single runtime call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>

#include "core/backend.hpp"

namespace hostreg {

class PageShare {
  public:
    // Registers [lo, lo + bytes) with be in pieces of `granule` bytes (see above). On success
    // *middle describes the piece owned by this registration alone (empty when there is
    // none) and *device is the device address of lo, or nullptr when the runtime gave none or
    // the pieces' device addresses are not contiguous. On failure nothing stays registered.
    Status acquire(const Backend& be, uintptr_t lo, size_t bytes, unsigned flags, size_t granule, Piece* middle,
                   void** device);

    // Undoes a successful acquire with the same arguments. If the runtime refuses to undo the
    // middle piece, nothing changes, *released is false and its status is returned (the
    // caller may retry). Otherwise *released is true and the edges are dropped; a middle the
    // runtime no longer knew (713) counts as released. An edge the runtime refuses to
    // unregister is kept, with no holder, for the next registration of that granule to take
    // over; its status is returned.
    Status release(const Backend& be, uintptr_t lo, size_t bytes, size_t granule, const Piece& middle, bool* released);

    // fork(2) handlers (called with the registry's own): the child inherits no lock or
    // runtime registration, so it starts with no edge.
    void before_fork() { mu_.lock(); }
    void after_fork_in_parent() { mu_.unlock(); }
    void after_fork_in_child() {
        edges_.clear();
        mu_.unlock();
    }

  private:
    struct Edge {
        unsigned holders = 0;
        Piece piece;
    };
    Status hold_edge(const Backend& be, uintptr_t at, size_t granule, unsigned flags, Piece* piece);
    Status drop_edge(const Backend& be, uintptr_t at, size_t granule);

    std::mutex mu_;
    std::map<uintptr_t, Edge> edges_;  // granule address -> edge registered with the runtime
};

}  // namespace hostreg
