// hostreg.cpp: the C ABI of registration and backends (include/hostreg/hostreg.h) over the
// registry. Each function only converts arguments and records failures for hostregGetLastError.
#include "hostreg/hostreg.h"

#include "backends/page_lock.hpp"
#include "backends/select.hpp"
#include "capi/capi.hpp"
#include "core/registry.hpp"

#include <sys/resource.h>

#include <algorithm>
#include <cstring>
#include <string>

using hostreg::null_out;
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

}  // namespace

extern "C" {

int hostregHostRegister(void* ptr, size_t bytes, unsigned int flags) {
    return record(Registry::instance().host_register(ptr, bytes, flags), __func__);
}

int hostregHostUnregister(void* ptr) { return record(Registry::instance().host_unregister(ptr), __func__); }

int hostregHostGetDevicePointer(void** device_ptr, void* host_ptr, unsigned int flags) {
    if (device_ptr == nullptr) return null_out("device_ptr", __func__);
    if (flags != 0) return record(Status::error(hostregErrorInvalidValue, "flags must be 0"), __func__);
    Registration r;
    if (!Registry::instance().find(host_ptr, &r))
        return record(Status::error(hostregErrorInvalidValue, "host pointer is not inside a registration"), __func__);
    if (r.device_ptr == nullptr)
        return record(
            Status::error(hostregErrorInvalidValue,
                          std::string("the ") + r.backend->name +
                              " runtime gave this registration no device address (it maps none for these flags, or it "
                              "mapped the registration's pages apart)"),
            __func__);
    const auto offset = reinterpret_cast<uintptr_t>(host_ptr) - r.base;
    *device_ptr = static_cast<char*>(r.device_ptr) + offset;
    return hostregSuccess;
}

int hostregHostGetFlags(unsigned int* flags, void* host_ptr) {
    if (flags == nullptr) return null_out("flags", __func__);
    Registration r;
    if (!Registry::instance().find(host_ptr, &r))
        return record(Status::error(hostregErrorInvalidValue, "host pointer is not inside a registration"), __func__);
    *flags = r.flags;
    return hostregSuccess;
}

int hostregIsRegistered(const void* ptr) { return Registry::instance().find(ptr, nullptr) ? 1 : 0; }

int hostregPointerGetRegistration(const void* ptr, hostregRegistration* out) {
    if (out == nullptr) return null_out("out", __func__);
    Registration r;
    if (!Registry::instance().find(ptr, &r))  // an answer, not an event: not logged
        return hostreg::remember(
            Status::error(hostregErrorHostMemoryNotRegistered, "pointer is not inside a registration"));
    fill(r, out);
    return hostregSuccess;
}

size_t hostregListRegistrations(hostregRegistration* out, size_t capacity, size_t* total) {
    const auto all = Registry::instance().list();
    if (total) *total = all.size();
    size_t n = 0;
    for (; out && n < capacity && n < all.size(); ++n)
        fill(all[n], &out[n]);
    return n;
}

int hostregGetStats(hostregStats* out) {
    if (out == nullptr) return null_out("out", __func__);
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
    if (!b) {  // logged once, when the choice was made
        hostreg::remember(why);
        return "none";
    }
    return b->name;
}

const char* const* hostregBackendNames(void) {
    static const char* const* names = [] {
        size_t n = 0;
        while (hostreg::kAllBackends[n])
            ++n;
        auto** v = new const char*[n + 1];
        for (size_t i = 0; i < n; ++i)
            v[i] = hostreg::kAllBackends[i]->name;
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
    Status s = found
                   ? found->probe().status
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
    if (out == nullptr) return null_out("out", __func__);
    const hostreg::Backend* found = backend_named(name);
    if (!found)
        return record(Status::error(hostregErrorInvalidValue, std::string("unknown backend ") + (name ? name : "NULL")),
                      __func__);
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

int hostregSetDefaultDevice(int device) {
    if (device < HOSTREG_DEVICE_OF_THIS_THREAD)
        return record(Status::error(hostregErrorInvalidValue, "device must be >= 0, or HOSTREG_DEVICE_OF_THIS_THREAD"),
                      __func__);
    // Asking for this thread's device is a question: its failures are answers, not logged.
    const bool asking = device == HOSTREG_DEVICE_OF_THIS_THREAD;
    Status why;
    const hostreg::Backend* b = hostreg::active_backend(&why);
    if (b == nullptr) return asking ? hostreg::remember(why) : record(why, __func__);
    Status s = b->set_default_device(device);
    return asking ? hostreg::remember(s) : record(s, __func__);
}

int hostregLockAllowance(unsigned long long* memlock_bytes, int* cap_ipc_lock) {
    if (memlock_bytes) {
        struct rlimit rl{};
        *memlock_bytes = (getrlimit(RLIMIT_MEMLOCK, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
                             ? ~0ull
                             : static_cast<unsigned long long>(rl.rlim_cur);
    }
    if (cap_ipc_lock) *cap_ipc_lock = hostreg::has_cap_ipc_lock() ? 1 : 0;
    return hostregSuccess;
}

void hostregSetLogHandler(hostregLogHandler handler, void* context) { hostreg::set_log_handler(handler, context); }

size_t hostregFormatLogEvent(const char* call, int code, long long native_code, const char* message, char* out,
                             size_t size) {
    const std::string text = hostreg::log_text(call, code, native_code, message ? message : "");
    if (out && size) {
        const size_t n = std::min(size - 1, text.size());
        std::memcpy(out, text.data(), n);
        out[n] = '\0';
    }
    return text.size();
}

int hostregLogLevelFromEnvironment(void) {
    const hostreg::LogLevel level = hostreg::log_level_from_environment();
    return level == hostreg::LogLevel::Off ? -1 : static_cast<int>(level);
}

const char* hostregVersion(void) { return HOSTREG_VERSION; }

}  // extern "C"
