// status.cpp: names and messages of CUDA's error codes, and the per-thread record of the
// last failure. The table is every member of CUDA 13.0's enum cudaError with the name and
// message the real libcudart.so.13 gives it (cuda_errors.inc, generated from the toolkit by
// scripts/gen_cuda_errors.py), so callers that print a code read what they would under CUDA.
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
#define HOSTREG_CUDA_ERROR(number, name, message) {number, #name, message},
#include "core/cuda_errors.inc"
#undef HOSTREG_CUDA_ERROR
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
