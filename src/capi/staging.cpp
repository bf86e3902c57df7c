// staging.cpp: the C ABI of staging memory (include/hostreg/staging.h) over src/staging/.
// Each function only converts arguments and records failures for hostregGetLastError.
#include "hostreg/staging.h"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>

#include "capi/capi.hpp"
#include "staging/chunked_registration.hpp"
#include "staging/copy.hpp"
#include "staging/layout.hpp"
#include "staging/shared_memory.hpp"
#include "staging/staging_buffer.hpp"

using hostreg::null_out;
using hostreg::record;
using hostreg::Status;

namespace {

// The C handle (an incomplete type for C callers) is the C++ staging buffer.
hostreg::StagingBuffer* cxx(hostregStagingBuffer* b) { return reinterpret_cast<hostreg::StagingBuffer*>(b); }
const hostreg::StagingBuffer* cxx(const hostregStagingBuffer* b) {
    return reinterpret_cast<const hostreg::StagingBuffer*>(b);
}
hostregStagingBuffer* handle(hostreg::StagingBuffer* b) { return reinterpret_cast<hostregStagingBuffer*>(b); }

}  // namespace

extern "C" {

int hostregSharedMemoryCreate(size_t bytes, int* fd) {
    return record(hostreg::create_shared_memory(bytes, fd), __func__);
}

int hostregMaxRegistration(size_t* bytes) {
    size_t got = SIZE_MAX;
    Status s = hostreg::max_registration_override(&got);
    if (bytes) *bytes = got;
    return record(s, __func__);
}

int hostregSharedMemoryDirectory(const char** dir) {
    static std::string text;  // one value per process (the environment is read once per call)
    static std::mutex mu;
    Status s;
    {
        std::lock_guard<std::mutex> g(mu);
        s = hostreg::shared_memory_dir(&text);
        if (!s.is_ok()) {
            const char* env = std::getenv("HOSTREG_SHM_DIR");
            text = env ? env : "";
        }
        if (dir) *dir = text.c_str();
    }
    return record(s, __func__);  // outside the lock: a log handler may wait for anything
}

int hostregPrepareMemory(void* ptr, size_t bytes, int fd) {
    return record(hostreg::prepare_memory(ptr, bytes, fd), __func__);
}

// The C handle is the C++ chunked registration.
struct hostregChunkedRegistration : hostreg::ChunkedRegistration {};

int hostregChunkedRegister(void* ptr, size_t bytes, unsigned int flags, size_t max_chunk_bytes,
                           hostregChunkedRegistration** out) {
    if (out == nullptr) return null_out("out", __func__);
    auto* r = new hostregChunkedRegistration();
    Status s = r->register_range(ptr, bytes, flags, max_chunk_bytes);
    if (!s.is_ok()) {
        delete r;
        r = nullptr;
    }
    *out = r;
    return record(s, __func__);
}

int hostregChunkedUnregister(hostregChunkedRegistration* registration) {
    if (registration == nullptr) return null_out("registration", __func__);
    Status s = registration->unregister_all();
    delete registration;
    return record(s, __func__);
}

size_t hostregChunkedCount(const hostregChunkedRegistration* registration) {
    return registration ? registration->chunks() : 0;
}

int hostregStagingBufferCreate(size_t bytes, int shared, int pin, unsigned int flags, size_t max_chunk_bytes,
                               hostregStagingBuffer** out) {
    if (out == nullptr) return null_out("out", __func__);
    std::unique_ptr<hostreg::StagingBuffer> b;
    Status s = hostreg::StagingBuffer::create(bytes, shared != 0, pin != 0, flags, max_chunk_bytes, &b);
    *out = handle(b.release());
    return record(s, __func__);
}

int hostregStagingBufferRoom(size_t bytes, int shared, int pin) {
    return hostreg::remember(hostreg::StagingBuffer::room(bytes, shared != 0, pin != 0));  // a question: not logged
}

int hostregStagingBufferAttach(int fd, size_t bytes, hostregStagingBuffer** out) {
    if (out == nullptr) {
        if (fd >= 0) close(fd);  // taken over, whatever happens
        return null_out("out", __func__);
    }
    std::unique_ptr<hostreg::StagingBuffer> b;
    Status s = hostreg::StagingBuffer::attach(fd, bytes, &b);
    *out = handle(b.release());
    return record(s, __func__);
}

void* hostregStagingBufferData(const hostregStagingBuffer* b) { return b ? cxx(b)->data() : nullptr; }
size_t hostregStagingBufferSize(const hostregStagingBuffer* b) { return b ? cxx(b)->size() : 0; }
int hostregStagingBufferFd(const hostregStagingBuffer* b) { return b ? cxx(b)->fd() : -1; }
size_t hostregStagingBufferChunks(const hostregStagingBuffer* b) { return b ? cxx(b)->chunks() : 0; }

int hostregStagingBufferUnregister(hostregStagingBuffer* b) {
    if (b == nullptr) return null_out("buffer", __func__);
    return record(cxx(b)->unregister(), __func__);
}

void hostregStagingBufferDestroy(hostregStagingBuffer* b) { delete cxx(b); }

hostregStagingBuffer* hostregStagingBufferFind(const void* ptr, size_t bytes) {
    return handle(hostreg::StagingBuffer::find(ptr, bytes));
}

void hostregStagingBufferSetUserData(hostregStagingBuffer* b, void* data) {
    if (b) cxx(b)->set_user_data(data);
}

void* hostregStagingBufferUserData(const hostregStagingBuffer* b) { return b ? cxx(b)->user_data() : nullptr; }

int hostregCopyBatch(void* const* dst, const void* const* src, const size_t* bytes, size_t n, unsigned int threads) {
    if (n > 0 && (!dst || !src || !bytes)) return null_out("dst, src or bytes", __func__);
    const size_t bad = hostreg::copy_batch(dst, src, bytes, n, threads);
    if (bad == SIZE_MAX) return hostregSuccess;
    char where[160];
    std::snprintf(where, sizeof where, "buffer %zu (%zu bytes from %p to %p) faulted while it was copied", bad,
                  bytes[bad], src[bad], dst[bad]);
    return record(Status::error(hostregErrorInvalidValue,
                                std::string(where) +
                                    ": its memory was unmapped meanwhile (a tensor's storage freed or resized while "
                                    "it was being staged?); nothing was read from it after that")
                      .blame_environment(),
                  __func__);
}

int hostregGroupRanges(size_t n, const uint64_t* key, const uint32_t* domain, const uint64_t* first,
                       const uint64_t* end, const unsigned char* alone, size_t align, int64_t* group, uint64_t* offset,
                       uint64_t* span_start, uint64_t* span_bytes, size_t* spans) {
    if (spans == nullptr) return null_out("spans", __func__);
    if (n > 0 && (!key || !first || !end || !group || !offset || !span_start || !span_bytes))
        return null_out("key, first, end or an output array", __func__);
    if (align == 0) return record(Status::error(hostregErrorInvalidValue, "align must be > 0"), __func__);
    hostreg::group_ranges(n, {key, domain, first, end, alone}, align, {group, offset, span_start, span_bytes, spans});
    return hostregSuccess;
}

}  // extern "C"
