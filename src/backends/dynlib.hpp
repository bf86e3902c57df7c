// dynlib.hpp: loading a vendor runtime with dlopen, once, from an X-macro symbol table.
//
// Each vendor file lists its symbols once, with their documented C prototypes (there are no
// vendor headers at build time; c10/cuda/driver_api.h is the model for the list):
//
//   #define HOSTREG_CUDA_SYMBOLS(REQUIRED, OPTIONAL) [backslash-newline]
//       REQUIRED(cuInit, int, (unsigned)) [backslash-newline]
//       OPTIONAL(cuSomethingNewer, int, (void*))
//
// then expands it into a struct of function pointers (HOSTREG_DECLARE_FN) and a loader
// (HOSTREG_LOAD_REQUIRED / HOSTREG_LOAD_OPTIONAL). A missing required symbol makes the
// backend unavailable, with the symbol named; a missing optional one leaves nullptr.
//
// Library files: HOSTREG_<VENDOR>_LIBRARY may name one, by absolute path only (a relative
// name could load a file from the working directory); otherwise the vendor's names are tried
// in order through the system's search path.
#pragma once

#include <dlfcn.h>

#include <initializer_list>
#include <string>

#include "core/status.hpp"

namespace hostreg {

class DynLib {
public:
    // Opens the library named by the environment variable override_env (absolute path), or
    // else the first of names that loads. status() says why not, when none did.
    DynLib(const char* override_env, std::initializer_list<const char*> names);
    DynLib(const DynLib&) = delete;
    DynLib& operator=(const DynLib&) = delete;

    bool loaded() const { return handle_ != nullptr; }
    const Status& status() const { return status_; }
    const std::string& path() const { return path_; }  // file actually loaded

    // Looks up sym into fn; false if absent.
    template <class F>
    bool load(F& fn, const char* sym) {
        fn = reinterpret_cast<F>(dlsym(handle_, sym));
        return fn != nullptr;
    }
    // Marks the library unusable because a required symbol is missing; returns the status.
    const Status& missing(const char* sym);

private:
    void* handle_ = nullptr;  // never dlclosed: vendor runtimes do not survive unloading
    std::string path_;
    Status status_;
};

// The one instance of a vendor backend's state T (holding a DynLib, its API and a Status),
// made and initialised by init on first use, thread-safely. Leaked on purpose:
// registrations may be undone during process exit, after static destructors would run.
template <class T, Status (*init)(T&)>
T& loaded_once() {
    static T* instance = [] {
        auto* t = new T();
        t->status = init(*t);
        return t;
    }();
    return *instance;
}

}  // namespace hostreg

#define HOSTREG_DECLARE_FN(name, ret, args) ret(*name) args = nullptr;
#define HOSTREG_LOAD_REQUIRED(name, ret, args) \
    if (!lib.load(api.name, #name)) return lib.missing(#name);
#define HOSTREG_LOAD_OPTIONAL(name, ret, args) lib.load(api.name, #name);
