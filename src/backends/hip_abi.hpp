// hip_abi.hpp: the part of AMD's HIP runtime (libamdhip64.so) hostreg calls, written from
// ROCm's include/hip/hip_runtime_api.h: types, constants and the symbol list. No vendor
// header is needed to build; tests/real/abi_hip.cpp checks every line against the real one.
#pragma once

#include <cstddef>

namespace hostreg::hip_abi {

using hipError_t = int;  // enum hipError_t; its numbers mirror cudaError's

constexpr hipError_t kHipSuccess = 0;               // hipSuccess
constexpr hipError_t kHipErrorInvalidValue = 1;     // hipErrorInvalidValue
constexpr unsigned kHipHostRegisterPortable = 0x1;  // hipHostRegisterPortable
constexpr unsigned kHipHostRegisterMapped = 0x2;    // hipHostRegisterMapped
constexpr unsigned kHipHostRegisterIoMemory = 0x4;  // hipHostRegisterIoMemory
// 0x8: hipHostRegisterReadOnly in current headers, hipExtHostRegisterCoarseGrained in older
// ones (ROCm 5.2); clr ignores the bit either way (docs/vendors.md "HIP").
constexpr unsigned kHipHostRegisterReadOnly = 0x8;  // hipHostRegisterReadOnly

#define HOSTREG_HIP_SYMBOLS(REQUIRED, OPTIONAL)                              \
    REQUIRED(hipGetDeviceCount, hipError_t, (int*))                          \
    REQUIRED(hipHostRegister, hipError_t, (void*, size_t, unsigned))         \
    REQUIRED(hipHostUnregister, hipError_t, (void*))                         \
    REQUIRED(hipHostGetDevicePointer, hipError_t, (void**, void*, unsigned)) \
    REQUIRED(hipGetErrorName, const char*, (hipError_t))                     \
    REQUIRED(hipGetErrorString, const char*, (hipError_t))                   \
    OPTIONAL(hipRuntimeGetVersion, hipError_t, (int*))

}  // namespace hostreg::hip_abi
