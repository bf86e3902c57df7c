// select.hpp: the backends compiled in, and which one this process uses.
#pragma once

#include "core/backend.hpp"

namespace hostreg {

// The backends compiled in, each defined in its own file in this directory.
extern const Backend kCudaBackend;
extern const Backend kHipBackend;
extern const Backend kAclBackend;
extern const Backend kZeBackend;
extern const Backend kMusaBackend;
extern const Backend kPosixBackend;

// Every backend, in the order HOSTREG_BACKEND=auto tries them; nullptr-terminated.
extern const Backend* const kAllBackends[];

// The backend this process uses: chosen once from HOSTREG_BACKEND (auto|<name>|none;
// default auto). Returns nullptr when none is usable; *why then holds the reason.
const Backend* active_backend(Status* why);

}  // namespace hostreg
