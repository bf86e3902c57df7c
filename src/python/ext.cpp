// ext.cpp: the nanobind extension hostreg._hostreg. It converts arguments, releases the GIL
// around calls that lock or unlock memory, and calls the C ABI (hostreg.h); all logic lives
// in the C++ core or in the Python package.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "hostreg/hostreg.h"
#include "hostreg/io.h"
#include "hostreg/staging.h"

namespace nb = nanobind;

namespace {

void* as_ptr(uintptr_t p) { return reinterpret_cast<void*>(p); }
uintptr_t as_int(const void* p) { return reinterpret_cast<uintptr_t>(p); }

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

// Integer arguments, converted as the Python package documents them: anything with __index__
// but bool, else TypeError; below 0 or not below `limit`, ValueError. Names are the Python ones.
uint64_t int_arg(nb::handle value, const char* name, unsigned long long limit = ~0ull) {
    if (PyBool_Check(value.ptr())) throw nb::type_error((std::string(name) + " must be an int, not bool").c_str());
    PyObject* index = PyNumber_Index(value.ptr());
    if (!index) {
        if (!PyErr_ExceptionMatches(PyExc_TypeError)) throw nb::python_error();  // e.g. a Ctrl-C in __index__
        PyErr_Clear();
        throw nb::type_error(
            (std::string(name) + " must be an int, not " + Py_TYPE(value.ptr())->tp_name).c_str());
    }
    nb::object i = nb::steal(index);
    int overflow = 0;
    const long long small = PyLong_AsLongLongAndOverflow(index, &overflow);
    unsigned long long v = static_cast<unsigned long long>(small);
    bool ok = overflow == 0 && small >= 0;
    if (overflow > 0) {  // above LLONG_MAX: may still fit 64 bits
        v = PyLong_AsUnsignedLongLong(index);
        ok = !PyErr_Occurred();
        PyErr_Clear();
    }
    // limit ~0ull stands for 2**64: every unsigned 64-bit value is below it.
    if (!ok || (limit != ~0ull && v >= limit)) {
        const std::string bound = limit == ~0ull ? "18446744073709551616" : std::to_string(limit);
        throw nb::value_error((std::string(name) + " must be in [0, " + bound + "), got " +
                               nb::str(i).c_str()).c_str());
    }
    return v;
}
constexpr unsigned long long kU32 = 1ull << 32;
constexpr unsigned long long kI32 = 1ull << 31;

// Set by an atexit callback registered when the module is imported: the interpreter is
// shutting down. Public API only (CPython's own finalizing flag is private before 3.13, and
// hidden from the stable ABI), and earlier than that flag: from the last atexit callback on.
std::atomic<bool> g_exiting{false};

// May a thread that does not hold the GIL take it now? Not once the interpreter is exiting:
// what hostreg would do then (log a line, release a buffer's owner) is left to the OS.
bool interpreter_running() { return Py_IsInitialized() && !g_exiting.load(std::memory_order_acquire); }

// hostreg's diagnostics go to one Python callable, sink(level, call, code, native, message,
// label), set by hostreg/_core.py; each event reaches it once (hostregSetLogHandler). label:
// what host_register / host_unregister were called for (the drop-in names torch's call), else
// None. The sink is called with the GIL, on the thread of the event, in the middle of a C
// call: an exception cannot pass through C, so a KeyboardInterrupt raised there is kept for
// this thread and raised by the binding once the C call has returned (raise_pending); any
// other exception is reported as unraisable.
PyObject* g_log_sink = nullptr;  // a strong reference, kept until exit
thread_local const char* t_label = nullptr;
thread_local PyObject* t_pending[3] = {nullptr, nullptr, nullptr};  // type, value, traceback

PyObject* text(const char* s) {  // hostreg's messages may quote bytes that are not UTF-8
    return PyUnicode_DecodeUTF8(s, static_cast<Py_ssize_t>(std::strlen(s)), "backslashreplace");
}

void to_sink(void*, int level, const char* call, int code, long long native, const char* message) {
    if (!interpreter_running()) return;
    PyGILState_STATE g = PyGILState_Ensure();
    if (PyObject* sink = g_log_sink) {
        Py_INCREF(sink);  // set_log_sink() may replace it while it runs
        PyObject *type, *value, *trace;
        PyErr_Fetch(&type, &value, &trace);  // an exception being raised stays as it was
        PyObject* args = Py_BuildValue("(isiLNN)", level, call, code, native, text(message),
                                       t_label ? text(t_label) : (Py_INCREF(Py_None), Py_None));
        PyObject* r = args ? PyObject_Call(sink, args, nullptr) : nullptr;
        Py_XDECREF(args);
        if (r) {
            Py_DECREF(r);
        } else if (PyErr_ExceptionMatches(PyExc_KeyboardInterrupt) && !t_pending[0]) {
            PyErr_Fetch(&t_pending[0], &t_pending[1], &t_pending[2]);
        } else {
            PyErr_WriteUnraisable(sink);  // a failing logging handler must not fail the call
        }
        PyErr_Restore(type, value, trace);
        Py_DECREF(sink);
    }
    PyGILState_Release(g);
}

// After a C call, with the GIL: the KeyboardInterrupt the log sink raised during it, if any.
void raise_pending() {
    if (!t_pending[0]) return;
    PyErr_Restore(t_pending[0], t_pending[1], t_pending[2]);
    t_pending[0] = t_pending[1] = t_pending[2] = nullptr;
    throw nb::python_error();
}

// The label for the calls of one scope on this thread.
struct Labelled {
    explicit Labelled(const char* label) : saved(t_label) { t_label = label; }
    ~Labelled() { t_label = saved; }
    const char* saved;
};

// The staging buffers alive in this process, by first byte, each with its Python object
// (borrowed: an entry goes when that object is destroyed). staging_buffer_of() finds the buffer
// a tensor's bytes lie in from here. Guarded by the GIL (every use holds it and none releases
// it), so no Python exception, garbage collection or fork() can find it half-updated or locked.
std::map<uintptr_t, PyObject*>& live_buffers() {
    static auto* live = new std::map<uintptr_t, PyObject*>();  // never destroyed: used until exit
    return *live;
}

// The staging buffer the C ABI hands out, owned by a Python object: released when that object
// goes (and with it the last tensor viewing the buffer, each of which holds a reference), or
// unregistered earlier by unregister(). Python never sees a raw handle.
class StagingBuffer {
public:
    explicit StagingBuffer(hostregStagingBuffer* b) : b_(b) {}
    StagingBuffer(const StagingBuffer&) = delete;
    StagingBuffer& operator=(const StagingBuffer&) = delete;
    ~StagingBuffer() {
        live_buffers().erase(data_ptr());
        hostregStagingBufferDestroy(b_);
    }
    uintptr_t data_ptr() const { return as_int(hostregStagingBufferData(b_)); }
    size_t size() const { return hostregStagingBufferSize(b_); }
    int fd() const { return hostregStagingBufferFd(b_); }
    size_t chunks() const { return hostregStagingBufferChunks(b_); }
    int unregister() { return hostregStagingBufferUnregister(b_); }

private:
    hostregStagingBuffer* b_;
};

// DLPack (the stable C ABI of dlpack.h, v0.8: DLManagedTensor) for handing torch a view of
// staging memory: one uint8 tensor of exactly nbytes whose deleter drops a reference to the
// Python object that owns the memory, so that memory lives as long as any tensor viewing it.
struct DLDevice {
    int32_t device_type;  // kDLCPU = 1
    int32_t device_id;
};
struct DLDataType {
    uint8_t code;  // kDLUInt = 1
    uint8_t bits;
    uint16_t lanes;
};
struct DLTensor {
    void* data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t* shape;
    int64_t* strides;
    uint64_t byte_offset;
};
struct DLManagedTensor {
    DLTensor dl_tensor;
    void* manager_ctx;
    void (*deleter)(DLManagedTensor*);
};
struct BytesView {
    DLManagedTensor managed;
    int64_t shape[1];
    PyObject* owner;
    bool unregister = false;  // pinned_view: undo the owner's registration first (owner.live)
};

// The owner's registration of the view's bytes, undone here in C when owner.live is true: a
// Python finalizer could be interrupted (a KeyboardInterrupt raised at its first line is
// ignored there) and leave freed memory registered. Called with the GIL.
void unregister_owned(BytesView* v) {
    PyObject *type, *value, *trace;
    PyErr_Fetch(&type, &value, &trace);  // the caller's exception in flight (an interrupt) stays its own
    PyObject* live = PyObject_GetAttrString(v->owner, "live");
    const int on = live ? PyObject_IsTrue(live) : 0;
    Py_XDECREF(live);
    if (on == 1) {
        hostregHostUnregister(v->managed.dl_tensor.data);
        PyObject_SetAttrString(v->owner, "live", Py_False);
    }
    if (PyErr_Occurred()) PyErr_WriteUnraisable(v->owner);
    PyErr_Restore(type, value, trace);
}

void drop_view(DLManagedTensor* m) {
    auto* v = static_cast<BytesView*>(m->manager_ctx);
    // Any thread may free the last tensor; at interpreter exit the owner is left to the OS.
    if (interpreter_running()) {
        PyGILState_STATE g = PyGILState_Ensure();
        if (v->unregister) unregister_owned(v);
        Py_DECREF(v->owner);
        PyGILState_Release(g);
    }
    delete v;
}

void capsule_gone(PyObject* capsule) {
    // Never handed to torch (which renames it "used_dltensor"): free it here.
    if (PyCapsule_IsValid(capsule, "dltensor")) {
        auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
        m->deleter(m);
    }
}

// The Python object owning b (None for a null b), entered in live_buffers().
nb::object own(hostregStagingBuffer* b) {
    if (!b) {
        return nb::none();
    }
    auto holder = std::make_unique<StagingBuffer>(b);
    nb::object obj = nb::cast(holder.get(), nb::rv_policy::take_ownership);
    holder.release();  // the Python object owns it now
    live_buffers()[as_int(hostregStagingBufferData(b))] = obj.ptr();
    return obj;
}

// The live staging buffer holding [ptr, ptr + nbytes), or None.
nb::object staging_buffer_of(uintptr_t ptr, size_t nbytes) {
    auto& live = live_buffers();
    auto it = live.upper_bound(ptr);
    if (it == live.begin()) {
        return nb::none();
    }
    --it;
    PyObject* obj = it->second;
    if (Py_REFCNT(obj) <= 0) {  // being destroyed (its weak references are being cleared)
        return nb::none();
    }
    const auto& buf = nb::cast<const StagingBuffer&>(nb::handle(obj));
    if (nbytes > buf.size() || ptr - it->first > buf.size() - nbytes) {
        return nb::none();
    }
    return nb::borrow(obj);
}

// A DLPack capsule of nbytes uint8 at ptr whose tensors keep owner (any object) alive; with
// unregister, the release of the last of them first undoes the registration at ptr when
// owner.live is true (see unregister_owned).
nb::object view_of(nb::handle owner, uintptr_t ptr, size_t nbytes, bool unregister = false) {
    auto* v = new BytesView{};
    v->unregister = unregister;
    v->shape[0] = static_cast<int64_t>(nbytes);
    v->owner = owner.ptr();
    Py_INCREF(v->owner);
    v->managed.dl_tensor = DLTensor{as_ptr(ptr), DLDevice{1, 0}, 1, DLDataType{1, 8, 1}, v->shape, nullptr, 0};
    v->managed.manager_ctx = v;
    v->managed.deleter = drop_view;
    PyObject* cap = PyCapsule_New(&v->managed, "dltensor", capsule_gone);
    if (!cap) {
        drop_view(&v->managed);
        throw nb::python_error();
    }
    return nb::steal(cap);
}

// Refuses (ValueError) a range that is not inside the buffer: a view past its end would read
// and write memory the buffer does not own.
nb::object bytes_view(nb::handle owner, uintptr_t ptr, size_t nbytes) {
    const auto& buf = nb::cast<const StagingBuffer&>(owner);
    const uintptr_t begin = buf.data_ptr();
    if (ptr < begin || nbytes > buf.size() || ptr - begin > buf.size() - nbytes) {
        throw nb::value_error("bytes_view: the range is not inside the staging buffer");
    }
    return view_of(owner, ptr, nbytes);
}

}  // namespace

NB_MODULE(_hostreg, m) {
    m.doc() = "hostreg's C core. Use the hostreg package rather than this module.";
    // Staged tensors may outlive the module at interpreter exit (they hold their buffers);
    // the OS releases the memory, and nanobind's leak report would only alarm.
    nb::set_leak_warnings(false);
    // atexit callbacks run in reverse order: those registered later (modules imported after
    // hostreg) run before this one and may still release buffers; what callbacks registered
    // earlier free afterwards is left to the OS.
    nb::module_::import_("atexit").attr("register")(
        nb::cpp_function([]() { g_exiting.store(true, std::memory_order_release); }));

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
        "set_log_sink",
        [](nb::object sink) {
            if (!sink.is_none() && !PyCallable_Check(sink.ptr())) throw nb::type_error("the log sink must be callable or None");
            PyObject* old = g_log_sink;
            g_log_sink = sink.is_none() ? nullptr : sink.release().ptr();
            hostregSetLogHandler(g_log_sink ? to_sink : nullptr, nullptr);
            Py_XDECREF(old);
        },
        nb::arg("sink").none(),
        "Send hostreg's diagnostics to sink(level, call, code, native, message, label) (0 debug, 1 info, "
        "2 warning); None: back to stderr (HOSTREG_LOG_LEVEL).");
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
            for (size_t i = 0; i < n; ++i) out.push_back(to_record(buf[i]));
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
        "error_name", [](nb::handle code) { return hostregGetErrorName(static_cast<int>(int_arg(code, "error", kI32))); },
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
    nb::class_<StagingBuffer>(m, "StagingBuffer", nb::is_weak_referenceable(),
                              "Staging memory owned whole (hostregStagingBufferCreate / Attach): its file, mapping "
                              "and registration are released when this object and every view of it are gone.")
        .def_prop_ro("data_ptr", &StagingBuffer::data_ptr, "Address of the first byte (page-aligned).")
        .def_prop_ro("size", &StagingBuffer::size, "Size in bytes.")
        .def_prop_ro("fd", &StagingBuffer::fd, "Descriptor of its shared-memory file (-1 for private memory).")
        .def_prop_ro("chunks", &StagingBuffer::chunks, "Registrations it holds (0 once unregistered).")
        .def(
            "unregister",
            [](StagingBuffer& b) {
                int code;
                {
                    nb::gil_scoped_release nogil;
                    code = b.unregister();
                }
                raise_pending();
                return code;
            },
            "Undo the registration now (the memory stays mapped). Idempotent. Returns a cudaError number.");
    m.def(
        "staging_buffer_create",
        [](size_t nbytes, bool shared, bool pin, unsigned flags, size_t max_chunk) {
            hostregStagingBuffer* b = nullptr;
            int code;
            {
                nb::gil_scoped_release nogil;
                code = hostregStagingBufferCreate(nbytes, shared, pin, flags, max_chunk, &b);
            }
            nb::object buffer = own(b);  // owned first: an exception below releases it
            raise_pending();
            return std::make_tuple(code, buffer);
        },
        nb::arg("nbytes"), nb::arg("shared"), nb::arg("pin"), nb::arg("flags"), nb::arg("max_chunk") = 0,
        nb::sig("def staging_buffer_create(nbytes: int, shared: bool, pin: bool, flags: int, max_chunk: int = 0) "
                "-> tuple[int, StagingBuffer | None]"),
        "hostregStagingBufferCreate: (cudaError number, StagingBuffer or None).");
    m.def(
        "staging_buffer_room",
        [](size_t nbytes, bool shared, bool pin) {
            int code;
            {
                nb::gil_scoped_release nogil;
                code = hostregStagingBufferRoom(nbytes, shared, pin);
            }
            raise_pending();
            return code;
        },
        nb::arg("nbytes"), nb::arg("shared"), nb::arg("pin"),
        "hostregStagingBufferRoom: cudaError number (0: the room is there).");
    m.def(
        "staging_buffer_attach",
        [](int fd, size_t nbytes) {
            hostregStagingBuffer* b = nullptr;
            int code;
            {
                nb::gil_scoped_release nogil;
                code = hostregStagingBufferAttach(fd, nbytes, &b);
            }
            nb::object buffer = own(b);  // owned first: an exception below releases it
            raise_pending();
            return std::make_tuple(code, buffer);
        },
        nb::arg("fd"), nb::arg("nbytes"),
        nb::sig("def staging_buffer_attach(fd: int, nbytes: int) -> tuple[int, StagingBuffer | None]"),
        "hostregStagingBufferAttach (takes fd over): (cudaError number, StagingBuffer or None).");
    m.def("staging_buffer_of", &staging_buffer_of, nb::arg("ptr"), nb::arg("nbytes"),
          nb::sig("def staging_buffer_of(ptr: int, nbytes: int) -> StagingBuffer | None"),
          "The live StagingBuffer of this process holding [ptr, ptr + nbytes), or None.");
    m.def("bytes_view", &bytes_view, nb::arg("owner"), nb::arg("ptr"), nb::arg("nbytes"),
          "A DLPack capsule of nbytes uint8 at ptr (for torch.from_dlpack) that keeps owner alive while any "
          "tensor made from it lives.");
    m.def("view_of", &view_of, nb::arg("owner"), nb::arg("ptr"), nb::arg("nbytes"), nb::arg("unregister") = false,
          "bytes_view for memory any owner object vouches for (the caller: it must stay valid while owner "
          "lives); owner is released when the last tensor made from the capsule is freed. unregister: first "
          "undo the registration at ptr there, in C, when owner.live is true (and set it false).");
    m.def(
        "shared_memory_directory",
        []() {
            const char* dir = nullptr;
            int code = hostregSharedMemoryDirectory(&dir);
            raise_pending();
            return std::make_tuple(code, std::string(dir ? dir : ""));
        },
        "hostregSharedMemoryDirectory: (cudaError number, directory staging memory is made in).");
    m.def(
        "max_registration",
        []() {
            size_t bytes = 0;
            int code = hostregMaxRegistration(&bytes);
            raise_pending();
            return std::make_tuple(code, bytes == SIZE_MAX ? std::optional<size_t>() : std::optional<size_t>(bytes));
        },
        "hostregMaxRegistration: (cudaError number, HOSTREG_MAX_REGISTRATION in bytes or None when unset).");
    m.def(
        "prepare_memory",
        [](uintptr_t ptr, size_t nbytes, int fd) {
            int code;
            {
                nb::gil_scoped_release nogil;
                code = hostregPrepareMemory(as_ptr(ptr), nbytes, fd);
            }
            raise_pending();
            return code;
        },
        nb::arg("ptr"), nb::arg("nbytes"), nb::arg("fd") = -1,
        "hostregPrepareMemory: allocate and map every page without changing bytes. Returns a cudaError number.");
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
    m.attr("IO_SYNC") = HOSTREG_IO_SYNC;
    m.attr("IO_MORE") = HOSTREG_IO_MORE;
    static_assert(sizeof(hostregFileSegment) == 24 && sizeof(hostregCrcPatch) == 24,
                  "file_write/file_read take arrays of three 64-bit words per entry");
    m.def(
        "file_write",
        [](int fd, uintptr_t segments, size_t count, uintptr_t patches, size_t patch_count, unsigned threads,
           int flags) {
            hostregFileStats st{};
            int code;
            {
                nb::gil_scoped_release nogil;
                code = hostregFileWrite(fd, static_cast<const hostregFileSegment*>(as_ptr(segments)), count,
                                        static_cast<const hostregCrcPatch*>(as_ptr(patches)), patch_count, threads,
                                        flags, &st);
            }
            raise_pending();
            return std::make_tuple(code, st.direct_bytes, st.bounced_bytes, st.requests, st.direct != 0);
        },
        nb::arg("fd"), nb::arg("segments"), nb::arg("count"), nb::arg("patches"), nb::arg("patch_count"),
        nb::arg("threads") = 0, nb::arg("flags") = HOSTREG_IO_SYNC,
        "hostregFileWrite over arrays at the given addresses (three 64-bit words per segment: file offset, "
        "length, memory; per patch: crc_of, into, offset; the caller vouches for them); flags: HOSTREG_IO_SYNC, "
        "HOSTREG_IO_MORE. Returns (cudaError "
        "number, direct bytes, bounced bytes, requests, O_DIRECT to the end).");
    m.def(
        "file_read",
        [](int fd, uintptr_t segments, size_t count, unsigned threads) {
            hostregFileStats st{};
            int code;
            {
                nb::gil_scoped_release nogil;
                code = hostregFileRead(fd, static_cast<const hostregFileSegment*>(as_ptr(segments)), count, threads,
                                       &st);
            }
            raise_pending();
            return std::make_tuple(code, st.direct_bytes, st.bounced_bytes, st.requests, st.direct != 0);
        },
        nb::arg("fd"), nb::arg("segments"), nb::arg("count"), nb::arg("threads") = 0,
        "hostregFileRead over an array of segments at the given address (as file_write's). Returns (cudaError "
        "number, direct bytes, bounced bytes, requests, O_DIRECT to the end).");
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
            return CapabilitiesRecord{code, c.flags, c.max_registration, c.granule, s(c.library), s(c.version),
                                      s(c.note), s(c.reason)};
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
    m.def(
        "format_log_event",
        [](const std::string& call, int code, long long native, const std::string& message) {
            std::string out(hostregFormatLogEvent(call.c_str(), code, native, message.c_str(), nullptr, 0), '\0');
            hostregFormatLogEvent(call.c_str(), code, native, message.c_str(), out.data(), out.size() + 1);
            return out;
        },
        nb::arg("call"), nb::arg("code"), nb::arg("native"), nb::arg("message"),
        "hostregFormatLogEvent: one event in hostreg's log format.");
    m.def("log_level_from_environment", &hostregLogLevelFromEnvironment,
          "hostregLogLevelFromEnvironment: HOSTREG_LOG_LEVEL as 0 debug, 1 info, 2 warning, or -1.");
    m.def("version", &hostregVersion, "Version of the C library.");
}
