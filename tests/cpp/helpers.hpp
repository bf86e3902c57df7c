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
#include "support/memory.hpp"  // page(), vmlck_kb(), pages_kb(), Mapping

namespace hrtest {

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
        for (size_t i = 0; i < n; ++i)
            hostregHostUnregister(regs[i].base);
    }
    long vmlck0_ = 0;  // VmLck at the start of the test
};

}  // namespace hrtest
