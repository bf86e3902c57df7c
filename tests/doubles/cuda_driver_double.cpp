// cuda_driver_double.cpp -> libhostreg_double_cuda.so
//
// TEST DOUBLE of the CUDA driver API (libcuda.so.1) for hostreg's tests. It is NOT NVIDIA's
// library: it exports the driver's C signatures for the calls hostreg's CUDA backend needs,
// enforces the documented rules strictly, and page-locks for real with mlock(2).
//
// Modelled on CUDA 13.0's cuda.h (signatures, CU_MEMHOSTREGISTER_* flags, CUresult numbers
// and the documented behaviour of each call): the driver keeps a per-thread context stack;
// a retained primary context "will be active and available to the user until the user
// releases it"; CU_MEMHOSTREGISTER_PORTABLE makes registered memory "considered as pinned
// memory by all CUDA contexts, not just the one that performed the allocation", so a
// registration belongs to the context it was made in.
//
// Rules enforced (CUresult numbers in parentheses):
//   - HOSTREG_DOUBLE_STUB=1: every call answers CUDA_ERROR_STUB_LIBRARY (34), like the
//     toolkit's stubs/libcuda.so (cuda.h: "applications that run with the stub ... will
//     result in CUDA API returning this error"). Read at every call.
//   - Before a successful cuInit(0) every call except cuDriverGetVersion, cuGetErrorName
//     and cuGetErrorString answers CUDA_ERROR_NOT_INITIALIZED (3).
//   - cuInit: flags != 0 -> CUDA_ERROR_INVALID_VALUE (1); HOSTREG_DOUBLE_DEVICES=0 ->
//     CUDA_ERROR_NO_DEVICE (100). A later failing cuInit does not undo an earlier success.
//   - Devices: HOSTREG_DOUBLE_DEVICES (default 1) read at every call; a bad ordinal or
//     CUdevice -> CUDA_ERROR_INVALID_DEVICE (101). CUdevice values are ordinals.
//   - Contexts: one primary context per device, active while its retain count is > 0.
//     The current context is per thread, a stack that starts empty (NULL).
//     cuCtxSetCurrent/cuCtxPushCurrent_v2 accept only an active primary context (else
//     CUDA_ERROR_INVALID_CONTEXT, 201); cuCtxSetCurrent(NULL) pops the top (cuda.h);
//     cuCtxPopCurrent_v2 on an empty stack and cuDevicePrimaryCtxRelease_v2 beyond the
//     retains -> 201. The last release resets the context: its registrations are gone.
//   - Memory calls (cuMemHost*) need a current context that is still active, else 201.
//   - cuMemHostRegister_v2: NULL or 0 bytes -> 1; flag bits outside 0xF (PORTABLE 0x1,
//     DEVICEMAP 0x2, IOMEMORY 0x4, READ_ONLY 0x8) -> 1; range wrapping past the end of
//     the address space -> 1; any byte already registered (exact repeat or partial
//     overlap; cuda.h documents no overlap answer: the stricter one) ->
//     CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED (712); mlock failure ->
//     CUDA_ERROR_OUT_OF_MEMORY (2). Extra knob HOSTREG_DOUBLE_NO_READONLY=1: the device
//     lacks attribute 113 (HostRegisterReadOnlySupported), READ_ONLY ->
//     CUDA_ERROR_NOT_SUPPORTED (801) (cuda.h, CU_MEMHOSTREGISTER_READ_ONLY).
//   - cuMemHostUnregister: anything but the base of a live registration made in the current
//     context -> CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED (713). (That another context cannot
//     undo it, Portable or not, is the stricter reading: cuda.h does not say.)
//   - cuMemHostGetDevicePointer_v2: flags must be 0, the out pointer non-NULL and the
//     address inside a live registration of the current context (or a Portable one), else 1.
//     The device address is host + 0x100000000000 (deliberately not the host address).
//   - cuMemHostGetFlags: the registered flags of the registration containing the address
//     (same visibility); NULL out or unregistered -> 1.
//   - cuDeviceGetAttribute: CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED (113) is 1
//     unless HOSTREG_DOUBLE_NO_READONLY=1; other attributes answer 0.
//   - cuGetErrorName/cuGetErrorString: NULL out -> 1; an unknown code sets *out = NULL and
//     answers 1 (cuda.h).
#include <cstdint>
#include <mutex>
#include <vector>

#include "double_common.hpp"

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st* CUcontext;
typedef unsigned long long CUdeviceptr;

// The opaque context object: the double's primary contexts are an array of these, one per
// device ordinal.
struct CUctx_st {
    char unused;
};

namespace {

using namespace hostreg_double;

constexpr CUresult CUDA_SUCCESS = 0;
constexpr CUresult CUDA_ERROR_INVALID_VALUE = 1;
constexpr CUresult CUDA_ERROR_OUT_OF_MEMORY = 2;
constexpr CUresult CUDA_ERROR_NOT_INITIALIZED = 3;
constexpr CUresult CUDA_ERROR_STUB_LIBRARY = 34;
constexpr CUresult CUDA_ERROR_NO_DEVICE = 100;
constexpr CUresult CUDA_ERROR_INVALID_DEVICE = 101;
constexpr CUresult CUDA_ERROR_INVALID_CONTEXT = 201;
constexpr CUresult CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 712;
constexpr CUresult CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED = 713;
constexpr CUresult CUDA_ERROR_NOT_SUPPORTED = 801;

constexpr int kDriverVersion = 13000;
constexpr unsigned kAllFlags = 0xFu;  // PORTABLE | DEVICEMAP | IOMEMORY | READ_ONLY
constexpr unsigned kReadOnly = 0x8u;
constexpr uintptr_t kDeviceOffset = 0x100000000000ull;

constexpr ErrorText kErrors[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {34, "CUDA_ERROR_STUB_LIBRARY", "CUDA driver is a stub library"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {712, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", "part or all of the requested memory range is already mapped"},
    {713, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED", "pointer does not correspond to a registered memory region"},
    {800, "CUDA_ERROR_NOT_PERMITTED", "operation not permitted"},
    {801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

// --- driver state -----------------------------------------------------------------------

std::mutex g_mu;  // guards g_initialized and g_retains
bool g_initialized = false;
int g_retains[kMaxDevices] = {};
CUctx_st g_primary[kMaxDevices];

// This thread's context stack; the top is the current context.
thread_local std::vector<CUcontext> t_stack;

bool initialized() {
    std::lock_guard<std::mutex> lock(g_mu);
    return g_initialized;
}

// The answer every call but the exempt ones gives before anything else: 34 for the stub,
// 3 before cuInit, else success.
CUresult gate() {
    if (knob_on("HOSTREG_DOUBLE_STUB")) return CUDA_ERROR_STUB_LIBRARY;
    if (!initialized()) return CUDA_ERROR_NOT_INITIALIZED;
    return CUDA_SUCCESS;
}

bool valid_device(CUdevice dev) { return dev >= 0 && dev < knob_devices(); }

// The device of a primary context handle, or -1 if ctx is not one of the double's.
int device_of(CUcontext ctx) {
    for (int i = 0; i < kMaxDevices; ++i)
        if (ctx == &g_primary[i]) return i;
    return -1;
}

// An active primary context of an existing device.
bool active(CUcontext ctx) {
    const int dev = device_of(ctx);
    if (dev < 0 || !valid_device(dev)) return false;
    std::lock_guard<std::mutex> lock(g_mu);
    return g_retains[dev] > 0;
}

// What memory calls need: a current context that is still active.
CUresult need_context() {
    if (t_stack.empty() || !active(t_stack.back())) return CUDA_ERROR_INVALID_CONTEXT;
    return CUDA_SUCCESS;
}

// gate() then need_context().
CUresult gate_with_context() {
    CUresult r = gate();
    return r != CUDA_SUCCESS ? r : need_context();
}

uintptr_t current_context() { return reinterpret_cast<uintptr_t>(t_stack.back()); }

// Is reg visible from the current context (made in it, or Portable)?
bool visible(const Registration& reg) { return reg.owner == current_context() || (reg.flags & 0x1u); }

}  // namespace

// --- initialization and version ---------------------------------------------------------

HRD_EXPORT CUresult cuInit(unsigned flags) {
    HRD_RECORD_CALL();
    if (knob_on("HOSTREG_DOUBLE_STUB")) return CUDA_ERROR_STUB_LIBRARY;
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (knob_devices() == 0) return CUDA_ERROR_NO_DEVICE;
    std::lock_guard<std::mutex> lock(g_mu);
    g_initialized = true;
    return CUDA_SUCCESS;
}

HRD_EXPORT CUresult cuDriverGetVersion(int* version) {
    HRD_RECORD_CALL();
    if (knob_on("HOSTREG_DOUBLE_STUB")) return CUDA_ERROR_STUB_LIBRARY;
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    *version = kDriverVersion;
    return CUDA_SUCCESS;
}

// --- devices ----------------------------------------------------------------------------

HRD_EXPORT CUresult cuDeviceGetCount(int* count) {
    HRD_RECORD_CALL();
    if (CUresult r = gate()) return r;
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    *count = knob_devices();
    return CUDA_SUCCESS;
}

HRD_EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
    HRD_RECORD_CALL();
    if (CUresult r = gate()) return r;
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

HRD_EXPORT CUresult cuDeviceGetAttribute(int* value, int attribute, CUdevice device) {
    HRD_RECORD_CALL();
    if (CUresult r = gate()) return r;
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
    *value = attribute == 113 ? !knob_on("HOSTREG_DOUBLE_NO_READONLY") : 0;
    return CUDA_SUCCESS;
}

// --- contexts ---------------------------------------------------------------------------

HRD_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice device) {
    HRD_RECORD_CALL();
    if (CUresult r = gate()) return r;
    if (!ctx) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
    std::lock_guard<std::mutex> lock(g_mu);
    ++g_retains[device];
    *ctx = &g_primary[device];
    return CUDA_SUCCESS;
}

HRD_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
    HRD_RECORD_CALL();
    if (CUresult r = gate()) return r;
    if (!valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
    std::lock_guard<std::mutex> lock(g_mu);
    if (g_retains[device] == 0) return CUDA_ERROR_INVALID_CONTEXT;
    // Released as often as retained: "the context is automatically reset once the last
    // reference to it is released" (cuda.h, cuDevicePrimaryCtxRelease), and its registrations
    // go with it.
    if (--g_retains[device] == 0) registry().remove_owned(reinterpret_cast<uintptr_t>(&g_primary[device]));
    return CUDA_SUCCESS;
}

HRD_EXPORT CUresult cuCtxGetCurrent(CUcontext* ctx) {
    HRD_RECORD_CALL();
    if (CUresult r = gate()) return r;
    if (!ctx) return CUDA_ERROR_INVALID_VALUE;
    *ctx = t_stack.empty() ? nullptr : t_stack.back();
    return CUDA_SUCCESS;
}

// Replaces the top of this thread's stack with ctx (pushes if empty); NULL pops the top.
HRD_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
    HRD_RECORD_CALL();
    if (CUresult r = gate()) return r;
    if (!ctx) {
        if (!t_stack.empty()) t_stack.pop_back();
        return CUDA_SUCCESS;
    }
    if (!active(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
    if (t_stack.empty())
        t_stack.push_back(ctx);
    else
        t_stack.back() = ctx;
    return CUDA_SUCCESS;
}

HRD_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx) {
    HRD_RECORD_CALL();
    if (CUresult r = gate()) return r;
    if (!active(ctx)) return CUDA_ERROR_INVALID_CONTEXT;  // NULL included
    t_stack.push_back(ctx);
    return CUDA_SUCCESS;
}

HRD_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext* ctx) {
    HRD_RECORD_CALL();
    if (CUresult r = gate()) return r;
    if (t_stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx) *ctx = t_stack.back();
    t_stack.pop_back();
    return CUDA_SUCCESS;
}

HRD_EXPORT CUresult cuCtxGetDevice(CUdevice* device) {
    HRD_RECORD_CALL();
    if (CUresult r = gate_with_context()) return r;
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    *device = device_of(t_stack.back());
    return CUDA_SUCCESS;
}

// --- host memory registration -----------------------------------------------------------

HRD_EXPORT CUresult cuMemHostRegister_v2(void* ptr, size_t bytes, unsigned flags) {
    HRD_RECORD_CALL();
    recorder().register_flags(flags);
    if (CUresult r = gate_with_context()) return r;
    const uintptr_t base = reinterpret_cast<uintptr_t>(ptr);
    if (!ptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    if (flags & ~kAllFlags) return CUDA_ERROR_INVALID_VALUE;
    if ((flags & kReadOnly) && knob_on("HOSTREG_DOUBLE_NO_READONLY")) return CUDA_ERROR_NOT_SUPPORTED;
    if (wraps(base, bytes)) return CUDA_ERROR_INVALID_VALUE;

    Registration reg;
    reg.base = base;
    reg.bytes = bytes;
    reg.flags = flags;
    reg.device = base + kDeviceOffset;
    reg.owner = current_context();
    switch (registry().add(reg, nullptr)) {
        case Registry::Result::Ok:
            return CUDA_SUCCESS;
        case Registry::Result::Overlap:
            return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
        default:
            return CUDA_ERROR_OUT_OF_MEMORY;  // mlock failed
    }
}

HRD_EXPORT CUresult cuMemHostUnregister(void* ptr) {
    HRD_RECORD_CALL();
    if (CUresult r = gate_with_context()) return r;
    const uintptr_t owner = current_context();
    if (registry().remove(reinterpret_cast<uintptr_t>(ptr), &owner) != Registry::Result::Ok)
        return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    return CUDA_SUCCESS;
}

HRD_EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr* device_ptr, void* ptr, unsigned flags) {
    HRD_RECORD_CALL();
    if (CUresult r = gate_with_context()) return r;
    if (!device_ptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
    Registration reg;
    if (!registry().find(p, &reg) || !visible(reg)) return CUDA_ERROR_INVALID_VALUE;
    *device_ptr = static_cast<CUdeviceptr>(reg.device + (p - reg.base));
    return CUDA_SUCCESS;
}

HRD_EXPORT CUresult cuMemHostGetFlags(unsigned* flags, void* ptr) {
    HRD_RECORD_CALL();
    if (CUresult r = gate_with_context()) return r;
    if (!flags) return CUDA_ERROR_INVALID_VALUE;
    Registration reg;
    if (!registry().find(reinterpret_cast<uintptr_t>(ptr), &reg) || !visible(reg)) return CUDA_ERROR_INVALID_VALUE;
    *flags = reg.flags;
    return CUDA_SUCCESS;
}

// --- error texts ------------------------------------------------------------------------

HRD_EXPORT CUresult cuGetErrorName(CUresult error, const char** name) {
    HRD_RECORD_CALL();
    if (knob_on("HOSTREG_DOUBLE_STUB")) return CUDA_ERROR_STUB_LIBRARY;
    if (!name) return CUDA_ERROR_INVALID_VALUE;
    const ErrorText* e = find_error(kErrors, error);
    *name = e ? e->name : nullptr;
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

HRD_EXPORT CUresult cuGetErrorString(CUresult error, const char** text) {
    HRD_RECORD_CALL();
    if (knob_on("HOSTREG_DOUBLE_STUB")) return CUDA_ERROR_STUB_LIBRARY;
    if (!text) return CUDA_ERROR_INVALID_VALUE;
    const ErrorText* e = find_error(kErrors, error);
    *text = e ? e->text : nullptr;
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
