// ze_double.cpp -> libhostreg_double_ze.so
//
// TEST DOUBLE of oneAPI Level Zero as hostreg sees it: the loader libze_loader.so.1 with
// Intel's GPU driver (compute-runtime) behind it. It is NOT Intel's library. It exports the
// loader's C functions hostreg calls, and hands out the driver's host-pointer import
// extension through zeDriverGetExtensionFunctionAddress, as the real driver does (the zex*
// functions are not exported by the loader).
//
// Modelled on the Level Zero spec header ze_api.h / ze_loader.h (Debian libze-dev 1.8.12) and
// on intel/compute-runtime:
//   level_zero/include/level_zero/driver_experimental/zex_driver.h   the zex* prototypes
//   level_zero/api/driver_experimental/public/zex_driver.cpp         their entry points
//   level_zero/core/source/driver/driver_handle.cpp                  importExternalPointer /
//       releaseImportedPointer / getHostPointerBaseAddress: no host pointer manager
//       (EnableHostPointerImport=0: the functions are still handed out,
//       extension_function_address.cpp) -> ZE_RESULT_ERROR_UNSUPPORTED_FEATURE; release of,
//       or the base address of, a pointer in no import -> ZE_RESULT_ERROR_INVALID_ARGUMENT;
//       the base address of a pointer inside an import -> that import's base
//   level_zero/core/source/driver/host_pointer_manager.cpp           the import itself
//       (createHostPointerMultiAllocation, in its order): NULL or size 0 -> INVALID_ARGUMENT;
//       first and last byte inside one imported range -> SUCCESS (re-import, or any part of an
//       import: nothing new is made); first byte inside one, last inside another ->
//       OVERLAPPING_REGIONS; first inside, last outside -> HANDLE_OBJECT_IN_USE; last inside,
//       first outside -> INVALID_SIZE; a range that covers an import without starting or
//       ending in it is not detected and imported too; allocation failure ->
//       OUT_OF_HOST_MEMORY (here: memory that is not mapped). freeHostPointerAllocation
//       finds the import *containing* the pointer, so releasing an interior pointer releases
//       the whole import.
// The import creates a userptr allocation per device; it does not lock pages, and neither
// does the double (hostreg locks them itself). What the real loader answers with no driver
// installed (Debian's libze_loader.so.1 on a machine without an Intel GPU) is modelled too:
// zeInit -> ZE_RESULT_ERROR_UNINITIALIZED.
//
// Knobs (read at every call):
//   HOSTREG_DOUBLE_DEVICES      devices of the one driver (default 1); 0: no driver at all,
//                               zeInit answers ZE_RESULT_ERROR_UNINITIALIZED
//   HOSTREG_DOUBLE_ZE_NO_IMPORT 1: the driver runs with EnableHostPointerImport=0
#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

#include "double_common.hpp"

typedef int ze_result_t;
typedef struct _ze_driver_handle_t* ze_driver_handle_t;
typedef struct _ze_device_handle_t* ze_device_handle_t;
struct _ze_driver_handle_t {
    char unused;
};
struct _ze_device_handle_t {
    char unused;
};
struct zel_version_t {
    int major, minor, patch;
};
struct zel_component_version_t {
    char component_name[64];
    int spec_version;
    zel_version_t component_lib_version;
};

namespace {

using namespace hostreg_double;

constexpr ze_result_t ZE_RESULT_SUCCESS = 0;
constexpr ze_result_t ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY = 0x70000002;
constexpr ze_result_t ZE_RESULT_ERROR_UNINITIALIZED = 0x78000001;
constexpr ze_result_t ZE_RESULT_ERROR_UNSUPPORTED_FEATURE = 0x78000003;
constexpr ze_result_t ZE_RESULT_ERROR_INVALID_ARGUMENT = 0x78000004;
constexpr ze_result_t ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE = 0x78000006;
constexpr ze_result_t ZE_RESULT_ERROR_INVALID_NULL_POINTER = 0x78000007;
constexpr ze_result_t ZE_RESULT_ERROR_INVALID_SIZE = 0x78000008;
constexpr ze_result_t ZE_RESULT_ERROR_INVALID_ENUMERATION = 0x7800000c;
constexpr ze_result_t ZE_RESULT_ERROR_OVERLAPPING_REGIONS = 0x7800001a;
constexpr unsigned kInitFlags = 0x1u | 0x2u;  // ZE_INIT_FLAG_GPU_ONLY | ZE_INIT_FLAG_VPU_ONLY
constexpr int kApiVersion = (1 << 16) | 8;    // ZE_MAKE_VERSION(1, 8)

std::mutex g_mu;
bool g_initialized = false;
_ze_driver_handle_t g_driver;
_ze_device_handle_t g_devices[kMaxDevices];

bool initialized() {
    std::lock_guard<std::mutex> lock(g_mu);
    return g_initialized;
}

bool import_enabled() { return !knob_on("HOSTREG_DOUBLE_ZE_NO_IMPORT"); }

bool mapped(uintptr_t lo, size_t bytes) {
    std::vector<unsigned char> v(4096);
    const uintptr_t first = page_down(lo), end = page_up(lo + bytes);
    for (uintptr_t at = first; at < end; at += 4096 * page_size()) {
        const size_t len = std::min<uintptr_t>(end - at, 4096 * page_size());
        if (mincore(reinterpret_cast<void*>(at), len, v.data()) != 0) return false;
    }
    return true;
}

// --- the driver's extension functions (compute-runtime; not exported) -------------------

ze_result_t import_external_pointer(ze_driver_handle_t driver, void* ptr, size_t size) {
    recorder().call("zexDriverImportExternalPointer");
    if (driver != &g_driver) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (!import_enabled()) return ZE_RESULT_ERROR_UNSUPPORTED_FEATURE;
    if (size == 0 || ptr == nullptr) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    const uintptr_t base = reinterpret_cast<uintptr_t>(ptr);
    Registration begin, end;
    const bool in_begin = registry().find(base, &begin), in_end = registry().find(base + size - 1, &end);
    if (in_begin && in_end && begin.base == end.base) return ZE_RESULT_SUCCESS;
    if (in_begin) return in_end ? ZE_RESULT_ERROR_OVERLAPPING_REGIONS : ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE;
    if (in_end) return ZE_RESULT_ERROR_INVALID_SIZE;
    if (wraps(base, size) || !mapped(base, size)) return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
    Registration reg;
    reg.base = base;
    reg.bytes = size;
    reg.device = base;  // USM: the device uses the host address
    reg.locked = false;
    reg.kind = "imported";
    registry().add(reg, nullptr, Registry::Overlaps::Keep);
    return ZE_RESULT_SUCCESS;
}

ze_result_t release_imported_pointer(ze_driver_handle_t driver, void* ptr) {
    recorder().call("zexDriverReleaseImportedPointer");
    if (driver != &g_driver) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (!import_enabled()) return ZE_RESULT_ERROR_UNSUPPORTED_FEATURE;
    Registration reg;
    if (!registry().find(reinterpret_cast<uintptr_t>(ptr), &reg)) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    registry().remove(reg.base);  // the import containing ptr, whatever ptr is inside it
    return ZE_RESULT_SUCCESS;
}

ze_result_t get_host_pointer_base_address(ze_driver_handle_t driver, void* ptr, void** base) {
    recorder().call("zexDriverGetHostPointerBaseAddress");
    if (driver != &g_driver) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (!import_enabled()) return ZE_RESULT_ERROR_UNSUPPORTED_FEATURE;
    Registration reg;
    if (!registry().find(reinterpret_cast<uintptr_t>(ptr), &reg)) return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    if (base) *base = reinterpret_cast<void*>(reg.base);
    return ZE_RESULT_SUCCESS;
}

}  // namespace

// --- the loader's exported functions ----------------------------------------------------

HRD_EXPORT ze_result_t zeInit(unsigned flags) {
    HRD_RECORD_CALL();
    if (flags & ~kInitFlags) return ZE_RESULT_ERROR_INVALID_ENUMERATION;
    if (knob_devices() == 0) return ZE_RESULT_ERROR_UNINITIALIZED;  // no driver found
    std::lock_guard<std::mutex> lock(g_mu);
    g_initialized = true;
    return ZE_RESULT_SUCCESS;
}

HRD_EXPORT ze_result_t zeDriverGet(uint32_t* count, ze_driver_handle_t* drivers) {
    HRD_RECORD_CALL();
    if (!initialized()) return ZE_RESULT_ERROR_UNINITIALIZED;
    if (!count) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (*count == 0 || drivers == nullptr) {
        *count = 1;
        return ZE_RESULT_SUCCESS;
    }
    *count = 1;
    drivers[0] = &g_driver;
    return ZE_RESULT_SUCCESS;
}

HRD_EXPORT ze_result_t zeDriverGetApiVersion(ze_driver_handle_t driver, int* version) {
    HRD_RECORD_CALL();
    if (!initialized()) return ZE_RESULT_ERROR_UNINITIALIZED;
    if (driver != &g_driver || !version) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    *version = kApiVersion;
    return ZE_RESULT_SUCCESS;
}

HRD_EXPORT ze_result_t zeDeviceGet(ze_driver_handle_t driver, uint32_t* count, ze_device_handle_t* devices) {
    HRD_RECORD_CALL();
    if (!initialized()) return ZE_RESULT_ERROR_UNINITIALIZED;
    if (driver != &g_driver || !count) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    const uint32_t n = static_cast<uint32_t>(knob_devices());
    if (*count == 0 || devices == nullptr) {
        *count = n;
        return ZE_RESULT_SUCCESS;
    }
    if (*count > n) *count = n;
    for (uint32_t i = 0; i < *count; ++i)
        devices[i] = &g_devices[i];
    return ZE_RESULT_SUCCESS;
}

HRD_EXPORT ze_result_t zeDriverGetExtensionFunctionAddress(ze_driver_handle_t driver, const char* name, void** fn) {
    HRD_RECORD_CALL();
    if (!initialized()) return ZE_RESULT_ERROR_UNINITIALIZED;
    if (driver != &g_driver || !name || !fn) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (std::strcmp(name, "zexDriverImportExternalPointer") == 0)
        *fn = reinterpret_cast<void*>(&import_external_pointer);
    else if (std::strcmp(name, "zexDriverReleaseImportedPointer") == 0)
        *fn = reinterpret_cast<void*>(&release_imported_pointer);
    else if (std::strcmp(name, "zexDriverGetHostPointerBaseAddress") == 0)
        *fn = reinterpret_cast<void*>(&get_host_pointer_base_address);
    else
        return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    return ZE_RESULT_SUCCESS;
}

// The real loader lists its own components only after zeInit found a driver.
HRD_EXPORT ze_result_t zelLoaderGetVersions(size_t* count, zel_component_version_t* versions) {
    HRD_RECORD_CALL();
    if (!count) return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (!initialized()) {
        *count = 0;
        return ZE_RESULT_SUCCESS;
    }
    if (versions && *count >= 1) {
        std::memset(&versions[0], 0, sizeof versions[0]);
        std::strcpy(versions[0].component_name, "loader");
        versions[0].spec_version = kApiVersion;
        versions[0].component_lib_version = {1, 8, 12};
    }
    *count = 1;
    return ZE_RESULT_SUCCESS;
}
