// common.hpp: what the files of the extension hostreg._hostreg share. The extension converts
// arguments, releases the GIL around calls that lock or unlock memory, and calls the C ABI
// (include/hostreg/); all logic lives in the C++ core or in the Python package. Files:
// ext.cpp (the module), log.cpp (argument conversion, the log sink), registration.cpp
// (registrations, errors, backends), staging.cpp (staging buffers), views.cpp (views of
// memory as DLPack capsules), io.cpp (checkpoint files), batch.cpp (calls over a whole state
// dict's tensors as lists).
#pragma once

#include <nanobind/nanobind.h>

#include <atomic>
#include <cstdint>
#include <vector>

namespace hostreg_py {

namespace nb = nanobind;

inline void* as_ptr(uintptr_t p) { return reinterpret_cast<void*>(p); }
inline uintptr_t as_int(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// Integer arguments, converted as the Python package documents them: anything with __index__
// but bool, else TypeError; below 0 or not below `limit`, ValueError. Names are the Python ones.
uint64_t int_arg(nb::handle value, const char* name, unsigned long long limit = ~0ull);
constexpr unsigned long long kU32 = 1ull << 32;
constexpr unsigned long long kI32 = 1ull << 31;

// Set by an atexit callback registered when the module is imported (ext.cpp): the
// interpreter is shutting down. Public API only (CPython's own finalizing flag is private
// before 3.13, and hidden from the stable ABI), and earlier than that flag: from the last
// atexit callback on.
extern std::atomic<bool> g_exiting;

// May a thread that does not hold the GIL take it now? Not once the interpreter is exiting:
// what hostreg would do then (log a line, release a buffer's owner) is left to the OS.
bool interpreter_running();

// The exception in flight on this thread, taken out of its error indicator (cleared): a new
// reference to the exception object, or nullptr when none. restore_error() raises it again
// and takes the reference. CPython 3.12 and newer: PyErr_GetRaisedException and
// PyErr_SetRaisedException; before, PyErr_Fetch and PyErr_Restore (deprecated since 3.12).
// All are in the stable ABI. Need the GIL.
inline PyObject* take_error() {
#if PY_VERSION_HEX >= 0x030C0000
    return PyErr_GetRaisedException();
#else
    PyObject *type, *value, *trace;
    PyErr_Fetch(&type, &value, &trace);
    if (type == nullptr) return nullptr;
    PyErr_NormalizeException(&type, &value, &trace);
    if (trace != nullptr && value != nullptr) PyException_SetTraceback(value, trace);
    Py_XDECREF(type);
    Py_XDECREF(trace);
    return value;
#endif
}

inline void restore_error(PyObject* exc) {
    if (exc == nullptr) return;
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(exc);
#else
    PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(exc));
    Py_INCREF(type);
    PyErr_Restore(type, exc, PyException_GetTraceback(exc));
#endif
}

// After a C call, with the GIL: the KeyboardInterrupt the log sink raised during it, if any
// (log.cpp says why it waits until then).
void raise_pending();

// What host_register / host_unregister on this thread are called for, given to the log sink.
extern thread_local const char* t_label;

// The label for the calls of one scope on this thread.
struct Labelled {
    explicit Labelled(const char* label) : saved(t_label) { t_label = label; }
    ~Labelled() { t_label = saved; }
    const char* saved;
};

// views.cpp: DLPack capsules for torch.from_dlpack whose tensors keep owner (any object)
// alive. view_of: nbytes uint8 at ptr; with unregister, the release of the last tensor first
// undoes the registration at ptr when owner.live is true (and sets it false), in C. typed_view:
// dtype as DLPack's code | bits << 8, shape and strides in elements (the caller has checked
// that its bytes lie in owner's memory).
nb::object view_of(nb::handle owner, uintptr_t ptr, size_t nbytes, bool unregister = false);
nb::object typed_view(nb::handle owner, uintptr_t ptr, uint32_t dtype, const std::vector<int64_t>& shape,
                      const std::vector<int64_t>& strides);

void bind_log(nb::module_& m);           // log.cpp
void bind_registration(nb::module_& m);  // registration.cpp
void bind_staging(nb::module_& m);       // staging.cpp
void bind_io(nb::module_& m);            // io.cpp
void bind_batch(nb::module_& m);         // batch.cpp

}  // namespace hostreg_py
