// ze_abi.hpp: the part of oneAPI Level Zero (the loader libze_loader.so.1, and Intel's
// compute-runtime driver behind it) hostreg calls: types, constants and the symbol list.
// zeInit .. zeDriverGetExtensionFunctionAddress are from the Level Zero spec's ze_api.h and
// zelLoaderGetVersions from the loader's ze_loader.h (tests/real/abi_ze.cpp checks them against
// the real headers, Debian's libze-dev); the zex* driver extension functions are from
// intel/compute-runtime's level_zero/include/level_zero/driver_experimental/zex_driver.h,
// which no package installs: they are fetched by name from the driver, not exported.
#pragma once

#include <cstddef>
#include <cstdint>

namespace hostreg::ze_abi {

using ze_result_t = int;  // enum _ze_result_t
using ze_init_flags_t = uint32_t;
using ze_api_version_t = int;  // enum _ze_api_version_t: ZE_MAKE_VERSION(major, minor)
struct _ze_driver_handle_t;
using ze_driver_handle_t = _ze_driver_handle_t*;
struct _ze_device_handle_t;
using ze_device_handle_t = _ze_device_handle_t*;
struct zel_version_t {
    int major, minor, patch;
};
struct zel_component_version_t {
    char component_name[64];
    ze_api_version_t spec_version;
    zel_version_t component_lib_version;
};

constexpr ze_result_t kResultSuccess = 0;                           // ZE_RESULT_SUCCESS
constexpr ze_result_t kResultErrorDeviceLost = 0x70000001;          // ZE_RESULT_ERROR_DEVICE_LOST
constexpr ze_result_t kResultErrorOutOfHostMemory = 0x70000002;     // ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY
constexpr ze_result_t kResultErrorUninitialized = 0x78000001;       // ZE_RESULT_ERROR_UNINITIALIZED
constexpr ze_result_t kResultErrorUnsupportedFeature = 0x78000003;  // ZE_RESULT_ERROR_UNSUPPORTED_FEATURE
constexpr ze_result_t kResultErrorInvalidArgument = 0x78000004;     // ZE_RESULT_ERROR_INVALID_ARGUMENT
constexpr ze_result_t kResultErrorHandleObjectInUse = 0x78000006;   // ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE
constexpr ze_result_t kResultErrorInvalidNullPointer = 0x78000007;  // ZE_RESULT_ERROR_INVALID_NULL_POINTER
constexpr ze_result_t kResultErrorInvalidSize = 0x78000008;         // ZE_RESULT_ERROR_INVALID_SIZE
constexpr ze_result_t kResultErrorOverlappingRegions = 0x7800001a;  // ZE_RESULT_ERROR_OVERLAPPING_REGIONS

#define HOSTREG_ZE_SYMBOLS(REQUIRED, OPTIONAL)                                                            \
    REQUIRED(zeInit, ze_result_t, (ze_init_flags_t))                                                      \
    REQUIRED(zeDriverGet, ze_result_t, (uint32_t*, ze_driver_handle_t*))                                  \
    REQUIRED(zeDriverGetApiVersion, ze_result_t, (ze_driver_handle_t, ze_api_version_t*))                 \
    REQUIRED(zeDeviceGet, ze_result_t, (ze_driver_handle_t, uint32_t*, ze_device_handle_t*))              \
    REQUIRED(zeDriverGetExtensionFunctionAddress, ze_result_t, (ze_driver_handle_t, const char*, void**)) \
    OPTIONAL(zelLoaderGetVersions, ze_result_t, (size_t*, zel_component_version_t*))

// compute-runtime's zex_driver.h; looked up with zeDriverGetExtensionFunctionAddress.
using zexDriverImportExternalPointer_t = ze_result_t (*)(ze_driver_handle_t, void* ptr, size_t size);
using zexDriverReleaseImportedPointer_t = ze_result_t (*)(ze_driver_handle_t, void* ptr);
using zexDriverGetHostPointerBaseAddress_t = ze_result_t (*)(ze_driver_handle_t, void* ptr, void** base);

}  // namespace hostreg::ze_abi
