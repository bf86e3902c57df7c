// hip.cpp: AMD ROCm, through the HIP runtime (libamdhip64.so).
//
// HIP's runtime keeps its own current device and context, as CUDA's runtime does, so this
// backend only translates flags and codes.
//
// Facts (vendor-abi.md "AMD ROCm, HIP"; ROCm include/hip/hip_runtime_api.h and clr's
// hipamd/src/hip_memory.cpp): flags Default 0, Portable 0x1, Mapped 0x2 as in CUDA; IoMemory
// 0x4 is "not supported" (newer clr answers InvalidValue), so hostreg answers 801 itself;
// ReadOnly 0x8 is the same bit as hipExtHostRegisterCoarseGrained, so passing it would
// silently change the memory's coherence: hostreg accepts ReadOnly (a hint that the device
// only reads, always safe to drop) and never passes the bit. Codes mirror CUDA's. The device
// address may differ from the host address: it is asked for with hipHostGetDevicePointer.
#include <cstdint>
#include <string>

#include "backends/dynlib.hpp"
#include "core/backend.hpp"

namespace hostreg {
namespace {

using hipError_t = int;

#define HOSTREG_HIP_SYMBOLS(REQUIRED, OPTIONAL)                             \
    REQUIRED(hipGetDeviceCount, hipError_t, (int*))                         \
    REQUIRED(hipHostRegister, hipError_t, (void*, size_t, unsigned))        \
    REQUIRED(hipHostUnregister, hipError_t, (void*))                        \
    REQUIRED(hipHostGetDevicePointer, hipError_t, (void**, void*, unsigned)) \
    REQUIRED(hipGetErrorName, const char*, (hipError_t))                    \
    REQUIRED(hipGetErrorString, const char*, (hipError_t))                  \
    OPTIONAL(hipRuntimeGetVersion, hipError_t, (int*))

struct Api {
    HOSTREG_HIP_SYMBOLS(HOSTREG_DECLARE_FN, HOSTREG_DECLARE_FN)
};

struct Hip {
    DynLib lib{"HOSTREG_HIP_LIBRARY", {"libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6"}};
    Api api;
    Status status;
    int version = 0;
};

Status failure(const Api& api, const char* call, hipError_t r) {
    const char* name = api.hipGetErrorName(r);
    const char* text = api.hipGetErrorString(r);
    return Status::error(mirror_cuda(r),
                         std::string(call) + " failed: " + (name ? name : "unknown hipError_t") + " (" +
                             std::to_string(r) + "): " + (text ? text : ""),
                         r);
}

Status init(Hip& h) {
    DynLib& lib = h.lib;
    Api& api = h.api;
    if (!lib.loaded()) return Status::error(lib.status().code, "no ROCm runtime: " + lib.status().message);
    HOSTREG_HIP_SYMBOLS(HOSTREG_LOAD_REQUIRED, HOSTREG_LOAD_OPTIONAL)
    if (api.hipRuntimeGetVersion) api.hipRuntimeGetVersion(&h.version);
    int count = 0;
    if (hipError_t r = api.hipGetDeviceCount(&count)) return failure(api, "hipGetDeviceCount", r);
    if (count == 0) return Status::error(hostregErrorNoDevice, "the HIP runtime reports no device");
    return Status::ok();
}

Hip& hip() { return loaded_once<Hip, init>(); }

Status hip_probe() { return hip().status; }

std::string hip_describe() { return hip().lib.path() + ", HIP runtime " + std::to_string(hip().version); }

Status hip_register(void* ptr, size_t bytes, unsigned flags, void** device_ptr) {
    Api& api = hip().api;
    const unsigned passed = flags & ~HOSTREG_HOST_REGISTER_READ_ONLY;  // never the coarse-grained bit
    if (hipError_t r = api.hipHostRegister(ptr, bytes, passed)) return failure(api, "hipHostRegister", r);
    if (api.hipHostGetDevicePointer(device_ptr, ptr, 0) != 0) *device_ptr = nullptr;
    return Status::ok();
}

Status hip_unregister(void* ptr, size_t /*bytes*/) {
    Api& api = hip().api;
    if (hipError_t r = api.hipHostUnregister(ptr)) return failure(api, "hipHostUnregister", r);
    return Status::ok();
}

}  // namespace

extern const Backend kHipBackend = {
    /*name=*/"hip",
    /*supported=*/HOSTREG_HOST_REGISTER_PORTABLE | HOSTREG_HOST_REGISTER_MAPPED | HOSTREG_HOST_REGISTER_READ_ONLY,
    /*max_registration=*/SIZE_MAX,
    /*probe=*/hip_probe,
    /*describe=*/hip_describe,
    /*host_register=*/hip_register,
    /*host_unregister=*/hip_unregister,
};

}  // namespace hostreg
