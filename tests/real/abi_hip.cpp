// abi_hip.cpp: src/backends/hip_abi.hpp against ROCm's own hip/hip_runtime_api.h (Debian's
// libamdhip64-dev). Compiled with the header only where it is found; every check is a
// static_assert.
#include <gtest/gtest.h>

#include <cstdio>

#ifdef HOSTREG_HAVE_HIP_HEADERS
#define __HIP_PLATFORM_AMD__
#include <hip/hip_runtime_api.h>

#include "abi_check.hpp"
#include "backends/hip_abi.hpp"

namespace hostreg::hip_abi {
HOSTREG_HIP_SYMBOLS(HRABI_CHECK_FN, HRABI_CHECK_FN)
static_assert(sizeof(hipError_t) == sizeof(::hipError_t));
static_assert(kHipSuccess == ::hipSuccess && kHipErrorInvalidValue == ::hipErrorInvalidValue);
static_assert(kHipHostRegisterPortable == hipHostRegisterPortable);
static_assert(kHipHostRegisterMapped == hipHostRegisterMapped);
static_assert(kHipHostRegisterIoMemory == hipHostRegisterIoMemory);
#ifdef hipHostRegisterReadOnly
static_assert(kHipHostRegisterReadOnly == hipHostRegisterReadOnly);
#else  // ROCm 5.x: the same bit is hipExtHostRegisterCoarseGrained
static_assert(kHipHostRegisterReadOnly == hipExtHostRegisterCoarseGrained);
#endif
// HIP's numbers for the codes hostreg relies on are CUDA's.
static_assert(::hipErrorHostMemoryAlreadyRegistered == 712 && ::hipErrorHostMemoryNotRegistered == 713);
static_assert(::hipErrorNoDevice == 100 && ::hipErrorInvalidDevice == 101 && ::hipErrorNotSupported == 801);
}  // namespace hostreg::hip_abi
#endif

TEST(VendorHeaders, Hip) {
#ifdef HOSTREG_HAVE_HIP_HEADERS
    std::printf("checked against %s/hip/hip_runtime_api.h\n", HOSTREG_VENDOR_INCLUDE_DIR);
#else
    GTEST_SKIP() << "HIP headers (hip/hip_runtime_api.h) not found: the check was not compiled";
#endif
}
