// test_faults.cpp: fault injection into the C++ core. This executable defines its own
// pthread_create, madvise, open, ftruncate and syscall (for SYS_mlock, SYS_memfd_create):
// symbols of the executable interpose on those libhostreg.so calls (ELF symbol lookup), and
// each forwards to the real one (dlsym RTLD_NEXT) unless a test armed a fault for it. After
// every injected failure the test checks what hostreg promises (docs/semantics.md, "What a
// failure leaves behind"): a documented code, no registration, VmLck back to its start, no
// descriptor left open, and no abort.
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdarg>
#include <cstring>
#include <dirent.h>
#include <string>
#include <thread>
#include <vector>

#include "helpers.hpp"
#include "hostreg/hostreg.h"
#include "hostreg/staging.h"

namespace {

// One armed fault: the n-th call (1-based) of `call` from now fails with `err`; 0: never.
// partial (mlock only): lock the first half of the range for real, then fail, as mlock does
// at a page it cannot fault in.
struct Fault {
    std::atomic<int> countdown{0};
    int err = 0;
    bool partial = false;
    std::atomic<int> injected{0};
};
Fault f_thread, f_madvise, f_open_tmpfile, f_ftruncate, f_mlock, f_memfd;

bool fire(Fault& f) {
    int c = f.countdown.load();
    while (c > 0 && !f.countdown.compare_exchange_weak(c, c - 1)) {
    }
    if (c != 1) return false;
    f.injected++;
    return true;
}

// The real function, looked up on first use. Its slot is a constant-initialised static, not a
// function-local `static auto next = dlsym(...)`: the guard of such a static may itself call
// syscall(SYS_futex) (LLVM's libc++abi does), which would land in the interposer below while
// it holds that guard.
template <class F>
F real(std::atomic<void*>& slot, const char* name) {
    static_assert(sizeof(F) == sizeof(void*));
    void* p = slot.load(std::memory_order_acquire);
    if (p == nullptr) {
        p = dlsym(RTLD_NEXT, name);
        slot.store(p, std::memory_order_release);
    }
    return reinterpret_cast<F>(p);
}

}  // namespace

extern "C" {

int pthread_create(pthread_t* t, const pthread_attr_t* a, void* (*fn)(void*), void* arg) {
    static std::atomic<void*> slot{nullptr};
    auto next = real<int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*)>(slot, "pthread_create");
    if (fire(f_thread)) return f_thread.err;  // as RLIMIT_NPROC or a pids limit answer: EAGAIN
    return next(t, a, fn, arg);
}

int madvise(void* addr, size_t len, int advice) {
    static std::atomic<void*> slot{nullptr};
    auto next = real<int (*)(void*, size_t, int)>(slot, "madvise");
    if (advice == MADV_POPULATE_WRITE && fire(f_madvise)) {
        errno = f_madvise.err;
        return -1;
    }
    return next(addr, len, advice);
}

int open(const char* path, int flags, ...) {
    static std::atomic<void*> slot{nullptr};
    auto next = real<int (*)(const char*, int, ...)>(slot, "open");
    mode_t mode = 0;
    if (flags & (O_CREAT | __O_TMPFILE)) {
        va_list ap;
        va_start(ap, flags);
        mode = static_cast<mode_t>(va_arg(ap, int));
        va_end(ap);
    }
    if ((flags & __O_TMPFILE) == __O_TMPFILE && fire(f_open_tmpfile)) {
        errno = f_open_tmpfile.err;
        return -1;
    }
    return next(path, flags, mode);
}

int ftruncate(int fd, off_t len) {
    static std::atomic<void*> slot{nullptr};
    auto next = real<int (*)(int, off_t)>(slot, "ftruncate");
    if (fire(f_ftruncate)) {
        errno = f_ftruncate.err;
        return -1;
    }
    return next(fd, len);
}

long syscall(long number, ...) {
    static std::atomic<void*> slot{nullptr};
    auto next = real<long (*)(long, ...)>(slot, "syscall");
    va_list ap;
    va_start(ap, number);
    long a[6];
    for (long& x : a)
        x = va_arg(ap, long);
    va_end(ap);
    if (number == SYS_mlock && fire(f_mlock)) {
        if (f_mlock.partial) next(SYS_mlock, a[0], static_cast<size_t>(a[1]) / 2);  // part of it, for real
        errno = f_mlock.err;
        return -1;
    }
    if (number == SYS_memfd_create && fire(f_memfd)) {
        errno = f_memfd.err;
        return -1;
    }
    return next(number, a[0], a[1], a[2], a[3], a[4], a[5]);
}

}  // extern "C"

namespace {

using hrtest::Mapping;
using hrtest::page;
using hrtest::vmlck_kb;

int open_fds() {
    int n = 0;
    DIR* d = opendir("/proc/self/fd");
    while (dirent* e = readdir(d))
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

void arm(Fault& f, int nth, int err, bool partial = false) {
    f.err = err;
    f.partial = partial;
    f.injected = 0;
    f.countdown = nth;
}

class Faults : public ::testing::Test {
  protected:
    void SetUp() override {
        for (Fault* f : {&f_thread, &f_madvise, &f_open_tmpfile, &f_ftruncate, &f_mlock, &f_memfd})
            f->countdown = 0;
        vmlck0_ = vmlck_kb();
        fds0_ = open_fds();
    }
    // What every failure must leave: nothing.
    void expect_nothing_left(const char* what) {
        hostregStats s{};
        hostregGetStats(&s);
        EXPECT_EQ(s.registrations, 0u) << what;
        EXPECT_EQ(vmlck_kb(), vmlck0_) << what << ": memory left locked";
        EXPECT_EQ(open_fds(), fds0_) << what << ": a descriptor left open";
    }
    long vmlck0_ = 0;
    int fds0_ = 0;
};

// A mapping of a fresh unnamed /dev/shm file, as staging makes (fd closed with it).
struct Shared {
    explicit Shared(size_t n) : bytes(n) {
        EXPECT_EQ(hostregSharedMemoryCreate(n, &fd), 0) << hrtest::last_message();
        p = static_cast<char*>(mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    }
    ~Shared() {
        munmap(p, bytes);
        close(fd);
    }
    size_t bytes;
    int fd = -1;
    char* p = nullptr;
};

size_t resident_pages(const char* p, size_t n) {
    std::vector<unsigned char> v((n + page() - 1) / page());
    if (mincore(const_cast<char*>(p), n, v.data()) != 0) return 0;
    size_t r = 0;
    for (unsigned char c : v)
        r += c & 1;
    return r;
}

TEST_F(Faults, RefusedPopulateThreadsDegradeToTheCallingThread) {
    if (std::thread::hardware_concurrency() < 2) GTEST_SKIP() << "one CPU: populate uses no extra thread";
    {  // two CPUs: one thread besides the caller's
        Shared s((64u << 20) + page() + 1);
        arm(f_thread, 1, EAGAIN);
        ASSERT_EQ(hostregPrepareMemory(s.p, s.bytes, s.fd), 0) << hrtest::last_message();
        EXPECT_EQ(f_thread.injected, 1) << "the fault did not fire: the test proves nothing";
        EXPECT_EQ(resident_pages(s.p, s.bytes), (s.bytes + page() - 1) / page()) << "every page, the last included";
    }
}

TEST_F(Faults, RefusedCopyThreadsDegradeToTheCallingThread) {
    const size_t n = 32u << 20;  // 4 threads of 8 MiB (copy.cpp's least a thread): 3 are started
    std::vector<char> src(n), dst(n, 0);
    for (size_t i = 0; i < n; i += 4096)
        src[i] = static_cast<char>(i >> 12);
    for (int nth : {1, 2, 3}) {
        std::fill(dst.begin(), dst.end(), 0);
        void* d[] = {dst.data()};
        const void* sp[] = {src.data()};
        size_t b[] = {n};
        arm(f_thread, nth, EAGAIN);
        ASSERT_EQ(hostregCopyBatch(d, sp, b, 1, 4), 0);
        EXPECT_EQ(f_thread.injected, 1);
        EXPECT_EQ(std::memcmp(src.data(), dst.data(), n), 0) << "thread " << nth << " refused";
    }
}

TEST_F(Faults, PopulateFailureAnswers2AndLeavesNothing) {
    {
        Shared s(32u << 20);
        for (int err : {ENOMEM, EFAULT}) {
            arm(f_madvise, 1, err);
            EXPECT_EQ(hostregPrepareMemory(s.p, s.bytes, s.fd), hostregErrorMemoryAllocation);
            EXPECT_EQ(f_madvise.injected, 1);
        }
    }
    expect_nothing_left("populate");
}

TEST_F(Faults, SharedMemoryCreationFailuresLeaveNoDescriptor) {
    int fd = -1;
    arm(f_open_tmpfile, 1, EMFILE);
    EXPECT_EQ(hostregSharedMemoryCreate(1 << 20, &fd), hostregErrorMemoryAllocation);
    EXPECT_EQ(fd, -1);
    expect_nothing_left("open(O_TMPFILE) refused");
    arm(f_ftruncate, 1, EFBIG);
    EXPECT_EQ(hostregSharedMemoryCreate(1 << 20, &fd), hostregErrorMemoryAllocation);
    expect_nothing_left("ftruncate refused");
    arm(f_open_tmpfile, 1, EOPNOTSUPP);  // no O_TMPFILE: memfd, which is refused too
    arm(f_memfd, 1, ENFILE);
    EXPECT_EQ(hostregSharedMemoryCreate(1 << 20, &fd), hostregErrorMemoryAllocation);
    EXPECT_EQ(f_memfd.injected, 1);
    expect_nothing_left("memfd refused");
}

TEST_F(Faults, AnMlockThatFailsPartWayLeavesNothingLocked) {
    Mapping m(64);
    for (int err : {ENOMEM, EAGAIN}) {
        arm(f_mlock, 1, err, /*partial=*/true);
        EXPECT_NE(hostregHostRegister(m.get(), m.size(), 0), hostregSuccess);
        EXPECT_EQ(f_mlock.injected, 1);
        expect_nothing_left("partial mlock");
    }
    // An unaligned range: edge pages and the middle are separate mlocks; fail each in turn.
    for (int nth : {1, 2, 3}) {
        arm(f_mlock, nth, ENOMEM, /*partial=*/true);
        EXPECT_NE(hostregHostRegister(m.get() + 100, 10 * page(), 0), hostregSuccess) << nth;
        expect_nothing_left("partial mlock of a piece");
    }
}

TEST_F(Faults, AChunkThatCannotBeLockedUndoesTheOthers) {
    Mapping m(64);
    for (int nth : {1, 3, 8}) {
        hostregChunkedRegistration* chunked = reinterpret_cast<hostregChunkedRegistration*>(1);
        arm(f_mlock, nth, ENOMEM, /*partial=*/true);
        EXPECT_EQ(hostregChunkedRegister(m.get(), m.size(), 0, 8 * page(), &chunked), hostregErrorMemoryAllocation);
        EXPECT_EQ(chunked, nullptr);
        expect_nothing_left("chunked registration");
    }
}

// A staging buffer is made whole or not at all: a failure at any of its steps leaves nothing.
TEST_F(Faults, AStagingBufferThatFailsAtAnyStepLeavesNothing) {
    const size_t n = (32u << 20) + 123;
    struct Step {
        Fault* fault;
        int err;
        bool partial;
        const char* what;
    } steps[] = {{&f_open_tmpfile, EMFILE, false, "creating the file"},
                 {&f_ftruncate, ENOSPC, false, "sizing it"},
                 {&f_madvise, EFAULT, false, "populating it"},
                 {&f_mlock, ENOMEM, true, "locking it"}};
    for (const Step& s : steps) {
        hostregStagingBuffer* b = reinterpret_cast<hostregStagingBuffer*>(1);
        arm(*s.fault, 1, s.err, s.partial);
        EXPECT_NE(hostregStagingBufferCreate(n, 1, 1, 0, 8u << 20, &b), hostregSuccess) << s.what;
        EXPECT_EQ(s.fault->injected, 1) << s.what;
        EXPECT_EQ(b, nullptr) << s.what;
        expect_nothing_left(s.what);
    }
    hostregStagingBuffer* b = nullptr;
    ASSERT_EQ(hostregStagingBufferCreate(n, 1, 1, 0, 8u << 20, &b), hostregSuccess) << hrtest::last_message();
    EXPECT_EQ(hostregStagingBufferChunks(b), 5u);
    EXPECT_GE(vmlck_kb() - vmlck0_, static_cast<long>(n / 1024));
    // Another "process" maps the same file: it sees the bytes, and holds its own descriptor.
    static_cast<char*>(hostregStagingBufferData(b))[n - 1] = 42;
    hostregStagingBuffer* other = nullptr;
    ASSERT_EQ(hostregStagingBufferAttach(dup(hostregStagingBufferFd(b)), n, &other), hostregSuccess);
    EXPECT_EQ(static_cast<char*>(hostregStagingBufferData(other))[n - 1], 42);
    EXPECT_EQ(hostregStagingBufferChunks(other), 0u);
    hostregStagingBufferDestroy(other);
    EXPECT_EQ(hostregStagingBufferAttach(-1, n, &other), hostregErrorInvalidValue);
    hostregStagingBufferDestroy(b);
    expect_nothing_left("destroy");
}

// Every call point, one at a time: the n-th mlock, populate, thread or file call of a whole
// staging (create, register in chunks, copy in, destroy) fails; the outcome is either the
// documented code with nothing left, or (threads) a complete result.
TEST_F(Faults, EveryCallPointOfAStagingFailsCleanly) {
    const size_t n = (48u << 20) + 4096 + 7;
    std::vector<char> src(n, 7);
    int injected = 0;
    struct Kind {
        Fault* fault;
        int err;
        bool partial;
        bool degrades;  // the work completes anyway
    } kinds[] = {{&f_mlock, ENOMEM, true, false},
                 {&f_madvise, ENOMEM, false, false},
                 {&f_thread, EAGAIN, false, true},
                 {&f_open_tmpfile, ENFILE, false, false},
                 {&f_ftruncate, EIO, false, false}};
    for (const Kind& k : kinds) {
        // A staging makes the same calls every time, so once the n-th call is not reached, no
        // later one is: the loop ends at the first nth that fires nothing, after checking that
        // staging (the unharmed case) too.
        for (int nth = 1;; ++nth) {
            arm(*k.fault, nth, k.err, k.partial);
            hostregStagingBuffer* b = nullptr;
            const int code = hostregStagingBufferCreate(n, 1, 1, 0, 8u << 20, &b);
            // Every buffer made is copied into and compared: one a refused thread degraded, or
            // the unharmed one (the copy's own threads may be the nth call of the thread kind).
            if (b) {
                void* d[] = {hostregStagingBufferData(b)};
                const void* s[] = {src.data()};
                size_t bytes[] = {n};
                EXPECT_EQ(hostregCopyBatch(d, s, bytes, 1, 4), 0);
                EXPECT_EQ(std::memcmp(d[0], src.data(), n), 0);
            }
            const bool fired = k.fault->injected > 0;
            injected += fired;
            if (fired && !k.degrades) {
                EXPECT_EQ(b, nullptr) << "call " << nth << " failed, yet a buffer was made";
                EXPECT_NE(code, hostregSuccess);
            } else {
                EXPECT_EQ(code, hostregSuccess) << "call " << nth << ": " << hrtest::last_message();
            }
            hostregStagingBufferDestroy(b);
            k.fault->countdown = 0;
            expect_nothing_left("a staging with one call failing");
            if (!fired) break;
            ASSERT_LT(nth, 64) << "a fault fired at every call: the count of calls is not bounded";
        }
    }
    std::printf("fault injection: %d failures injected into stagings, each left nothing\n", injected);
    EXPECT_GE(injected, 12) << "the faults must have reached the call points";
}

TEST_F(Faults, NoInjectionMeansNoFailure) {
    // The interposers forward faithfully: the same calls succeed when nothing is armed.
    Shared s(32u << 20);
    ASSERT_EQ(hostregPrepareMemory(s.p, s.bytes, s.fd), 0);
    hostregChunkedRegistration* chunked = nullptr;
    ASSERT_EQ(hostregChunkedRegister(s.p, s.bytes, 0, 0, &chunked), 0) << hrtest::last_message();
    EXPECT_GE(vmlck_kb() - vmlck0_, static_cast<long>(s.bytes / 1024));
    ASSERT_EQ(hostregChunkedUnregister(chunked), 0);
    EXPECT_EQ(vmlck_kb(), vmlck0_);
}

}  // namespace
