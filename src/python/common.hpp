// common.hpp: what the files of the extension hostreg._hostreg share. The extension converts
// arguments, releases the GIL around calls that lock or unlock memory, and calls the C ABI
// (include/hostreg/); all logic lives in the C++ core or in the Python package. Files:
// ext.cpp (the module), log.cpp (argument conversion, the log sink), registration.cpp
// (registrations, errors, backends), staging.cpp (staging buffers and views of memory as
// DLPack capsules), io.cpp (checkpoint files).
#pragma once

#include <nanobind/nanobind.h>

#include <atomic>
#include <cstdint>

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

void bind_log(nb::module_& m);           // log.cpp
void bind_registration(nb::module_& m);  // registration.cpp
void bind_staging(nb::module_& m);       // staging.cpp
void bind_io(nb::module_& m);            // io.cpp

}  // namespace hostreg_py
