// acl.cpp: Huawei Ascend NPUs, through AscendCL (libascendcl.so, CANN; calls in acl_abi.hpp).
//
// Facts from the CANN runtime's published sources (hicann/runtime) and the CANN 8.5 / 9.x
// API docs; see docs/vendors.md "AscendCL":
// - Every registration asks for ACL_HOST_REG_MAPPED | ACL_HOST_REG_PINNED. PINNED alone is
//   not enough: on drivers without pin-register support the runtime only *records* a
//   PINNED range and locks nothing (src/runtime/api/impl/api_impl.cc, ApiImpl::HostRegisterV2:
//   `if (isMapped) { flag &= ~RT_MEM_HOST_REGISTER_PINNED; ... Driver_()->HostRegister(...) }
//   if (isPinned) { InsertPinnedMemory(ptr, size); }`), a success that is not a lock. MAPPED
//   always reaches the driver, which maps the pages for the device's DMA; where the driver
//   supports pin-register, PINNED reaches it too and it also pins them
//   (src/runtime/driver/npu_driver_mem.cc, NpuDriver::HostRegister: MAPPED|PINNED becomes
//   HOST_MEM_MAP_DEV | MEM_REGISTER_HOST_PINNED). torch_npu's pinned memory uses MAPPED too.
// - CUDA's flags: Default, Portable and Mapped all become MAPPED|PINNED (a superset of each);
//   ReadOnly is dropped (a promise that the device only reads; AscendCL's READONLY is
//   reserved in CANN 9.x); IoMemory (reserved as well) answers 801.
// - The address must be 4 KiB-aligned for every flag (CANN 8.5 / 9.x aclrtHostRegisterV2
//   docs; V1 documents the same); the driver answers 507899 otherwise. So the backend's
//   granule is 4 KiB (or the page, if larger): the registry registers whole granules and
//   shares partial edge granules between neighbours (core/page_share.hpp).
// - Older CANN has only V1, aclrtHostRegister(ptr, size, ACL_HOST_REGISTER_MAPPED, &devPtr),
//   which takes the same path to the driver (NpuDriver::HostRegister with MAPPED).
// - A current context is required (107002 without). Like the CUDA runtime, hostreg makes one
//   when the calling thread has none: aclInit (100002, already initialised, is fine) at first
//   use, then aclrtSetDevice on the device current where hostreg was first used, else device 0,
//   leaving it current, as cudaHostRegister would.
// - Codes (kCodes below); aclGetRecentErrMsg gives the runtime's own explanation, kept in the
//   message. aclrtHostGetDevicePointer takes only the exact base of a registration.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "backends/acl_abi.hpp"
#include "backends/codes.hpp"
#include "backends/dynlib.hpp"

namespace hostreg {
namespace {

using namespace acl_abi;

constexpr uint32_t kFlag = kHostRegMapped | kHostRegPinned;  // see the file comment
constexpr size_t kAlignment = 4096;  // CANN docs: "4K-page-aligned"

HOSTREG_DEFINE_API(HOSTREG_ACL_SYMBOLS)

// AscendCL code -> the cudaError a CUDA caller expects.
constexpr CodeMap kCodes[] = {
    {kSuccess, hostregSuccess},
    {kErrorInvalidParam, hostregErrorInvalidValue},
    {kErrorRtParamInvalid, hostregErrorInvalidValue},
    {kErrorRtAddrUnaligned, hostregErrorInvalidValue},
    {kErrorRtInvalidDeviceId, hostregErrorInvalidDevice},            // 101
    {kErrorUninitialize, hostregErrorInitializationError},
    {kErrorRtContextNull, 201},                                      // cudaErrorDeviceUninitialized
    {kErrorBadAlloc, hostregErrorMemoryAllocation},
    {kErrorRtMemoryAllocation, hostregErrorMemoryAllocation},
    {kErrorApiNotSupport, hostregErrorNotSupported},
    {kErrorRtFeatureNotSupport, hostregErrorNotSupported},
    {kErrorRtNoDevice, hostregErrorNoDevice},
    {kErrorRtNoPermission, hostregErrorNotPermitted},
    {kErrorHostMemoryAlreadyRegistered, hostregErrorHostMemoryAlreadyRegistered},
    {kErrorHostMemoryNotRegistered, hostregErrorHostMemoryNotRegistered},
    // 507000 (runtime internal) and 507899 (driver internal) stay 999 except where a call
    // gives them a meaning (acl_register).
};

struct Acl : Runtime<Api> {
    static constexpr const char* kLibraryEnv = "HOSTREG_ACL_LIBRARY";
    static constexpr const char* kLibraryNames[] = {"libascendcl.so", nullptr};
    static constexpr const char* kAbsent = "no CANN runtime";
    int32_t device = 0;  // the device a thread without a context is given
};

Status failure(const Api& api, const char* call, aclError r, int code) {
    const char* msg = api.aclGetRecentErrMsg();
    return Status::error(code,
                         std::string(call) + " failed: aclError " + std::to_string(r) + (msg && *msg ? ": " : "") +
                             (msg ? msg : ""),
                         r);
}
Status failure(const Api& api, const char* call, aclError r) { return failure(api, call, r, translate(r, kCodes)); }

Status start(Acl& a) {
    Api& api = a.api;
    Capabilities& caps = a.probe.caps;
    int32_t major = 0, minor = 0, patch = 0;
    if (api.aclrtGetVersion && api.aclrtGetVersion(&major, &minor, &patch) == kSuccess)
        caps.version = "AscendCL " + std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
    caps.version += std::string(caps.version.empty() ? "" : ", ") +
                    (api.aclrtHostRegisterV2 ? "aclrtHostRegisterV2" : "V1 aclrtHostRegister only");
    if (aclError r = api.aclInit(nullptr); r != kSuccess && r != kErrorRepeatInitialize)
        return failure(api, "aclInit", r);
    uint32_t count = 0;
    if (aclError r = api.aclrtGetDeviceCount(&count)) return failure(api, "aclrtGetDeviceCount", r);
    if (count == 0) return Status::error(hostregErrorNoDevice, "AscendCL reports no NPU");
    int32_t current = 0;
    if (api.aclrtGetDevice(&current) == kSuccess) a.device = current;  // else: no context here, device 0
    caps.flags = HOSTREG_HOST_REGISTER_PORTABLE | HOSTREG_HOST_REGISTER_MAPPED | HOSTREG_HOST_REGISTER_READ_ONLY;
    caps.granule = std::max(kAlignment, static_cast<size_t>(sysconf(_SC_PAGESIZE)));
    caps.note = std::string("page-locked and mapped for the NPU by the CANN driver (") +
                (api.aclrtHostRegisterV2 ? "aclrtHostRegisterV2 MAPPED|PINNED" : "aclrtHostRegister MAPPED") +
                "), in whole 4 KiB pages";
    return Status::ok();
}

Acl& acl() { return loaded_once<Acl, start>(); }

// Gives the calling thread a current context if it has none (see the file comment).
Status ensure_context() {
    Acl& a = acl();
    int32_t dev = 0;
    if (a.api.aclrtGetDevice(&dev) == kSuccess) return Status::ok();
    if (aclError r = a.api.aclrtSetDevice(a.device)) return failure(a.api, "aclrtSetDevice", r);
    return Status::ok();
}

const Probe& acl_probe() { return acl().probe; }

// [ptr, ptr + bytes) is whole granules (the registry's doing).
Status acl_register(void* ptr, size_t bytes, unsigned /*flags*/, Piece* piece) {
    Api& api = acl().api;
    if (Status s = ensure_context(); !s.is_ok()) return s;
    const char* call = api.aclrtHostRegisterV2 ? "aclrtHostRegisterV2" : "aclrtHostRegister";
    void* dev = nullptr;
    aclError r = api.aclrtHostRegisterV2 ? api.aclrtHostRegisterV2(ptr, bytes, kFlag)
                                         : api.aclrtHostRegister(ptr, bytes, kHostRegisterMapped, &dev);
    // The arguments are valid and aligned: a driver failure means it could not register the
    // memory, which CUDA reports as cudaErrorMemoryAllocation.
    if (r == kErrorRtDrvInternalError) return failure(api, call, r, hostregErrorMemoryAllocation);
    if (r != kSuccess) return failure(api, call, r);
    if (api.aclrtHostRegisterV2 &&
        (!api.aclrtHostGetDevicePointer || api.aclrtHostGetDevicePointer(ptr, &dev, 0) != kSuccess))
        dev = nullptr;
    piece->device = dev;
    return Status::ok();
}

Status acl_unregister(void* ptr, size_t /*bytes*/, const Piece& /*piece*/) {
    Api& api = acl().api;
    if (Status s = ensure_context(); !s.is_ok()) return s;
    if (aclError r = api.aclrtHostUnregister(ptr)) return failure(api, "aclrtHostUnregister", r);
    return Status::ok();
}

}  // namespace

extern const Backend kAclBackend = {
    /*name=*/"acl",
    /*probe=*/acl_probe,
    /*host_register=*/acl_register,
    /*host_unregister=*/acl_unregister,
    /*share=*/nullptr,
};

}  // namespace hostreg
