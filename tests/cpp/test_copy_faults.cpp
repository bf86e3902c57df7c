// test_copy_faults.cpp: hostregCopyBatch (include/hostreg/staging.h) when a buffer's memory is
// unmapped under it, as a tensor's storage freed by another thread during an asynchronous
// stage: the copy answers 1 naming the buffer, the process goes on, and a fault anywhere else
// still ends the process as it would have.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "hostreg/hostreg.h"
#include "hostreg/staging.h"

// ThreadSanitizer takes over signal delivery (it runs a handler later, outside the faulting
// instruction), so no handler can jump back into the copy there: the copy's guard is off.
#if defined(__SANITIZE_THREAD__)
#define HOSTREG_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define HOSTREG_TSAN 1
#endif
#endif

namespace {

// An aarch64 build run under qemu-user (scripts/test-wheels) sees the host's /proc/cpuinfo:
// qemu-user does not hand a guest a fault it can jump out of, so the guard is off there.
bool emulated() {
#if defined(__aarch64__)
    std::ifstream cpuinfo("/proc/cpuinfo");
    std::string line;
    while (std::getline(cpuinfo, line))
        if (line.rfind("vendor_id", 0) == 0) return true;  // an x86 host's field
#endif
    return false;
}

std::string last_message() {
    long long native = 0;
    const char* message = nullptr;
    hostregGetLastError(&native, &message);
    return message != nullptr ? message : "";
}

TEST(CopyFaults, AnUnmappedSourceIsAnErrorNamingItNotACrash) {
#ifdef HOSTREG_TSAN
    GTEST_SKIP() << "ThreadSanitizer owns signal delivery: the copy's fault guard does not apply under it";
#endif
    if (emulated()) GTEST_SKIP() << "an aarch64 build under qemu-user: the copy's fault guard does not apply there";
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t n = 64 * page;
    for (unsigned threads : {1u, 4u}) {
        auto* good = static_cast<char*>(mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
        auto* gone = static_cast<char*>(mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
        ASSERT_NE(good, MAP_FAILED);
        ASSERT_NE(gone, MAP_FAILED);
        std::memset(good, 7, n);
        ASSERT_EQ(munmap(gone + n / 2, n / 2), 0);  // its second half freed, as by another thread
        std::vector<char> d1(n), d2(n);
        void* dst[] = {d1.data(), d2.data()};
        const void* src[] = {good, gone};
        size_t bytes[] = {n, n};
        EXPECT_EQ(hostregCopyBatch(dst, src, bytes, 2, threads), hostregErrorInvalidValue);
        EXPECT_NE(last_message().find("buffer 1"), std::string::npos) << last_message();
        EXPECT_NE(last_message().find("unmapped"), std::string::npos) << last_message();
        // Copies after it work as before, on every thread.
        const void* src_ok[] = {good, good};
        EXPECT_EQ(hostregCopyBatch(dst, src_ok, bytes, 2, threads), 0);
        EXPECT_EQ(std::memcmp(d2.data(), good, n), 0);
        munmap(good, n);
        munmap(gone, n / 2);
    }
}

void copy_then_fault_elsewhere() {
    char a[8] = {};
    char b[8] = {};
    void* dst[] = {a};
    const void* src[] = {b};
    size_t bytes[] = {8};
    hostregCopyBatch(dst, src, bytes, 1, 1);  // the handler is installed now
    volatile int* nowhere = nullptr;
    *nowhere = 1;  // not in a copy: the default action
}

TEST(CopyFaultsDeathTest, AFaultOutsideACopyStillEndsTheProcess) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_DEATH(copy_then_fault_elsewhere(), "");
}

}  // namespace
