// conformance.cpp: one suite, run once per backend, that checks the CUDA-visible behaviour
// of hostreg is the same whatever runtime is underneath: codes, names, registry state and
// locked bytes (VmLck). ctest runs it with HOSTREG_BACKEND=<backend> and, for vendor
// backends, HOSTREG_<VENDOR>_LIBRARY=<the vendor's test double> (tests/doubles/).
//
// Where a vendor backend is used, the suite also opens the double itself (the same file, so
// the same instance hostreg loaded) to check that calls really reached the vendor's
// function, and that the rules hostreg enforces itself (overlap, unknown pointers, bad
// arguments) never reach it.
//
// Per-backend differences are stated here, not hidden: which flags each backend honours, and
// that AscendCL's V1-only runtime cannot register pointers that are not page-aligned.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "../cpp/helpers.hpp"  // page(), vmlck_kb(), last_message()
#include "hostreg/hostreg.h"

namespace {

using hrtest::page;
using hrtest::vmlck_kb;

struct Profile {
    const char* backend;      // HOSTREG_BACKEND
    const char* library_env;  // HOSTREG_<VENDOR>_LIBRARY, or nullptr for posix
    const char* reg_symbol;   // the vendor function that registers
    const char* unreg_symbol; // ... and unregisters
    bool io_memory_ok;        // IoMemory passed through to the runtime (which accepts it)
    bool aligned_only;        // only 64 KiB-aligned pointers can be registered (V1 AscendCL)
    unsigned (*vendor_flags)(unsigned flags);  // what must reach the runtime for CUDA flags
};

unsigned same(unsigned f) { return f; }
unsigned hip_flags(unsigned f) { return f & ~0x8u; }  // ReadOnly is HIP's coarse-grained bit
unsigned acl_v2_flags(unsigned f) { return 0x10000000u | (f & 0x2u); }  // PINNED [| MAPPED]
unsigned acl_v1_type(unsigned) { return 0; }  // ACL_HOST_REGISTER_MAPPED

const Profile kProfiles[] = {
    {"posix", nullptr, nullptr, nullptr, false, false, same},
    {"cuda", "HOSTREG_CUDA_LIBRARY", "cuMemHostRegister_v2", "cuMemHostUnregister", true, false, same},
    {"hip", "HOSTREG_HIP_LIBRARY", "hipHostRegister", "hipHostUnregister", false, false, hip_flags},
    {"acl", "HOSTREG_ACL_LIBRARY", "aclrtHostRegisterV2", "aclrtHostUnregister", false, false, acl_v2_flags},
    {"acl-v1", "HOSTREG_ACL_LIBRARY", "aclrtHostRegister", "aclrtHostUnregister", false, true, acl_v1_type},
    {"musa", "HOSTREG_MUSA_LIBRARY", "musaHostRegister", "musaHostUnregister", true, false, same},
};

// HOSTREG_CONFORMANCE_PROFILE names the profile (acl and acl-v1 share HOSTREG_BACKEND=acl).
const Profile& profile() {
    static const Profile* p = [] {
        const char* name = std::getenv("HOSTREG_CONFORMANCE_PROFILE");
        for (const Profile& q : kProfiles)
            if (name && std::string(name) == q.backend) return &q;
        std::fprintf(stderr, "HOSTREG_CONFORMANCE_PROFILE must name a profile\n");
        std::abort();
    }();
    return *p;
}

// The double's inspection API (tests/doubles/double_common.hpp).
struct Double {
    long (*calls)(const char*) = nullptr;
    long (*live)() = nullptr;
    unsigned (*last_flags)() = nullptr;
};

const Double& the_double() {
    static const Double d = [] {
        Double d;
        if (!profile().library_env) return d;
        void* h = dlopen(std::getenv(profile().library_env), RTLD_NOW | RTLD_NOLOAD);
        if (!h) return d;  // checked by BackendIsTheRequestedOne
        d.calls = reinterpret_cast<long (*)(const char*)>(dlsym(h, "hostreg_double_calls"));
        d.live = reinterpret_cast<long (*)()>(dlsym(h, "hostreg_double_live"));
        d.last_flags = reinterpret_cast<unsigned (*)()>(dlsym(h, "hostreg_double_last_flags"));
        return d;
    }();
    return d;
}

// The granule the suite places ranges on: a page, or 64 KiB where the runtime needs it
// (AscendCL V1: page-aligned documented, 64 KiB reported by Mooncake PR #4053).
size_t unit() { return profile().aligned_only ? 64 * 1024 : page(); }

// A private anonymous mapping of n units whose base is 64 KiB-aligned; unmapped at the end.
class Mapping {
public:
    explicit Mapping(size_t units) : len_(units * unit()) {
        const size_t align = 64 * 1024;
        void* p = mmap(nullptr, len_ + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) std::abort();
        auto raw = reinterpret_cast<uintptr_t>(p);
        auto base = (raw + align - 1) / align * align;
        if (base > raw) munmap(p, base - raw);
        if (raw + len_ + align > base + len_) munmap(reinterpret_cast<void*>(base + len_), raw + align - base);
        base_ = reinterpret_cast<char*>(base);
    }
    ~Mapping() { munmap(base_, len_); }
    Mapping(const Mapping&) = delete;
    Mapping& operator=(const Mapping&) = delete;
    char* get() const { return base_; }
    char* at(size_t units) const { return base_ + units * unit(); }
    size_t size() const { return len_; }

private:
    size_t len_;
    char* base_;
};

long vendor_calls(const char* sym) { return the_double().calls && sym ? the_double().calls(sym) : 0; }

class Conformance : public ::testing::Test {
protected:
    void SetUp() override {
        hostregStats s{};
        ASSERT_EQ(hostregGetStats(&s), 0);
        ASSERT_EQ(s.registrations, 0u);
        vmlck0_ = vmlck_kb();
    }
    void TearDown() override {
        hostregStats s{};
        hostregGetStats(&s);
        EXPECT_EQ(s.registrations, 0u) << "test left registrations behind";
        EXPECT_EQ(vmlck_kb(), vmlck0_) << "test left memory locked";
        if (the_double().live) {
            EXPECT_EQ(the_double().live(), 0) << "the runtime still holds registrations";
        }
    }
    // bytes, rounded up to a unit where the backend needs aligned pointers, else left odd.
    size_t odd(size_t bytes) const { return profile().aligned_only ? (bytes + unit() - 1) / unit() * unit() : bytes; }
    long vmlck0_ = 0;
};

TEST_F(Conformance, BackendIsTheRequestedOne) {
    const char* want = std::getenv("HOSTREG_BACKEND");
    ASSERT_NE(want, nullptr);
    ASSERT_STREQ(hostregBackendName(), want) << hrtest::last_message();
    if (profile().library_env) {
        ASSERT_NE(the_double().calls, nullptr) << "could not open the double's inspection API";
        const char* detail = nullptr;
        EXPECT_EQ(hostregProbeBackend(want, &detail), 0);
        EXPECT_NE(std::string(detail).find(std::getenv(profile().library_env)), std::string::npos) << detail;
    }
}

TEST_F(Conformance, BadArgumentsAnswer1AndNeverReachTheRuntime) {
    Mapping m(4);
    const long before = vendor_calls(profile().reg_symbol);
    EXPECT_EQ(hostregHostRegister(nullptr, page(), 0), hostregErrorInvalidValue);
    EXPECT_EQ(hostregHostRegister(m.get(), 0, 0), hostregErrorInvalidValue);
    EXPECT_EQ(hostregHostRegister(reinterpret_cast<void*>(UINTPTR_MAX - page() + 1), 2 * page(), 0),
              hostregErrorInvalidValue);
    for (unsigned bit = 0x10; bit != 0; bit <<= 1)
        EXPECT_EQ(hostregHostRegister(m.get(), page(), bit), hostregErrorInvalidValue) << bit;
    EXPECT_EQ(vendor_calls(profile().reg_symbol), before);
}

TEST_F(Conformance, EveryFlagIsHonouredOrAnswers801) {
    Mapping m(4);
    for (unsigned flags : {0x0u, 0x1u, 0x2u, 0x3u, 0x8u, 0xBu}) {
        ASSERT_EQ(hostregHostRegister(m.get(), page(), flags), hostregSuccess) << flags << hrtest::last_message();
        unsigned got = 99;
        EXPECT_EQ(hostregHostGetFlags(&got, m.get()), 0);
        EXPECT_EQ(got, flags);  // the caller's flags, whatever the runtime was given
        if (the_double().last_flags) {
            EXPECT_EQ(the_double().last_flags(), profile().vendor_flags(flags)) << "flags given to the runtime";
        }
        EXPECT_EQ(hostregHostUnregister(m.get()), hostregSuccess);
    }
    const int io = hostregHostRegister(m.get(), page(), HOSTREG_HOST_REGISTER_IO_MEMORY);
    if (profile().io_memory_ok) {
        EXPECT_EQ(io, hostregSuccess);
        EXPECT_EQ(hostregHostUnregister(m.get()), hostregSuccess);
    } else {
        EXPECT_EQ(io, hostregErrorNotSupported);
    }
}

TEST_F(Conformance, OverlapAnswers712FromTheRegistry) {
    Mapping m(16);
    char* a = m.at(4) + odd(100);
    const size_t u = unit();
    ASSERT_EQ(hostregHostRegister(a, 4 * u, 0), hostregSuccess) << hrtest::last_message();
    const long before = vendor_calls(profile().reg_symbol);
    struct {
        char* p;
        size_t n;
    } cases[] = {{a, 4 * u}, {a - u, 2 * u}, {a + 3 * u, 4 * u}, {a + u, u}, {m.get(), 16 * u}, {a + 4 * u - 1, 1}};
    for (const auto& c : cases) EXPECT_EQ(hostregHostRegister(c.p, c.n, 0), hostregErrorHostMemoryAlreadyRegistered);
    EXPECT_EQ(vendor_calls(profile().reg_symbol), before) << "overlap reached the runtime";
    EXPECT_STREQ(hostregGetErrorName(hostregErrorHostMemoryAlreadyRegistered), "cudaErrorHostMemoryAlreadyRegistered");
    EXPECT_EQ(hostregHostUnregister(a), hostregSuccess);
}

TEST_F(Conformance, UnregisterOfNonBaseAnswers713) {
    Mapping m(8);
    char* a = m.at(2);
    ASSERT_EQ(hostregHostRegister(a, 2 * unit(), 0), hostregSuccess) << hrtest::last_message();
    const long before = vendor_calls(profile().unreg_symbol);
    EXPECT_EQ(hostregHostUnregister(a + 1), hostregErrorHostMemoryNotRegistered);
    EXPECT_EQ(hostregHostUnregister(m.get()), hostregErrorHostMemoryNotRegistered);
    EXPECT_EQ(hostregHostUnregister(nullptr), hostregErrorHostMemoryNotRegistered);
    EXPECT_EQ(vendor_calls(profile().unreg_symbol), before);
    EXPECT_EQ(hostregHostUnregister(a), hostregSuccess);
    EXPECT_EQ(hostregHostUnregister(a), hostregErrorHostMemoryNotRegistered);
    if (profile().library_env) {
        EXPECT_EQ(vendor_calls(profile().unreg_symbol), before + 1);
    }
}

TEST_F(Conformance, RegistrationReallyLocksAndIsRecorded) {
    Mapping m(32);
    std::memset(m.get(), 0x5A, m.size());
    char* a = m.at(1) + odd(12);
    const size_t bytes = 20 * unit();
    const long calls = vendor_calls(profile().reg_symbol);
    ASSERT_EQ(hostregHostRegister(a, bytes, HOSTREG_HOST_REGISTER_PORTABLE), hostregSuccess) << hrtest::last_message();
    if (profile().library_env) {
        EXPECT_EQ(vendor_calls(profile().reg_symbol), calls + 1);
    }
    EXPECT_GE(vmlck_kb() - vmlck0_, static_cast<long>(bytes / 1024)) << "VmLck did not rise";
    hostregRegistration r{};
    ASSERT_EQ(hostregPointerGetRegistration(a + 5 * unit(), &r), 0);
    EXPECT_EQ(r.base, a);
    EXPECT_EQ(r.bytes, bytes);
    EXPECT_EQ(r.flags, HOSTREG_HOST_REGISTER_PORTABLE);
    EXPECT_STREQ(r.backend, std::getenv("HOSTREG_BACKEND"));
    EXPECT_EQ(hostregIsRegistered(a + bytes - 1), 1);
    EXPECT_EQ(hostregIsRegistered(a + bytes), 0);
    for (size_t i = 0; i < m.size(); ++i) ASSERT_EQ(m.get()[i], 0x5A) << "contents changed at " << i;
    ASSERT_EQ(hostregHostUnregister(a), hostregSuccess);
    EXPECT_EQ(vmlck_kb(), vmlck0_);
}

TEST_F(Conformance, MappedRegistrationHasADeviceAddress) {
    Mapping m(8);
    char* a = m.at(2);
    ASSERT_EQ(hostregHostRegister(a, 2 * unit(), HOSTREG_HOST_REGISTER_MAPPED), hostregSuccess) << hrtest::last_message();
    void* dev = nullptr;
    ASSERT_EQ(hostregHostGetDevicePointer(&dev, a + 10, 0), hostregSuccess) << hrtest::last_message();
    EXPECT_NE(dev, nullptr);
    void* dev0 = nullptr;
    ASSERT_EQ(hostregHostGetDevicePointer(&dev0, a, 0), hostregSuccess);
    EXPECT_EQ(static_cast<char*>(dev) - static_cast<char*>(dev0), 10);
    EXPECT_EQ(hostregHostGetDevicePointer(&dev, a, 1), hostregErrorInvalidValue);
    EXPECT_EQ(hostregHostUnregister(a), hostregSuccess);
    EXPECT_EQ(hostregHostGetDevicePointer(&dev, a, 0), hostregErrorInvalidValue);
}

TEST_F(Conformance, SharedPageNeighboursStayLocked) {
    Mapping m(8);
    char* a = m.at(1);
    const size_t first = odd(page() + 100);
    ASSERT_EQ(hostregHostRegister(a, first, 0), hostregSuccess) << hrtest::last_message();
    ASSERT_EQ(hostregHostRegister(a + first, 3 * page(), 0), hostregSuccess) << hrtest::last_message();
    ASSERT_EQ(hostregHostUnregister(a), hostregSuccess);
    EXPECT_EQ(vmlck_kb() - vmlck0_, static_cast<long>((first % page() ? 4 : 3) * page() / 1024))
        << "the neighbour's pages, shared one included, must stay locked";
    ASSERT_EQ(hostregHostUnregister(a + first), hostregSuccess);
}

TEST_F(Conformance, ThreadWithoutContextRegisters) {
    Mapping m(4);
    int reg = -1, unreg = -1;
    std::thread t([&] {
        reg = hostregHostRegister(m.get(), page(), 0);
        unreg = hostregHostUnregister(m.get());
    });
    t.join();
    EXPECT_EQ(reg, hostregSuccess);
    EXPECT_EQ(unreg, hostregSuccess);
}

TEST_F(Conformance, LockFailureAnswers2WithTheNativeCodeKept) {
    // In a child: no CAP_IPC_LOCK (setuid to nobody drops it) and a 64 KiB memlock limit.
    Mapping m(512 * page() / unit() + 1);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        struct rlimit rl = {64 * 1024, 64 * 1024};
        if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0 || setuid(65534) != 0) _exit(10);
        if (hostregHostRegister(m.get(), m.size(), 0) != hostregErrorMemoryAllocation) _exit(11);
        long long native = 0;
        hostregGetLastError(&native, nullptr);
        if (native == 0) _exit(12);
        hostregStats s{};
        hostregGetStats(&s);
        if (s.registrations != 0) _exit(13);
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0) << "child step failed (see the _exit codes)";
}

TEST_F(Conformance, ErrorNamesAreCudas) {
    EXPECT_STREQ(hostregGetErrorName(1), "cudaErrorInvalidValue");
    EXPECT_STREQ(hostregGetErrorName(713), "cudaErrorHostMemoryNotRegistered");
    EXPECT_STREQ(hostregGetErrorString(801), "operation not supported");
}

}  // namespace
