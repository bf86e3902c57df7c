// select.cpp: which backend this process uses.
//
// HOSTREG_BACKEND picks it: "auto" (default; the first available accelerator runtime, else
// posix), a backend's name, or "none" (registration disabled: every register answers 801).
// The choice is made once, on first use, and then fixed for the process.
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>

#include "backends/select.hpp"

namespace hostreg {
namespace {

struct Choice {
    const Backend* backend = nullptr;
    Status why;  // reason when backend is nullptr
};

Choice choose() {
    const char* env = std::getenv("HOSTREG_BACKEND");
    const std::string want = (env && *env) ? env : "auto";
    if (want == "none")
        return {nullptr,
                Status::error(hostregErrorNotSupported, "host registration is disabled (HOSTREG_BACKEND=none)")};
    std::string tried;
    for (const Backend* const* it = kAllBackends; *it; ++it) {
        const Backend* b = *it;
        if (want != "auto" && want != b->name) continue;
        const Status& s = b->probe().status;
        if (s.is_ok()) return {b, Status::ok()};
        if (want != "auto")
            return {nullptr,
                    Status::error(hostregErrorInitializationError,
                                  std::string("backend ") + b->name + " (HOSTREG_BACKEND) is unavailable: " + s.message,
                                  s.native)};
        tried += std::string(tried.empty() ? "" : "; ") + b->name + ": " + s.message;
    }
    if (want != "auto")
        return {nullptr, Status::error(hostregErrorInitializationError,
                                       "unknown backend '" + want +
                                           "' in HOSTREG_BACKEND (use auto, cuda, hip, acl, ze, musa, posix or none)")};
    return {nullptr, Status::error(hostregErrorInitializationError, "no backend is available (" + tried + ")")};
}

}  // namespace

// Accelerator runtimes first, in a fixed documented order; posix, always available, last.
const Backend* const kAllBackends[] = {&kCudaBackend, &kHipBackend,   &kAclBackend, &kZeBackend,
                                       &kMusaBackend, &kPosixBackend, nullptr};

const Backend* active_backend(Status* why) {
    static const Choice* choice = new Choice(choose());  // once; leaked for use at exit
    // Announced after the choice, outside its initialisation: a log handler may wait for
    // something (a language's interpreter lock) that a thread waiting for the choice holds.
    static std::atomic<bool> announced{false};
    if (!announced.exchange(true))
        log(LogLevel::Info, choice->backend ? std::string("backend ") + choice->backend->name + " selected"
                                            : "no backend: " + choice->why.message);
    if (!choice->backend && why) *why = choice->why;
    return choice->backend;
}

}  // namespace hostreg
