// hip_double.cpp -> libhostreg_double_hip.so
//
// TEST DOUBLE of the HIP runtime (libamdhip64.so) for hostreg's tests. It is NOT AMD's
// library: it exports HIP's C signatures for the calls hostreg's HIP backend needs, enforces
// the documented rules strictly, and page-locks for real with mlock(2).
//
// Modelled on ROCm's own files: include/hip/hip_runtime_api.h (signatures, flags,
// hipError_t numbers) and clr's hipamd/src/hip_memory.cpp (ihipHostRegister,
// ihipHostUnregister; github.com/ROCm/rocm-systems projects/clr), and on what Debian's real
// libamdhip64.so.5 (ROCm 5.2.3) answers on a machine without a GPU.
//
// Rules (hipError_t numbers in parentheses):
//   - HOSTREG_DOUBLE_DEVICES (default 1) read at every call. With 0 devices
//     hipGetDeviceCount stores 0 and answers hipErrorNoDevice (100), and the memory calls
//     answer hipErrorInvalidDevice (101), as the real runtime does with no GPU.
//   - hipHostRegister (clr ihipHostRegister): NULL, 0 bytes or flag bits outside Portable
//     0x1 | Mapped 0x2 | IoMemory 0x4 | 0x8 (ReadOnly / CoarseGrained) | Uncached
//     0x80000000 -> hipErrorInvalidValue (1). Every registration is made the same way
//     (CL_MEM_USE_HOST_PTR | CL_MEM_SVM_ATOMICS): bit 0x8 is ignored; IoMemory marks it as
//     I/O memory. Pinning failure (`if (!mem->create(...)) ... return hipErrorInvalidValue`)
//     -> 1, not 2: here when mlock fails. clr never answers 712: an overlapping range is
//     registered too (its memory-object map only logs a duplicate base) and ROCr keeps
//     overlapping locks, so pages stay locked while any registration covers them.
//   - hipHostUnregister (clr ihipHostUnregister): NULL -> 1; a pointer inside a registration
//     that is not its base ABORTS THE PROCESS, as clr's guarantee() in MemObjMap::RemoveMemObj
//     does; an unknown pointer -> hipErrorHostMemoryNotRegistered (713).
//   - hipHostGetDevicePointer: flags must be 0, the out pointer non-NULL and the address
//     inside a live registration, else 1. The device address is host + 0x200000000000
//     (hip_runtime_api.h: the device address may differ from the host address).
//   - hipHostGetFlags: the raw flags of the registration containing the address; NULL out
//     or unregistered -> 1.
//   - hipGetErrorName/hipGetErrorString: HIP's names; unknown codes read as
//     "hipErrorUnknown" / "unknown error".
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "double_common.hpp"

typedef int hipError_t;

namespace {

using namespace hostreg_double;

constexpr hipError_t hipSuccess = 0;
constexpr hipError_t hipErrorInvalidValue = 1;
constexpr hipError_t hipErrorNoDevice = 100;
constexpr hipError_t hipErrorInvalidDevice = 101;
constexpr hipError_t hipErrorHostMemoryNotRegistered = 713;

constexpr unsigned hipHostRegisterPortable = 0x1u;
constexpr unsigned hipHostRegisterMapped = 0x2u;
constexpr unsigned hipHostRegisterIoMemory = 0x4u;
constexpr unsigned hipHostRegisterReadOnly = 0x8u;  // == hipExtHostRegisterCoarseGrained; ignored
constexpr unsigned hipExtHostRegisterUncached = 0x80000000u;
constexpr unsigned kKnownFlags = hipHostRegisterPortable | hipHostRegisterMapped | hipHostRegisterIoMemory |
                                 hipHostRegisterReadOnly | hipExtHostRegisterUncached;

// HIP_VERSION style: major * 10000000 + minor * 100000 + patch (here ROCm 6.4).
constexpr int kRuntimeVersion = 60443483;
constexpr int kDriverVersion = 60443483;
constexpr uintptr_t kDeviceOffset = 0x200000000000ull;

constexpr ErrorText kErrors[] = {
    {0, "hipSuccess", "no error"},
    {1, "hipErrorInvalidValue", "invalid argument"},
    {2, "hipErrorOutOfMemory", "out of memory"},
    {3, "hipErrorNotInitialized", "initialization error"},
    {35, "hipErrorInsufficientDriver", "driver version is insufficient for runtime version"},
    {100, "hipErrorNoDevice", "no ROCm-capable device is detected"},
    {101, "hipErrorInvalidDevice", "invalid device ordinal"},
    {201, "hipErrorInvalidContext", "invalid device context"},
    {712, "hipErrorHostMemoryAlreadyRegistered", "part or all of the requested memory range is already mapped"},
    {713, "hipErrorHostMemoryNotRegistered", "pointer does not correspond to a registered memory region"},
    {801, "hipErrorNotSupported", "operation not supported"},
    {999, "hipErrorUnknown", "unknown error"},
};
constexpr ErrorText kUnknown = {999, "hipErrorUnknown", "unknown error"};

const ErrorText& find_error(hipError_t code) {
    const ErrorText* e = hostreg_double::find_error(kErrors, code);
    return e ? *e : kUnknown;
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
    if (no_device()) return hipErrorInvalidDevice;
    const uintptr_t base = reinterpret_cast<uintptr_t>(ptr);
    if (!ptr || bytes == 0) return hipErrorInvalidValue;
    if (flags & ~kKnownFlags) return hipErrorInvalidValue;
    if (wraps(base, bytes)) return hipErrorInvalidValue;

    Registration reg;
    reg.base = base;
    reg.bytes = bytes;
    reg.flags = flags;
    reg.device = base + kDeviceOffset;
    reg.kind = (flags & hipHostRegisterIoMemory) ? "io-memory" : "fine-grained";
    if (registry().add(reg, nullptr, Registry::Overlaps::Keep) != Registry::Result::Ok)
        return hipErrorInvalidValue;  // mem->create failed: clr answers 1
    return hipSuccess;
}

HRD_EXPORT hipError_t hipHostUnregister(void* ptr) {
    HRD_RECORD_CALL();
    if (no_device()) return hipErrorInvalidDevice;
    if (!ptr) return hipErrorInvalidValue;
    const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
    Registration reg;
    if (registry().find(p, &reg) && reg.base != p) {
        std::fprintf(stderr, "hip double: hipHostUnregister(%p) is inside the registration at %p: clr aborts here\n",
                     ptr, reinterpret_cast<void*>(reg.base));
        std::abort();
    }
    if (registry().remove(p) != Registry::Result::Ok) return hipErrorHostMemoryNotRegistered;
    return hipSuccess;
}

HRD_EXPORT hipError_t hipHostGetDevicePointer(void** device_ptr, void* ptr, unsigned flags) {
    HRD_RECORD_CALL();
    if (no_device()) return hipErrorInvalidDevice;
    if (!device_ptr || flags != 0) return hipErrorInvalidValue;
    const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
    Registration reg;
    if (!registry().find(p, &reg)) return hipErrorInvalidValue;
    *device_ptr = reinterpret_cast<void*>(reg.device + (p - reg.base));
    return hipSuccess;
}

HRD_EXPORT hipError_t hipHostGetFlags(unsigned* flags, void* ptr) {
    HRD_RECORD_CALL();
    if (no_device()) return hipErrorInvalidDevice;
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
