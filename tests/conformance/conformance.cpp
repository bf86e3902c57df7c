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
// Per-backend differences are stated here, not hidden: which flags each backend honours and
// what it passes to its runtime. Backends whose runtime registers whole granules only (posix,
// acl, ze: hostregCapabilities.granule > 1) get unaligned ranges as up to three pieces; the
// suite counts them.
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

#include "../cpp/helpers.hpp"  // page(), vmlck_kb(), last_message(), Mapping
#include "hostreg/hostreg.h"

namespace {

using hrtest::Mapping;
using hrtest::page;
using hrtest::vmlck_kb;

struct Profile {
    const char* name;                          // HOSTREG_CONFORMANCE_PROFILE
    const char* library_env;                   // HOSTREG_<VENDOR>_LIBRARY, or nullptr for posix
    const char* reg_symbol;                    // the vendor function that registers
    const char* unreg_symbol;                  // ... and unregisters
    bool io_memory_ok;                         // IoMemory passed through to the runtime (which accepts it)
    unsigned (*vendor_flags)(unsigned flags);  // what must reach the runtime for CUDA flags;
                                               // nullptr: the runtime takes no flags
};

unsigned same(unsigned f) { return f; }
// AscendCL: every registration is MAPPED | PINNED (PINNED alone may lock nothing).
unsigned acl_v2_flags(unsigned) { return 0x10000000u | 0x2u; }
unsigned acl_v1_type(unsigned) { return 0; }  // ACL_HOST_REGISTER_MAPPED

const Profile kProfiles[] = {
    {"posix", nullptr, nullptr, nullptr, false, nullptr},
    {"cuda", "HOSTREG_CUDA_LIBRARY", "cuMemHostRegister_v2", "cuMemHostUnregister", true, same},
    {"hip", "HOSTREG_HIP_LIBRARY", "hipHostRegister", "hipHostUnregister", true, same},
    {"acl", "HOSTREG_ACL_LIBRARY", "aclrtHostRegisterV2", "aclrtHostUnregister", false, acl_v2_flags},
    {"acl-v1", "HOSTREG_ACL_LIBRARY", "aclrtHostRegister", "aclrtHostUnregister", false, acl_v1_type},
    {"acl-pin", "HOSTREG_ACL_LIBRARY", "aclrtHostRegisterV2", "aclrtHostUnregister", false, acl_v2_flags},
    {"ze", "HOSTREG_ZE_LIBRARY", "zexDriverImportExternalPointer", "zexDriverReleaseImportedPointer", false, nullptr},
    {"musa", "HOSTREG_MUSA_LIBRARY", "musaHostRegister", "musaHostUnregister", true, same},
};

// HOSTREG_CONFORMANCE_PROFILE names the profile (acl, acl-v1, acl-pin share HOSTREG_BACKEND=acl).
const Profile& profile() {
    static const Profile* p = [] {
        const char* name = std::getenv("HOSTREG_CONFORMANCE_PROFILE");
        for (const Profile& q : kProfiles)
            if (name && std::string(name) == q.name) return &q;
        std::fprintf(stderr, "HOSTREG_CONFORMANCE_PROFILE must name a profile\n");
        std::abort();
    }();
    return *p;
}

bool is(const char* name) { return std::string(profile().name) == name; }

// The double's inspection API (tests/doubles/double_common.hpp).
struct Double {
    void* handle = nullptr;
    long (*calls)(const char*) = nullptr;
    long (*live)() = nullptr;
    unsigned (*last_flags)() = nullptr;
    long (*acl_pinned_records)() = nullptr;  // AscendCL's record-only PINNED ranges
};

const Double& the_double() {
    static const Double d = [] {
        Double d;
        if (!profile().library_env) return d;
        void* h = dlopen(std::getenv(profile().library_env), RTLD_NOW | RTLD_NOLOAD);
        if (!h) return d;  // checked by BackendIsTheRequestedOne
        d.handle = h;
        d.calls = reinterpret_cast<long (*)(const char*)>(dlsym(h, "hostreg_double_calls"));
        d.live = reinterpret_cast<long (*)()>(dlsym(h, "hostreg_double_live"));
        d.last_flags = reinterpret_cast<unsigned (*)()>(dlsym(h, "hostreg_double_last_flags"));
        d.acl_pinned_records = reinterpret_cast<long (*)()>(dlsym(h, "hostreg_double_acl_pinned_records"));
        return d;
    }();
    return d;
}

// The active backend's granule (1: any range is one runtime registration).
size_t granule() {
    hostregCapabilities caps{};
    hostregBackendCapabilities(hostregBackendName(), &caps);
    return caps.granule;
}

// How many runtime registrations hostreg makes for [p, p + bytes) (page_share.hpp).
long pieces(const void* p, size_t bytes) {
    const size_t g = granule();
    if (g <= 1) return 1;
    const auto lo = reinterpret_cast<uintptr_t>(p), hi = lo + bytes;
    const bool head = lo % g != 0, tail = hi % g != 0;
    const uintptr_t first = lo / g, last = (hi - 1) / g;
    if (first == last) return 1;
    const long whole = static_cast<long>((tail ? last : last + 1) - (head ? first + 1 : first));
    return (whole > 0 ? 1 : 0) + head + tail;
}

long vendor_calls(const char* sym) { return the_double().calls && sym ? the_double().calls(sym) : 0; }

class Conformance : public ::testing::Test {
  protected:
    void SetUp() override {
        // The process's device, chosen as an application would (AscendCL registers on a
        // thread without a context only for a device the process chose; others ignore it).
        ASSERT_EQ(hostregSetDefaultDevice(0), hostregSuccess) << hrtest::last_message();
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
        if (the_double().acl_pinned_records) {
            EXPECT_EQ(the_double().acl_pinned_records(), 0) << "AscendCL still holds PINNED records";
        }
    }
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
        if (the_double().last_flags && profile().vendor_flags) {
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
    char* a = m.page_at(4) + 100;
    const size_t u = page();
    ASSERT_EQ(hostregHostRegister(a, 4 * u, 0), hostregSuccess) << hrtest::last_message();
    const long before = vendor_calls(profile().reg_symbol);
    struct {
        char* p;
        size_t n;
    } cases[] = {{a, 4 * u}, {a - u, 2 * u}, {a + 3 * u, 4 * u}, {a + u, u}, {m.get(), 16 * u}, {a + 4 * u - 1, 1}};
    for (const auto& c : cases)
        EXPECT_EQ(hostregHostRegister(c.p, c.n, 0), hostregErrorHostMemoryAlreadyRegistered);
    EXPECT_EQ(vendor_calls(profile().reg_symbol), before) << "overlap reached the runtime";
    EXPECT_STREQ(hostregGetErrorName(hostregErrorHostMemoryAlreadyRegistered), "cudaErrorHostMemoryAlreadyRegistered");
    EXPECT_EQ(hostregHostUnregister(a), hostregSuccess);
}

TEST_F(Conformance, UnregisterOfNonBaseAnswers713) {
    Mapping m(8);
    char* a = m.page_at(2);
    ASSERT_EQ(hostregHostRegister(a, 2 * page(), 0), hostregSuccess) << hrtest::last_message();
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

// The promise hostreg exists for: a success is a real lock, whatever the runtime (on
// AscendCL that means never resting on PINNED alone, which its runtime may only record).
// Unaligned start and end: a granule backend makes three pieces.
TEST_F(Conformance, RegistrationReallyLocksAndIsRecorded) {
    Mapping m(32);
    std::memset(m.get(), 0x5A, m.size());
    char* a = m.page_at(1) + 12;
    const size_t bytes = 20 * page();
    const long calls = vendor_calls(profile().reg_symbol);
    ASSERT_EQ(hostregHostRegister(a, bytes, HOSTREG_HOST_REGISTER_PORTABLE), hostregSuccess) << hrtest::last_message();
    if (profile().library_env) {
        EXPECT_EQ(vendor_calls(profile().reg_symbol), calls + pieces(a, bytes));
    }
    EXPECT_GE(vmlck_kb() - vmlck0_, static_cast<long>(bytes / 1024)) << "VmLck did not rise: the success is not a lock";
    hostregRegistration r{};
    ASSERT_EQ(hostregPointerGetRegistration(a + 5 * page(), &r), 0);
    EXPECT_EQ(r.base, a);
    EXPECT_EQ(r.bytes, bytes);
    EXPECT_EQ(r.flags, HOSTREG_HOST_REGISTER_PORTABLE);
    EXPECT_STREQ(r.backend, std::getenv("HOSTREG_BACKEND"));
    EXPECT_EQ(hostregIsRegistered(a + bytes - 1), 1);
    EXPECT_EQ(hostregIsRegistered(a + bytes), 0);
    for (size_t i = 0; i < m.size(); ++i)
        ASSERT_EQ(m.get()[i], 0x5A) << "contents changed at " << i;
    ASSERT_EQ(hostregHostUnregister(a), hostregSuccess);
    EXPECT_EQ(vmlck_kb(), vmlck0_);
}

// A page-aligned range (what every staging arena chunk is) is one runtime registration.
TEST_F(Conformance, AlignedRangeIsOneRuntimeCall) {
    Mapping m(8);
    const long calls = vendor_calls(profile().reg_symbol);
    ASSERT_EQ(hostregHostRegister(m.page_at(1), 6 * page(), 0), hostregSuccess) << hrtest::last_message();
    if (profile().library_env) {
        EXPECT_EQ(vendor_calls(profile().reg_symbol), calls + 1);
        EXPECT_EQ(the_double().live(), 1);
    }
    EXPECT_EQ(vmlck_kb() - vmlck0_, hrtest::pages_kb(6));
    ASSERT_EQ(hostregHostUnregister(m.page_at(1)), hostregSuccess);
}

TEST_F(Conformance, MappedRegistrationHasADeviceAddress) {
    Mapping m(8);
    for (size_t start : {size_t{0}, size_t{100}}) {  // aligned: one piece; unaligned: pieces
        char* a = m.page_at(2) + start;
        ASSERT_EQ(hostregHostRegister(a, 2 * page(), HOSTREG_HOST_REGISTER_MAPPED), hostregSuccess)
            << hrtest::last_message();
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
}

// Neighbours that share a page: neither unregister unlocks (or unregisters from the runtime)
// the other's page.
TEST_F(Conformance, SharedPageNeighboursStayLocked) {
    Mapping m(8);
    char* a = m.page_at(1);
    const size_t first = page() + 100;
    ASSERT_EQ(hostregHostRegister(a, first, 0), hostregSuccess) << hrtest::last_message();
    ASSERT_EQ(hostregHostRegister(a + first, 3 * page(), 0), hostregSuccess) << hrtest::last_message();
    EXPECT_EQ(vmlck_kb() - vmlck0_, hrtest::pages_kb(5));
    ASSERT_EQ(hostregHostUnregister(a), hostregSuccess);
    EXPECT_EQ(vmlck_kb() - vmlck0_, hrtest::pages_kb(4))
        << "the neighbour's pages, shared one included, must stay locked";
    if (the_double().live && !is("ze")) {  // granule backends: the shared page, b's middle and tail
        EXPECT_EQ(the_double().live(), granule() > 1 ? 3 : 1);
    }
    ASSERT_EQ(hostregHostUnregister(a + first), hostregSuccess);
    EXPECT_EQ(vmlck_kb(), vmlck0_);
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

// A registration made on one thread is undone on another (PyTorch's finalizers run wherever
// the garbage collector does), on a runtime that ties it to a context too.
TEST_F(Conformance, UnregisterOnAnotherThread) {
    Mapping m(4);
    ASSERT_EQ(hostregHostRegister(m.get(), 2 * page(), 0), hostregSuccess) << hrtest::last_message();
    int unreg = -1;
    std::thread t([&] { unreg = hostregHostUnregister(m.get()); });
    t.join();
    EXPECT_EQ(unreg, hostregSuccess) << hrtest::last_message();
}

// cuda: a registration is undone in the context it was made in (cuda.h, see cuda.cpp),
// whatever context the unregistering thread has.
TEST_F(Conformance, CudaUnregistersInTheContextItWasMadeIn) {
    if (!is("cuda")) GTEST_SKIP() << "cuda only";
    using CUctx = void*;
    auto retain = reinterpret_cast<int (*)(CUctx*, int)>(dlsym(the_double().handle, "cuDevicePrimaryCtxRetain"));
    auto release = reinterpret_cast<int (*)(int)>(dlsym(the_double().handle, "cuDevicePrimaryCtxRelease_v2"));
    auto push = reinterpret_cast<int (*)(CUctx)>(dlsym(the_double().handle, "cuCtxPushCurrent_v2"));
    auto pop = reinterpret_cast<int (*)(CUctx*)>(dlsym(the_double().handle, "cuCtxPopCurrent_v2"));
    setenv("HOSTREG_DOUBLE_DEVICES", "2", 1);
    CUctx dev1 = nullptr, popped = nullptr;
    ASSERT_EQ(retain(&dev1, 1), 0);
    Mapping m(4);
    ASSERT_EQ(push(dev1), 0);  // the caller selected device 1
    ASSERT_EQ(hostregHostRegister(m.get(), page(), 0), hostregSuccess) << hrtest::last_message();
    ASSERT_EQ(pop(&popped), 0);
    int other = -1;
    std::thread t([&] { other = hostregHostUnregister(m.get()); });  // no context: hostreg pushes device 1's
    t.join();
    EXPECT_EQ(other, hostregSuccess) << hrtest::last_message();

    // The context released to nothing is reset, its registrations with it: unregistering then
    // answers 713 and forgets it, and the memory can be registered again.
    ASSERT_EQ(push(dev1), 0);
    ASSERT_EQ(hostregHostRegister(m.get(), page(), 0), hostregSuccess) << hrtest::last_message();
    ASSERT_EQ(pop(&popped), 0);
    EXPECT_EQ(release(1), 0);
    EXPECT_EQ(hostregHostUnregister(m.get()), hostregErrorHostMemoryNotRegistered);
    EXPECT_EQ(hostregIsRegistered(m.get()), 0);
    ASSERT_EQ(hostregHostRegister(m.get(), page(), 0), hostregSuccess) << hrtest::last_message();
    ASSERT_EQ(hostregHostUnregister(m.get()), hostregSuccess);
    unsetenv("HOSTREG_DOUBLE_DEVICES");
}

// fork: the child inherits no lock and no edge; what it registers and unregisters there
// leaves nothing locked, neighbours of the parent's ranges included.
TEST_F(Conformance, ForkedChildStartsWithNoEdges) {
    if (!is("posix")) GTEST_SKIP() << "posix: a vendor runtime does not survive fork";
    Mapping m(8);
    ASSERT_EQ(hostregHostRegister(m.page_at(1) + 100, page(), 0), hostregSuccess);  // edges 1 and 2
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        if (vmlck_kb() != 0) _exit(10);
        if (hostregHostRegister(m.page_at(2) + 200, page(), 0) != hostregSuccess) _exit(11);  // shares page 2
        if (vmlck_kb() != hrtest::pages_kb(2)) _exit(12);
        if (hostregHostUnregister(m.page_at(2) + 200) != hostregSuccess) _exit(13);
        _exit(vmlck_kb() == 0 ? 0 : 14);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0) << "child step failed (see the _exit codes)";
    ASSERT_EQ(hostregHostUnregister(m.page_at(1) + 100), hostregSuccess);
}

TEST_F(Conformance, LockFailureAnswers2WithTheNativeCodeKept) {
    // In a child: no CAP_IPC_LOCK (setuid to nobody drops it) and a 64 KiB memlock limit.
    Mapping m(513);
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
        if (the_double().live && the_double().live() != 0) _exit(14);
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

// What the probe reports is data the registry enforces: flags outside caps.flags answer 801.
TEST_F(Conformance, CapabilitiesAreEnforced) {
    hostregCapabilities caps{};
    ASSERT_EQ(hostregBackendCapabilities(hostregBackendName(), &caps), 0);
    EXPECT_NE(caps.note, nullptr);
    EXPECT_GT(std::strlen(caps.note), 0u);
    EXPECT_GE(caps.granule, 1u);
    if (profile().library_env) {
        EXPECT_NE(std::string(caps.library).find(std::getenv(profile().library_env)), std::string::npos)
            << caps.library;
    }
    Mapping m(2);
    for (unsigned bit = 1; bit <= 8; bit <<= 1) {
        const int code = hostregHostRegister(m.get(), page(), bit);
        if (caps.flags & bit) {
            EXPECT_EQ(code, hostregSuccess) << bit << hrtest::last_message();
            hostregHostUnregister(m.get());
        } else {
            EXPECT_EQ(code, hostregErrorNotSupported) << bit;
        }
    }
    EXPECT_EQ(hostregBackendCapabilities("nonesuch", &caps), hostregErrorInvalidValue);
    EXPECT_EQ(hostregBackendCapabilities(hostregBackendName(), nullptr), hostregErrorInvalidValue);
}

// acl: a registration is undone on the NPU it was made for, whatever the unregistering
// thread's NPU; two NPUs cannot share a page (801); and once the process has registered for
// two NPUs, Portable (every device) answers 801. Defined last: it makes this process a
// two-NPU one for the tests after it.
TEST_F(Conformance, AclUnregistersOnTheDeviceItWasMadeFor) {
    if (!is("acl") && !is("acl-pin") && !is("acl-v1")) GTEST_SKIP() << "acl only";
    auto set_device = reinterpret_cast<int (*)(int32_t)>(dlsym(the_double().handle, "aclrtSetDevice"));
    auto get_device = reinterpret_cast<int (*)(int32_t*)>(dlsym(the_double().handle, "aclrtGetDevice"));
    setenv("HOSTREG_DOUBLE_DEVICES", "2", 1);
    Mapping m(8);
    int reg = -1, unreg = -1, shared = -1;
    int32_t after = -1;
    std::thread t1([&] {
        set_device(1);
        reg = hostregHostRegister(m.page_at(1) + 100, 2 * page(), 0);  // pages 1..3, edges 1 and 3
    });
    t1.join();
    std::thread t2([&] {
        set_device(0);
        shared = hostregHostRegister(m.page_at(3) + 200, page(), 0);  // shares page 3: refused
        unreg = hostregHostUnregister(m.page_at(1) + 100);
        get_device(&after);
    });
    t2.join();
    EXPECT_EQ(reg, hostregSuccess);
    EXPECT_EQ(shared, hostregErrorNotSupported);
    EXPECT_EQ(unreg, hostregSuccess) << "undone on NPU 1";
    EXPECT_EQ(after, 0) << "the thread's own NPU restored";
    std::thread t3([&] {
        set_device(0);
        reg = hostregHostRegister(m.page_at(5), page(), HOSTREG_HOST_REGISTER_PORTABLE);
    });
    t3.join();
    EXPECT_EQ(reg, hostregErrorNotSupported) << "Portable after NPUs 0 and 1 were used";
    unsetenv("HOSTREG_DOUBLE_DEVICES");
}

}  // namespace
