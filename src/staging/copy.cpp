// copy.cpp: see copy.hpp. The total byte count is cut into equal shares, one per thread; a
// share may begin or end inside a buffer, so one large tensor is split as well as many small
// ones are grouped.
//
// A fault while copying (SIGSEGV, SIGBUS: a buffer's memory unmapped by another thread, such
// as a tensor's storage freed or resized while it is staged asynchronously) must not end the
// process. Each share runs with a jump buffer of its thread's (sigsetjmp); the process-wide
// handler installed before the first copy jumps back to it when the fault is in a copy here,
// and otherwise does what the handler before it did (the default action: the process ends as
// it would have). The copy then reports which buffer it could not read or write.
#include "staging/copy.hpp"

#include <setjmp.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "staging/parallel.hpp"

namespace hostreg {
namespace {

constexpr size_t kMinBytesPerThread = size_t{8} << 20;  // below this a thread costs more than it gains
constexpr size_t kPiece = size_t{256} << 10;

// Set while this thread copies. Volatile, and fenced against the compiler below: the store
// before the copy is otherwise dead to it (overwritten after the copy with no read between,
// the handler's read being invisible to it), and clang removed it.
thread_local sigjmp_buf* volatile t_guard = nullptr;
struct sigaction g_before_segv, g_before_bus;
std::once_flag g_installed;

void on_fault(int sig, siginfo_t* info, void* context) {
    if (sigjmp_buf* guard = t_guard) {
        t_guard = nullptr;
        siglongjmp(*guard, 1);  // SA_NODEFER: the signal mask is as it was, nothing to restore
    }
    const struct sigaction& before = sig == SIGSEGV ? g_before_segv : g_before_bus;
    if ((before.sa_flags & SA_SIGINFO) != 0 && before.sa_sigaction != nullptr) {
        before.sa_sigaction(sig, info, context);
        return;
    }
    if ((before.sa_flags & SA_SIGINFO) == 0 && before.sa_handler != SIG_DFL && before.sa_handler != SIG_IGN) {
        before.sa_handler(sig);
        return;
    }
    // The default action: restored, and the faulting instruction runs again under it.
    struct sigaction dfl = {};
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(sig, &dfl, nullptr);
}

void install_fault_handler() {
    struct sigaction sa = {};
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_before_segv);
    sigaction(SIGBUS, &sa, &g_before_bus);
}

// Copies the bytes in [lo, hi) of the concatenation of all buffers; returns the index of the
// buffer whose copy faulted, or SIZE_MAX.
size_t copy_span(void* const* dst, const void* const* src, const size_t* bytes, size_t n, size_t lo, size_t hi) {
    sigjmp_buf env;
    volatile size_t at = SIZE_MAX;  // the buffer being copied (read after a jump back)
    if (sigsetjmp(env, 0) != 0) return at;
    t_guard = &env;
    std::atomic_signal_fence(std::memory_order_seq_cst);  // the guard is in place before any copy
    size_t start = 0;                                     // offset of buffer i in the concatenation
    for (size_t i = 0; i < n && start < hi; start += bytes[i], ++i) {
        const size_t end = start + bytes[i];
        if (end <= lo) continue;
        at = i;
        const size_t a = std::max(lo, start), b = std::min(hi, end);
        // In pieces: glibc switches to non-temporal stores for one large memcpy, which ran
        // slower than cached stores here (measured against torch's copy_, 2 GiB warm).
        for (size_t off = a; off < b; off += kPiece)
            std::memcpy(static_cast<char*>(dst[i]) + (off - start), static_cast<const char*>(src[i]) + (off - start),
                        std::min(kPiece, b - off));
    }
    std::atomic_signal_fence(std::memory_order_seq_cst);  // every copy is done before the guard goes
    t_guard = nullptr;
    return SIZE_MAX;
}

}  // namespace

size_t copy_batch(void* const* dst, const void* const* src, const size_t* bytes, size_t n, unsigned threads) {
    std::call_once(g_installed, install_fault_handler);
    size_t total = 0;
    for (size_t i = 0; i < n; ++i)
        total += bytes[i];
    if (threads == 0) threads = usable_cpus();
    threads = static_cast<unsigned>(std::min<size_t>(threads, std::max<size_t>(1, total / kMinBytesPerThread)));
    if (threads <= 1) return copy_span(dst, src, bytes, n, 0, total);
    std::atomic<size_t> faulted{SIZE_MAX};
    run_parts(threads, [&](size_t t) {  // a refused thread's share is copied here instead
        const Span s = part_of(total, threads, 1, t);
        const size_t bad = copy_span(dst, src, bytes, n, s.begin, s.end);
        if (bad != SIZE_MAX) faulted.store(bad);
    });
    return faulted.load();
}

}  // namespace hostreg
