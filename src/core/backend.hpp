// backend.hpp: the one interface every runtime backend implements.
//
// A backend page-locks a host range the way its runtime does (posix: mlock; cuda:
// cuMemHostRegister; ...). It is a table of operations, one constant per backend file
// (libfabric's hmem ops table is the model). The registry calls it only for ranges that
// already passed CUDA's rules (non-null, non-empty, no overlap, known flags), so a backend
// knows nothing about other registrations except the pages it may share with them.
#pragma once

#include <cstddef>
#include <string>

#include "core/status.hpp"

namespace hostreg {

struct Backend {
    const char* name;    // "posix", "cuda", ...
    unsigned supported;  // flag bits this backend honours; others answer 801
    size_t max_registration;  // most bytes one registration may span (arenas split above it)

    // Is the runtime usable here? Error status (with the reason) when not. Loads and
    // initialises the runtime on the first call; later calls answer the cached result.
    Status (*probe)();

    // Library file and version, for doctor (after a successful probe; "" if unknown).
    std::string (*describe)();

    // Page-lock [ptr, ptr+bytes) with flags (already validated against `supported`), and
    // store the device address of ptr in *device_ptr. On failure nothing stays locked.
    Status (*host_register)(void* ptr, size_t bytes, unsigned flags, void** device_ptr);

    // Undo a successful host_register of exactly [ptr, ptr+bytes).
    Status (*host_unregister)(void* ptr, size_t bytes);
};

// The backends compiled in, each defined in its own file under src/backends/.
extern const Backend kCudaBackend;
extern const Backend kHipBackend;
extern const Backend kAclBackend;
extern const Backend kMusaBackend;
extern const Backend kPosixBackend;

// Every backend, in the order HOSTREG_BACKEND=auto tries them; nullptr-terminated.
extern const Backend* const kAllBackends[];

// A vendor's native code and the cudaError a CUDA caller expects for it.
struct CodeMap {
    long long native;
    int code;
};

// The cudaError for native through map (n entries); hostregErrorUnknown if not listed.
int translate(long long native, const CodeMap* map, size_t n);
template <size_t N>
int translate(long long native, const CodeMap (&map)[N]) {
    return translate(native, map, N);
}

// For runtimes whose numbers mirror CUDA's (CUDA driver, HIP, MUSA): the same number when
// hostreg knows it, context errors (201 invalid context) as 3, anything else 999.
int mirror_cuda(long long native);

// The backend this process uses: chosen once from HOSTREG_BACKEND (auto|posix|none;
// default auto). Returns nullptr when none is usable; *why then holds the reason.
const Backend* active_backend(Status* why);

}  // namespace hostreg
