// acl.cpp: Huawei Ascend NPUs, through AscendCL (libascendcl.so, CANN; calls in acl_abi.hpp).
//
// Facts from the CANN runtime's sources (hicann/runtime) and API docs (docs/vendors.md):
// - Every registration asks for ACL_HOST_REG_MAPPED | ACL_HOST_REG_PINNED. PINNED alone is
//   not enough: on drivers without pin-register support the runtime only *records* a
//   PINNED range and locks nothing (ApiImpl::HostRegisterV2; docs/vendors.md quotes it), a
//   success that is not a lock. MAPPED always reaches the driver, which maps the pages for
//   the device's DMA; where the driver supports pin-register, PINNED reaches it too and it
//   also pins them (NpuDriver::HostRegister). (PINNED on memory that is already page-locked,
//   an aclrtMallocHost buffer, is refused: an error, never a false success.)
// - CUDA's flags: Default, Portable and Mapped all become MAPPED|PINNED; but a registration is
//   for one NPU only (ApiImpl::HostRegisterV2 passes the current context's device to the
//   driver, which keeps one mapping node per device), where CUDA's Portable means every
//   device. So Portable is honoured while the process registers for one NPU (torch_npu's
//   setup: one NPU per process) and answers 801 once it has registered for another;
//   ReadOnly is dropped (a promise that the device only reads; AscendCL's READONLY is
//   reserved in CANN 9.x); IoMemory (reserved as well) answers 801.
// - The address must be 4 KiB-aligned for every flag (CANN 8.5 / 9.x aclrtHostRegisterV2
//   docs; V1 documents the same); the driver answers 507899 otherwise. So the backend's
//   granule is 4 KiB (or the page, if larger): the registry registers whole granules and
//   shares partial edge granules between neighbours (core/page_share.hpp).
// - Older CANN has only V1, aclrtHostRegister(ptr, size, ACL_HOST_REGISTER_MAPPED, &devPtr),
//   which takes the same path to the driver (NpuDriver::HostRegister with MAPPED).
// - A current context is required (107002 without), and contexts are per thread: SetDevice
//   stores the context thread-locally and aclrtGetDevice answers 107002 on a thread that never
//   set one (src/runtime/api/impl/api_impl.cc, ApiImpl::SetDevice / GetDevice). The first
//   registration often runs on a staging thread (hostreg's Stager, DCP's DefaultStager), which
//   has none. A registration is made for the device of the thread's current context, so the
//   backend registers on such a thread for *the process's* device: the one set with
//   hostregSetDefaultDevice, else the one it saw current on a thread that used hostreg (the
//   first such thread; torch_npu sets threads without a context to the device it was
//   initialised on the same way, torch_npu/csrc/core/npu/CachingHostAllocator.cpp). With
//   neither it refuses with 201 and says how to tell it: it never creates a context on a
//   device the process did not choose (NPU 0 for rank k would map rank k's arena for the
//   wrong NPU). aclInit (100002, already initialised, is fine) runs at first use.
// - A registration is made for the thread's current device (ApiImpl::HostRegisterV2, and
//   HostUnregister likewise): each piece remembers its device and is undone on it. A host page
//   is registered for one device only: registrations on two NPUs cannot share an edge page
//   (the second answers 801 and says so).
// - Kernels 5.10 or older: unavailable (kernel_too_old). Codes: kCodes, aclGetRecentErrMsg in
//   the message. aclrtHostGetDevicePointer takes only a base. Details: docs/vendors.md.
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <string>

#include "backends/acl_abi.hpp"
#include "backends/codes.hpp"
#include "backends/dynlib.hpp"

namespace hostreg {
namespace {

using namespace acl_abi;

constexpr uint32_t kFlag = kHostRegMapped | kHostRegPinned;  // see the file comment
constexpr size_t kAlignment = 4096;                          // CANN docs: "4K-page-aligned"

HOSTREG_DEFINE_API(HOSTREG_ACL_SYMBOLS)

// AscendCL code -> the cudaError a CUDA caller expects.
constexpr CodeMap kCodes[] = {
    {kSuccess, hostregSuccess},
    {kErrorInvalidParam, hostregErrorInvalidValue},
    {kErrorRtParamInvalid, hostregErrorInvalidValue},
    {kErrorRtAddrUnaligned, hostregErrorInvalidValue},
    {kErrorRtInvalidDeviceId, hostregErrorInvalidDevice},  // 101
    {kErrorUninitialize, hostregErrorInitializationError},
    {kErrorRtContextNull, 201},  // cudaErrorDeviceUninitialized
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
    std::atomic<int32_t> device{-1};  // the process's device, for threads without a context; -1: not known
    std::atomic<uint64_t> used{0};    // bit d: the process has registered for NPU d (d < 64)
};

uint64_t bit(int32_t device) { return device >= 0 && device < 64 ? uint64_t{1} << device : 0; }

std::string npu_list(uint64_t mask) {
    std::string out;
    for (int d = 0; d < 64; ++d)
        if (mask & bit(d)) out += (out.empty() ? "" : ", ") + std::to_string(d);
    return out;
}

Status failure(const Api& api, const char* call, aclError r, int code) {
    const char* msg = api.aclGetRecentErrMsg();
    return Status::error(
        code,
        std::string(call) + " failed: aclError " + std::to_string(r) + (msg && *msg ? ": " : "") + (msg ? msg : ""), r);
}
Status failure(const Api& api, const char* call, aclError r) { return failure(api, call, r, translate(r, kCodes)); }

// CANN's API docs (hicann/runtime docs/zh/api_ref/11-02_host_memory_management.md, `ptr` of
// aclrtHostRegister and aclrtHostRegisterV2): on OS kernels 5.10 or older, registering host
// memory that aclrtMallocHost did not allocate "causes exceptions"; such memory must come
// from aclrtMallocHost. hostreg registers any memory (malloc, mmap, /dev/shm), so on such a
// kernel the backend is unavailable, saying why. Returns the kernel's release when it is
// 5.10 or older, else "".
std::string kernel_too_old() {
    utsname u{};
    if (uname(&u) != 0) return "";
    unsigned major = 0, minor = 0;
    if (std::sscanf(u.release, "%u.%u", &major, &minor) != 2) return "";
    return (major < 5 || (major == 5 && minor <= 10)) ? u.release : "";
}

Status start(Acl& a) {
    Api& api = a.api;
    Capabilities& caps = a.probe.caps;
    if (const std::string release = kernel_too_old(); !release.empty())
        return Status::error(
            hostregErrorNotSupported,
            "Linux " + release +
                " is 5.10 or older: CANN's API docs say registering host memory that "
                "aclrtMallocHost did not allocate causes exceptions on such kernels (aclrtHostRegister, "
                "aclrtHostRegisterV2: ptr), and hostreg registers any memory, so it does not use AscendCL "
                "here (HOSTREG_BACKEND=auto takes posix: the OS's page lock, not mapped for the NPU)");
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
    if (api.aclrtGetDevice(&current) == kSuccess) a.device = current;  // else: learned later, or told
    caps.flags = HOSTREG_HOST_REGISTER_PORTABLE | HOSTREG_HOST_REGISTER_MAPPED | HOSTREG_HOST_REGISTER_READ_ONLY;
    caps.granule = std::max(kAlignment, static_cast<size_t>(sysconf(_SC_PAGESIZE)));
    caps.note = std::string("page-locked and mapped for the NPU by the CANN driver (") +
                (api.aclrtHostRegisterV2 ? "aclrtHostRegisterV2 MAPPED|PINNED" : "aclrtHostRegister MAPPED") +
                "), in whole 4 KiB pages";
    return Status::ok();
}

Acl& acl() { return loaded_once<Acl, start>(); }

// Gives the calling thread a current context on the process's device if it has none, and
// learns the process's device from a thread that has one (see the file comment).
Status ensure_context() {
    Acl& a = acl();
    int32_t dev = 0;
    if (a.api.aclrtGetDevice(&dev) == kSuccess) {
        int32_t unknown = -1;
        a.device.compare_exchange_strong(unknown, dev);
        return Status::ok();
    }
    const int32_t device = a.device.load();
    if (device < 0)
        return Status::error(
            201,  // cudaErrorDeviceUninitialized: no context to register in
            "this thread has no current NPU context, and hostreg does not know which NPU this process "
            "uses: set it on this thread first (torch.npu.set_device, aclrtSetDevice), or tell hostreg "
            "(hostreg.set_default_device(n), hostregSetDefaultDevice); hostreg does not guess NPU 0",
            kErrorRtContextNull);
    if (aclError r = a.api.aclrtSetDevice(device)) return failure(a.api, "aclrtSetDevice", r);
    return Status::ok();
}

Status acl_set_default_device(int device) {
    Acl& a = acl();
    Api& api = a.api;
    if (device < 0) {  // the calling thread's
        int32_t dev = 0;
        if (aclError r = api.aclrtGetDevice(&dev))
            return failure(api, "aclrtGetDevice", r, 201);  // 107002: this thread has no current context
        a.device = dev;
        return Status::ok();
    }
    uint32_t count = 0;
    if (aclError r = api.aclrtGetDeviceCount(&count)) return failure(api, "aclrtGetDeviceCount", r);
    if (static_cast<uint32_t>(device) >= count)
        return Status::error(
            hostregErrorInvalidDevice,
            "NPU " + std::to_string(device) + " does not exist (AscendCL reports " + std::to_string(count) + ")");
    a.device = device;
    return Status::ok();
}

const Probe& acl_probe() { return acl().probe; }

// A piece's owner is its device, stored as device + 1 (so that no device is nullptr).
void* owner_of(int32_t device) { return reinterpret_cast<void*>(static_cast<intptr_t>(device) + 1); }
int32_t device_of(const Piece& piece) { return static_cast<int32_t>(reinterpret_cast<intptr_t>(piece.owner) - 1); }

// [ptr, ptr + bytes) is whole granules (the registry's doing).
Status acl_register(void* ptr, size_t bytes, unsigned flags, Piece* piece) {
    Acl& a = acl();
    Api& api = a.api;
    if (Status s = ensure_context(); !s.is_ok()) return s;
    int32_t device = 0;
    api.aclrtGetDevice(&device);  // ensure_context made sure there is one
    if ((flags & HOSTREG_HOST_REGISTER_PORTABLE) && (a.used.load() & ~bit(device)))
        return Status::error(hostregErrorNotSupported,
                             "cudaHostRegisterPortable asks for every device, but AscendCL registers for one NPU (this "
                             "thread's, NPU " +
                                 std::to_string(device) + "), and this process has registered for NPU " +
                                 npu_list(a.used.load() & ~bit(device)) +
                                 " too: register without Portable, once per NPU, from a thread on that NPU");
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
    a.used |= bit(device);
    piece->device = dev;
    piece->owner = owner_of(device);
    return Status::ok();
}

// One more registration shares an edge page: only on the device it is registered for.
Status acl_share(void* ptr, size_t /*bytes*/, const Piece& piece) {
    Api& api = acl().api;
    if (Status s = ensure_context(); !s.is_ok()) return s;
    int32_t device = 0;
    api.aclrtGetDevice(&device);
    if (device == device_of(piece)) return Status::ok();
    char at[32];
    std::snprintf(at, sizeof at, "%p", ptr);
    return Status::error(hostregErrorNotSupported, std::string("the 4 KiB page at ") + at + " is registered for NPU " +
                                                       std::to_string(device_of(piece)) +
                                                       " by a neighbouring registration, and this thread's is NPU " +
                                                       std::to_string(device) +
                                                       ": AscendCL registers a host page for one device only (align "
                                                       "ranges registered for different NPUs to 4 KiB)");
}

// Undone on the NPU it was made for (HostUnregister acts for the current context's device).
// A thread on another NPU switches there for the call and back exactly: its context saved
// and restored with aclrtGetCurrentContext / aclrtSetCurrentContext (aclrtSetDevice back
// would replace a context the user set with the primary one, and retain that one again).
// The switch's own aclrtSetDevice retains the registration's primary context once
// (src/runtime/core/src/runtime.cc, PrimaryContextRetain); it is not given back:
// aclrtResetDevice "frees resources on the device, including the default context, the
// default stream" and one call suffices after many aclrtSetDevice (acl_rt.h), so it could
// tear down the user's own context. A thread that had no context keeps the registration's
// NPU current: AscendCL has no "no context" to restore (aclrtSetCurrentContext refuses NULL,
// src/acl/aclrt_impl/context.cpp).
Status acl_unregister(void* ptr, size_t /*bytes*/, const Piece& piece) {
    Api& api = acl().api;
    const int32_t owner = device_of(piece);
    int32_t current = -1;
    const bool had_context = api.aclrtGetDevice(&current) == kSuccess;
    if (had_context && current == owner) {
        if (aclError r = api.aclrtHostUnregister(ptr)) return failure(api, "aclrtHostUnregister", r);
        return Status::ok();
    }
    aclrtContext saved = nullptr;
    const bool exact = had_context && api.aclrtGetCurrentContext && api.aclrtSetCurrentContext &&
                       api.aclrtGetCurrentContext(&saved) == kSuccess && saved != nullptr;
    if (aclError r = api.aclrtSetDevice(owner)) return failure(api, "aclrtSetDevice", r);
    const aclError r = api.aclrtHostUnregister(ptr);
    if (exact) {
        api.aclrtSetCurrentContext(saved);
    } else if (had_context) {
        api.aclrtSetDevice(current);  // a runtime without the context calls: the thread's NPU back
    }
    if (r) return failure(api, "aclrtHostUnregister", r);
    return Status::ok();
}

}  // namespace

extern const Backend kAclBackend = {
    /*name=*/"acl",
    /*probe=*/acl_probe,
    /*host_register=*/acl_register,
    /*host_unregister=*/acl_unregister,
    /*share=*/acl_share,
    /*set_default_device=*/acl_set_default_device,
    /*room=*/defaults::room,  // the runtime pins; no limit that hostreg checks beforehand
};

}  // namespace hostreg
