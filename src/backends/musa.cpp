// musa.cpp: Moore Threads MUSA, through the MUSA runtime (libmusart.so).
//
// The MUSA runtime mirrors CUDA's: musaHostRegister(void*, size_t, unsigned) with CUDA's
// flag bits, musaHostUnregister, musaHostGetDevicePointer, and (expected, *unconfirmed* in
// vendor-abi.md "Moore Threads MUSA") CUDA's error numbers. So flags pass through, and codes
// hostreg knows keep their number; anything else becomes 999 with the native code kept.
#include <cstdint>
#include <string>

#include "backends/dynlib.hpp"
#include "core/backend.hpp"

namespace hostreg {
namespace {

using musaError_t = int;

#define HOSTREG_MUSA_SYMBOLS(REQUIRED, OPTIONAL)                               \
    REQUIRED(musaGetDeviceCount, musaError_t, (int*))                          \
    REQUIRED(musaHostRegister, musaError_t, (void*, size_t, unsigned))         \
    REQUIRED(musaHostUnregister, musaError_t, (void*))                         \
    REQUIRED(musaHostGetDevicePointer, musaError_t, (void**, void*, unsigned)) \
    REQUIRED(musaGetErrorString, const char*, (musaError_t))                   \
    OPTIONAL(musaGetErrorName, const char*, (musaError_t))                     \
    OPTIONAL(musaRuntimeGetVersion, musaError_t, (int*))

struct Api {
    HOSTREG_MUSA_SYMBOLS(HOSTREG_DECLARE_FN, HOSTREG_DECLARE_FN)
};

struct Musa {
    DynLib lib{"HOSTREG_MUSA_LIBRARY", {"libmusart.so", "libmusart.so.1"}};
    Api api;
    Status status;
    int version = 0;
};

Status failure(const Api& api, const char* call, musaError_t r) {
    const char* name = api.musaGetErrorName ? api.musaGetErrorName(r) : nullptr;
    const char* text = api.musaGetErrorString(r);
    return Status::error(mirror_cuda(r),
                         std::string(call) + " failed: " + (name ? name : "musaError_t") + " (" +
                             std::to_string(r) + "): " + (text ? text : ""),
                         r);
}

Status init(Musa& m) {
    DynLib& lib = m.lib;
    Api& api = m.api;
    if (!lib.loaded()) return Status::error(lib.status().code, "no MUSA runtime: " + lib.status().message);
    HOSTREG_MUSA_SYMBOLS(HOSTREG_LOAD_REQUIRED, HOSTREG_LOAD_OPTIONAL)
    if (api.musaRuntimeGetVersion) api.musaRuntimeGetVersion(&m.version);
    int count = 0;
    if (musaError_t r = api.musaGetDeviceCount(&count)) return failure(api, "musaGetDeviceCount", r);
    if (count == 0) return Status::error(hostregErrorNoDevice, "the MUSA runtime reports no device");
    return Status::ok();
}

Musa& musa() { return loaded_once<Musa, init>(); }

Status musa_probe() { return musa().status; }

std::string musa_describe() { return musa().lib.path() + ", MUSA runtime " + std::to_string(musa().version); }

Status musa_register(void* ptr, size_t bytes, unsigned flags, void** device_ptr) {
    Api& api = musa().api;
    if (musaError_t r = api.musaHostRegister(ptr, bytes, flags)) return failure(api, "musaHostRegister", r);
    if (api.musaHostGetDevicePointer(device_ptr, ptr, 0) != 0) *device_ptr = nullptr;
    return Status::ok();
}

Status musa_unregister(void* ptr, size_t /*bytes*/) {
    Api& api = musa().api;
    if (musaError_t r = api.musaHostUnregister(ptr)) return failure(api, "musaHostUnregister", r);
    return Status::ok();
}

}  // namespace

extern const Backend kMusaBackend = {
    /*name=*/"musa",
    /*supported=*/HOSTREG_HOST_REGISTER_ALL_FLAGS,
    /*max_registration=*/SIZE_MAX,
    /*probe=*/musa_probe,
    /*describe=*/musa_describe,
    /*host_register=*/musa_register,
    /*host_unregister=*/musa_unregister,
};

}  // namespace hostreg
