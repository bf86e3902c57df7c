// cuda.cpp: NVIDIA CUDA, through the driver API (libcuda.so.1; calls in cuda_abi.hpp).
//
// Why the driver and not the runtime (libcudart): the driver library is installed with every
// NVIDIA driver under one stable name, while libcudart comes in per-toolkit major versions
// (.so.12, .so.13) that must match what the rest of the process uses. The driver's
// registration is the same operation cudaHostRegister performs. A toolkit without a driver
// has no libcuda.so.1 (or only stubs/libcuda.so, whose cuInit answers 34
// CUDA_ERROR_STUB_LIBRARY): the backend is then unavailable and "auto" falls through.
//
// Contexts, as the CUDA runtime does it: a registration is made in the caller's current
// context when there is one (the runtime makes the selected device's primary context
// current, so a device chosen with cudaSetDevice / torch.cuda.set_device is respected), else
// in device 0's primary context, retained once for the process (cuda.h: a retained primary
// context stays active until released), pushed for the call and popped after. cuda.h's
// CU_MEMHOSTREGISTER_PORTABLE ("considered as pinned memory by all CUDA contexts, not just the
// one that performed the allocation") implies a registration belongs to its context, so it is
// undone in the context it was made in, whichever thread and context the caller has then.
//
// Flags pass through (the driver decides); ReadOnly is left out of the capabilities when
// device 0 lacks CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED (113), so it answers
// 801 as the driver would. CUresult numbers are cudaError's: they are kept (codes.hpp).
#include <cstdint>
#include <string>

#include "backends/codes.hpp"
#include "backends/cuda_abi.hpp"
#include "backends/dynlib.hpp"

namespace hostreg {
namespace {

using namespace cuda_abi;

// Driver r580 and later refuse one registration of 512 GiB or more (page-table size cap;
// docs/vendors.md, from xcena-dev/maru #64 and LMCache PR #5177): hostregChunkedRegister splits below that.
constexpr size_t kMaxRegistration = size_t{256} << 30;

HOSTREG_DEFINE_API(HOSTREG_CUDA_SYMBOLS)

struct Cuda : Runtime<Api> {
    static constexpr const char* kLibraryEnv = "HOSTREG_CUDA_LIBRARY";
    static constexpr const char* kLibraryNames[] = {"libcuda.so.1", nullptr};
    static constexpr const char* kAbsent = "no NVIDIA driver";
    CUcontext primary = nullptr;  // device 0's primary context, retained for the process
};

// "cuMemHostRegister_v2 failed: CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED (712): <text>"
Status failure(const Api& api, const char* call, CUresult r) {
    const char* name = nullptr;
    const char* text = nullptr;
    // A stub driver cannot name its own codes: fall back to hostreg's names (same numbers).
    if (api.cuGetErrorName(r, &name) != kCudaSuccess || !name) name = error_name(mirror_cuda(r));
    if (api.cuGetErrorString(r, &text) != kCudaSuccess || !text) text = error_string(mirror_cuda(r));
    return Status::error(mirror_cuda(r),
                         std::string(call) + " failed: " + name + " (" + std::to_string(r) + "): " + text, r);
}

Status start(Cuda& c) {
    Api& api = c.api;
    int version = 0;
    if (api.cuDriverGetVersion(&version) == kCudaSuccess)
        c.probe.caps.version =
            "driver API " + std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
    if (CUresult r = api.cuInit(0)) {
        Status s = failure(api, "cuInit", r);
        if (r == kCudaErrorStubLibrary) s.message += " (" + c.lib.path() + " is the toolkit's stub, not a driver)";
        return s;
    }
    int count = 0;
    if (CUresult r = api.cuDeviceGetCount(&count)) return failure(api, "cuDeviceGetCount", r);
    if (count == 0) return Status::error(hostregErrorNoDevice, "the driver reports no CUDA device");
    CUdevice dev = 0;
    if (CUresult r = api.cuDeviceGet(&dev, 0)) return failure(api, "cuDeviceGet", r);
    if (CUresult r = api.cuDevicePrimaryCtxRetain(&c.primary, dev)) return failure(api, "cuDevicePrimaryCtxRetain", r);
    Capabilities& caps = c.probe.caps;
    caps.flags = HOSTREG_HOST_REGISTER_ALL_FLAGS;
    int read_only = 1;
    if (api.cuDeviceGetAttribute &&
        api.cuDeviceGetAttribute(&read_only, kAttributeReadOnlyHostRegisterSupported, dev) == kCudaSuccess &&
        !read_only)
        caps.flags &= ~HOSTREG_HOST_REGISTER_READ_ONLY;
    caps.max_registration = kMaxRegistration;
    caps.note = "page-locked and DMA-mapped by the NVIDIA driver (cuMemHostRegister)";
    return Status::ok();
}

Cuda& cuda() { return loaded_once<Cuda, start>(); }

// Runs call with ctx current (nullptr: the caller's current context, else device 0's primary
// one) and stores the context used in *used. Returns call's CUresult, or the push's when ctx
// cannot be made current (*pushed then false).
template <class F>
CUresult in_context(CUcontext ctx, CUcontext* used, F call, bool* pushed = nullptr) {
    Cuda& c = cuda();
    CUcontext current = nullptr;
    if (c.api.cuCtxGetCurrent(&current) != kCudaSuccess) current = nullptr;
    if (ctx == nullptr) ctx = current ? current : c.primary;
    *used = ctx;
    if (pushed) *pushed = true;
    if (ctx == current) return call();
    if (CUresult r = c.api.cuCtxPushCurrent_v2(ctx)) {
        if (pushed) *pushed = false;
        return r;
    }
    CUresult r = call();
    CUcontext popped = nullptr;
    c.api.cuCtxPopCurrent_v2(&popped);
    return r;
}

const Probe& cuda_probe() { return cuda().probe; }

Status cuda_register(void* ptr, size_t bytes, unsigned flags, Piece* piece) {
    Api& api = cuda().api;
    CUdeviceptr dev = 0;
    CUcontext used = nullptr;
    CUresult r = in_context(nullptr, &used, [&] {
        CUresult rr = api.cuMemHostRegister_v2(ptr, bytes, flags);
        if (rr == kCudaSuccess && api.cuMemHostGetDevicePointer_v2(&dev, ptr, 0) != kCudaSuccess) dev = 0;
        return rr;
    });
    if (r) return failure(api, "cuMemHostRegister_v2", r);
    piece->device = reinterpret_cast<void*>(static_cast<uintptr_t>(dev));
    piece->owner = used;
    return Status::ok();
}

Status cuda_unregister(void* ptr, size_t /*bytes*/, const Piece& piece) {
    Api& api = cuda().api;
    CUcontext used = nullptr;
    bool pushed = true;
    CUresult r =
        in_context(static_cast<CUcontext>(piece.owner), &used, [&] { return api.cuMemHostUnregister(ptr); }, &pushed);
    if (r == kCudaSuccess) return Status::ok();
    // The context it was made in is gone (released to nothing, reset or destroyed), and its
    // registrations went with it (cuda.h: a primary context "is automatically reset once the
    // last reference to it is released"): "not registered", so the registry forgets it rather
    // than keep it for ever.
    if (!pushed && (r == kCudaErrorInvalidContext || r == kCudaErrorContextIsDestroyed)) {
        Status s = failure(api, "cuCtxPushCurrent_v2", r);
        return Status::error(
                   hostregErrorHostMemoryNotRegistered,
                   s.message + " (the context the registration was made in is gone, and the registration with it)", r)
            .blame_environment();
    }
    return failure(api, "cuMemHostUnregister", r);
}

}  // namespace

extern const Backend kCudaBackend = {
    /*name=*/"cuda",
    /*probe=*/cuda_probe,
    /*host_register=*/cuda_register,
    /*host_unregister=*/cuda_unregister,
    /*share=*/defaults::share,
    /*set_default_device=*/defaults::set_default_device,  // a thread without a context: device 0's primary context,
                                                          // CUDA's default
    /*room=*/defaults::room,                              // the runtime pins; no limit that hostreg checks beforehand
};

}  // namespace hostreg
