// cuda.cpp: NVIDIA CUDA, through the driver API (libcuda.so.1).
//
// Why the driver and not the runtime (libcudart): the driver library is installed with every
// NVIDIA driver under one stable name, while libcudart comes in per-toolkit major versions
// (.so.12, .so.13) that must match what the rest of the process uses. The driver's
// registration is the same operation cudaHostRegister performs. A toolkit without a driver
// has no libcuda.so.1 (or only stubs/libcuda.so, whose cuInit answers 34
// CUDA_ERROR_STUB_LIBRARY): the backend is then unavailable and "auto" falls through.
//
// Contexts, as the CUDA runtime does it: the caller's current context when there is one
// (the runtime makes the selected device's primary context current, so a device chosen with
// cudaSetDevice / torch.cuda.set_device is respected); otherwise device 0's primary context,
// pushed for the call and popped after, so the caller's thread state is left as it was.
//
// Facts (vendor-abi.md "NVIDIA CUDA"; CUDA 13.0 cuda.h): cuda.h maps cuMemHostRegister and
// cuMemHostGetDevicePointer to their _v2 symbols; registration flags are the runtime's bits
// (Portable 0x1, DeviceMap 0x2, IoMemory 0x4, ReadOnly 0x8) and are passed through: the
// driver decides (ReadOnly without device attribute 113 answers 801). CUresult numbers
// mirror cudaError's for every code used here.
#include <mutex>
#include <cstdint>
#include <string>

#include "backends/dynlib.hpp"
#include "core/backend.hpp"

namespace hostreg {
namespace {

using CUresult = int;
using CUdevice = int;
using CUcontext = struct CUctx_st*;
using CUdeviceptr = unsigned long long;

// Driver r580 and later refuse one registration of 512 GiB or more (page-table size cap;
// vendor-abi.md, from xcena-dev/maru #64 and LMCache PR #5177): arenas split below that.
constexpr size_t kMaxRegistration = size_t{256} << 30;

#define HOSTREG_CUDA_SYMBOLS(REQUIRED, OPTIONAL)                                  \
    REQUIRED(cuInit, CUresult, (unsigned))                                        \
    REQUIRED(cuDriverGetVersion, CUresult, (int*))                                \
    REQUIRED(cuDeviceGetCount, CUresult, (int*))                                  \
    REQUIRED(cuDeviceGet, CUresult, (CUdevice*, int))                             \
    REQUIRED(cuDevicePrimaryCtxRetain, CUresult, (CUcontext*, CUdevice))          \
    REQUIRED(cuCtxGetCurrent, CUresult, (CUcontext*))                             \
    REQUIRED(cuCtxPushCurrent_v2, CUresult, (CUcontext))                          \
    REQUIRED(cuCtxPopCurrent_v2, CUresult, (CUcontext*))                          \
    REQUIRED(cuMemHostRegister_v2, CUresult, (void*, size_t, unsigned))           \
    REQUIRED(cuMemHostUnregister, CUresult, (void*))                              \
    REQUIRED(cuMemHostGetDevicePointer_v2, CUresult, (CUdeviceptr*, void*, unsigned)) \
    REQUIRED(cuGetErrorName, CUresult, (CUresult, const char**))                  \
    REQUIRED(cuGetErrorString, CUresult, (CUresult, const char**))

struct Api {
    HOSTREG_CUDA_SYMBOLS(HOSTREG_DECLARE_FN, HOSTREG_DECLARE_FN)
};

struct Cuda {
    DynLib lib{"HOSTREG_CUDA_LIBRARY", {"libcuda.so.1"}};
    Api api;
    Status status;
    int driver_version = 0;
    CUcontext primary = nullptr;  // device 0's primary context, retained for the process
};

// "cuMemHostRegister_v2 failed: CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED (712): <text>"
Status failure(const Api& api, const char* call, CUresult r) {
    const char* name = nullptr;
    const char* text = nullptr;
    // A stub driver cannot name its own codes: fall back to hostreg's names (same numbers).
    if (api.cuGetErrorName(r, &name) != 0 || !name) name = error_name(mirror_cuda(r));
    if (api.cuGetErrorString(r, &text) != 0 || !text) text = error_string(mirror_cuda(r));
    return Status::error(mirror_cuda(r),
                         std::string(call) + " failed: " + name + " (" + std::to_string(r) + "): " + text, r);
}

Status init(Cuda& c) {
    DynLib& lib = c.lib;
    Api& api = c.api;
    if (!lib.loaded()) return Status::error(lib.status().code, "no NVIDIA driver: " + lib.status().message);
    HOSTREG_CUDA_SYMBOLS(HOSTREG_LOAD_REQUIRED, HOSTREG_LOAD_OPTIONAL)
    api.cuDriverGetVersion(&c.driver_version);
    if (CUresult r = api.cuInit(0)) {
        Status s = failure(api, "cuInit", r);
        if (r == 34) s.message += " (" + lib.path() + " is the toolkit's stub, not a driver)";
        return s;
    }
    int count = 0;
    if (CUresult r = api.cuDeviceGetCount(&count)) return failure(api, "cuDeviceGetCount", r);
    if (count == 0) return Status::error(hostregErrorNoDevice, "the driver reports no CUDA device");
    CUdevice dev = 0;
    if (CUresult r = api.cuDeviceGet(&dev, 0)) return failure(api, "cuDeviceGet", r);
    if (CUresult r = api.cuDevicePrimaryCtxRetain(&c.primary, dev))
        return failure(api, "cuDevicePrimaryCtxRetain", r);
    return Status::ok();
}

Cuda& cuda() { return loaded_once<Cuda, init>(); }

// Runs call with a current context (see the file comment) and returns its CUresult.
template <class F>
CUresult with_context(F call) {
    Cuda& c = cuda();
    CUcontext current = nullptr;
    if (c.api.cuCtxGetCurrent(&current) == 0 && current) return call();
    if (CUresult r = c.api.cuCtxPushCurrent_v2(c.primary)) return r;
    CUresult r = call();
    CUcontext popped = nullptr;
    c.api.cuCtxPopCurrent_v2(&popped);
    return r;
}

Status cuda_probe() { return cuda().status; }

std::string cuda_describe() {
    Cuda& c = cuda();
    return c.lib.path() + ", driver API " + std::to_string(c.driver_version / 1000) + "." +
           std::to_string(c.driver_version % 1000 / 10);
}

Status cuda_register(void* ptr, size_t bytes, unsigned flags, void** device_ptr) {
    Api& api = cuda().api;
    CUdeviceptr dev = 0;
    CUresult r = with_context([&] {
        CUresult rr = api.cuMemHostRegister_v2(ptr, bytes, flags);
        if (rr == 0 && api.cuMemHostGetDevicePointer_v2(&dev, ptr, 0) != 0) dev = 0;
        return rr;
    });
    if (r) return failure(api, "cuMemHostRegister_v2", r);
    *device_ptr = reinterpret_cast<void*>(static_cast<uintptr_t>(dev));
    return Status::ok();
}

Status cuda_unregister(void* ptr, size_t /*bytes*/) {
    Api& api = cuda().api;
    if (CUresult r = with_context([&] { return api.cuMemHostUnregister(ptr); }))
        return failure(api, "cuMemHostUnregister", r);
    return Status::ok();
}

}  // namespace

extern const Backend kCudaBackend = {
    /*name=*/"cuda",
    /*supported=*/HOSTREG_HOST_REGISTER_ALL_FLAGS,
    /*max_registration=*/kMaxRegistration,
    /*probe=*/cuda_probe,
    /*describe=*/cuda_describe,
    /*host_register=*/cuda_register,
    /*host_unregister=*/cuda_unregister,
};

}  // namespace hostreg
