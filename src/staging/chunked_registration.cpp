// chunked_registration.cpp: see chunked_registration.hpp.
#include "staging/chunked_registration.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "backends/select.hpp"
#include "core/memory_map.hpp"
#include "core/registry.hpp"

namespace hostreg {

Status max_registration_override(size_t* bytes) {
    const char* env = std::getenv("HOSTREG_MAX_REGISTRATION");
    *bytes = SIZE_MAX;
    if (!env || !*env) return Status::ok();
    char* end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(env, &end, 10);
    if (errno || *end || v == 0 || env[0] == '-')
        return Status::error(hostregErrorInvalidValue,
                             std::string("HOSTREG_MAX_REGISTRATION=") + env + " is not a positive number of bytes")
            .blame_environment();
    *bytes = static_cast<size_t>(v);
    return Status::ok();
}

Status ChunkedRegistration::register_range(void* ptr, size_t bytes, unsigned flags, size_t max_chunk) {
    Status why;
    const Backend* be = active_backend(&why);
    if (be == nullptr) return why;
    const Capabilities& caps = be->probe().caps;
    size_t user_cap = SIZE_MAX;
    if (Status s = max_registration_override(&user_cap); !s.is_ok()) return s;
    const uintptr_t page = std::max(page_size(), caps.granule);  // chunks of whole pages and granules
    size_t chunk = std::min(caps.max_registration, user_cap);
    if (max_chunk) chunk = std::min(chunk, max_chunk);
    chunk = std::max<size_t>(page, chunk / page * page);
    if (Status s = check_range(ptr, bytes); !s.is_ok()) return s;
    // Chunk boundaries fall on page boundaries (counted from the page holding ptr), so no two
    // chunks share a page even when ptr is not page-aligned.
    const auto base = reinterpret_cast<uintptr_t>(ptr);
    const uintptr_t end = base + bytes;
    for (uintptr_t lo = base, next; lo < end; lo = next) {
        const uintptr_t boundary = (lo & ~(page - 1)) + chunk;
        next = (boundary > lo && boundary < end) ? boundary : end;
        Status s = Registry::instance().host_register(reinterpret_cast<void*>(lo), next - lo, flags);
        if (!s.is_ok()) {
            unregister_all();
            if (lo != base) s.message += " (chunk at offset " + std::to_string(lo - base) + ")";
            return s;
        }
        bases_.push_back(lo);
    }
    return Status::ok();
}

Status ChunkedRegistration::unregister_all() {
    Status first;
    for (uintptr_t b : bases_) {
        Status s = Registry::instance().host_unregister(reinterpret_cast<void*>(b));
        if (!s.is_ok() && first.is_ok()) first = s;
    }
    bases_.clear();
    return first;
}

}  // namespace hostreg
