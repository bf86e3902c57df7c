// acl_double.cpp -> libhostreg_double_acl.so and, compiled with HOSTREG_DOUBLE_ACL_V1,
//                   libhostreg_double_acl_v1.so
//
// TEST DOUBLE of Huawei AscendCL (libascendcl.so, CANN) for hostreg's tests. It is NOT
// Huawei's library: it exports AscendCL's C signatures for the calls hostreg's AscendCL
// backend needs, enforces the documented rules strictly, and page-locks for real with
// mlock(2). Two builds of this file:
//   - libhostreg_double_acl.so: CANN 8.5 and later, exports aclrtHostRegisterV2 too;
//   - libhostreg_double_acl_v1.so (HOSTREG_DOUBLE_ACL_V1 defined): older CANN, where
//     aclrtHostRegisterV2 does not exist at all (not exported), only V1.
//
// Sources: /work/shared/reference/vendor-abi.md, section "Huawei Ascend, AscendCL (CANN)",
// which collects `include/external/acl/acl_rt.h`, `acl_base_rt.h` and
// `error_codes/rt_error_codes.h` of the public CANN runtime sources and the CANN API docs.
//
// Rules enforced (aclError numbers in parentheses):
//   - aclInit: 0 the first time, ACL_ERROR_REPEAT_INITIALIZE (100002) after; aclFinalize
//     undoes it (and resets every device), then aclInit succeeds again. aclFinalize
//     without aclInit -> ACL_ERROR_UNINITIALIZE (100001).
//   - Devices: HOSTREG_DOUBLE_DEVICES (default 1) read at every call; 0 devices:
//     aclrtGetDeviceCount reports 0 and aclrtSetDevice answers RT_NO_DEVICE (207004).
//   - aclrtSetDevice: before aclInit -> 100001; a bad id -> ACL_ERROR_INVALID_PARAM
//     (100000); else makes the device's default context current on the calling thread and
//     takes a reference on the device. aclrtResetDevice drops one; at zero the device's
//     context is gone for every thread.
//   - aclrtGetDevice: RT_CONTEXT_NULL (107002) when this thread has no (live) context.
//   - Memory calls (aclrtHostRegister, aclrtHostRegisterV2, aclrtHostGetDevicePointer,
//     aclrtHostUnregister) need a current context on the calling thread, else 107002.
//   - NULL pointer, size 0, NULL devPtr (V1), or a range wrapping past the end of the
//     address space -> 100000.
//   - V1 aclrtHostRegister: type must be ACL_HOST_REGISTER_MAPPED (0); any other value,
//     IOMEMORY 0x4 and READONLY 0x8 included -> RT_FEATURE_NOT_SUPPORT (207000). The
//     pointer must be 64 KiB aligned (vendor-abi.md: docs say page-aligned, Mooncake
//     PR #4053 reports 64 KiB; the stricter) -> else RT_ADDR_UNALIGNED (107008).
//     Returns the device pointer, host + 0x300000000000.
//   - V2 aclrtHostRegisterV2: flag must be non-zero and hold only MAPPED 0x2 | IOMEMORY
//     0x4 | READONLY 0x8 | PINNED 0x10000000, else RT_PARAM_INVALID (107000); IOMEMORY
//     and READONLY -> 207000 (reserved/unsupported in CANN 9.x); with PINNED any
//     alignment is accepted; without it (MAPPED only) the pointer must be page-aligned,
//     else 107008.
//   - Any byte already registered (V1 or V2) -> HOST_MEMORY_ALREADY_REGISTERED (507910);
//     mlock failure -> RT_MEMORY_ALLOCATION (207001).
//   - aclrtHostUnregister: anything but the base of a live registration ->
//     HOST_MEMORY_NOT_REGISTERED (507911).
//   - aclrtHostGetDevicePointer: flag must be 0 (else 100000); works only inside a
//     registration made with MAPPED (V1, or V2 with 0x2); unregistered or PINNED-only ->
//     107000.
//   - Every failure sets the calling thread's text returned by aclGetRecentErrMsg (NULL
//     while this thread has had no failure).
#include <cstdarg>
#include <cstdint>
#include <cstdio>
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
constexpr aclError ACL_ERROR_RT_CONTEXT_NULL = 107002;
constexpr aclError ACL_ERROR_RT_ADDR_UNALIGNED = 107008;
constexpr aclError ACL_ERROR_RT_FEATURE_NOT_SUPPORT = 207000;
constexpr aclError ACL_ERROR_RT_MEMORY_ALLOCATION = 207001;
constexpr aclError ACL_ERROR_RT_NO_DEVICE = 207004;
constexpr aclError ACL_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 507910;
constexpr aclError ACL_ERROR_HOST_MEMORY_NOT_REGISTERED = 507911;

constexpr aclrtHostRegisterType ACL_HOST_REGISTER_MAPPED = 0;
constexpr uint32_t ACL_HOST_REG_MAPPED = 0x2u;
constexpr uint32_t ACL_HOST_REG_IOMEMORY = 0x4u;
constexpr uint32_t ACL_HOST_REG_READONLY = 0x8u;
constexpr uint32_t ACL_HOST_REG_PINNED = 0x10000000u;
constexpr uint32_t kV2Flags =
    ACL_HOST_REG_MAPPED | ACL_HOST_REG_IOMEMORY | ACL_HOST_REG_READONLY | ACL_HOST_REG_PINNED;

constexpr uintptr_t kV1Alignment = 64 * 1024;
constexpr uintptr_t kDeviceOffset = 0x300000000000ull;

// aclrtGetVersion's answer (the double's own choice; the reference gives no numbers).
#ifdef HOSTREG_DOUBLE_ACL_V1
constexpr int32_t kVersion[3] = {1, 10, 0};
#else
constexpr int32_t kVersion[3] = {1, 15, 0};
#endif

// --- state ------------------------------------------------------------------------------

std::mutex g_mu;  // guards g_initialized and g_device_refs
bool g_initialized = false;
int g_device_refs[kMaxDevices] = {};

thread_local int t_device = -1;       // device of this thread's current context, -1: none
thread_local bool t_has_error = false;
thread_local std::string t_error;     // text for aclGetRecentErrMsg

// Records this thread's failure text ("<function>: <what> (aclError <code>)") and returns
// code, so that every failure reads `return fail(code, __func__, "...", ...)`.
__attribute__((format(printf, 3, 4))) aclError fail(aclError code, const char* function,
                                                     const char* format, ...) {
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

bool is_registration_mapped(const Registration& reg) { return reg.device != 0; }

// Records reg, translating the registry's answer into AscendCL's codes.
aclError add(const Registration& reg, const char* function) {
    int error = 0;
    switch (registry().add(reg, &error)) {
        case Registry::Result::Ok: return ACL_SUCCESS;
        case Registry::Result::Overlap:
            return fail(ACL_ERROR_HOST_MEMORY_ALREADY_REGISTERED, function,
                        "[%p, +%zu) overlaps a registered range", reinterpret_cast<void*>(reg.base),
                        reg.bytes);
        default:
            return fail(ACL_ERROR_RT_MEMORY_ALLOCATION, function,
                        "mlock of [%p, +%zu) failed (errno %d)", reinterpret_cast<void*>(reg.base),
                        reg.bytes, error);
    }
}

}  // namespace

// --- initialization ---------------------------------------------------------------------

HRD_EXPORT aclError aclInit(const char* config_path) {
    HRD_RECORD_CALL();
    (void)config_path;
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_initialized)
        return fail(ACL_ERROR_REPEAT_INITIALIZE, __func__, "AscendCL is already initialized");
    g_initialized = true;
    return ACL_SUCCESS;
}

HRD_EXPORT aclError aclFinalize(void) {
    HRD_RECORD_CALL();
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_initialized) return fail(ACL_ERROR_UNINITIALIZE, __func__, "aclInit was not called");
    g_initialized = false;
    for (int& refs : g_device_refs) refs = 0;
    return ACL_SUCCESS;
}

HRD_EXPORT aclError aclrtGetVersion(int32_t* major, int32_t* minor, int32_t* patch) {
    HRD_RECORD_CALL();
    if (!major || !minor || !patch)
        return fail(ACL_ERROR_INVALID_PARAM, __func__, "NULL output pointer");
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
    if (!valid_device(device))
        return fail(ACL_ERROR_INVALID_PARAM, __func__, "device %d does not exist", device);
    ++g_device_refs[device];
    t_device = device;
    return ACL_SUCCESS;
}

HRD_EXPORT aclError aclrtResetDevice(int32_t device) {
    HRD_RECORD_CALL();
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_initialized) return fail(ACL_ERROR_UNINITIALIZE, __func__, "aclInit was not called");
    if (knob_devices() == 0) return fail(ACL_ERROR_RT_NO_DEVICE, __func__, "no device");
    if (!valid_device(device))
        return fail(ACL_ERROR_INVALID_PARAM, __func__, "device %d does not exist", device);
    if (g_device_refs[device] > 0) --g_device_refs[device];
    if (t_device == device && g_device_refs[device] == 0) t_device = -1;
    return ACL_SUCCESS;
}

HRD_EXPORT aclError aclrtGetDevice(int32_t* device) {
    HRD_RECORD_CALL();
    if (!device) return fail(ACL_ERROR_INVALID_PARAM, __func__, "NULL device");
    if (!has_context())
        return fail(ACL_ERROR_RT_CONTEXT_NULL, __func__, "this thread has no current context");
    *device = t_device;
    return ACL_SUCCESS;
}

// --- host memory registration -----------------------------------------------------------

HRD_EXPORT aclError aclrtHostRegister(void* ptr, uint64_t size, aclrtHostRegisterType type,
                                      void** dev_ptr) {
    HRD_RECORD_CALL();
    recorder().register_flags(static_cast<unsigned>(type));
    if (!has_context())
        return fail(ACL_ERROR_RT_CONTEXT_NULL, __func__, "this thread has no current context");
    const uintptr_t base = reinterpret_cast<uintptr_t>(ptr);
    if (!ptr || size == 0 || !dev_ptr)
        return fail(ACL_ERROR_INVALID_PARAM, __func__, "NULL pointer, size 0 or NULL devPtr");
    if (type != ACL_HOST_REGISTER_MAPPED)
        return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, __func__,
                    "register type %d is not supported (only ACL_HOST_REGISTER_MAPPED)", type);
    if (base % kV1Alignment != 0)
        return fail(ACL_ERROR_RT_ADDR_UNALIGNED, __func__, "%p is not 64 KiB aligned", ptr);
    if (wraps(base, size)) return fail(ACL_ERROR_INVALID_PARAM, __func__, "range wraps");

    Registration reg;
    reg.base = base;
    reg.bytes = size;
    reg.flags = static_cast<unsigned>(type);
    reg.device = base + kDeviceOffset;
    reg.kind = "mapped";
    aclError r = add(reg, __func__);
    if (r == ACL_SUCCESS) *dev_ptr = reinterpret_cast<void*>(reg.device);
    return r;
}

#ifndef HOSTREG_DOUBLE_ACL_V1
HRD_EXPORT aclError aclrtHostRegisterV2(void* ptr, uint64_t size, uint32_t flag) {
    HRD_RECORD_CALL();
    recorder().register_flags(flag);
    if (!has_context())
        return fail(ACL_ERROR_RT_CONTEXT_NULL, __func__, "this thread has no current context");
    const uintptr_t base = reinterpret_cast<uintptr_t>(ptr);
    if (!ptr || size == 0) return fail(ACL_ERROR_INVALID_PARAM, __func__, "NULL pointer or size 0");
    if (flag == 0 || (flag & ~kV2Flags))
        return fail(ACL_ERROR_RT_PARAM_INVALID, __func__, "invalid flag 0x%x", flag);
    if (flag & (ACL_HOST_REG_IOMEMORY | ACL_HOST_REG_READONLY))
        return fail(ACL_ERROR_RT_FEATURE_NOT_SUPPORT, __func__,
                    "flag 0x%x: IOMEMORY and READONLY are reserved", flag);
    const bool pinned = flag & ACL_HOST_REG_PINNED;
    const bool mapped = flag & ACL_HOST_REG_MAPPED;
    if (!pinned && base % page_size() != 0)
        return fail(ACL_ERROR_RT_ADDR_UNALIGNED, __func__,
                    "%p is not page-aligned (only PINNED accepts any alignment)", ptr);
    if (wraps(base, size)) return fail(ACL_ERROR_INVALID_PARAM, __func__, "range wraps");

    Registration reg;
    reg.base = base;
    reg.bytes = size;
    reg.flags = flag;
    reg.device = mapped ? base + kDeviceOffset : 0;
    reg.kind = pinned ? (mapped ? "pinned+mapped" : "pinned") : "mapped";
    return add(reg, __func__);
}
#endif

HRD_EXPORT aclError aclrtHostGetDevicePointer(void* ptr, void** dev_ptr, uint32_t flag) {
    HRD_RECORD_CALL();
    if (!has_context())
        return fail(ACL_ERROR_RT_CONTEXT_NULL, __func__, "this thread has no current context");
    if (!ptr || !dev_ptr) return fail(ACL_ERROR_INVALID_PARAM, __func__, "NULL pointer");
    if (flag != 0) return fail(ACL_ERROR_INVALID_PARAM, __func__, "flag must be 0, got 0x%x", flag);
    const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
    Registration reg;
    if (!registry().find(p, &reg))
        return fail(ACL_ERROR_RT_PARAM_INVALID, __func__, "%p is not registered", ptr);
    if (!is_registration_mapped(reg))
        return fail(ACL_ERROR_RT_PARAM_INVALID, __func__,
                    "%p was registered without MAPPED: no device pointer", ptr);
    *dev_ptr = reinterpret_cast<void*>(reg.device + (p - reg.base));
    return ACL_SUCCESS;
}

HRD_EXPORT aclError aclrtHostUnregister(void* ptr) {
    HRD_RECORD_CALL();
    if (!has_context())
        return fail(ACL_ERROR_RT_CONTEXT_NULL, __func__, "this thread has no current context");
    if (!ptr) return fail(ACL_ERROR_INVALID_PARAM, __func__, "NULL pointer");
    if (registry().remove(reinterpret_cast<uintptr_t>(ptr)) != Registry::Result::Ok)
        return fail(ACL_ERROR_HOST_MEMORY_NOT_REGISTERED, __func__,
                    "%p is not the base of a registered range", ptr);
    return ACL_SUCCESS;
}

// --- error text -------------------------------------------------------------------------

HRD_EXPORT const char* aclGetRecentErrMsg(void) {
    HRD_RECORD_CALL();
    return t_has_error ? t_error.c_str() : nullptr;
}
