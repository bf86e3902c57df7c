// status.cpp: names and messages of the cudaError_t codes hostreg uses, and the per-thread
// record of the last failure. Names and messages are CUDA's (CUDA 13.0 driver_types.h and
// cudaGetErrorString), so callers that print them read what they would under CUDA.
#include "core/status.hpp"

#include <cctype>
#include <cstdio>
#include <cstdlib>

namespace hostreg {
namespace {

struct CodeInfo {
    int code;
    const char* name;
    const char* message;
};

constexpr CodeInfo kCodes[] = {
    {hostregSuccess, "cudaSuccess", "no error"},
    {hostregErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {hostregErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {hostregErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {hostregErrorCudartUnloading, "cudaErrorCudartUnloading", "driver shutting down"},
    {hostregErrorStubLibrary, "cudaErrorStubLibrary", "CUDA driver is a stub library"},
    {hostregErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {hostregErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {hostregErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {hostregErrorHostMemoryAlreadyRegistered, "cudaErrorHostMemoryAlreadyRegistered",
     "part or all of the requested memory range is already mapped"},
    {hostregErrorHostMemoryNotRegistered, "cudaErrorHostMemoryNotRegistered",
     "pointer does not correspond to a registered memory region"},
    {hostregErrorNotPermitted, "cudaErrorNotPermitted", "operation not permitted"},
    {hostregErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {hostregErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

constexpr const char* kUnrecognized = "unrecognized error code";

const CodeInfo* find(int code) {
    for (const auto& c : kCodes) {
        if (c.code == code) return &c;
    }
    return nullptr;
}

thread_local Status t_last;

LogLevel threshold() {
    static const LogLevel level = [] {
        const char* env = std::getenv("HOSTREG_LOG_LEVEL");
        std::string v = env ? env : "";
        for (char& c : v) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        if (v == "debug") return LogLevel::Debug;
        if (v == "info") return LogLevel::Info;
        if (v == "warning" || v == "warn") return LogLevel::Warning;
        return LogLevel::Off;
    }();
    return level;
}

}  // namespace

const char* error_name(int code) {
    const CodeInfo* c = find(code);
    return c ? c->name : kUnrecognized;
}

bool is_known_code(long long code) {
    return code >= 0 && code <= 0x7fffffff && find(static_cast<int>(code)) != nullptr;
}

const char* error_string(int code) {
    const CodeInfo* c = find(code);
    return c ? c->message : kUnrecognized;
}

void log(LogLevel level, const std::string& message) {
    if (level < threshold()) return;
    static const char* const kNames[] = {"debug", "info", "warning"};
    std::fprintf(stderr, "hostreg %s: %s\n", kNames[static_cast<int>(level)], message.c_str());
}

int record(const Status& s) {
    if (s.is_ok()) return s.code;
    t_last = s;
    const bool callers = s.code == hostregErrorInvalidValue || s.code == hostregErrorHostMemoryAlreadyRegistered ||
                         s.code == hostregErrorHostMemoryNotRegistered;
    if (threshold() != LogLevel::Off)
        log(callers ? LogLevel::Debug : LogLevel::Warning,
            std::string(error_name(s.code)) + " (" + std::to_string(s.code) + "), native " + std::to_string(s.native) +
                ": " + s.message);
    return s.code;
}

const Status& last_error() { return t_last; }

}  // namespace hostreg
