// staging.cpp: staging buffers (include/hostreg/staging.h) owned by Python objects, and the
// views of them made for torch (views.cpp makes the capsules); see common.hpp for the files.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "common.hpp"
#include "hostreg/hostreg.h"
#include "hostreg/staging.h"

namespace hostreg_py {
namespace {

// The staging buffer the C ABI hands out, owned by a Python object: released when that object
// goes (and with it the last tensor viewing the buffer, each of which holds a reference), or
// unregistered earlier by unregister(). Python never sees a raw handle.
class StagingBuffer {
  public:
    explicit StagingBuffer(hostregStagingBuffer* b) : b_(b) {}
    StagingBuffer(const StagingBuffer&) = delete;
    StagingBuffer& operator=(const StagingBuffer&) = delete;
    ~StagingBuffer() { hostregStagingBufferDestroy(b_); }
    uintptr_t data_ptr() const { return as_int(hostregStagingBufferData(b_)); }
    size_t size() const { return hostregStagingBufferSize(b_); }
    int fd() const { return hostregStagingBufferFd(b_); }
    size_t chunks() const { return hostregStagingBufferChunks(b_); }
    int unregister() { return hostregStagingBufferUnregister(b_); }

  private:
    hostregStagingBuffer* b_;
};

// The Python object owning b (None for a null b), kept as b's user data (borrowed: the object
// destroys b, and with it the pointer, when it goes) for staging_buffer_of().
nb::object own(hostregStagingBuffer* b) {
    if (!b) {
        return nb::none();
    }
    auto holder = std::make_unique<StagingBuffer>(b);
    nb::object obj = nb::cast(holder.get(), nb::rv_policy::take_ownership);
    holder.release();  // the Python object owns it now
    hostregStagingBufferSetUserData(b, obj.ptr());
    return obj;
}

// The live StagingBuffer object holding [ptr, ptr + nbytes) (hostregStagingBufferFind), or
// None. A StagingBuffer object gets its pointer and is destroyed holding the GIL, as this runs:
// the one found cannot go half-way.
nb::object staging_buffer_of(uintptr_t ptr, size_t nbytes) {
    auto* obj = static_cast<PyObject*>(hostregStagingBufferUserData(hostregStagingBufferFind(as_ptr(ptr), nbytes)));
    if (obj == nullptr || Py_REFCNT(obj) <= 0) {  // not Python's, or being destroyed (weak references clearing)
        return nb::none();
    }
    return nb::borrow(obj);
}

// owner as the StagingBuffer it must be, else TypeError naming the call.
const StagingBuffer& buffer_arg(nb::handle owner, const char* call) {
    if (!nb::isinstance<StagingBuffer>(owner))
        throw nb::type_error((std::string(call) + ": owner must be a StagingBuffer").c_str());
    return nb::cast<const StagingBuffer&>(owner);
}

// One DLPack capsule per tensor of a staging buffer, each of its own dtype (DLPack's code and
// bits), shape and strides (in elements) at its address, keeping the buffer alive while any
// tensor made from it lives: torch.from_dlpack makes each a tensor whose storage holds exactly
// its bytes. Refuses (ValueError) a tensor whose bytes are not inside the buffer.
nb::list typed_views(nb::handle owner, const std::vector<uintptr_t>& ptrs, const std::vector<uint32_t>& dtypes,
                     const std::vector<std::vector<int64_t>>& shapes,
                     const std::vector<std::vector<int64_t>>& strides) {
    const StagingBuffer& buf = buffer_arg(owner, "typed_views");
    const size_t n = ptrs.size();
    if (dtypes.size() != n || shapes.size() != n || strides.size() != n)
        throw nb::value_error("typed_views: ptrs, dtypes, shapes and strides must have the same length");
    nb::list out;
    for (size_t i = 0; i < n; ++i) {
        const auto& shape = shapes[i];
        const auto& stride = strides[i];
        const uint64_t itemsize = (dtypes[i] >> 8) / 8;
        if (stride.size() != shape.size() || itemsize == 0 || (dtypes[i] >> 8) % 8 != 0 || dtypes[i] >> 16)
            throw nb::value_error("typed_views: a shape and its strides differ in length, or a dtype has no bytes");
        uint64_t last = 0;  // the elements lie in [ptr, ptr + (last + 1) * itemsize)
        bool wraps = false;
        for (size_t d = 0; d < shape.size(); ++d) {
            if (shape[d] <= 0 || stride[d] < 0)
                throw nb::value_error("typed_views: an empty tensor, or a negative stride, has no view here");
            uint64_t step = 0;
            wraps |=
                __builtin_mul_overflow(static_cast<uint64_t>(shape[d] - 1), static_cast<uint64_t>(stride[d]), &step);
            wraps |= __builtin_add_overflow(last, step, &last);
        }
        uint64_t extent = 0;
        wraps |= __builtin_add_overflow(last, uint64_t{1}, &last) || __builtin_mul_overflow(last, itemsize, &extent);
        if (wraps || ptrs[i] < buf.data_ptr() || extent > buf.size() || ptrs[i] - buf.data_ptr() > buf.size() - extent)
            throw nb::value_error("typed_views: a tensor's bytes are not inside the staging buffer");
        out.append(typed_view(owner, ptrs[i], dtypes[i], shape, stride));
    }
    return out;
}

// Refuses (ValueError) a range that is not inside the buffer: a view past its end would read
// and write memory the buffer does not own.
nb::object bytes_view(nb::handle owner, uintptr_t ptr, size_t nbytes) {
    const StagingBuffer& buf = buffer_arg(owner, "bytes_view");
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
    m.def("typed_views", &typed_views, nb::arg("owner"), nb::arg("ptrs"), nb::arg("dtypes"), nb::arg("shapes"),
          nb::arg("strides"),
          "DLPack capsules (for torch.from_dlpack) of tensors in a StagingBuffer: dtypes as DLPack's code | bits << 8, "
          "shapes and strides in elements; each keeps owner alive while any tensor made from it lives.");
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
}

}  // namespace hostreg_py
