// chunked_registration.hpp: one large range registered through the registry as several
// ordinary registrations (chunks), and undone in one call.
//
// Chunks are page-aligned (and granule-aligned for runtimes with a larger granule) and no
// larger than the backend's max_registration (CUDA r580+ refuses one registration of 512 GiB
// or more; docs/vendors.md). A failure part-way undoes the chunks already registered.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/status.hpp"

namespace hostreg {

// HOSTREG_MAX_REGISTRATION: the most bytes one chunk may span, below the backend's own cap
// (SIZE_MAX when unset; 1 naming the variable when it is not a positive number).
Status max_registration_override(size_t* bytes);

class ChunkedRegistration {
  public:
    // Registers [ptr, ptr+bytes) with flags, in chunks of at most max_chunk bytes (0: the
    // backend's limit); this object then owns them. On failure it holds none. Call once.
    Status register_range(void* ptr, size_t bytes, unsigned flags, size_t max_chunk);

    // Unregisters every chunk (all are tried; the first failure is returned).
    Status unregister_all();

    size_t chunks() const { return bases_.size(); }

  private:
    std::vector<uintptr_t> bases_;
};

}  // namespace hostreg
