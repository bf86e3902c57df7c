// dynlib.hpp: loading a vendor runtime with dlopen, once, from one X-macro symbol table.
//
// Each vendor lists its symbols once, in src/backends/<vendor>_abi.hpp, with their
// documented C prototypes (no vendor header is needed to build; c10/cuda/driver_api.h is the
// model for the list, and tests/real checks every entry against the real vendor header):
//
//   #define HOSTREG_CUDA_SYMBOLS(REQUIRED, OPTIONAL) [backslash-newline]
//       REQUIRED(cuInit, CUresult, (unsigned)) [backslash-newline]
//       OPTIONAL(cuSomethingNewer, CUresult, (void*))
//
// HOSTREG_DEFINE_API(SYMBOLS) expands the list into `struct Api`: one function pointer per
// symbol and `bind(lib)`, which looks them all up. A missing required symbol makes the
// backend unavailable, with the symbol named; a missing optional one stays nullptr.
//
// loaded_once<T, start>() then gives each backend one process-wide state T (a Runtime<Api>
// with the vendor's own fields): it opens T's library, binds T's Api, records the file
// loaded, and calls start(T&) for the vendor-specific steps (initialise, count devices, fill
// the capabilities), keeping the resulting Probe for the life of the process.
//
// Library files: HOSTREG_<VENDOR>_LIBRARY may name one, by absolute path only (a relative
// name could load a file from the working directory); otherwise the vendor's names are tried
// in order through the system's search path, except that a name the loader would find in the
// working directory (an empty or relative LD_LIBRARY_PATH element) is looked for in the
// absolute directories of the search path only.
#pragma once

#include <dlfcn.h>

#include <string>

#include "core/backend.hpp"

namespace hostreg {

class DynLib {
  public:
    // Opens the library named by the environment variable override_env (absolute path), or
    // else the first of names (nullptr-terminated) that loads. status() says why not.
    void open(const char* override_env, const char* const* names);

    bool loaded() const { return handle_ != nullptr; }
    // No candidate file could be loaded (rather than an override refused).
    bool not_found() const { return not_found_; }
    const Status& status() const { return status_; }
    const std::string& path() const { return path_; }  // file actually loaded

    // The address of sym, or nullptr.
    void* symbol(const char* sym) const { return dlsym(handle_, sym); }
    // The Status of a missing required symbol.
    Status missing(const char* sym) const;

  private:
    void* handle_ = nullptr;  // never dlclosed: vendor runtimes do not survive unloading
    bool not_found_ = false;
    std::string path_;
    Status status_;
};

// State every vendor backend has; a vendor derives its own with the extra fields it needs.
template <class ApiT>
struct Runtime {
    using Api = ApiT;
    DynLib lib;
    Api api;
    Probe probe;
};

// The one instance of a vendor backend's state T, made on first use, thread-safely. T names
// its library with `static constexpr const char* kLibraryEnv` (HOSTREG_<VENDOR>_LIBRARY),
// `kLibraryNames[]` (nullptr-terminated) and `kAbsent` (how to say it is missing: "no
// NVIDIA driver"). Leaked on purpose: registrations may be undone during process exit,
// after static destructors would run.
template <class T, Status (*start)(T&)>
T& loaded_once() {
    static T* instance = [] {
        auto* t = new T();
        t->lib.open(T::kLibraryEnv, T::kLibraryNames);
        Status s = t->lib.status();
        if (!t->lib.loaded()) {
            if (t->lib.not_found()) s.message = std::string(T::kAbsent) + ": " + s.message;
        } else {
            t->probe.caps.library = t->lib.path();
            s = t->api.bind(t->lib);
            if (s.is_ok()) s = start(*t);
        }
        t->probe.status = s;
        return t;
    }();
    return *instance;
}

}  // namespace hostreg

#define HOSTREG_DECLARE_FN(name, ret, args) ret(*name) args = nullptr;
#define HOSTREG_BIND_REQUIRED(name, ret, args)               \
    name = reinterpret_cast<ret(*) args>(lib.symbol(#name)); \
    if (name == nullptr) return lib.missing(#name);
#define HOSTREG_BIND_OPTIONAL(name, ret, args) name = reinterpret_cast<ret(*) args>(lib.symbol(#name));

#define HOSTREG_DEFINE_API(SYMBOLS)                               \
    struct Api {                                                  \
        SYMBOLS(HOSTREG_DECLARE_FN, HOSTREG_DECLARE_FN)           \
        ::hostreg::Status bind(const ::hostreg::DynLib& lib) {    \
            SYMBOLS(HOSTREG_BIND_REQUIRED, HOSTREG_BIND_OPTIONAL) \
            return ::hostreg::Status::ok();                       \
        }                                                         \
    };
