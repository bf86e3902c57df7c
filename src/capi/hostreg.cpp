// hostreg.cpp: the C ABI (include/hostreg/hostreg.h) over the registry. Each function only
// converts arguments and records failures for hostregGetLastError.
#include "hostreg/hostreg.h"

#include "core/arena.hpp"
#include "core/copy.hpp"
#include "core/registry.hpp"

#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>

using hostreg::record;
using hostreg::Registration;
using hostreg::Registry;
using hostreg::Status;

namespace {

void fill(const Registration& r, hostregRegistration* out) {
    out->base = reinterpret_cast<void*>(r.base);
    out->bytes = r.bytes;
    out->flags = r.flags;
    out->device_ptr = r.device_ptr;
    out->backend = r.backend->name;
}

// The C handle (an incomplete type for C callers) is the C++ staging buffer.
hostreg::StagingBuffer* cxx(hostregStagingBuffer* b) { return reinterpret_cast<hostreg::StagingBuffer*>(b); }
const hostreg::StagingBuffer* cxx(const hostregStagingBuffer* b) {
    return reinterpret_cast<const hostreg::StagingBuffer*>(b);
}
hostregStagingBuffer* handle(hostreg::StagingBuffer* b) { return reinterpret_cast<hostregStagingBuffer*>(b); }

int null_out(const char* what) {
    return record(Status::error(hostregErrorInvalidValue, std::string(what) + " is NULL"));
}

}  // namespace

extern "C" {

int hostregHostRegister(void* ptr, size_t bytes, unsigned int flags) {
    return record(Registry::instance().host_register(ptr, bytes, flags));
}

int hostregHostUnregister(void* ptr) { return record(Registry::instance().host_unregister(ptr)); }

int hostregHostGetDevicePointer(void** device_ptr, void* host_ptr, unsigned int flags) {
    if (device_ptr == nullptr) return null_out("device_ptr");
    if (flags != 0)
        return record(Status::error(hostregErrorInvalidValue, "flags must be 0"));
    Registration r;
    if (!Registry::instance().find(host_ptr, &r))
        return record(Status::error(hostregErrorInvalidValue,
                                    "host pointer is not inside a registration"));
    if (r.device_ptr == nullptr)
        return record(Status::error(hostregErrorInvalidValue,
                                    std::string("the ") + r.backend->name +
                                        " runtime gave this registration no device address (it maps none for these flags, or it "
                                        "mapped the registration's pages apart)"));
    const auto offset = reinterpret_cast<uintptr_t>(host_ptr) - r.base;
    *device_ptr = static_cast<char*>(r.device_ptr) + offset;
    return hostregSuccess;
}

int hostregHostGetFlags(unsigned int* flags, void* host_ptr) {
    if (flags == nullptr) return null_out("flags");
    Registration r;
    if (!Registry::instance().find(host_ptr, &r))
        return record(Status::error(hostregErrorInvalidValue,
                                    "host pointer is not inside a registration"));
    *flags = r.flags;
    return hostregSuccess;
}

int hostregIsRegistered(const void* ptr) { return Registry::instance().find(ptr, nullptr) ? 1 : 0; }

int hostregPointerGetRegistration(const void* ptr, hostregRegistration* out) {
    if (out == nullptr) return null_out("out");
    Registration r;
    if (!Registry::instance().find(ptr, &r))
        return record(Status::error(hostregErrorHostMemoryNotRegistered,
                                    "pointer is not inside a registration"));
    fill(r, out);
    return hostregSuccess;
}

size_t hostregListRegistrations(hostregRegistration* out, size_t capacity, size_t* total) {
    const auto all = Registry::instance().list();
    if (total) *total = all.size();
    size_t n = 0;
    for (; out && n < capacity && n < all.size(); ++n) fill(all[n], &out[n]);
    return n;
}

int hostregGetStats(hostregStats* out) {
    if (out == nullptr) return null_out("out");
    const auto st = Registry::instance().stats();
    out->registrations = st.registrations;
    out->bytes_registered = st.bytes_registered;
    out->bytes_locked = st.bytes_locked;
    return hostregSuccess;
}

const char* hostregGetErrorName(int code) { return hostreg::error_name(code); }

const char* hostregGetErrorString(int code) { return hostreg::error_string(code); }

int hostregGetLastError(long long* native_code, const char** message) {
    const Status& s = hostreg::last_error();
    if (native_code) *native_code = s.native;
    if (message) *message = s.message.c_str();
    return s.code;
}

const char* hostregBackendName(void) {
    Status why;
    const hostreg::Backend* b = hostreg::active_backend(&why);
    if (!b) {
        record(why);
        return "none";
    }
    return b->name;
}

int hostregSharedMemoryCreate(size_t bytes, int* fd) { return record(hostreg::create_shared_memory(bytes, fd)); }

int hostregSharedMemoryDirectory(const char** dir) {
    static std::string text;  // one value per process (the environment is read once per call)
    static std::mutex mu;
    std::lock_guard<std::mutex> g(mu);
    Status s = hostreg::shared_memory_dir(&text);
    if (!s.is_ok()) {
        const char* env = std::getenv("HOSTREG_SHM_DIR");
        text = env ? env : "";
    }
    if (dir) *dir = text.c_str();
    return record(s);
}

int hostregPrepareMemory(void* ptr, size_t bytes, int fd) { return record(hostreg::prepare_memory(ptr, bytes, fd)); }

// The C handle is the C++ arena.
struct hostregArena : hostreg::Arena {};

int hostregArenaRegister(void* ptr, size_t bytes, unsigned int flags, size_t max_chunk_bytes, hostregArena** arena) {
    if (arena == nullptr) return null_out("arena");
    auto* a = new hostregArena();
    Status s = a->register_range(ptr, bytes, flags, max_chunk_bytes);
    if (!s.is_ok()) {
        delete a;
        a = nullptr;
    }
    *arena = a;
    return record(s);
}

int hostregArenaUnregister(hostregArena* arena) {
    if (arena == nullptr) return null_out("arena");
    Status s = arena->unregister_all();
    delete arena;
    return record(s);
}

size_t hostregArenaChunkCount(const hostregArena* arena) { return arena ? arena->chunks() : 0; }


int hostregStagingBufferCreate(size_t bytes, int shared, int pin, unsigned int flags, size_t max_chunk_bytes,
                               hostregStagingBuffer** out) {
    if (out == nullptr) return null_out("out");
    std::unique_ptr<hostreg::StagingBuffer> b;
    Status s = hostreg::StagingBuffer::create(bytes, shared != 0, pin != 0, flags, max_chunk_bytes, &b);
    *out = handle(b.release());
    return record(s);
}

int hostregStagingBufferAttach(int fd, size_t bytes, hostregStagingBuffer** out) {
    if (out == nullptr) {
        if (fd >= 0) close(fd);  // taken over, whatever happens
        return null_out("out");
    }
    std::unique_ptr<hostreg::StagingBuffer> b;
    Status s = hostreg::StagingBuffer::attach(fd, bytes, &b);
    *out = handle(b.release());
    return record(s);
}

void* hostregStagingBufferData(const hostregStagingBuffer* b) { return b ? cxx(b)->data() : nullptr; }
size_t hostregStagingBufferSize(const hostregStagingBuffer* b) { return b ? cxx(b)->size() : 0; }
int hostregStagingBufferFd(const hostregStagingBuffer* b) { return b ? cxx(b)->fd() : -1; }
size_t hostregStagingBufferChunks(const hostregStagingBuffer* b) { return b ? cxx(b)->chunks() : 0; }

int hostregStagingBufferUnregister(hostregStagingBuffer* b) {
    if (b == nullptr) return null_out("buffer");
    return record(cxx(b)->unregister());
}

void hostregStagingBufferDestroy(hostregStagingBuffer* b) { delete cxx(b); }

int hostregCopyBatch(void* const* dst, const void* const* src, const size_t* bytes, size_t n, unsigned int threads) {
    if (n > 0 && (!dst || !src || !bytes)) return null_out("dst, src or bytes");
    hostreg::copy_batch(dst, src, bytes, n, threads);
    return hostregSuccess;
}

const char* const* hostregBackendNames(void) {
    static const char* const* names = [] {
        size_t n = 0;
        while (hostreg::kAllBackends[n]) ++n;
        auto** v = new const char*[n + 1];
        for (size_t i = 0; i < n; ++i) v[i] = hostreg::kAllBackends[i]->name;
        v[n] = nullptr;
        return v;
    }();
    return names;
}

namespace {

const hostreg::Backend* backend_named(const char* name) {
    for (const hostreg::Backend* const* b = hostreg::kAllBackends; *b && name; ++b)
        if (std::string(name) == (*b)->name) return *b;
    return nullptr;
}

}  // namespace

int hostregProbeBackend(const char* name, const char** detail) {
    thread_local std::string text;
    const hostreg::Backend* found = backend_named(name);
    Status s = found ? found->probe().status
                     : Status::error(hostregErrorInvalidValue, std::string("unknown backend ") + (name ? name : "NULL"));
    if (s.is_ok()) {
        const hostreg::Capabilities& c = found->probe().caps;
        text = c.library.empty() ? c.version : c.library + (c.version.empty() ? "" : ", " + c.version);
    } else {
        text = s.message;
    }
    if (detail) *detail = text.c_str();
    return s.code;
}

int hostregBackendCapabilities(const char* name, hostregCapabilities* out) {
    if (out == nullptr) return null_out("out");
    const hostreg::Backend* found = backend_named(name);
    if (!found)
        return record(Status::error(hostregErrorInvalidValue, std::string("unknown backend ") + (name ? name : "NULL")));
    const hostreg::Probe& p = found->probe();  // kept for the life of the process
    out->flags = p.status.is_ok() ? p.caps.flags : 0;
    out->max_registration = p.caps.max_registration;
    out->granule = p.caps.granule;
    out->library = p.caps.library.c_str();
    out->version = p.caps.version.c_str();
    out->note = p.caps.note.c_str();
    out->reason = p.status.message.c_str();
    return p.status.code;
}

const char* hostregVersion(void) { return HOSTREG_VERSION; }

}  // extern "C"
