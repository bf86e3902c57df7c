// cuda_abi.hpp: the part of the NVIDIA CUDA driver API (libcuda.so.1) hostreg calls, written
// from CUDA 13.0's cuda.h: types, constants and the symbol list. No vendor header is needed to
// build; tests/real/abi_cuda.cpp checks every line here against the real cuda.h.
#pragma once

#include <cstddef>

namespace hostreg::cuda_abi {

using CUresult = int;  // enum cudaError_enum; its numbers are the runtime's cudaError numbers
using CUdevice = int;
struct CUctx_st;
using CUcontext = CUctx_st*;
using CUdeviceptr = unsigned long long;
using CUdevice_attribute = int;  // enum CUdevice_attribute_enum

constexpr CUresult kCudaSuccess = 0;                    // CUDA_SUCCESS
constexpr CUresult kCudaErrorStubLibrary = 34;          // CUDA_ERROR_STUB_LIBRARY, the toolkit's stubs/libcuda.so
constexpr CUresult kCudaErrorInvalidContext = 201;      // CUDA_ERROR_INVALID_CONTEXT
constexpr CUresult kCudaErrorContextIsDestroyed = 709;  // CUDA_ERROR_CONTEXT_IS_DESTROYED
// cuMemHostRegister flags: the same bits as the runtime's cudaHostRegister flags.
constexpr unsigned kMemHostRegisterPortable = 0x01;   // CU_MEMHOSTREGISTER_PORTABLE
constexpr unsigned kMemHostRegisterDeviceMap = 0x02;  // CU_MEMHOSTREGISTER_DEVICEMAP
constexpr unsigned kMemHostRegisterIoMemory = 0x04;   // CU_MEMHOSTREGISTER_IOMEMORY
constexpr unsigned kMemHostRegisterReadOnly = 0x08;   // CU_MEMHOSTREGISTER_READ_ONLY
constexpr CUdevice_attribute kAttributeReadOnlyHostRegisterSupported =
    113;  // CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED

// cuda.h maps the plain names of these calls to their _v2 symbols (e.g.
// `#define cuMemHostRegister cuMemHostRegister_v2`): the _v2 names are the exported ones.
#define HOSTREG_CUDA_SYMBOLS(REQUIRED, OPTIONAL)                                      \
    REQUIRED(cuInit, CUresult, (unsigned))                                            \
    REQUIRED(cuDriverGetVersion, CUresult, (int*))                                    \
    REQUIRED(cuDeviceGetCount, CUresult, (int*))                                      \
    REQUIRED(cuDeviceGet, CUresult, (CUdevice*, int))                                 \
    REQUIRED(cuDevicePrimaryCtxRetain, CUresult, (CUcontext*, CUdevice))              \
    REQUIRED(cuCtxGetCurrent, CUresult, (CUcontext*))                                 \
    REQUIRED(cuCtxPushCurrent_v2, CUresult, (CUcontext))                              \
    REQUIRED(cuCtxPopCurrent_v2, CUresult, (CUcontext*))                              \
    REQUIRED(cuMemHostRegister_v2, CUresult, (void*, size_t, unsigned))               \
    REQUIRED(cuMemHostUnregister, CUresult, (void*))                                  \
    REQUIRED(cuMemHostGetDevicePointer_v2, CUresult, (CUdeviceptr*, void*, unsigned)) \
    REQUIRED(cuGetErrorName, CUresult, (CUresult, const char**))                      \
    REQUIRED(cuGetErrorString, CUresult, (CUresult, const char**))                    \
    OPTIONAL(cuDeviceGetAttribute, CUresult, (int*, CUdevice_attribute, CUdevice))

}  // namespace hostreg::cuda_abi
