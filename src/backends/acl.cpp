// acl.cpp: Huawei Ascend NPUs, through AscendCL (libascendcl.so, CANN).
//
// Facts (vendor-abi.md "Huawei Ascend, AscendCL"; CANN include/external/acl/acl_rt.h,
// acl_base_rt.h, error_codes/rt_error_codes.h, and the CANN 8.5 API docs):
// - aclrtHostRegisterV2(ptr, size, flag) (CANN 8.5+): flag must be non-zero and hold only
//   MAPPED 0x2, IOMEMORY 0x4, READONLY 0x8, PINNED 0x10000000, else 107000. CUDA's
//   Default (0) is therefore translated, never passed: hostreg always asks for PINNED, plus
//   MAPPED when the caller asked for Mapped. PINNED also registers pointers that are not
//   page-aligned (torch_npu's tests). IOMEMORY and READONLY are reserved in CANN 9.x:
//   hostreg answers 801 for IoMemory and drops ReadOnly (a hint, always safe to drop).
// - Older CANN has only V1, aclrtHostRegister(ptr, size, ACL_HOST_REGISTER_MAPPED = 0,
//   &devPtr), which wants a page-aligned pointer (Mooncake PR #4053 reports 64 KiB in
//   practice). hostreg refuses a pointer that is not page-aligned with 1 and says why, rather
//   than registering less than asked; a runtime demanding more answers 107008, which hostreg
//   also reports as 1 with AscendCL's message.
// - A current context is required (107002 without). Like the CUDA runtime, hostreg makes one
//   when the calling thread has none: aclInit (100002, already initialised, is fine) at
//   first use, then aclrtSetDevice on the device current where hostreg was first used, else
//   device 0. That leaves the thread with that device current, as cudaHostRegister would.
// - Codes: 507910 already registered, 507911 not registered, and the rest in kCodes below.
//   aclGetRecentErrMsg gives the runtime's own explanation, kept in the message.
#include <unistd.h>

#include <cstdint>
#include <string>

#include "backends/dynlib.hpp"
#include "core/backend.hpp"

namespace hostreg {
namespace {

using aclError = int;

constexpr uint32_t kRegMapped = 0x2;        // ACL_HOST_REG_MAPPED (V2)
constexpr uint32_t kRegPinned = 0x10000000; // ACL_HOST_REG_PINNED (V2)
constexpr int kRegisterTypeMapped = 0;      // ACL_HOST_REGISTER_MAPPED (V1)
constexpr aclError kRepeatInitialize = 100002;

#define HOSTREG_ACL_SYMBOLS(REQUIRED, OPTIONAL)                                  \
    REQUIRED(aclInit, aclError, (const char*))                                  \
    REQUIRED(aclrtSetDevice, aclError, (int32_t))                               \
    REQUIRED(aclrtGetDevice, aclError, (int32_t*))                              \
    REQUIRED(aclrtGetDeviceCount, aclError, (uint32_t*))                        \
    REQUIRED(aclrtHostRegister, aclError, (void*, uint64_t, int, void**))       \
    REQUIRED(aclrtHostUnregister, aclError, (void*))                            \
    REQUIRED(aclGetRecentErrMsg, const char*, (void))                           \
    OPTIONAL(aclrtHostRegisterV2, aclError, (void*, uint64_t, uint32_t))        \
    OPTIONAL(aclrtHostGetDevicePointer, aclError, (void*, void**, uint32_t))    \
    OPTIONAL(aclrtGetVersion, aclError, (int32_t*, int32_t*, int32_t*))

struct Api {
    HOSTREG_ACL_SYMBOLS(HOSTREG_DECLARE_FN, HOSTREG_DECLARE_FN)
};

// AscendCL code -> the cudaError a CUDA caller expects.
constexpr CodeMap kCodes[] = {
    {0, hostregSuccess},
    {100000, hostregErrorInvalidValue},       // ACL_ERROR_INVALID_PARAM
    {107000, hostregErrorInvalidValue},       // RT_PARAM_INVALID
    {107008, hostregErrorInvalidValue},       // RT_ADDR_UNALIGNED
    {100001, hostregErrorInitializationError},// ACL_ERROR_UNINITIALIZE
    {107002, hostregErrorInitializationError},// RT_CONTEXT_NULL
    {200000, hostregErrorMemoryAllocation},   // ACL_ERROR_BAD_ALLOC
    {207001, hostregErrorMemoryAllocation},   // RT_MEMORY_ALLOCATION
    {200001, hostregErrorNotSupported},       // API not supported
    {207000, hostregErrorNotSupported},       // RT_FEATURE_NOT_SUPPORT
    {207004, hostregErrorNoDevice},           // RT_NO_DEVICE
    {207006, hostregErrorNotPermitted},       // RT_NO_PERMISSION
    {507910, hostregErrorHostMemoryAlreadyRegistered},
    {507911, hostregErrorHostMemoryNotRegistered},
};

struct Acl {
    DynLib lib{"HOSTREG_ACL_LIBRARY", {"libascendcl.so"}};
    Api api;
    Status status;
    int32_t device = 0;  // the device a thread without a context is given
    std::string version;
};

Status failure(const Api& api, const char* call, aclError r) {
    const char* msg = api.aclGetRecentErrMsg ? api.aclGetRecentErrMsg() : nullptr;
    return Status::error(translate(r, kCodes),
                         std::string(call) + " failed: aclError " + std::to_string(r) + (msg && *msg ? ": " : "") +
                             (msg ? msg : ""),
                         r);
}

Status init(Acl& a) {
    DynLib& lib = a.lib;
    Api& api = a.api;
    if (!lib.loaded()) return Status::error(lib.status().code, "no CANN runtime: " + lib.status().message);
    HOSTREG_ACL_SYMBOLS(HOSTREG_LOAD_REQUIRED, HOSTREG_LOAD_OPTIONAL)
    int32_t major = 0, minor = 0, patch = 0;
    if (api.aclrtGetVersion && api.aclrtGetVersion(&major, &minor, &patch) == 0)
        a.version = std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
    if (aclError r = api.aclInit(nullptr); r != 0 && r != kRepeatInitialize) return failure(api, "aclInit", r);
    uint32_t count = 0;
    if (aclError r = api.aclrtGetDeviceCount(&count)) return failure(api, "aclrtGetDeviceCount", r);
    if (count == 0) return Status::error(hostregErrorNoDevice, "AscendCL reports no NPU");
    int32_t current = 0;
    if (api.aclrtGetDevice(&current) == 0) a.device = current;  // else: no context here, device 0
    return Status::ok();
}

Acl& acl() { return loaded_once<Acl, init>(); }

// Gives the calling thread a current context if it has none (see the file comment).
Status ensure_context() {
    Acl& a = acl();
    int32_t dev = 0;
    if (a.api.aclrtGetDevice(&dev) == 0) return Status::ok();
    if (aclError r = a.api.aclrtSetDevice(a.device)) return failure(a.api, "aclrtSetDevice", r);
    return Status::ok();
}

Status acl_probe() { return acl().status; }

std::string acl_describe() {
    Acl& a = acl();
    return a.lib.path() + ", AscendCL " + (a.version.empty() ? "version unknown" : a.version) +
           (a.api.aclrtHostRegisterV2 ? ", aclrtHostRegisterV2" : ", V1 aclrtHostRegister only");
}

Status acl_register(void* ptr, size_t bytes, unsigned flags, void** device_ptr) {
    Api& api = acl().api;
    if (Status s = ensure_context(); !s.is_ok()) return s;
    const bool mapped = flags & HOSTREG_HOST_REGISTER_MAPPED;
    if (api.aclrtHostRegisterV2) {
        const uint32_t flag = kRegPinned | (mapped ? kRegMapped : 0);
        if (aclError r = api.aclrtHostRegisterV2(ptr, bytes, flag)) return failure(api, "aclrtHostRegisterV2", r);
        *device_ptr = nullptr;  // only MAPPED memory has a device address
        if (mapped && api.aclrtHostGetDevicePointer && api.aclrtHostGetDevicePointer(ptr, device_ptr, 0) != 0)
            *device_ptr = nullptr;
        return Status::ok();
    }
    static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    if (reinterpret_cast<uintptr_t>(ptr) % page != 0)
        return Status::error(hostregErrorInvalidValue,
                             "this CANN has only V1 aclrtHostRegister, which needs a page-aligned pointer; "
                             "upgrade to CANN 8.5+ (aclrtHostRegisterV2) to register unaligned memory");
    if (aclError r = api.aclrtHostRegister(ptr, bytes, kRegisterTypeMapped, device_ptr))
        return failure(api, "aclrtHostRegister", r);
    return Status::ok();
}

Status acl_unregister(void* ptr, size_t /*bytes*/) {
    Api& api = acl().api;
    if (Status s = ensure_context(); !s.is_ok()) return s;
    if (aclError r = api.aclrtHostUnregister(ptr)) return failure(api, "aclrtHostUnregister", r);
    return Status::ok();
}

}  // namespace

extern const Backend kAclBackend = {
    /*name=*/"acl",
    /*supported=*/HOSTREG_HOST_REGISTER_PORTABLE | HOSTREG_HOST_REGISTER_MAPPED | HOSTREG_HOST_REGISTER_READ_ONLY,
    /*max_registration=*/SIZE_MAX,
    /*probe=*/acl_probe,
    /*describe=*/acl_describe,
    /*host_register=*/acl_register,
    /*host_unregister=*/acl_unregister,
};

}  // namespace hostreg
