// hip_double.cpp -> libhostreg_double_hip.so
//
// TEST DOUBLE of the HIP runtime (libamdhip64.so) for hostreg's tests. It is NOT AMD's
// library: it exports HIP's C signatures for the calls hostreg's HIP backend needs, enforces
// the documented rules strictly, and page-locks for real with mlock(2).
//
// Sources: /work/shared/reference/vendor-abi.md, section "AMD ROCm, HIP", which collects
// `include/hip/hip_runtime_api.h` (signatures, hipHostRegister* flags, hipError_t numbers)
// and clr's `hipamd/src/hip_memory.cpp` (IoMemory refused, ReadOnly = coarse-grained).
//
// Rules enforced (hipError_t numbers in parentheses):
//   - HOSTREG_DOUBLE_DEVICES (default 1) read at every call. With 0 devices
//     hipGetDeviceCount stores 0 and answers hipErrorNoDevice (100), and so do the memory
//     calls (hipHost*): the runtime cannot initialize without a device.
//   - hipHostRegister: NULL or 0 bytes -> hipErrorInvalidValue (1); flag bits outside
//     Portable 0x1 | Mapped 0x2 | IoMemory 0x4 | ReadOnly/Coarse-grained 0x8 |
//     Uncached 0x80000000 -> 1; IoMemory 0x4 -> 1 (newer clr); a range wrapping past the
//     end of the address space -> 1; any byte already registered ->
//     hipErrorHostMemoryAlreadyRegistered (712); mlock failure -> hipErrorOutOfMemory (2).
//     0x8 is accepted but the registration is recorded as "coarse-grained" (clr treats
//     ReadOnly as hipExtHostRegisterCoarseGrained); hostreg_double_kind() reports it. The
//     raw flags of every call are recorded (hostreg_double_last_flags/_flags_log).
//   - hipHostUnregister: anything but the base of a live registration ->
//     hipErrorHostMemoryNotRegistered (713).
//   - hipHostGetDevicePointer: flags must be 0, the out pointer non-NULL and the address
//     inside a live registration, else 1. The device address is host + 0x200000000000
//     (hip_runtime_api.h: the device address may differ from the host address).
//   - hipHostGetFlags: the raw flags of the registration containing the address; NULL out
//     or unregistered -> 1.
//   - hipGetErrorName/hipGetErrorString: HIP's names; unknown codes read as
//     "hipErrorUnknown" / "unknown error".
#include <cstdint>

#include "double_common.hpp"

typedef int hipError_t;

namespace {

using namespace hostreg_double;

constexpr hipError_t hipSuccess = 0;
constexpr hipError_t hipErrorInvalidValue = 1;
constexpr hipError_t hipErrorOutOfMemory = 2;
constexpr hipError_t hipErrorNoDevice = 100;
constexpr hipError_t hipErrorHostMemoryAlreadyRegistered = 712;
constexpr hipError_t hipErrorHostMemoryNotRegistered = 713;

constexpr unsigned hipHostRegisterPortable = 0x1u;
constexpr unsigned hipHostRegisterMapped = 0x2u;
constexpr unsigned hipHostRegisterIoMemory = 0x4u;
constexpr unsigned hipHostRegisterReadOnly = 0x8u;  // == hipExtHostRegisterCoarseGrained
constexpr unsigned hipExtHostRegisterUncached = 0x80000000u;
constexpr unsigned kKnownFlags = hipHostRegisterPortable | hipHostRegisterMapped |
                                 hipHostRegisterIoMemory | hipHostRegisterReadOnly |
                                 hipExtHostRegisterUncached;

// HIP_VERSION style: major * 10000000 + minor * 100000 + patch (here ROCm 6.4).
constexpr int kRuntimeVersion = 60443483;
constexpr int kDriverVersion = 60443483;
constexpr uintptr_t kDeviceOffset = 0x200000000000ull;

struct ErrorText {
    hipError_t code;
    const char* name;
    const char* text;
};
constexpr ErrorText kErrors[] = {
    {0, "hipSuccess", "no error"},
    {1, "hipErrorInvalidValue", "invalid argument"},
    {2, "hipErrorOutOfMemory", "out of memory"},
    {3, "hipErrorNotInitialized", "initialization error"},
    {35, "hipErrorInsufficientDriver", "driver version is insufficient for runtime version"},
    {100, "hipErrorNoDevice", "no ROCm-capable device is detected"},
    {101, "hipErrorInvalidDevice", "invalid device ordinal"},
    {201, "hipErrorInvalidContext", "invalid device context"},
    {712, "hipErrorHostMemoryAlreadyRegistered",
     "part or all of the requested memory range is already mapped"},
    {713, "hipErrorHostMemoryNotRegistered",
     "pointer does not correspond to a registered memory region"},
    {801, "hipErrorNotSupported", "operation not supported"},
    {999, "hipErrorUnknown", "unknown error"},
};
constexpr ErrorText kUnknown = {999, "hipErrorUnknown", "unknown error"};

const ErrorText& find_error(hipError_t code) {
    for (const ErrorText& e : kErrors)
        if (e.code == code) return e;
    return kUnknown;
}

bool no_device() { return knob_devices() == 0; }

}  // namespace

// --- devices and versions ---------------------------------------------------------------

HRD_EXPORT hipError_t hipGetDeviceCount(int* count) {
    HRD_RECORD_CALL();
    if (!count) return hipErrorInvalidValue;
    *count = knob_devices();
    return *count == 0 ? hipErrorNoDevice : hipSuccess;
}

HRD_EXPORT hipError_t hipRuntimeGetVersion(int* version) {
    HRD_RECORD_CALL();
    if (!version) return hipErrorInvalidValue;
    *version = kRuntimeVersion;
    return hipSuccess;
}

HRD_EXPORT hipError_t hipDriverGetVersion(int* version) {
    HRD_RECORD_CALL();
    if (!version) return hipErrorInvalidValue;
    *version = kDriverVersion;
    return hipSuccess;
}

// --- host memory registration -----------------------------------------------------------

HRD_EXPORT hipError_t hipHostRegister(void* ptr, size_t bytes, unsigned flags) {
    HRD_RECORD_CALL();
    recorder().register_flags(flags);
    if (no_device()) return hipErrorNoDevice;
    const uintptr_t base = reinterpret_cast<uintptr_t>(ptr);
    if (!ptr || bytes == 0) return hipErrorInvalidValue;
    if (flags & ~kKnownFlags) return hipErrorInvalidValue;
    if (flags & hipHostRegisterIoMemory) return hipErrorInvalidValue;
    if (wraps(base, bytes)) return hipErrorInvalidValue;

    Registration reg;
    reg.base = base;
    reg.bytes = bytes;
    reg.flags = flags;
    reg.device = base + kDeviceOffset;
    reg.kind = (flags & hipHostRegisterReadOnly) ? "coarse-grained" : "fine-grained";
    switch (registry().add(reg, nullptr)) {
        case Registry::Result::Ok: return hipSuccess;
        case Registry::Result::Overlap: return hipErrorHostMemoryAlreadyRegistered;
        default: return hipErrorOutOfMemory;  // mlock failed
    }
}

HRD_EXPORT hipError_t hipHostUnregister(void* ptr) {
    HRD_RECORD_CALL();
    if (no_device()) return hipErrorNoDevice;
    if (registry().remove(reinterpret_cast<uintptr_t>(ptr)) != Registry::Result::Ok)
        return hipErrorHostMemoryNotRegistered;
    return hipSuccess;
}

HRD_EXPORT hipError_t hipHostGetDevicePointer(void** device_ptr, void* ptr, unsigned flags) {
    HRD_RECORD_CALL();
    if (no_device()) return hipErrorNoDevice;
    if (!device_ptr || flags != 0) return hipErrorInvalidValue;
    const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
    Registration reg;
    if (!registry().find(p, &reg)) return hipErrorInvalidValue;
    *device_ptr = reinterpret_cast<void*>(reg.device + (p - reg.base));
    return hipSuccess;
}

HRD_EXPORT hipError_t hipHostGetFlags(unsigned* flags, void* ptr) {
    HRD_RECORD_CALL();
    if (no_device()) return hipErrorNoDevice;
    if (!flags) return hipErrorInvalidValue;
    Registration reg;
    if (!registry().find(reinterpret_cast<uintptr_t>(ptr), &reg)) return hipErrorInvalidValue;
    *flags = reg.flags;
    return hipSuccess;
}

// --- error texts ------------------------------------------------------------------------

HRD_EXPORT const char* hipGetErrorName(hipError_t error) {
    HRD_RECORD_CALL();
    return find_error(error).name;
}

HRD_EXPORT const char* hipGetErrorString(hipError_t error) {
    HRD_RECORD_CALL();
    return find_error(error).text;
}
