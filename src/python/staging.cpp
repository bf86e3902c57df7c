// staging.cpp: staging buffers (include/hostreg/staging.h) owned by Python objects, and views
// of memory handed to torch as DLPack capsules; see common.hpp for the extension's files.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "common.hpp"
#include "dlpack_abi.hpp"
#include "hostreg/hostreg.h"
#include "hostreg/staging.h"

namespace hostreg_py {
namespace {

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

void bind_staging(nb::module_& m) {
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
}

}  // namespace hostreg_py
