// abi_cuda.cpp: src/backends/cuda_abi.hpp against CUDA's own cuda.h (the toolkit's include/),
// and hostreg's cudaError table (src/core/cuda_errors.inc) against driver_types.h. Compiled
// with the header only where it is found (tests/real/CMakeLists.txt); every check is a
// static_assert, so a mismatch fails the build.
#include <gtest/gtest.h>

#include <cstdio>

#ifdef HOSTREG_HAVE_CUDA_HEADERS
#include <cuda.h>
#include <driver_types.h>

#include "abi_check.hpp"
#include "backends/cuda_abi.hpp"
#include "hostreg/hostreg.h"

namespace hostreg::cuda_abi {
HOSTREG_CUDA_SYMBOLS(HRABI_CHECK_FN, HRABI_CHECK_FN)
static_assert(sizeof(CUresult) == sizeof(::CUresult) && sizeof(CUdevice) == sizeof(::CUdevice));
static_assert(sizeof(CUdeviceptr) == sizeof(::CUdeviceptr));
static_assert(kCudaSuccess == ::CUDA_SUCCESS);
static_assert(kCudaErrorStubLibrary == ::CUDA_ERROR_STUB_LIBRARY);
static_assert(kCudaErrorInvalidContext == ::CUDA_ERROR_INVALID_CONTEXT);
static_assert(kCudaErrorContextIsDestroyed == ::CUDA_ERROR_CONTEXT_IS_DESTROYED);
static_assert(kMemHostRegisterPortable == CU_MEMHOSTREGISTER_PORTABLE);
static_assert(kMemHostRegisterDeviceMap == CU_MEMHOSTREGISTER_DEVICEMAP);
static_assert(kMemHostRegisterIoMemory == CU_MEMHOSTREGISTER_IOMEMORY);
static_assert(kMemHostRegisterReadOnly == CU_MEMHOSTREGISTER_READ_ONLY);
static_assert(kAttributeReadOnlyHostRegisterSupported == ::CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED);
// hostreg's own flag bits and the codes it answers itself are CUDA's.
static_assert(HOSTREG_HOST_REGISTER_PORTABLE == cudaHostRegisterPortable);
static_assert(HOSTREG_HOST_REGISTER_MAPPED == cudaHostRegisterMapped);
static_assert(HOSTREG_HOST_REGISTER_IO_MEMORY == cudaHostRegisterIoMemory);
static_assert(HOSTREG_HOST_REGISTER_READ_ONLY == cudaHostRegisterReadOnly);
static_assert(static_cast<int>(hostregErrorHostMemoryAlreadyRegistered) == ::cudaErrorHostMemoryAlreadyRegistered);
static_assert(static_cast<int>(hostregErrorHostMemoryNotRegistered) == ::cudaErrorHostMemoryNotRegistered);
}  // namespace hostreg::cuda_abi

// Every entry of hostreg's generated table is the member of enum cudaError of that name.
#define HOSTREG_CUDA_ERROR(number, name, message) static_assert(number == static_cast<int>(::name), #name);
#include "core/cuda_errors.inc"
#undef HOSTREG_CUDA_ERROR
constexpr int kTableSize = 0
#define HOSTREG_CUDA_ERROR(number, name, message) +1
#include "core/cuda_errors.inc"
#undef HOSTREG_CUDA_ERROR
    ;
#endif

TEST(VendorHeaders, Cuda) {
#ifdef HOSTREG_HAVE_CUDA_HEADERS
    // Completeness (no member missing) is checked against the real libcudart in real_cudart.cpp.
    EXPECT_GT(kTableSize, 100);
    std::printf("checked against %s: %d cudaError codes, driver API symbols and constants\n",
                HOSTREG_VENDOR_INCLUDE_DIR, kTableSize);
#else
    GTEST_SKIP() << "CUDA headers (cuda.h) not found: the check was not compiled";
#endif
}
