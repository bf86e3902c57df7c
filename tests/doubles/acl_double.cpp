// acl_double.cpp -> libhostreg_double_acl.so and, compiled with HOSTREG_DOUBLE_ACL_V1,
//                   libhostreg_double_acl_v1.so
//
// TEST DOUBLE of Huawei AscendCL (libascendcl.so, CANN) for hostreg's tests. It is NOT
// Huawei's library. It exports AscendCL's C signatures for the calls hostreg's AscendCL
// backend makes and behaves as the CANN runtime's published sources show, layer by layer, in
// the order they check. Two builds of this file:
//   - libhostreg_double_acl.so: CANN 8.5 and later, with aclrtHostRegisterV2;
//   - libhostreg_double_acl_v1.so (HOSTREG_DOUBLE_ACL_V1): older CANN, V1 aclrtHostRegister
//     only (aclrtHostRegisterV2 is not exported at all).
//
// Modelled on hicann/runtime (github.com/hicann/runtime):
//   include/external/acl/acl_rt.h, acl_base_rt.h, error_codes/rt_error_codes.h  (ABI, codes)
//   src/acl/aclrt_impl/memory.cpp      aclrt layer: NULL pointer, NULL devPtr, size 0 -> 100000
//   src/runtime/api/impl/api_error.cc  flag/type checks: V2 flag must be non-zero and only
//                                      MAPPED|IOMEMORY|READONLY|PINNED, else 107000; V1 type
//                                      only IOMEMORY|READONLY bits (0, 4, 8, 12), else 207000
//   src/runtime/api/impl/api_impl.cc   ApiImpl::HostRegisterV2 / HostUnregister: a current
//                                      context (else 107002); then, on a driver WITHOUT
//                                      pin-register support, the overlap check against the
//                                      runtime's own records (507910), MAPPED (without PINNED)
//                                      to the driver, and PINNED only *recorded*
//                                      (InsertPinnedMemory: no lock at all); on a driver WITH
//                                      it, the whole flag goes to the driver
//   src/runtime/core/src/common/register_memory.cc   the records: overlap by byte ranges;
//                                      unregister and device pointer by exact base only
//   src/runtime/driver/npu_driver_mem.cc   NpuDriver::HostRegister: DRV_ERROR_BUSY (already
//                                      registered) -> 507910; HostUnregister: not found ->
//                                      507911
// The driver itself (halHostRegister) is not published. From the CANN 8.5 / 9.x API docs: the
// address must be 4 KiB-aligned for every flag, else the driver fails with 507899
// (ACL_ERROR_RT_DRV_INTERNAL_ERROR); IOMEMORY and READONLY are reserved (the double's driver
// answers 207000 for them, the stricter reading). The driver locks the pages it registers:
// the double mlocks them for real.
//
// Knobs (read at every call):
//   HOSTREG_DOUBLE_DEVICES           devices (default 1); 0: aclrtGetDeviceCount 0,
//                                    aclrtSetDevice 207004
//   HOSTREG_DOUBLE_ACL_PIN_REGISTER  1: the driver supports pin-register
//                                    (FEATURE_SVM_MEM_REGISTER_HOST_PINNED); default: it does
//                                    not, so a PINNED-only request locks nothing
// Registrations that reach the driver are for the calling thread's device
// (CurrentContext()->Device_()); unregistering from another device answers 507911. Contexts
// are per thread (api_impl.cc, ApiImpl::SetDevice keeps the context in thread-local storage,
// GetDevice answers 107002 on a thread that set none) and each aclrtSetDevice retains the
// device's primary context once (src/runtime/core/src/runtime.cc, PrimaryContextRetain).
// Inspection, not AscendCL: hostreg_double_acl_device_of(ptr), hostreg_double_acl_context_refs(device).
// Other rules: aclInit twice -> 100002; aclrtSetDevice before aclInit -> 100001, a bad id ->
// 107001 (ACL_ERROR_RT_INVALID_DEVICEID); aclrtGetDevice without a context -> 107002; every
// failure sets the calling thread's aclGetRecentErrMsg text (NULL before any failure).
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>

#include "double_common.hpp"

typedef int aclError;
typedef int aclrtHostRegisterType;

namespace {

using namespace hostreg_double;

constexpr aclError ACL_SUCCESS = 0;
constexpr aclError ACL_ERROR_INVALID_PARAM = 100000;
constexpr aclError ACL_ERROR_UNINITIALIZE = 100001;
constexpr aclError ACL_ERROR_REPEAT_INITIALIZE = 100002;
constexpr aclError ACL_ERROR_RT_PARAM_INVALID = 107000;
constexpr aclError ACL_ERROR_RT_INVALID_DEVICEID = 107001;
constexpr aclError ACL_ERROR_RT_CONTEXT_NULL = 107002;
constexpr aclError ACL_ERROR_RT_FEATURE_NOT_SUPPORT = 207000;
constexpr aclError ACL_ERROR_RT_MEMORY_ALLOCATION = 207001;
constexpr aclError ACL_ERROR_RT_NO_DEVICE = 207004;
constexpr aclError ACL_ERROR_RT_DRV_INTERNAL_ERROR = 507899;
constexpr aclError ACL_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 507910;
constexpr aclError ACL_ERROR_HOST_MEMORY_NOT_REGISTERED = 507911;

constexpr uint32_t ACL_HOST_REG_MAPPED = 0x2u;
constexpr uint32_t ACL_HOST_REG_IOMEMORY = 0x4u;
constexpr uint32_t ACL_HOST_REG_READONLY = 0x8u;
constexpr uint32_t ACL_HOST_REG_PINNED = 0x10000000u;
constexpr uint32_t kV2Flags = ACL_HOST_REG_MAPPED | ACL_HOST_REG_IOMEMORY | ACL_HOST_REG_READONLY | ACL_HOST_REG_PINNED;
constexpr uint32_t kMappedBits = ACL_HOST_REG_MAPPED | ACL_HOST_REG_IOMEMORY | ACL_HOST_REG_READONLY;
constexpr unsigned kV1Types = 0x4u | 0x8u;  // RT_HOST_REGISTER_IOMEMORY | RT_HOST_REGISTER_READONLY

constexpr uintptr_t kAlignment = 4096;  // CANN docs: "4K-page-aligned", every flag
constexpr uintptr_t kDeviceOffset = 0x300000000000ull;

// aclrtGetVersion's answer (the double's own choice; the sources give no numbers).
#ifdef HOSTREG_DOUBLE_ACL_V1
constexpr int32_t kVersion[3] = {1, 10, 0};
#else
constexpr int32_t kVersion[3] = {1, 15, 0};
#endif

// --- state ------------------------------------------------------------------------------

std::mutex g_mu;  // guards g_initialized, g_device_refs and g_pinned
bool g_initialized = false;
int g_device_refs[kMaxDevices] = {};
std::map<uintptr_t, uint64_t> g_pinned;  // the runtime's PINNED records (no lock): base -> size

thread_local int t_device = -1;  // device of this thread's current context, -1: none
thread_local bool t_has_error = false;
thread_local std::string t_error;  // text for aclGetRecentErrMsg

[[maybe_unused]] bool pin_register_supported() { return knob_on("HOSTREG_DOUBLE_ACL_PIN_REGISTER"); }

// Records this thread's failure text ("<function>: <what> (aclError <code>)") and returns
// code, so that every failure reads `return fail(code, __func__, "...", ...)`.
__attribute__((format(printf, 3, 4))) aclError fail(aclError code, const char* function, const char* format, ...) {
    char what[256];
    va_list args;
    va_start(args, format);
    std::vsnprintf(what, sizeof what, format, args);
    va_end(args);
    char text[400];
    std::snprintf(text, sizeof text, "%s: %s (aclError %d)", function, what, code);
    t_error = text;
    t_has_error = true;
    return code;
}

bool valid_device(int32_t id) { return id >= 0 && id < knob_devices(); }

// Does the calling thread have a current context, on a device still set?
bool has_context() {
    if (t_device < 0 || !valid_device(t_device)) return false;
    std::lock_guard<std::mutex> lock(g_mu);
    return g_initialized && g_device_refs[t_device] > 0;
}

[[maybe_unused]] bool pinned_overlaps(uintptr_t base, uint64_t size) {
    std::lock_guard<std::mutex> lock(g_mu);
    for (const auto& [b, n] : g_pinned)
        if (b < base + size && b + n > base) return true;
    return false;
}

// The double's driver (halHostRegister): 4 KiB alignment for every flag, reserved IOMEMORY
// and READONLY, DRV_ERROR_BUSY for memory it already holds, real locking.
aclError driver_register(uintptr_t base, uint64_t size, uint32_t flag, const char* kind, const char* function) {
    if (base % kAlignment != 0)
        return fail(ACL_ERROR_RT_DRV_INTERNAL_ERROR, function,
                    "driver: halHostRegister of %p failed: the address is not 4K-page-aligned",
                    reinterpret_cast<void*>(base));
    if (flag & (ACL_HOST_REG_IOMEMORY | ACL_HOST_REG_READONLY))
        return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, function, "driver: IOMEMORY and READONLY are reserved");
    Registration reg;
    reg.base = base;
    reg.bytes = size;
    reg.flags = flag;
    reg.device = (flag & ACL_HOST_REG_MAPPED) ? base + kDeviceOffset : 0;
    reg.owner = static_cast<uintptr_t>(t_device) + 1;  // the driver registers for this device
    reg.kind = kind;
    int error = 0;
    switch (registry().add(reg, &error)) {
        case Registry::Result::Ok:
            return ACL_SUCCESS;
        case Registry::Result::Overlap:
            return fail(ACL_ERROR_HOST_MEMORY_ALREADY_REGISTERED, function, "driver: busy: [%p, +%llu) is registered",
                        reinterpret_cast<void*>(base), static_cast<unsigned long long>(size));
        default:
            return fail(ACL_ERROR_RT_MEMORY_ALLOCATION, function, "driver: locking [%p, +%llu) failed (errno %d)",
                        reinterpret_cast<void*>(base), static_cast<unsigned long long>(size), error);
    }
}

}  // namespace

// --- initialization ---------------------------------------------------------------------

HRD_EXPORT aclError aclInit(const char* config_path) {
    HRD_RECORD_CALL();
    (void)config_path;
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_initialized) return fail(ACL_ERROR_REPEAT_INITIALIZE, __func__, "AscendCL is already initialized");
    g_initialized = true;
    return ACL_SUCCESS;
}

HRD_EXPORT aclError aclFinalize(void) {
    HRD_RECORD_CALL();
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_initialized) return fail(ACL_ERROR_UNINITIALIZE, __func__, "aclInit was not called");
    g_initialized = false;
    for (int& refs : g_device_refs)
        refs = 0;
    return ACL_SUCCESS;
}

HRD_EXPORT aclError aclrtGetVersion(int32_t* major, int32_t* minor, int32_t* patch) {
    HRD_RECORD_CALL();
    if (!major || !minor || !patch) return fail(ACL_ERROR_INVALID_PARAM, __func__, "NULL output pointer");
    *major = kVersion[0];
    *minor = kVersion[1];
    *patch = kVersion[2];
    return ACL_SUCCESS;
}

// --- devices and contexts ---------------------------------------------------------------

HRD_EXPORT aclError aclrtGetDeviceCount(uint32_t* count) {
    HRD_RECORD_CALL();
    if (!count) return fail(ACL_ERROR_INVALID_PARAM, __func__, "NULL count");
    *count = static_cast<uint32_t>(knob_devices());
    return ACL_SUCCESS;
}

HRD_EXPORT aclError aclrtSetDevice(int32_t device) {
    HRD_RECORD_CALL();
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_initialized) return fail(ACL_ERROR_UNINITIALIZE, __func__, "aclInit was not called");
    if (knob_devices() == 0) return fail(ACL_ERROR_RT_NO_DEVICE, __func__, "no device");
    if (!valid_device(device)) return fail(ACL_ERROR_RT_INVALID_DEVICEID, __func__, "device %d does not exist", device);
    ++g_device_refs[device];
    t_device = device;
    return ACL_SUCCESS;
}

HRD_EXPORT aclError aclrtResetDevice(int32_t device) {
    HRD_RECORD_CALL();
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_initialized) return fail(ACL_ERROR_UNINITIALIZE, __func__, "aclInit was not called");
    if (knob_devices() == 0) return fail(ACL_ERROR_RT_NO_DEVICE, __func__, "no device");
    if (!valid_device(device)) return fail(ACL_ERROR_RT_INVALID_DEVICEID, __func__, "device %d does not exist", device);
    if (g_device_refs[device] > 0) --g_device_refs[device];
    if (t_device == device && g_device_refs[device] == 0) t_device = -1;
    return ACL_SUCCESS;
}

// Contexts: the double models each device's primary (default) context only, its address the
// handle. src/acl/aclrt_impl/context.cpp: aclrtGetCurrentContext answers the runtime's error
// on a thread without one (here 107002), aclrtSetCurrentContext refuses NULL (100000); the
// acl_rt.h restriction "the device ... has been reset: you cannot set the context" is 107000
// here. Setting a context takes no retain (SetDevice does: runtime.cc, PrimaryContextRetain).
char g_primary[kMaxDevices];

HRD_EXPORT aclError aclrtGetCurrentContext(void** context) {
    HRD_RECORD_CALL();
    if (!context) return fail(ACL_ERROR_INVALID_PARAM, __func__, "NULL context");
    if (!has_context()) return fail(ACL_ERROR_RT_CONTEXT_NULL, __func__, "this thread has no current context");
    *context = &g_primary[t_device];
    return ACL_SUCCESS;
}

HRD_EXPORT aclError aclrtSetCurrentContext(void* context) {
    HRD_RECORD_CALL();
    if (!context) return fail(ACL_ERROR_INVALID_PARAM, __func__, "context is NULL");
    const auto at = static_cast<char*>(context) - g_primary;
    if (at < 0 || at >= kMaxDevices || !valid_device(static_cast<int32_t>(at)))
        return fail(ACL_ERROR_RT_PARAM_INVALID, __func__, "%p is not a context", context);
    {
        std::lock_guard<std::mutex> lock(g_mu);
        if (!g_initialized || g_device_refs[at] == 0)
            return fail(ACL_ERROR_RT_PARAM_INVALID, __func__, "the device of context %p has been reset", context);
    }
    t_device = static_cast<int>(at);
    return ACL_SUCCESS;
}

HRD_EXPORT aclError aclrtGetDevice(int32_t* device) {
    HRD_RECORD_CALL();
    if (!device) return fail(ACL_ERROR_INVALID_PARAM, __func__, "NULL device");
    if (!has_context()) return fail(ACL_ERROR_RT_CONTEXT_NULL, __func__, "this thread has no current context");
    *device = t_device;
    return ACL_SUCCESS;
}

// --- host memory registration -----------------------------------------------------------

HRD_EXPORT aclError aclrtHostRegister(void* ptr, uint64_t size, aclrtHostRegisterType type, void** dev_ptr) {
    HRD_RECORD_CALL();
    recorder().register_flags(static_cast<unsigned>(type));
    // memory.cpp, aclrtHostRegisterImpl
    if (!ptr) return fail(ACL_ERROR_INVALID_PARAM, __func__, "ptr is NULL");
    if (!dev_ptr) return fail(ACL_ERROR_INVALID_PARAM, __func__, "devPtr is NULL");
    if (size == 0) return fail(ACL_ERROR_INVALID_PARAM, __func__, "size must be greater than 0");
    // api_error.cc, ApiErrorDecorator::HostRegister
    if (static_cast<unsigned>(type) & ~kV1Types)
        return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, __func__, "type %d is not supported", type);
    // api_impl.cc, ApiImpl::HostRegister
    if (!has_context()) return fail(ACL_ERROR_RT_CONTEXT_NULL, __func__, "this thread has no current context");
    const uintptr_t base = reinterpret_cast<uintptr_t>(ptr);
    if (wraps(base, size)) return fail(ACL_ERROR_INVALID_PARAM, __func__, "range wraps");
    // V1 types name MAPPED semantics (npu_driver_mem.cc: HOST_MEM_MAP_DEV, IO or READONLY).
    const uint32_t flag = ACL_HOST_REG_MAPPED | (static_cast<unsigned>(type) & kV1Types);
    aclError r = driver_register(base, size, flag, "mapped", __func__);
    if (r == ACL_SUCCESS) *dev_ptr = reinterpret_cast<void*>(base + kDeviceOffset);
    return r;
}

#ifndef HOSTREG_DOUBLE_ACL_V1
HRD_EXPORT aclError aclrtHostRegisterV2(void* ptr, uint64_t size, uint32_t flag) {
    HRD_RECORD_CALL();
    recorder().register_flags(flag);
    // memory.cpp, aclrtHostRegisterV2Impl
    if (!ptr) return fail(ACL_ERROR_INVALID_PARAM, __func__, "ptr is NULL");
    if (size == 0) return fail(ACL_ERROR_INVALID_PARAM, __func__, "size must be greater than 0");
    // api_error.cc, ApiErrorDecorator::HostRegisterV2
    if ((flag & kV2Flags) == 0 || (flag & ~kV2Flags))
        return fail(ACL_ERROR_RT_PARAM_INVALID, __func__, "invalid flag 0x%x", flag);
    // api_impl.cc, ApiImpl::HostRegisterV2
    if (!has_context()) return fail(ACL_ERROR_RT_CONTEXT_NULL, __func__, "this thread has no current context");
    const uintptr_t base = reinterpret_cast<uintptr_t>(ptr);
    if (wraps(base, size)) return fail(ACL_ERROR_INVALID_PARAM, __func__, "range wraps");
    const bool pinned = flag & ACL_HOST_REG_PINNED;
    const bool mapped = flag & kMappedBits;
    if (pin_register_supported())
        return driver_register(base, size, flag, pinned ? (mapped ? "pinned+mapped" : "pinned") : "mapped", __func__);
    // Driver without pin-register support: the runtime checks its own records first ...
    if (pinned_overlaps(base, size) || registry().overlaps(base, base + size))
        return fail(ACL_ERROR_HOST_MEMORY_ALREADY_REGISTERED, __func__, "the memory range has already been registered");
    // ... sends only the MAPPED part to the driver ...
    if (mapped) {
        if (aclError r = driver_register(base, size, flag & ~ACL_HOST_REG_PINNED, "mapped", __func__)) return r;
    }
    // ... and only records PINNED: nothing is locked for it.
    if (pinned) {
        std::lock_guard<std::mutex> lock(g_mu);
        g_pinned.emplace(base, size);
    }
    return ACL_SUCCESS;
}
#endif

HRD_EXPORT aclError aclrtHostGetDevicePointer(void* ptr, void** dev_ptr, uint32_t flag) {
    HRD_RECORD_CALL();
    // memory.cpp, aclrtHostGetDevicePointerImpl
    if (!ptr || !dev_ptr) return fail(ACL_ERROR_INVALID_PARAM, __func__, "NULL pointer");
    if (flag != 0) return fail(ACL_ERROR_INVALID_PARAM, __func__, "flag must be 0, got 0x%x", flag);
    if (!has_context()) return fail(ACL_ERROR_RT_CONTEXT_NULL, __func__, "this thread has no current context");
    // register_memory.cc GetMappedDevicePointer: the exact base of a mapped registration only.
    const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
    Registration reg;
    if (!registry().find(p, &reg) || reg.base != p || reg.device == 0)
        return fail(ACL_ERROR_RT_PARAM_INVALID, __func__,
                    "%p: the host pointer has not been registered for device address mapping", ptr);
    *dev_ptr = reinterpret_cast<void*>(reg.device);
    return ACL_SUCCESS;
}

HRD_EXPORT aclError aclrtHostUnregister(void* ptr) {
    HRD_RECORD_CALL();
    if (!ptr) return fail(ACL_ERROR_INVALID_PARAM, __func__, "ptr is NULL");
    if (!has_context()) return fail(ACL_ERROR_RT_CONTEXT_NULL, __func__, "this thread has no current context");
    const uintptr_t base = reinterpret_cast<uintptr_t>(ptr);
    // api_impl.cc, ApiImpl::HostUnregister: the driver's registration (for this thread's
    // device: halHostUnregisterEx(ptr, deviceId)) and the runtime's PINNED record (the
    // process's), each by exact base.
    const uintptr_t device = static_cast<uintptr_t>(t_device) + 1;
    const bool mapped = registry().remove(base, &device) == Registry::Result::Ok;
    bool pinned = false;
    {
        std::lock_guard<std::mutex> lock(g_mu);
        pinned = g_pinned.erase(base) > 0;
    }
    if (!mapped && !pinned)
        return fail(ACL_ERROR_HOST_MEMORY_NOT_REGISTERED, __func__,
                    "%p: the host pointer has not been registered for device memory mapping", ptr);
    return ACL_SUCCESS;
}

// --- error text -------------------------------------------------------------------------

HRD_EXPORT const char* aclGetRecentErrMsg(void) {
    HRD_RECORD_CALL();
    return t_has_error ? t_error.c_str() : nullptr;
}

// --- inspection (not AscendCL) ----------------------------------------------------------

// The device a driver registration based at ptr is for (-1: none based there).
HRD_EXPORT int hostreg_double_acl_device_of(void* ptr) {
    Registration reg;
    const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
    if (!registry().find(p, &reg) || reg.base != p) return -1;
    return static_cast<int>(reg.owner) - 1;
}

// How many aclrtSetDevice retains of device's primary context are held (0: no context there).
HRD_EXPORT int hostreg_double_acl_context_refs(int device) {
    std::lock_guard<std::mutex> lock(g_mu);
    return device >= 0 && device < kMaxDevices ? g_device_refs[device] : -1;
}

// Ranges the runtime recorded as PINNED without the driver locking them.
HRD_EXPORT long hostreg_double_acl_pinned_records(void) {
    std::lock_guard<std::mutex> lock(g_mu);
    return static_cast<long>(g_pinned.size());
}
