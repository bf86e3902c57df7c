// status.cpp: names and messages of CUDA's error codes, and the per-thread record of the
// last failure. The table is every member of CUDA 13.0's enum cudaError with the name and
// message the real libcudart.so.13 gives it (cuda_errors.inc, generated from the toolkit by
// scripts/gen_cuda_errors.py), so callers that print a code read what they would under CUDA.
#include "core/status.hpp"

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <atomic>
#include <mutex>
#include <string>

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
        for (char& c : v)
            c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        if (v == "debug") return LogLevel::Debug;
        if (v == "info") return LogLevel::Info;
        if (v == "warning" || v == "warn") return LogLevel::Warning;
        if (v == "off") return LogLevel::Off;  // silent, also the drop-in's first refusal (hostreg/_cudart.py)
        if (!v.empty())
            std::fprintf(stderr, "hostreg: HOSTREG_LOG_LEVEL='%s' is not debug, info, warning, warn or off; ignored\n",
                         env);
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

std::string with_commas(unsigned long long n) {
    std::string s = std::to_string(n);
    for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3)
        s.insert(static_cast<size_t>(i), ",");
    return s;
}

namespace {

struct Handler {
    hostregLogHandler fn;
    void* context;
    const Handler* older;  // every handler ever set stays reachable from g_made
};
// Set rarely (once, by a language binding), read at every event without a lock, so that no
// fork() can leave one held: each setting is a new object, never freed, since an event on
// another thread may still be using an older one.
std::atomic<const Handler*> g_handler{nullptr};
std::atomic<const Handler*> g_made{nullptr};
std::mutex g_set;  // setters take turns (events never take it)

// One event to the handler, or to stderr when none is set and HOSTREG_LOG_LEVEL asks for it.
void emit(LogLevel level, const char* call, int code, long long native, const std::string& message) {
    if (const Handler* h = g_handler.load(std::memory_order_acquire); h && h->fn) {
        // The handler may call hostreg itself (a lookup that answers "none" sets the last
        // error): the failure being reported stays this thread's last error.
        const Status saved = t_last;
        h->fn(h->context, static_cast<int>(level), call, code, native, message.c_str());
        t_last = saved;
        return;
    }
    if (level < threshold()) return;
    static const char* const kNames[] = {"debug", "info", "warning"};
    std::fprintf(stderr, "hostreg %s: %s\n", kNames[static_cast<int>(level)],
                 log_text(call, code, native, message).c_str());
}

}  // namespace

std::string log_text(const char* call, int code, long long native, const std::string& message) {
    std::string text;
    if (call && *call) text += std::string(call) + ": ";
    if (code)
        text +=
            std::string(error_name(code)) + " (" + std::to_string(code) + "), native " + std::to_string(native) + ": ";
    return text + message;
}

bool is_callers_error(int code) {
    return code == hostregErrorInvalidValue || code == hostregErrorHostMemoryAlreadyRegistered ||
           code == hostregErrorHostMemoryNotRegistered;
}

void log(LogLevel level, const std::string& message) { emit(level, "", 0, 0, message); }

LogLevel log_level_from_environment() { return threshold(); }

void set_log_handler(hostregLogHandler handler, void* context) {
    std::lock_guard<std::mutex> g(g_set);
    const Handler* h = nullptr;
    if (handler) {
        h = new Handler{handler, context, g_made.load()};
        g_made.store(h);
    }
    g_handler.store(h, std::memory_order_release);
}

int record(const Status& s, const char* call) {
    if (s.is_ok()) return s.code;
    t_last = s;
    const bool callers = is_callers_error(s.code) && !s.environment;
    emit(callers ? LogLevel::Debug : LogLevel::Warning, call ? call : "", s.code, s.native, s.message);
    return s.code;
}

int remember(const Status& s) {
    if (!s.is_ok()) t_last = s;
    return s.code;
}

const Status& last_error() { return t_last; }

}  // namespace hostreg
