// ze.cpp: Intel GPUs (PyTorch XPU), through oneAPI Level Zero (libze_loader.so.1; calls in
// ze_abi.hpp).
//
// Level Zero's counterpart of cudaHostRegister is the driver extension
// zexDriverImportExternalPointer(hDriver, ptr, size) / zexDriverReleaseImportedPointer(hDriver,
// ptr) of Intel's compute-runtime (level_zero/api/driver_experimental/public/zex_driver.cpp),
// fetched after zeInit(0) and zeDriverGet with zeDriverGetExtensionFunctionAddress. Why this
// and not the newer ZE_extension_external_memmap_sysmem (compute-runtime
// doc/experimental_extensions/EXTERNAL_MEMMAP_SYSMEM.md; it is the memmap that keeps the same
// address on host and device, ze_api.h `ze_external_memmap_sysmem_ext_desc_t`): the import is
// undone by the caller's own address and needs no context, exactly cudaHostRegister's
// contract, and compute-runtime has offered it for years (EnableHostPointerImport, -1:
// enabled), while memmap needs a context, is released with zeMemFree, and arrived in
// compute-runtime only in 2025.
//
// What the import does (level_zero/core/source/driver/host_pointer_manager.cpp,
// HostPointerManager::createHostPointerMultiAllocation): for every device it creates an
// allocation of type externalHostPtr over the range, with a GPU address range of its own
// (shared/source/memory_manager/memory_manager.cpp, useNonSvmHostPtrAlloc; the driver
// translates host pointers into it for copies, driver_handle.cpp
// getDriverSystemMemoryAllocation, and for pointer kernel arguments, kernel_imp.cpp): the host
// address is what Level Zero calls take, not the GPU's own address. Null or size 0 ->
// ZE_RESULT_ERROR_INVALID_ARGUMENT; a range whose first and last byte lie inside one existing
// import -> SUCCESS, creating nothing; overlaps -> OVERLAPPING_REGIONS, HANDLE_OBJECT_IN_USE or
// INVALID_SIZE; allocation failure -> OUT_OF_HOST_MEMORY; release frees the import that
// *contains* the pointer, and an unknown pointer answers INVALID_ARGUMENT (driver_handle.cpp).
// hostreg's registry refuses overlaps with its own registrations; other users of the same
// driver import too (SYCL's prepare_for_device_copy, oneCCL), so before importing hostreg asks
// zexDriverGetHostPointerBaseAddress about the first and last byte and answers 712 where
// either is already imported: a SUCCESS there would register nothing of hostreg's own, and its
// unregister would release the other user's import. With EnableHostPointerImport=0 the
// functions are still handed out but every import answers UNSUPPORTED_FEATURE
// (driver_handle.cpp), so the probe imports and releases one page. The import does not
// promise residency against swap, so hostreg also page-locks the pages with mlock(2): a
// success is an import *and* a lock. Locks do not nest, so the granule is a page
// (core/page_share.hpp shares edge pages).
#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <string>

#include "backends/codes.hpp"
#include "backends/dynlib.hpp"
#include "backends/page_lock.hpp"
#include "backends/ze_abi.hpp"
#include "core/memory_map.hpp"

namespace hostreg {
namespace {

using namespace ze_abi;

HOSTREG_DEFINE_API(HOSTREG_ZE_SYMBOLS)

constexpr CodeMap kCodes[] = {
    {kResultSuccess, hostregSuccess},
    {kResultErrorInvalidArgument, hostregErrorInvalidValue},
    {kResultErrorInvalidNullPointer, hostregErrorInvalidValue},
    {kResultErrorOutOfHostMemory, hostregErrorMemoryAllocation},
    {kResultErrorUnsupportedFeature, hostregErrorNotSupported},
    {kResultErrorUninitialized, hostregErrorInitializationError},
    {kResultErrorOverlappingRegions, hostregErrorHostMemoryAlreadyRegistered},
    {kResultErrorHandleObjectInUse, hostregErrorHostMemoryAlreadyRegistered},
    {kResultErrorInvalidSize, hostregErrorHostMemoryAlreadyRegistered},
    {kResultErrorDeviceLost, 46},  // cudaErrorDevicesUnavailable
};

struct Ze : Runtime<Api> {
    static constexpr const char* kLibraryEnv = "HOSTREG_ZE_LIBRARY";
    static constexpr const char* kLibraryNames[] = {"libze_loader.so.1", nullptr};
    static constexpr const char* kAbsent = "no Level Zero loader";
    ze_driver_handle_t driver = nullptr;
    zexDriverImportExternalPointer_t import = nullptr;
    zexDriverReleaseImportedPointer_t release = nullptr;
    zexDriverGetHostPointerBaseAddress_t base_of = nullptr;  // nullptr: a driver without it
};

std::string hex(long long r) {
    char buf[24];
    std::snprintf(buf, sizeof buf, "0x%llx", r);
    return buf;
}

Status failure(const char* call, ze_result_t r) {
    return Status::error(translate(r, kCodes), std::string(call) + " failed: ze_result_t " + hex(r), r);
}

Status start(Ze& z) {
    Api& api = z.api;
    if (ze_result_t r = api.zeInit(0)) {
        Status s = failure("zeInit", r);
        if (r == kResultErrorUninitialized) s.message += " (ZE_RESULT_ERROR_UNINITIALIZED: the loader found no driver)";
        return s;
    }
    size_t n = 1;
    zel_component_version_t loader{};
    if (api.zelLoaderGetVersions && api.zelLoaderGetVersions(&n, &loader) == kResultSuccess && n >= 1)
        z.probe.caps.version = std::string(loader.component_name) + " " +
                               std::to_string(loader.component_lib_version.major) + "." +
                               std::to_string(loader.component_lib_version.minor) + "." +
                               std::to_string(loader.component_lib_version.patch);
    uint32_t count = 0;
    if (ze_result_t r = api.zeDriverGet(&count, nullptr)) return failure("zeDriverGet", r);
    ze_driver_handle_t drivers[16] = {};
    if (count > 16) count = 16;
    if (ze_result_t r = api.zeDriverGet(&count, drivers)) return failure("zeDriverGet", r);
    // The first driver with a device and the import extension (an NPU driver may come first).
    std::string why = "the loader reports no driver";
    int code = hostregErrorNoDevice;
    for (uint32_t i = 0; i < count && !z.driver; ++i) {
        uint32_t devices = 0;
        if (api.zeDeviceGet(drivers[i], &devices, nullptr) != kResultSuccess || devices == 0) {
            why = "no driver reports a device";
            continue;
        }
        void* import = nullptr;
        void* release = nullptr;
        if (api.zeDriverGetExtensionFunctionAddress(drivers[i], "zexDriverImportExternalPointer", &import) ||
            api.zeDriverGetExtensionFunctionAddress(drivers[i], "zexDriverReleaseImportedPointer", &release) ||
            !import || !release) {
            why = "no driver offers zexDriverImportExternalPointer (Intel compute-runtime's host pointer import)";
            continue;
        }
        // The functions are handed out even where the driver imports nothing (compute-runtime
        // with EnableHostPointerImport=0 answers UNSUPPORTED_FEATURE to every import): try one page.
        auto imp = reinterpret_cast<zexDriverImportExternalPointer_t>(import);
        auto rel = reinterpret_cast<zexDriverReleaseImportedPointer_t>(release);
        const size_t page = page_size();
        void* probe = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (probe == MAP_FAILED)
            return Status::error(hostregErrorMemoryAllocation, "cannot map a page to probe the import");
        const ze_result_t tried = imp(drivers[i], probe, page);
        if (tried == kResultSuccess) rel(drivers[i], probe);
        munmap(probe, page);
        if (tried != kResultSuccess) {
            why = "the driver offers zexDriverImportExternalPointer but refuses it (" +
                  failure("import of one page", tried).message +
                  (tried == kResultErrorUnsupportedFeature
                       ? "; compute-runtime answers so when run with EnableHostPointerImport=0"
                       : "") +
                  ")";
            code = hostregErrorNotSupported;
            continue;
        }
        z.driver = drivers[i];
        z.import = imp;
        z.release = rel;
        void* base_of = nullptr;
        if (api.zeDriverGetExtensionFunctionAddress(drivers[i], "zexDriverGetHostPointerBaseAddress", &base_of) ==
            kResultSuccess)
            z.base_of = reinterpret_cast<zexDriverGetHostPointerBaseAddress_t>(base_of);
    }
    if (!z.driver) return Status::error(code, why);
    ze_api_version_t api_version = 0;
    if (api.zeDriverGetApiVersion(z.driver, &api_version) == kResultSuccess)
        z.probe.caps.version += std::string(z.probe.caps.version.empty() ? "" : ", ") + "Level Zero API " +
                                std::to_string(api_version >> 16) + "." + std::to_string(api_version & 0xffff);
    Capabilities& caps = z.probe.caps;
    caps.flags = HOSTREG_HOST_REGISTER_PORTABLE | HOSTREG_HOST_REGISTER_MAPPED | HOSTREG_HOST_REGISTER_READ_ONLY;
    caps.granule = page_size();
    caps.note =
        "imported into the Level Zero driver for every device (zexDriverImportExternalPointer) and "
        "page-locked with mlock(2)";
    return Status::ok();
}

Ze& ze() { return loaded_once<Ze, start>(); }

const Probe& ze_probe() { return ze().probe; }

// Someone else's import holding byte `at` (see the file comment), or nullptr.
void* imported_by_another(Ze& z, void* at) {
    void* base = nullptr;
    return z.base_of && z.base_of(z.driver, at, &base) == kResultSuccess ? (base ? base : at) : nullptr;
}

Status ze_register(void* ptr, size_t bytes, unsigned /*flags*/, Piece* piece) {
    Ze& z = ze();
    for (void* at : {ptr, static_cast<void*>(static_cast<char*>(ptr) + bytes - 1)}) {
        if (void* base = imported_by_another(z, at)) {
            char where[64];
            std::snprintf(where, sizeof where, "%p (its import starts at %p)", at, base);
            return Status::error(
                hostregErrorHostMemoryAlreadyRegistered,
                std::string("byte ") + where +
                    " is already imported into the Level Zero driver by "
                    "another user of it in this process (SYCL, oneCCL): zexDriverGetHostPointerBaseAddress");
        }
    }
    if (ze_result_t r = z.import(z.driver, ptr, bytes)) return failure("zexDriverImportExternalPointer", r);
    if (Status s = lock_range(reinterpret_cast<uintptr_t>(ptr), bytes); !s.is_ok()) {  // nothing left locked
        z.release(z.driver, ptr);
        return s;
    }
    piece->device = ptr;  // the address Level Zero calls take (they translate it; see the file comment)
    return Status::ok();
}

Status ze_share(void* ptr, size_t bytes, const Piece& /*piece*/) {               // see posix_share
    return lock_range(reinterpret_cast<uintptr_t>(ptr), bytes, /*undo=*/false);  // a neighbour holds it
}

Status ze_unregister(void* ptr, size_t bytes, const Piece& /*piece*/) {
    Ze& z = ze();
    if (ze_result_t r = z.release(z.driver, ptr)) {
        Status s = failure("zexDriverReleaseImportedPointer", r);
        // hostreg releases only what it imported: INVALID_ARGUMENT ("unknown pointer",
        // driver_handle.cpp) means the driver no longer holds it, and the registry forgets the
        // registration (713), so its lock goes too. Any other failure leaves the registration
        // live, imported and locked, as the registry keeps it.
        if (r != kResultErrorInvalidArgument) return s;
        s.code = hostregErrorHostMemoryNotRegistered;
        unlock_pages(reinterpret_cast<uintptr_t>(ptr), bytes);
        return s;
    }
    unlock_pages(reinterpret_cast<uintptr_t>(ptr), bytes);
    return Status::ok();
}

}  // namespace

extern const Backend kZeBackend = {
    /*name=*/"ze",
    /*probe=*/ze_probe,
    /*host_register=*/ze_register,
    /*host_unregister=*/ze_unregister,
    /*share=*/ze_share,
    /*set_default_device=*/defaults::set_default_device,  // imports are the driver's, for no one device
    /*room=*/lock_room,                                   // the pages are locked with mlock too
};

}  // namespace hostreg
