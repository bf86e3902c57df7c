// abi_ze.cpp: src/backends/ze_abi.hpp against the Level Zero spec's own level_zero/ze_api.h
// and loader/ze_loader.h (Debian's libze-dev). Compiled with the headers only where they are
// found; every check is a static_assert. (The zex* driver extension prototypes are in Intel
// compute-runtime's zex_driver.h, which no package installs.)
#include <gtest/gtest.h>

#include <cstdio>

#ifdef HOSTREG_HAVE_ZE_HEADERS
#include <level_zero/loader/ze_loader.h>
#include <level_zero/ze_api.h>

#include "abi_check.hpp"
#include "backends/ze_abi.hpp"

namespace hostreg::ze_abi {
HOSTREG_ZE_SYMBOLS(HRABI_CHECK_FN, HRABI_CHECK_FN)
static_assert(sizeof(ze_result_t) == sizeof(::ze_result_t) && sizeof(ze_api_version_t) == sizeof(::ze_api_version_t));
static_assert(sizeof(zel_component_version_t) == sizeof(::zel_component_version_t));
static_assert(offsetof(zel_component_version_t, component_lib_version) ==
              offsetof(::zel_component_version_t, component_lib_version));
static_assert(kResultSuccess == ::ZE_RESULT_SUCCESS && kResultErrorDeviceLost == ::ZE_RESULT_ERROR_DEVICE_LOST);
static_assert(kResultErrorOutOfHostMemory == ::ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY);
static_assert(kResultErrorUninitialized == ::ZE_RESULT_ERROR_UNINITIALIZED);
static_assert(kResultErrorUnsupportedFeature == ::ZE_RESULT_ERROR_UNSUPPORTED_FEATURE);
static_assert(kResultErrorInvalidArgument == ::ZE_RESULT_ERROR_INVALID_ARGUMENT);
static_assert(kResultErrorHandleObjectInUse == ::ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE);
static_assert(kResultErrorInvalidNullPointer == ::ZE_RESULT_ERROR_INVALID_NULL_POINTER);
static_assert(kResultErrorInvalidSize == ::ZE_RESULT_ERROR_INVALID_SIZE);
static_assert(kResultErrorOverlappingRegions == ::ZE_RESULT_ERROR_OVERLAPPING_REGIONS);
}  // namespace hostreg::ze_abi
#endif

TEST(VendorHeaders, LevelZero) {
#ifdef HOSTREG_HAVE_ZE_HEADERS
    std::printf("checked against %s/level_zero\n", HOSTREG_VENDOR_INCLUDE_DIR);
#else
    GTEST_SKIP() << "Level Zero headers (level_zero/ze_api.h) not found: the check was not compiled";
#endif
}
