// musa_double.cpp -> libhostreg_double_musa.so
//
// TEST DOUBLE of the Moore Threads MUSA runtime (libmusart.so) for hostreg's tests. It is
// NOT Moore Threads' library: it exports the MUSA runtime's C signatures for the calls
// hostreg's MUSA backend needs, enforces the rules strictly, and page-locks for real with
// mlock(2).
//
// Modelled on CUDA 13.0's runtime (cuda_runtime_api.h, driver_types.h), which the MUSA
// runtime mirrors (MUSA publishes no header outside its SDK; torch_musa's sources call the
// same functions with the musa prefix and the same flags; docs/vendors.md "MUSA"). MUSA's
// error numbers are unconfirmed ("expected to mirror CUDA"); this double uses CUDA's.
//
// Rules enforced (musaError_t numbers in parentheses):
//   - HOSTREG_DOUBLE_DEVICES (default 1) read at every call. With 0 devices
//     musaGetDeviceCount stores 0 and answers musaErrorNoDevice (100), and so do the
//     memory calls (musaHost*), as CUDA's runtime does without a device.
//   - musaHostRegister: NULL or 0 bytes -> musaErrorInvalidValue (1); flag bits outside
//     Portable 0x1 | Mapped 0x2 | IoMemory 0x4 | ReadOnly 0x8 -> 1; a range wrapping past
//     the end of the address space -> 1; any byte already registered ->
//     musaErrorHostMemoryAlreadyRegistered (712); mlock failure ->
//     musaErrorMemoryAllocation (2).
//   - musaHostUnregister: anything but the base of a live registration ->
//     musaErrorHostMemoryNotRegistered (713).
//   - musaHostGetDevicePointer: flags must be 0, the out pointer non-NULL and the address
//     inside a live registration, else 1. The device address is host + 0x400000000000
//     (deliberately not the host address).
//   - musaHostGetFlags: the registered flags; NULL out or unregistered -> 1.
//   - musaGetErrorName/musaGetErrorString: CUDA's names with the musa prefix; unknown codes
//     read as "musaErrorUnknown" / "unknown error".
#include <cstdint>

#include "double_common.hpp"

typedef int musaError_t;

namespace {

using namespace hostreg_double;

constexpr musaError_t musaSuccess = 0;
constexpr musaError_t musaErrorInvalidValue = 1;
constexpr musaError_t musaErrorMemoryAllocation = 2;
constexpr musaError_t musaErrorNoDevice = 100;
constexpr musaError_t musaErrorHostMemoryAlreadyRegistered = 712;
constexpr musaError_t musaErrorHostMemoryNotRegistered = 713;

constexpr unsigned kAllFlags = 0xFu;  // Portable | Mapped | IoMemory | ReadOnly
// CUDA runtime style: 1000 * major + 10 * minor (here MUSA 4.2).
constexpr int kRuntimeVersion = 4020;
constexpr uintptr_t kDeviceOffset = 0x400000000000ull;

constexpr ErrorText kErrors[] = {
    {0, "musaSuccess", "no error"},
    {1, "musaErrorInvalidValue", "invalid argument"},
    {2, "musaErrorMemoryAllocation", "out of memory"},
    {3, "musaErrorInitializationError", "initialization error"},
    {35, "musaErrorInsufficientDriver", "MUSA driver version is insufficient for MUSA runtime version"},
    {100, "musaErrorNoDevice", "no MUSA-capable device is detected"},
    {101, "musaErrorInvalidDevice", "invalid device ordinal"},
    {712, "musaErrorHostMemoryAlreadyRegistered", "part or all of the requested memory range is already mapped"},
    {713, "musaErrorHostMemoryNotRegistered", "pointer does not correspond to a registered memory region"},
    {801, "musaErrorNotSupported", "operation not supported"},
    {999, "musaErrorUnknown", "unknown error"},
};
constexpr ErrorText kUnknown = {999, "musaErrorUnknown", "unknown error"};

const ErrorText& find_error(musaError_t code) {
    const ErrorText* e = hostreg_double::find_error(kErrors, code);
    return e ? *e : kUnknown;
}

bool no_device() { return knob_devices() == 0; }

}  // namespace

// --- devices and version ----------------------------------------------------------------

HRD_EXPORT musaError_t musaGetDeviceCount(int* count) {
    HRD_RECORD_CALL();
    if (!count) return musaErrorInvalidValue;
    *count = knob_devices();
    return *count == 0 ? musaErrorNoDevice : musaSuccess;
}

HRD_EXPORT musaError_t musaRuntimeGetVersion(int* version) {
    HRD_RECORD_CALL();
    if (!version) return musaErrorInvalidValue;
    *version = kRuntimeVersion;
    return musaSuccess;
}

// --- host memory registration -----------------------------------------------------------

HRD_EXPORT musaError_t musaHostRegister(void* ptr, size_t bytes, unsigned flags) {
    HRD_RECORD_CALL();
    recorder().register_flags(flags);
    if (no_device()) return musaErrorNoDevice;
    const uintptr_t base = reinterpret_cast<uintptr_t>(ptr);
    if (!ptr || bytes == 0) return musaErrorInvalidValue;
    if (flags & ~kAllFlags) return musaErrorInvalidValue;
    if (wraps(base, bytes)) return musaErrorInvalidValue;

    Registration reg;
    reg.base = base;
    reg.bytes = bytes;
    reg.flags = flags;
    reg.device = base + kDeviceOffset;
    switch (registry().add(reg, nullptr)) {
        case Registry::Result::Ok:
            return musaSuccess;
        case Registry::Result::Overlap:
            return musaErrorHostMemoryAlreadyRegistered;
        default:
            return musaErrorMemoryAllocation;  // mlock failed
    }
}

HRD_EXPORT musaError_t musaHostUnregister(void* ptr) {
    HRD_RECORD_CALL();
    if (no_device()) return musaErrorNoDevice;
    if (registry().remove(reinterpret_cast<uintptr_t>(ptr)) != Registry::Result::Ok)
        return musaErrorHostMemoryNotRegistered;
    return musaSuccess;
}

HRD_EXPORT musaError_t musaHostGetDevicePointer(void** device_ptr, void* ptr, unsigned flags) {
    HRD_RECORD_CALL();
    if (no_device()) return musaErrorNoDevice;
    if (!device_ptr || flags != 0) return musaErrorInvalidValue;
    const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
    Registration reg;
    if (!registry().find(p, &reg)) return musaErrorInvalidValue;
    *device_ptr = reinterpret_cast<void*>(reg.device + (p - reg.base));
    return musaSuccess;
}

HRD_EXPORT musaError_t musaHostGetFlags(unsigned* flags, void* ptr) {
    HRD_RECORD_CALL();
    if (no_device()) return musaErrorNoDevice;
    if (!flags) return musaErrorInvalidValue;
    Registration reg;
    if (!registry().find(reinterpret_cast<uintptr_t>(ptr), &reg)) return musaErrorInvalidValue;
    *flags = reg.flags;
    return musaSuccess;
}

// --- error texts ------------------------------------------------------------------------

HRD_EXPORT const char* musaGetErrorName(musaError_t error) {
    HRD_RECORD_CALL();
    return find_error(error).name;
}

HRD_EXPORT const char* musaGetErrorString(musaError_t error) {
    HRD_RECORD_CALL();
    return find_error(error).text;
}
