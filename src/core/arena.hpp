// arena.hpp: one large region (a whole state dict's staging memory) made safe to touch and
// registered as one unit.
//
// create_shared_memory makes an unnamed shared-memory file (O_TMPFILE in /dev/shm, mode 0600;
// memfd where that is impossible), refusing at once when /dev/shm plainly lacks the bytes.
// prepare_memory then allocates and maps every page of a mapping inside the kernel
// (MADV_POPULATE_WRITE, several threads), so a /dev/shm that fills up is an error naming
// it, its size and the bytes needed, never a SIGBUS at a later write. Neither changes a byte.
//
// Arena registers a region through the registry in page-aligned chunks no larger than the
// backend's max_registration (CUDA r580+ refuses one registration of 512 GiB or more), and
// undoes all of them in one call. A failure part-way undoes the chunks already registered.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/status.hpp"

namespace hostreg {

Status create_shared_memory(size_t bytes, int* fd);
Status prepare_memory(void* ptr, size_t bytes, int fd);

class Arena {
public:
    // Registers [ptr, ptr+bytes) with flags, in chunks of at most max_chunk bytes (0: the
    // backend's limit); the arena then owns them. On failure it holds none. Call once.
    Status register_range(void* ptr, size_t bytes, unsigned flags, size_t max_chunk);

    // Unregisters every chunk (all are tried; the first failure is returned).
    Status unregister_all();

    size_t chunks() const { return bases_.size(); }

private:
    std::vector<uintptr_t> bases_;
};

}  // namespace hostreg
