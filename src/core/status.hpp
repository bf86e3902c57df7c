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
    bool environment = false;   // the environment's fault although the code is one a caller's
                                // mistake gives (a bad HOSTREG_* variable, a context gone)

    static Status ok() { return {}; }
    static Status error(int code, std::string message, long long native = 0) {
        return Status{code, native, std::move(message)};
    }
    bool is_ok() const { return code == hostregSuccess; }
    Status&& blame_environment() && {
        environment = true;
        return std::move(*this);
    }
};

// CUDA's name / message for a code, as libcudart.so.13 gives them; "unrecognized error code"
// for numbers outside enum cudaError.
const char* error_name(int code);
const char* error_string(int code);

// Is code a member of CUDA 13.0's enum cudaError?
bool is_known_code(long long code);

// A byte count for messages, with thousands separators ("2,147,483,648").
std::string with_commas(unsigned long long n);

// Records s as the calling thread's last failure (no-op for success) and returns s.code.
// call: the C ABI function that failed (its __func__), named in the log line.
int record(const Status& s, const char* call = "");

// Records s as the last failure without logging it: for lookups whose "no" is an answer
// (no registration there, no backend), asked often. Returns s.code.
int remember(const Status& s);

// The calling thread's last failure (code 0 if none).
const Status& last_error();

// Diagnostics. Each event is logged once: to the handler set by hostregSetLogHandler when
// there is one (it gets every event and decides what to keep), else to stderr for
// HOSTREG_LOG_LEVEL=debug|info|warning|off (default: silent). The one severity rule: backend
// selection is Info; a failure is Debug when it is the caller's mistake (is_callers_error,
// and not Status::environment), else Warning (the environment's: cannot lock, no backend,
// not supported, a bad HOSTREG_* variable, ...).
enum class LogLevel { Debug = HOSTREG_LOG_DEBUG, Info = HOSTREG_LOG_INFO, Warning = HOSTREG_LOG_WARNING, Off = 3 };
void log(LogLevel level, const std::string& message);
void set_log_handler(hostregLogHandler handler, void* context);
LogLevel log_level_from_environment();  // HOSTREG_LOG_LEVEL, Off when unset or unknown

// The text of one event, the one format of every diagnostic line (stderr's, and the Python
// logger's through hostregFormatLogEvent): "<call>: <cudaError name> (<code>), native <n>:
// <message>", the call and code parts only when given.
std::string log_text(const char* call, int code, long long native, const std::string& message);

// 1 (invalid value), 712 and 713: what the caller got wrong, not what the machine refused.
bool is_callers_error(int code);

}  // namespace hostreg
