// registration.cpp: registrations, errors and backends (include/hostreg/hostreg.h); see
// common.hpp for the extension's files.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "common.hpp"
#include "hostreg/hostreg.h"

namespace hostreg_py {
namespace {

// hostregRegistration as Python sees it (addresses as ints).
struct RegistrationRecord {
    uintptr_t base;
    size_t nbytes;
    unsigned flags;
    uintptr_t device_ptr;
    std::string backend;
};

RegistrationRecord to_record(const hostregRegistration& r) {
    return {as_int(r.base), r.bytes, r.flags, as_int(r.device_ptr), r.backend ? r.backend : ""};
}

// hostregBackendCapabilities' answer and record.
struct CapabilitiesRecord {
    int code;  // cudaError number: 0 when the backend is usable
    unsigned flags;
    size_t max_registration;
    size_t granule;
    std::string library, version, note, reason;
};

}  // namespace

void bind_registration(nb::module_& m) {
    nb::class_<RegistrationRecord>(m, "RegistrationRecord", "One live registration (hostregRegistration).")
        .def_ro("base", &RegistrationRecord::base, "address passed to host_register")
        .def_ro("nbytes", &RegistrationRecord::nbytes, "byte count passed to host_register")
        .def_ro("flags", &RegistrationRecord::flags, "flags passed to host_register")
        .def_ro("device_ptr", &RegistrationRecord::device_ptr, "device address of base (posix: base itself)")
        .def_ro("backend", &RegistrationRecord::backend, "backend that locked it");
    nb::class_<CapabilitiesRecord>(m, "CapabilitiesRecord",
                                   "What one backend can do here (hostregCapabilities), with the probe's answer.")
        .def_ro("code", &CapabilitiesRecord::code, "cudaError number: 0 when the backend is usable")
        .def_ro("flags", &CapabilitiesRecord::flags, "cudaHostRegister flags honoured; 0 if unavailable")
        .def_ro("max_registration", &CapabilitiesRecord::max_registration, "most bytes one registration may span")
        .def_ro("granule", &CapabilitiesRecord::granule, "bytes the runtime registers in (1: any range)")
        .def_ro("library", &CapabilitiesRecord::library, "the runtime file loaded, '' if none")
        .def_ro("version", &CapabilitiesRecord::version, "the runtime's version in its own terms")
        .def_ro("note", &CapabilitiesRecord::note, "what a success means with this backend")
        .def_ro("reason", &CapabilitiesRecord::reason, "why the backend is unavailable, '' when it is available");
    m.def(
        "host_register",
        [](nb::handle ptr, nb::handle nbytes, nb::handle flags, std::optional<std::string> label) {
            const uint64_t p = int_arg(ptr, "ptr"), n = int_arg(nbytes, "nbytes"), f = int_arg(flags, "flags", kU32);
            int code;
            {
                nb::gil_scoped_release nogil;
                Labelled scope(label ? label->c_str() : nullptr);
                code = hostregHostRegister(as_ptr(p), n, static_cast<unsigned>(f));
            }
            raise_pending();
            return code;
        },
        nb::arg("ptr"), nb::arg("nbytes"), nb::arg("flags"), nb::arg("label").none() = nb::none(),
        "hostregHostRegister: page-lock nbytes bytes at address ptr. Returns a cudaError number. label: what the "
        "call is for, given to the log sink.");
    m.def(
        "host_unregister",
        [](nb::handle ptr, std::optional<std::string> label) {
            const uint64_t p = int_arg(ptr, "ptr");
            int code;
            {
                nb::gil_scoped_release nogil;
                Labelled scope(label ? label->c_str() : nullptr);
                code = hostregHostUnregister(as_ptr(p));
            }
            raise_pending();
            return code;
        },
        nb::arg("ptr"), nb::arg("label").none() = nb::none(),
        "hostregHostUnregister: undo the registration based at ptr. Returns a cudaError number.");
    m.def(
        "host_get_device_pointer",
        [](nb::handle ptr, nb::handle flags) {
            void* dev = nullptr;
            const uint64_t p = int_arg(ptr, "ptr"), f = int_arg(flags, "flags", kU32);
            int code = hostregHostGetDevicePointer(&dev, as_ptr(p), static_cast<unsigned>(f));
            raise_pending();
            return std::make_tuple(code, as_int(dev));
        },
        nb::arg("ptr"), nb::arg("flags") = 0, "Returns (cudaError number, device address).");
    m.def(
        "host_get_flags",
        [](nb::handle ptr) {
            unsigned flags = 0;
            int code = hostregHostGetFlags(&flags, as_ptr(int_arg(ptr, "ptr")));
            raise_pending();
            return std::make_tuple(code, flags);
        },
        nb::arg("ptr"), "Returns (cudaError number, registration flags).");
    m.def(
        "is_registered", [](uintptr_t ptr) { return hostregIsRegistered(as_ptr(ptr)) == 1; }, nb::arg("ptr"),
        "hostregIsRegistered: whether address ptr lies in a live registration.");
    m.def(
        "registration",
        [](nb::handle ptr) -> std::optional<RegistrationRecord> {
            hostregRegistration r{};
            if (hostregPointerGetRegistration(as_ptr(int_arg(ptr, "ptr")), &r) != hostregSuccess) return std::nullopt;
            return to_record(r);
        },
        nb::arg("ptr"), "hostregPointerGetRegistration: the live registration containing ptr, or None.");
    m.def(
        "registrations",
        []() {
            size_t total = 0;
            hostregListRegistrations(nullptr, 0, &total);
            std::vector<hostregRegistration> buf(total + 16);  // room for concurrent additions
            size_t n = hostregListRegistrations(buf.data(), buf.size(), &total);
            std::vector<RegistrationRecord> out;
            out.reserve(n);
            for (size_t i = 0; i < n; ++i)
                out.push_back(to_record(buf[i]));
            return out;
        },
        "hostregListRegistrations: all live registrations, in address order.");
    m.def(
        "stats",
        []() {
            hostregStats st{};
            hostregGetStats(&st);
            return std::make_tuple(st.registrations, st.bytes_registered, st.bytes_locked);
        },
        "(live registrations, bytes registered, bytes in the distinct pages they cover).");
    m.def(
        "error_name",
        [](nb::handle code) { return hostregGetErrorName(static_cast<int>(int_arg(code, "error", kI32))); },
        nb::arg("code"), "CUDA's name for a cudaError number.");
    m.def(
        "error_string",
        [](nb::handle code) { return hostregGetErrorString(static_cast<int>(int_arg(code, "error", kI32))); },
        nb::arg("code"), "CUDA's message for a cudaError number.");
    m.def(
        "last_error",
        []() {
            long long native = 0;
            const char* msg = nullptr;
            int code = hostregGetLastError(&native, &msg);
            return std::make_tuple(code, native, std::string(msg ? msg : ""));
        },
        "The calling thread's last failure as (cudaError number, native code, message).");
    m.def(
        "backend_name",
        []() {
            const char* name;
            {
                nb::gil_scoped_release nogil;  // the first call chooses: vendor runtimes load
                name = hostregBackendName();
            }
            raise_pending();
            return std::string(name);
        },
        "Name of the backend in use (selecting it on first call).");
    m.def(
        "backend_names",
        []() {
            std::vector<std::string> v;
            for (const char* const* n = hostregBackendNames(); *n; ++n)
                v.emplace_back(*n);
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
            raise_pending();
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
            raise_pending();
            auto s = [](const char* p) { return std::string(p ? p : ""); };
            return CapabilitiesRecord{code,         c.flags,      c.max_registration, c.granule,
                                      s(c.library), s(c.version), s(c.note),          s(c.reason)};
        },
        nb::arg("name"), "hostregBackendCapabilities: what one backend can do here, as its probe found it.");
    m.def(
        "set_default_device",
        [](int device) {
            int code;
            {
                nb::gil_scoped_release nogil;  // may load and initialise the backend's runtime
                code = hostregSetDefaultDevice(device);
            }
            raise_pending();
            return code;
        },
        nb::arg("device"),
        "hostregSetDefaultDevice: the device registrations on threads without a context are for (-1: this "
        "thread's current one); returns the cudaError number.");
    m.def(
        "lock_allowance",
        []() {
            unsigned long long limit = 0;
            int cap = 0;
            hostregLockAllowance(&limit, &cap);
            return std::make_tuple(limit == ~0ull ? std::optional<unsigned long long>() : limit, cap != 0);
        },
        "hostregLockAllowance: (RLIMIT_MEMLOCK soft limit in bytes or None when unlimited, CAP_IPC_LOCK held).");
}

}  // namespace hostreg_py
