// musa_abi.hpp: the part of Moore Threads' MUSA runtime (libmusart.so) hostreg calls. MUSA
// publishes no header outside its SDK; the prototypes mirror CUDA's runtime, as torch_musa's
// sources use them (docs/vendors.md "MUSA"). Error numbers are expected to mirror CUDA's
// (unconfirmed: no header to check them against).
#pragma once

#include <cstddef>

namespace hostreg::musa_abi {

using musaError_t = int;

#define HOSTREG_MUSA_SYMBOLS(REQUIRED, OPTIONAL)                               \
    REQUIRED(musaGetDeviceCount, musaError_t, (int*))                          \
    REQUIRED(musaHostRegister, musaError_t, (void*, size_t, unsigned))         \
    REQUIRED(musaHostUnregister, musaError_t, (void*))                         \
    REQUIRED(musaHostGetDevicePointer, musaError_t, (void**, void*, unsigned)) \
    REQUIRED(musaGetErrorString, const char*, (musaError_t))                   \
    OPTIONAL(musaGetErrorName, const char*, (musaError_t))                     \
    OPTIONAL(musaRuntimeGetVersion, musaError_t, (int*))

}  // namespace hostreg::musa_abi
