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
#include <memory>
#include <string>
#include <vector>

#include "core/status.hpp"

namespace hostreg {

// The directory staging memory is made in: HOSTREG_SHM_DIR if set (it must be an absolute
// path to an existing tmpfs, ramfs or hugetlbfs directory, else 1 naming the variable and the
// cause), else /dev/shm.
Status shared_memory_dir(std::string* dir);

Status create_shared_memory(size_t bytes, int* fd);

// HOSTREG_MAX_REGISTRATION: the most bytes one arena chunk may span, below the backend's own
// cap (SIZE_MAX when unset; 1 naming the variable when it is not a positive number).
Status max_registration_override(size_t* bytes);
Status prepare_memory(void* ptr, size_t bytes, int fd);

// The staging memory of one state dict, owned whole: the shared-memory file (or anonymous
// memory), its mapping, every page allocated, and (optionally) its registration. Made in one
// call that either returns the whole thing or leaves nothing; the destructor undoes all of it
// (unregister, unmap, close), so no exception half-way can leak any part.
class StagingBuffer;

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

class StagingBuffer {
public:
    // bytes (> 0) of staging memory: shared (an unnamed /dev/shm file, mapped MAP_SHARED) or
    // private anonymous memory; every page allocated (prepare_memory); registered with flags in
    // chunks of at most max_chunk bytes when pin. On failure *out is empty and nothing is left.
    static Status create(size_t bytes, bool shared, bool pin, unsigned flags, size_t max_chunk,
                         std::unique_ptr<StagingBuffer>* out);
    // Maps the shared buffer another process made, given a descriptor of its file (taken over:
    // closed on failure too). Not registered: the pages are the other process's, locked there.
    static Status attach(int fd, size_t bytes, std::unique_ptr<StagingBuffer>* out);

    StagingBuffer(const StagingBuffer&) = delete;
    StagingBuffer& operator=(const StagingBuffer&) = delete;
    ~StagingBuffer();

    void* data() const { return map_; }
    size_t size() const { return bytes_; }
    int fd() const { return fd_; }  // -1 for private memory
    size_t chunks() const { return arena_.chunks(); }
    // Undo the registration now (the memory stays mapped). Idempotent.
    Status unregister() { return arena_.unregister_all(); }

private:
    StagingBuffer() = default;
    int fd_ = -1;
    void* map_ = nullptr;
    size_t bytes_ = 0;
    Arena arena_;
};

}  // namespace hostreg
