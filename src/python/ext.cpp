// ext.cpp: the nanobind extension hostreg._hostreg. It converts arguments, releases the GIL
// around calls that lock or unlock memory, and calls the C ABI (hostreg.h); all logic lives
// in the C++ core or in the Python package.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "hostreg/hostreg.h"

namespace nb = nanobind;

namespace {

void* as_ptr(uintptr_t p) { return reinterpret_cast<void*>(p); }
uintptr_t as_int(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// (base, bytes, flags, device_ptr, backend)
using RegTuple = std::tuple<uintptr_t, size_t, unsigned, uintptr_t, std::string>;

RegTuple to_tuple(const hostregRegistration& r) {
    return {as_int(r.base), r.bytes, r.flags, as_int(r.device_ptr), r.backend};
}

}  // namespace

NB_MODULE(_hostreg, m) {
    m.doc() = "hostreg's C core. Use the hostreg package rather than this module.";

    m.def(
        "host_register",
        [](uintptr_t ptr, size_t nbytes, unsigned flags) {
            nb::gil_scoped_release nogil;
            return hostregHostRegister(as_ptr(ptr), nbytes, flags);
        },
        nb::arg("ptr"), nb::arg("nbytes"), nb::arg("flags"),
        "hostregHostRegister: page-lock nbytes bytes at address ptr. Returns a cudaError number.");
    m.def(
        "host_unregister",
        [](uintptr_t ptr) {
            nb::gil_scoped_release nogil;
            return hostregHostUnregister(as_ptr(ptr));
        },
        nb::arg("ptr"), "hostregHostUnregister: undo the registration based at ptr. Returns a cudaError number.");
    m.def(
        "host_get_device_pointer",
        [](uintptr_t ptr, unsigned flags) {
            void* dev = nullptr;
            int code = hostregHostGetDevicePointer(&dev, as_ptr(ptr), flags);
            return std::make_tuple(code, as_int(dev));
        },
        nb::arg("ptr"), nb::arg("flags") = 0, "Returns (cudaError number, device address).");
    m.def(
        "host_get_flags",
        [](uintptr_t ptr) {
            unsigned flags = 0;
            int code = hostregHostGetFlags(&flags, as_ptr(ptr));
            return std::make_tuple(code, flags);
        },
        nb::arg("ptr"), "Returns (cudaError number, registration flags).");
    m.def(
        "registration",
        [](uintptr_t ptr) -> std::optional<RegTuple> {
            hostregRegistration r{};
            if (hostregPointerGetRegistration(as_ptr(ptr), &r) != hostregSuccess) return std::nullopt;
            return to_tuple(r);
        },
        nb::arg("ptr"),
        "The live registration containing ptr as (base, nbytes, flags, device_ptr, backend), or None.");
    m.def(
        "registrations",
        []() {
            size_t total = 0;
            hostregListRegistrations(nullptr, 0, &total);
            std::vector<hostregRegistration> buf(total + 16);  // room for concurrent additions
            size_t n = hostregListRegistrations(buf.data(), buf.size(), &total);
            std::vector<RegTuple> out;
            out.reserve(n);
            for (size_t i = 0; i < n; ++i) out.push_back(to_tuple(buf[i]));
            return out;
        },
        "All live registrations, in address order, as (base, nbytes, flags, device_ptr, backend).");
    m.def(
        "stats",
        []() {
            hostregStats st{};
            hostregGetStats(&st);
            return std::make_tuple(st.registrations, st.bytes_registered, st.bytes_locked);
        },
        "(live registrations, bytes registered, bytes in the distinct pages they cover).");
    m.def("error_name", &hostregGetErrorName, nb::arg("code"), "CUDA's name for a cudaError number.");
    m.def("error_string", &hostregGetErrorString, nb::arg("code"), "CUDA's message for a cudaError number.");
    m.def(
        "last_error",
        []() {
            long long native = 0;
            const char* msg = nullptr;
            int code = hostregGetLastError(&native, &msg);
            return std::make_tuple(code, native, std::string(msg ? msg : ""));
        },
        "The calling thread's last failure as (cudaError number, native code, message).");
    m.def("backend_name", &hostregBackendName, "Name of the backend in use (selecting it on first call).");
    m.def(
        "shared_memory_create",
        [](size_t nbytes) {
            int fd = -1;
            int code;
            {
                nb::gil_scoped_release nogil;
                code = hostregSharedMemoryCreate(nbytes, &fd);
            }
            return std::make_tuple(code, fd);
        },
        nb::arg("nbytes"), "hostregSharedMemoryCreate: (cudaError number, fd or -1); the caller closes fd.");
    m.def(
        "prepare_memory",
        [](uintptr_t ptr, size_t nbytes, int fd) {
            nb::gil_scoped_release nogil;
            return hostregPrepareMemory(as_ptr(ptr), nbytes, fd);
        },
        nb::arg("ptr"), nb::arg("nbytes"), nb::arg("fd") = -1,
        "hostregPrepareMemory: allocate and map every page without changing bytes. Returns a cudaError number.");
    m.def(
        "arena_register",
        [](uintptr_t ptr, size_t nbytes, unsigned flags, size_t max_chunk) {
            hostregArena* arena = nullptr;
            int code;
            {
                nb::gil_scoped_release nogil;
                code = hostregArenaRegister(as_ptr(ptr), nbytes, flags, max_chunk, &arena);
            }
            return std::make_tuple(code, as_int(arena), hostregArenaChunkCount(arena));
        },
        nb::arg("ptr"), nb::arg("nbytes"), nb::arg("flags"), nb::arg("max_chunk") = 0,
        "hostregArenaRegister: returns (cudaError number, arena handle or 0, chunk count).");
    m.def(
        "arena_unregister",
        [](uintptr_t handle) {
            nb::gil_scoped_release nogil;
            return hostregArenaUnregister(reinterpret_cast<hostregArena*>(handle));
        },
        nb::arg("handle"), "hostregArenaUnregister: unregister every chunk and free the handle (use once).");
    m.def(
        "copy_batch",
        [](const std::vector<uintptr_t>& dst, const std::vector<uintptr_t>& src, const std::vector<size_t>& nbytes,
           unsigned threads) {
            if (dst.size() != src.size() || dst.size() != nbytes.size())
                throw nb::value_error("copy_batch: dst, src and nbytes must have the same length");
            nb::gil_scoped_release nogil;
            return hostregCopyBatch(reinterpret_cast<void* const*>(dst.data()),
                                    reinterpret_cast<const void* const*>(src.data()), nbytes.data(), dst.size(),
                                    threads);
        },
        nb::arg("dst"), nb::arg("src"), nb::arg("nbytes"), nb::arg("threads") = 0,
        "hostregCopyBatch over lists of addresses and byte counts (the caller vouches for them).");
    m.def(
        "backend_names",
        []() {
            std::vector<std::string> v;
            for (const char* const* n = hostregBackendNames(); *n; ++n) v.emplace_back(*n);
            return v;
        },
        "Backends compiled in, in the order HOSTREG_BACKEND=auto tries them.");
    m.def(
        "probe_backend",
        [](const std::string& name) {
            const char* detail = nullptr;
            int code;
            {
                nb::gil_scoped_release nogil;  // loading a vendor runtime can take a while
                code = hostregProbeBackend(name.c_str(), &detail);
            }
            return std::make_tuple(code, std::string(detail ? detail : ""));
        },
        nb::arg("name"), "(cudaError number, description or reason) for one backend.");
    m.def(
        "backend_capabilities",
        [](const std::string& name) {
            hostregCapabilities c{};
            int code;
            {
                nb::gil_scoped_release nogil;  // loading a vendor runtime can take a while
                code = hostregBackendCapabilities(name.c_str(), &c);
            }
            auto s = [](const char* p) { return std::string(p ? p : ""); };
            return std::make_tuple(code, c.flags, c.max_registration, c.granule, s(c.library), s(c.version), s(c.note),
                                   s(c.reason));
        },
        nb::arg("name"),
        "hostregBackendCapabilities: (cudaError number, flags, max_registration bytes, granule bytes, library, "
        "version, note, reason) for one backend.");
    m.def("version", &hostregVersion, "Version of the C library.");
}
