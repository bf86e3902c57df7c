// staging_buffer.hpp: the staging memory of one state dict, owned whole.
//
// A StagingBuffer holds the shared-memory file (or anonymous memory), its mapping, every page
// allocated, and (optionally) its registration. It is made in one call that either returns the
// whole thing or leaves nothing; the destructor undoes all of it (unregister, unmap, close),
// so no exception half-way can leak any part.
#pragma once

#include <cstddef>
#include <memory>

#include "core/status.hpp"
#include "staging/chunked_registration.hpp"

namespace hostreg {

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
    // Whether create(bytes, shared, pin, ...) would be refused for lack of room, answered
    // before any memory is made: the shared-memory directory's free space (shared) and the
    // active backend's limit on pinning (pin; posix and ze: RLIMIT_MEMLOCK against VmLck).
    // The same code and words create would give; ok when it would find the room (it may
    // still fail later, e.g. the kernel out of memory).
    static Status room(size_t bytes, bool shared, bool pin);

    StagingBuffer(const StagingBuffer&) = delete;
    StagingBuffer& operator=(const StagingBuffer&) = delete;
    ~StagingBuffer();

    void* data() const { return map_; }
    size_t size() const { return bytes_; }
    int fd() const { return fd_; }  // -1 for private memory
    size_t chunks() const { return registration_.chunks(); }
    // Undo the registration now (the memory stays mapped). Idempotent.
    Status unregister() { return registration_.unregister_all(); }

    // The live buffer (made by create or attach, not yet destroyed) whose memory holds
    // [ptr, ptr + bytes), or null. Live buffers never overlap (each is its own mapping). The
    // answer is only as current as the call: the caller orders it with any destruction.
    static StagingBuffer* find(const void* ptr, size_t bytes);
    // A pointer the caller keeps with the buffer (a language binding: the object owning it);
    // null until set. Not read by hostreg.
    void* user_data() const { return user_data_; }
    void set_user_data(void* data) { user_data_ = data; }

  private:
    StagingBuffer() = default;
    void enter_live();  // into the index find() searches; the destructor takes it out
    int fd_ = -1;
    void* map_ = nullptr;
    size_t bytes_ = 0;
    ChunkedRegistration registration_;
    void* user_data_ = nullptr;
    bool live_ = false;  // in the index
};

}  // namespace hostreg
