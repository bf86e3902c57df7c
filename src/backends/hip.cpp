// hip.cpp: AMD ROCm, through the HIP runtime (libamdhip64.so; calls in hip_abi.hpp).
//
// HIP's runtime keeps its own current device and context, as CUDA's runtime does, so this
// backend only translates flags and codes. Facts from ROCm's clr, hipamd/src/hip_memory.cpp
// (ihipHostRegister / ihipHostUnregister), and hip_runtime_api.h; see docs/vendors.md "HIP":
// - Flags: Portable 0x1 and Mapped 0x2 as CUDA's. clr registers every range the same way
//   (CL_MEM_USE_HOST_PTR | CL_MEM_SVM_ATOMICS) and never reads bit 0x8
//   (hipHostRegisterReadOnly, "ignored on AMD devices"; hipExtHostRegisterCoarseGrained in
//   ROCm 5.x headers), so ReadOnly is passed through harmlessly. IoMemory 0x4 is honoured by
//   current clr on Linux (ROCCLR_MEM_IO_MEMORY) and accepted by older ones; a runtime that
//   answers hipErrorInvalidValue for it did not take it, which hostreg reports as 801.
// - clr answers hipErrorInvalidValue (1), not hipErrorOutOfMemory, when it cannot pin the
//   memory (`if (!mem->create(...)) ... return hipErrorInvalidValue`). hostreg has already
//   checked every argument, so a 1 here means the pin failed: reported as 2
//   (cudaErrorMemoryAllocation), the native 1 and clr's reason kept.
// - clr never answers 712: an overlap only logs, and ROCr keeps overlapping locks. The
//   registry refuses overlaps itself. Unregistering a pointer inside a registration aborts
//   the process inside clr; the registry passes only the exact base it registered.
// - The device address may differ from the host address: asked with hipHostGetDevicePointer.
#include <string>

#include "backends/codes.hpp"
#include "backends/dynlib.hpp"
#include "backends/hip_abi.hpp"

namespace hostreg {
namespace {

using namespace hip_abi;

HOSTREG_DEFINE_API(HOSTREG_HIP_SYMBOLS)

struct Hip : Runtime<Api> {
    static constexpr const char* kLibraryEnv = "HOSTREG_HIP_LIBRARY";
    // Unversioned (a ROCm install or -dev package), then ROCm 7, 6 and 5 (Debian's 5.2).
    static constexpr const char* kLibraryNames[] = {"libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6",
                                                    "libamdhip64.so.5", nullptr};
    static constexpr const char* kAbsent = "no ROCm runtime";
};

Status failure(const Api& api, const char* call, hipError_t r, int code, const std::string& why = "") {
    const char* name = api.hipGetErrorName(r);
    const char* text = api.hipGetErrorString(r);
    return Status::error(code,
                         std::string(call) + " failed: " + (name ? name : "unknown hipError_t") + " (" +
                             std::to_string(r) + "): " + (text ? text : "") + why,
                         r);
}

Status start(Hip& h) {
    Api& api = h.api;
    int version = 0;
    if (api.hipRuntimeGetVersion && api.hipRuntimeGetVersion(&version) == kHipSuccess)  // HIP_VERSION's encoding
        h.probe.caps.version = "HIP " + std::to_string(version / 10000000) + "." +
                               std::to_string(version / 100000 % 100) + "." + std::to_string(version % 100000);
    int count = 0;
    if (hipError_t r = api.hipGetDeviceCount(&count)) return failure(api, "hipGetDeviceCount", r, mirror_cuda(r));
    if (count == 0) return Status::error(hostregErrorNoDevice, "the HIP runtime reports no device");
    h.probe.caps.flags =
        kHipHostRegisterPortable | kHipHostRegisterMapped | kHipHostRegisterIoMemory | kHipHostRegisterReadOnly;
    h.probe.caps.note = "page-locked and DMA-mapped by the ROCm runtime (hipHostRegister)";
    return Status::ok();
}

Hip& hip() { return loaded_once<Hip, start>(); }

const Probe& hip_probe() { return hip().probe; }

Status hip_register(void* ptr, size_t bytes, unsigned flags, Piece* piece) {
    Api& api = hip().api;
    if (hipError_t r = api.hipHostRegister(ptr, bytes, flags)) {
        if (r != kHipErrorInvalidValue) return failure(api, "hipHostRegister", r, mirror_cuda(r));
        if (flags & kHipHostRegisterIoMemory)
            return failure(api, "hipHostRegister", r, hostregErrorNotSupported,
                           " (this HIP runtime did not register the range as I/O memory, hipHostRegisterIoMemory)");
        return failure(api, "hipHostRegister", r, hostregErrorMemoryAllocation,
                       " (the arguments are valid: the runtime could not pin the memory)");
    }
    void* dev = nullptr;
    piece->device = api.hipHostGetDevicePointer(&dev, ptr, 0) == kHipSuccess ? dev : nullptr;
    return Status::ok();
}

Status hip_unregister(void* ptr, size_t /*bytes*/, const Piece& /*piece*/) {
    Api& api = hip().api;
    if (hipError_t r = api.hipHostUnregister(ptr)) return failure(api, "hipHostUnregister", r, mirror_cuda(r));
    return Status::ok();
}

}  // namespace

extern const Backend kHipBackend = {
    /*name=*/"hip",
    /*probe=*/hip_probe,
    /*host_register=*/hip_register,
    /*host_unregister=*/hip_unregister,
    /*share=*/defaults::share,
    /*set_default_device=*/defaults::set_default_device,  // the runtime's own current device (0 unless chosen), as
                                                          // CUDA's
    /*room=*/defaults::room,                              // the runtime pins; no limit that hostreg checks beforehand
};

}  // namespace hostreg
