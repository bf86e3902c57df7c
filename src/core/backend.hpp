// backend.hpp: the one interface every runtime backend implements.
//
// A backend page-locks a host range the way its runtime does (posix: mlock; cuda:
// cuMemHostRegister; acl: aclrtHostRegisterV2; ...). It is a table of operations, one
// constant per backend file, each slot named, none null. The registry calls it
// only for ranges that already passed CUDA's rules (non-null, non-empty, mapped, no overlap,
// flags the backend's capabilities list), so a backend knows nothing about other
// registrations.
//
// What a backend can do is data, not code: its probe fills one Capabilities record that the
// registry enforces (flags, granule, largest registration) and `hostreg doctor` prints.
// Where a runtime can only register whole granules (AscendCL: 4 KiB-aligned addresses for
// every flag; mlock: locks do not nest), the registry hands the backend granule-aligned
// pieces and shares the partial edge granules between neighbouring registrations itself
// (core/page_share.hpp), so no backend repeats that bookkeeping.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/status.hpp"

namespace hostreg {

// What one backend can do on this machine, filled by its probe.
struct Capabilities {
    unsigned flags = 0;                  // CUDA flag bits honoured; the others answer 801
    size_t max_registration = SIZE_MAX;  // most bytes one registration may span (chunked registrations split below)
    size_t granule = 1;                  // 1: any address and size; else the runtime gets only
                                         // whole granules (a power of two, a multiple of the page)
    std::string library;                 // file actually loaded ("" for posix)
    std::string version;                 // the runtime's version, in its own terms
    std::string note;                    // what a success means here, and any caveat
};

// A probe's answer, computed once per process and kept for its lifetime.
struct Probe {
    Status status;      // ok when usable; else why not (code and the runtime's own answer)
    Capabilities caps;  // meaningful when status is ok; library is filled whenever loaded
};

// One registration the runtime made: what the registry keeps to undo it.
struct Piece {
    void* device = nullptr;  // device address of the piece's first byte; nullptr if none
    void* owner = nullptr;   // the backend's own handle (cuda: the context it was made in)
};

struct Backend {
    const char* name;  // "posix", "cuda", ...

    // Loads and initialises the runtime on the first call; later calls answer the same
    // record, which lives until the process ends.
    const Probe& (*probe)();

    // Page-lock [ptr, ptr + bytes) with flags (already checked against the capabilities)
    // and describe the result in *piece. When the backend's granule is > 1, ptr and bytes are
    // multiples of it. On failure nothing stays locked or registered.
    Status (*host_register)(void* ptr, size_t bytes, unsigned flags, Piece* piece);

    // Undo a successful host_register of exactly [ptr, ptr + bytes) that answered piece.
    Status (*host_unregister)(void* ptr, size_t bytes, const Piece& piece);

    // Called when one more registration starts sharing an edge piece that is already
    // registered (granule > 1 only). posix locks it again: mlock is idempotent, and the
    // holder's lock is gone if its memory was unmapped meanwhile. Default: nothing to do.
    Status (*share)(void* ptr, size_t bytes, const Piece& piece);

    // Sets the device that registrations made on threads without a current device context of
    // their own are for; device < 0: the calling thread's current device, as its runtime
    // says (hostregSetDefaultDevice). Default: registrations do not depend on the calling
    // thread's device, and the call is accepted and ignored.
    Status (*set_default_device)(int device);

    // Answers, before any memory is made, whether a registration of `bytes` more would be
    // refused for lack of room (posix and ze lock pages with mlock: RLIMIT_MEMLOCK).
    // Default: the runtime's pinning is bounded by nothing hostreg can read beforehand.
    Status (*room)(size_t bytes);
};

// The defaults of the last three slots, for backends that need nothing there: every slot of
// every table holds a function, so callers never test for null.
namespace defaults {
inline Status share(void*, size_t, const Piece&) { return Status::ok(); }
inline Status set_default_device(int) { return Status::ok(); }
inline Status room(size_t) { return Status::ok(); }
}  // namespace defaults

// The backends compiled in, the order auto tries them, and the choice: backends/select.hpp.

}  // namespace hostreg
