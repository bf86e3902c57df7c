// musa.cpp: Moore Threads MUSA, through the MUSA runtime (libmusart.so; calls in
// musa_abi.hpp).
//
// The MUSA runtime mirrors CUDA's: musaHostRegister(void*, size_t, unsigned) with CUDA's
// flag bits, musaHostUnregister, musaHostGetDevicePointer, and (expected, unconfirmed:
// docs/vendors.md "MUSA") CUDA's error numbers. So flags pass through, and numbers that are
// cudaError's keep their number; anything else becomes 999 with the native code kept.
#include <string>

#include "backends/codes.hpp"
#include "backends/dynlib.hpp"
#include "backends/musa_abi.hpp"

namespace hostreg {
namespace {

using namespace musa_abi;

HOSTREG_DEFINE_API(HOSTREG_MUSA_SYMBOLS)

struct Musa : Runtime<Api> {
    static constexpr const char* kLibraryEnv = "HOSTREG_MUSA_LIBRARY";
    static constexpr const char* kLibraryNames[] = {"libmusart.so", "libmusart.so.1", nullptr};
    static constexpr const char* kAbsent = "no MUSA runtime";
};

Status failure(const Api& api, const char* call, musaError_t r) {
    const char* name = api.musaGetErrorName ? api.musaGetErrorName(r) : nullptr;
    const char* text = api.musaGetErrorString(r);
    return Status::error(mirror_cuda(r),
                         std::string(call) + " failed: " + (name ? name : "musaError_t") + " (" + std::to_string(r) +
                             "): " + (text ? text : ""),
                         r);
}

Status start(Musa& m) {
    Api& api = m.api;
    int version = 0;
    if (api.musaRuntimeGetVersion && api.musaRuntimeGetVersion(&version) == 0)
        m.probe.caps.version = "MUSA runtime " + std::to_string(version);
    int count = 0;
    if (musaError_t r = api.musaGetDeviceCount(&count)) return failure(api, "musaGetDeviceCount", r);
    if (count == 0) return Status::error(hostregErrorNoDevice, "the MUSA runtime reports no device");
    m.probe.caps.flags = HOSTREG_HOST_REGISTER_ALL_FLAGS;
    m.probe.caps.note = "page-locked and DMA-mapped by the MUSA runtime (musaHostRegister)";
    return Status::ok();
}

Musa& musa() { return loaded_once<Musa, start>(); }

const Probe& musa_probe() { return musa().probe; }

Status musa_register(void* ptr, size_t bytes, unsigned flags, Piece* piece) {
    Api& api = musa().api;
    if (musaError_t r = api.musaHostRegister(ptr, bytes, flags)) return failure(api, "musaHostRegister", r);
    void* dev = nullptr;
    piece->device = api.musaHostGetDevicePointer(&dev, ptr, 0) == 0 ? dev : nullptr;
    return Status::ok();
}

Status musa_unregister(void* ptr, size_t /*bytes*/, const Piece& /*piece*/) {
    Api& api = musa().api;
    if (musaError_t r = api.musaHostUnregister(ptr)) return failure(api, "musaHostUnregister", r);
    return Status::ok();
}

}  // namespace

extern const Backend kMusaBackend = {
    /*name=*/"musa",
    /*probe=*/musa_probe,
    /*host_register=*/musa_register,
    /*host_unregister=*/musa_unregister,
    /*share=*/defaults::share,
    /*set_default_device=*/defaults::set_default_device,  // the runtime's own current device (0 unless chosen), as
                                                          // CUDA's
    /*room=*/defaults::room,                              // the runtime pins; no limit that hostreg checks beforehand
};

}  // namespace hostreg
