// status.hpp: hostreg's error model.
//
// Every operation answers a Status: a cudaError_t-compatible code (a member of CUDA 13.0's
// enum cudaError, driver_types.h; names and messages in cuda_errors.inc), the backend's native code (errno,
// CUresult, aclError, ...) and a human explanation. The last failing Status of each thread
// is kept for hostregGetLastError.
#pragma once

#include <string>

#include "hostreg/hostreg.h"

namespace hostreg {

struct Status {
    int code = hostregSuccess;  // cudaError_t number
    long long native = 0;       // backend's own code, 0 if none
    std::string message;        // why, in words; empty on success

    static Status ok() { return {}; }
    static Status error(int code, std::string message, long long native = 0) {
        return Status{code, native, std::move(message)};
    }
    bool is_ok() const { return code == hostregSuccess; }
};

// CUDA's name / message for a code, as libcudart.so.13 gives them; "unrecognized error code"
// for numbers outside enum cudaError.
const char* error_name(int code);
const char* error_string(int code);

// Is code a member of CUDA 13.0's enum cudaError?
bool is_known_code(long long code);

// Records s as the calling thread's last failure (no-op for success) and returns s.code.
int record(const Status& s);

// The calling thread's last failure (code 0 if none).
const Status& last_error();

// Diagnostics on stderr, for HOSTREG_LOG_LEVEL=debug|info|warning (default: silent).
// debug: every failure recorded; info: backend selection; warning: failures that are the
// environment's, not the caller's (codes other than 1, 712, 713).
enum class LogLevel { Debug = 0, Info = 1, Warning = 2, Off = 3 };
void log(LogLevel level, const std::string& message);

}  // namespace hostreg
