// staging_buffer.cpp: see staging_buffer.hpp.
#include "staging/staging_buffer.hpp"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <pthread.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "backends/select.hpp"
#include "staging/shared_memory.hpp"

namespace hostreg {
namespace {

// The live staging buffers of this process, by first byte. A fork(2) child keeps them (its
// mappings are the parent's, copied), so the lock is only held across fork, never reset.
struct LiveBuffers {
    std::mutex mu;
    std::map<uintptr_t, StagingBuffer*> by_address;
};

LiveBuffers& live() {
    static LiveBuffers* l = [] {
        auto* made = new LiveBuffers();  // never destroyed: buffers may be destroyed during exit
        pthread_atfork([] { live().mu.lock(); }, [] { live().mu.unlock(); }, [] { live().mu.unlock(); });
        return made;
    }();
    return *l;
}

}  // namespace

void StagingBuffer::enter_live() {
    LiveBuffers& l = live();
    std::lock_guard<std::mutex> g(l.mu);
    l.by_address[reinterpret_cast<uintptr_t>(map_)] = this;
    live_ = true;
}

StagingBuffer* StagingBuffer::find(const void* ptr, size_t bytes) {
    const auto p = reinterpret_cast<uintptr_t>(ptr);
    LiveBuffers& l = live();
    std::lock_guard<std::mutex> g(l.mu);
    auto it = l.by_address.upper_bound(p);
    if (it == l.by_address.begin()) return nullptr;
    --it;  // the last buffer starting at or below p
    const size_t size = it->second->size();
    if (bytes > size || p - it->first > size - bytes) return nullptr;
    return it->second;
}

Status StagingBuffer::create(size_t bytes, bool shared, bool pin, unsigned flags, size_t max_chunk,
                             std::unique_ptr<StagingBuffer>* out) {
    out->reset();
    if (bytes == 0) return Status::error(hostregErrorInvalidValue, "staging buffer of 0 bytes");
    std::unique_ptr<StagingBuffer> b(new StagingBuffer());  // from here on, every part is b's
    if (shared) {
        if (Status s = create_shared_memory(bytes, &b->fd_); !s.is_ok()) return s;
    }
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, shared ? MAP_SHARED : (MAP_PRIVATE | MAP_ANONYMOUS),
                   shared ? b->fd_ : -1, 0);
    if (p == MAP_FAILED) {
        const int err = errno;
        return Status::error(hostregErrorMemoryAllocation,
                             "cannot map " + with_commas(bytes) + " bytes of staging memory: " + std::strerror(err) +
                                 (err == ENOMEM ? " (an address-space limit? see ulimit -v)" : ""),
                             err);
    }
    b->map_ = p;
    b->bytes_ = bytes;
    if (Status s = prepare_memory(p, bytes, b->fd_); !s.is_ok()) return s;
    if (pin) {
        if (Status s = b->registration_.register_range(p, bytes, flags, max_chunk); !s.is_ok()) return s;
    }
    b->enter_live();
    *out = std::move(b);
    return Status::ok();
}

Status StagingBuffer::room(size_t bytes, bool shared, bool pin) {
    if (bytes == 0) return Status::error(hostregErrorInvalidValue, "staging buffer of 0 bytes");
    if (shared) {
        if (Status s = shared_memory_room(bytes); !s.is_ok()) return s;
    }
    if (!pin) return Status::ok();
    Status why;
    const Backend* b = active_backend(&why);
    if (b == nullptr) return why;
    return b->room(bytes);
}

Status StagingBuffer::attach(int fd, size_t bytes, std::unique_ptr<StagingBuffer>* out) {
    out->reset();
    std::unique_ptr<StagingBuffer> b(new StagingBuffer());
    b->fd_ = fd;  // owned from here: closed by b, whatever happens
    struct stat st{};
    if (fd < 0 || fstat(fd, &st) != 0) return Status::error(hostregErrorInvalidValue, "not a descriptor", errno);
    if (bytes == 0 || static_cast<unsigned long long>(st.st_size) < bytes)
        return Status::error(hostregErrorInvalidValue, "the staging file holds " + with_commas(st.st_size) +
                                                           " bytes, not the " + with_commas(bytes) + " expected");
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        const int err = errno;
        return Status::error(hostregErrorMemoryAllocation,
                             "cannot map " + with_commas(bytes) + " bytes of staging memory: " + std::strerror(err),
                             err);
    }
    b->map_ = p;
    b->bytes_ = bytes;
    b->enter_live();
    *out = std::move(b);
    return Status::ok();
}

StagingBuffer::~StagingBuffer() {
    if (live_) {
        LiveBuffers& l = live();
        std::lock_guard<std::mutex> g(l.mu);
        l.by_address.erase(reinterpret_cast<uintptr_t>(map_));
    }
    registration_.unregister_all();
    if (map_) munmap(map_, bytes_);
    if (fd_ >= 0) close(fd_);
}

}  // namespace hostreg
