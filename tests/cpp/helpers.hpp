// helpers.hpp: shared fixtures for the hostreg GoogleTest suite (public C ABI only).
#pragma once

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "hostreg/hostreg.h"

namespace hrtest {

inline size_t page() {
    static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return p;
}

// The kernel's count of this process's locked memory (VmLck in /proc/self/status), in kB.
inline long vmlck_kb() {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line))
        if (line.rfind("VmLck:", 0) == 0) return std::stol(line.substr(6));
    return -1;
}

inline long pages_kb(size_t n) { return static_cast<long>(n * page() / 1024); }

// A fresh private anonymous mapping of n pages, unmapped on destruction.
class Mapping {
public:
    explicit Mapping(size_t pages, int prot = PROT_READ | PROT_WRITE) : len_(pages * page()) {
        void* p = mmap(nullptr, len_, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        base_ = (p == MAP_FAILED) ? nullptr : static_cast<char*>(p);
    }
    ~Mapping() {
        if (base_) munmap(base_, len_);
    }
    Mapping(const Mapping&) = delete;
    Mapping& operator=(const Mapping&) = delete;
    char* get() const { return base_; }
    char* page_at(size_t i) const { return base_ + i * page(); }
    size_t size() const { return len_; }

private:
    size_t len_;
    char* base_;
};

inline hostregStats stats() {
    hostregStats s{};
    EXPECT_EQ(hostregGetStats(&s), 0);
    return s;
}

inline std::string last_message() {
    const char* msg = nullptr;
    hostregGetLastError(nullptr, &msg);
    return msg ? msg : "";
}

// Every test starts with no registration and must end with none: TearDown reports (and
// then removes) any left behind, so tests stay independent in one process.
class HostregTest : public ::testing::Test {
protected:
    void SetUp() override {
        ASSERT_STREQ(hostregBackendName(), "posix");
        ASSERT_EQ(stats().registrations, 0u) << "a previous test leaked registrations";
        vmlck0_ = vmlck_kb();
        ASSERT_GE(vmlck0_, 0);
    }
    void TearDown() override {
        size_t total = 0;
        hostregListRegistrations(nullptr, 0, &total);
        EXPECT_EQ(total, 0u) << "test left registrations behind";
        std::vector<hostregRegistration> regs(total);
        const size_t n = hostregListRegistrations(regs.data(), regs.size(), nullptr);
        for (size_t i = 0; i < n; ++i) hostregHostUnregister(regs[i].base);
    }
    long vmlck0_ = 0;  // VmLck at the start of the test
};

}  // namespace hrtest
