// test_hip_double.cpp: the HIP double (hip_double.cpp) against the rules it promises.
#include "double_test.hpp"

namespace {

using namespace hrd_test;

TEST(DoubleExports, Hip) {
    expect_exports(HOSTREG_DOUBLE_HIP_PATH, {"hipGetDeviceCount", "hipRuntimeGetVersion", "hipDriverGetVersion",
                                             "hipHostRegister", "hipHostUnregister", "hipHostGetDevicePointer",
                                             "hipHostGetFlags", "hipGetErrorName", "hipGetErrorString"});
}

constexpr uintptr_t kHipOffset = 0x200000000000ull;

class HipDouble : public DoubleTest {
  protected:
    void SetUp() override {
        ASSERT_NO_FATAL_FAILURE(open(HOSTREG_DOUBLE_HIP_PATH));
        LOAD(hipGetDeviceCount);
        LOAD(hipRuntimeGetVersion);
        LOAD(hipDriverGetVersion);
        LOAD(hipHostRegister);
        LOAD(hipHostUnregister);
        LOAD(hipHostGetDevicePointer);
        LOAD(hipHostGetFlags);
        LOAD(hipGetErrorName);
        LOAD(hipGetErrorString);
    }
    int (*hipGetDeviceCount)(int*) = nullptr;
    int (*hipRuntimeGetVersion)(int*) = nullptr;
    int (*hipDriverGetVersion)(int*) = nullptr;
    int (*hipHostRegister)(void*, size_t, unsigned) = nullptr;
    int (*hipHostUnregister)(void*) = nullptr;
    int (*hipHostGetDevicePointer)(void**, void*, unsigned) = nullptr;
    int (*hipHostGetFlags)(unsigned*, void*) = nullptr;
    const char* (*hipGetErrorName)(int) = nullptr;
    const char* (*hipGetErrorString)(int) = nullptr;
};

// Knob: HOSTREG_DOUBLE_DEVICES; 0 devices -> hipErrorNoDevice (100) from the count and
// hipErrorInvalidDevice (101) from the memory calls, as Debian's real libamdhip64.so.5 answers.
TEST_F(HipDouble, DeviceCountFollowsTheKnob) {
    int n = -1;
    EXPECT_EQ(hipGetDeviceCount(&n), 0);
    EXPECT_EQ(n, 1);
    setenv("HOSTREG_DOUBLE_DEVICES", "4", 1);
    EXPECT_EQ(hipGetDeviceCount(&n), 0);
    EXPECT_EQ(n, 4);
    setenv("HOSTREG_DOUBLE_DEVICES", "0", 1);
    EXPECT_EQ(hipGetDeviceCount(&n), 100);
    EXPECT_EQ(n, 0);
    Mapping m(Bytes{page()});
    void* d = nullptr;
    unsigned flags = 0;
    EXPECT_EQ(hipHostRegister(m.get(), page(), 0), 101);
    EXPECT_EQ(hipHostUnregister(m.get()), 101);
    EXPECT_EQ(hipHostGetDevicePointer(&d, m.get(), 0), 101);
    EXPECT_EQ(hipHostGetFlags(&flags, m.get()), 101);
    EXPECT_EQ(lib_->live(), 0);
    EXPECT_EQ(hipGetDeviceCount(nullptr), 1);
}

TEST_F(HipDouble, VersionsAreReported) {
    int v = 0;
    EXPECT_EQ(hipRuntimeGetVersion(&v), 0);
    EXPECT_GT(v, 0);
    v = 0;
    EXPECT_EQ(hipDriverGetVersion(&v), 0);
    EXPECT_GT(v, 0);
    EXPECT_EQ(hipRuntimeGetVersion(nullptr), 1);
    EXPECT_EQ(hipDriverGetVersion(nullptr), 1);
}

// Rule (clr ihipHostRegister): only 0x1|0x2|0x4|0x8|0x80000000 are known (else 1); NULL,
// 0 bytes, a wrapping range -> 1. Every known combination registers.
TEST_F(HipDouble, RegisterValidatesArgumentsAndFlags) {
    Mapping m(Bytes{page()});
    EXPECT_EQ(hipHostRegister(m.get(), page(), 0x10), 1);
    EXPECT_EQ(hipHostRegister(m.get(), page(), 0x40000000), 1);
    EXPECT_EQ(hipHostRegister(nullptr, page(), 0), 1);
    EXPECT_EQ(hipHostRegister(m.get(), 0, 0), 1);
    EXPECT_EQ(hipHostRegister(reinterpret_cast<void*>(UINTPTR_MAX - 100), 1000, 0), 1);
    EXPECT_EQ(lib_->live(), 0);
    for (unsigned flags : {0x0u, 0x1u, 0x2u, 0x3u, 0x4u, 0x6u, 0x8u, 0xBu, 0xFu, 0x80000000u, 0x80000003u}) {
        ASSERT_EQ(hipHostRegister(m.get(), page(), flags), 0) << std::hex << flags;
        unsigned got = 0;
        EXPECT_EQ(hipHostGetFlags(&got, m.get()), 0);
        EXPECT_EQ(got, flags);
        ASSERT_EQ(hipHostUnregister(m.get()), 0);
    }
}

// Rule: bit 0x8 (ReadOnly) changes nothing: clr registers every range the same way; IoMemory
// marks it as I/O memory. The raw flags of every call reach the recorder unchanged.
TEST_F(HipDouble, ReadOnlyIsIgnoredIoMemoryIsKept) {
    Mapping m(Bytes{2 * page()});
    char* a = m.get();
    char* b = m.get() + page();
    ASSERT_EQ(hipHostRegister(a, page(), 0x8), 0);
    ASSERT_EQ(hipHostRegister(b, page(), 0x4), 0);
    EXPECT_EQ(lib_->kind(a + 10), "fine-grained");
    EXPECT_EQ(lib_->kind(b), "io-memory");
    EXPECT_EQ(lib_->last_flags(), 0x4u);
    EXPECT_EQ(lib_->flags_log(), (std::vector<unsigned>{0x8, 0x4}));
    EXPECT_EQ(lib_->calls("hipHostRegister"), 2);
    ASSERT_EQ(hipHostUnregister(a), 0);
    ASSERT_EQ(hipHostUnregister(b), 0);
}

// Rule: clr never answers 712: overlapping ranges register, and their pages stay locked while
// any of them is registered (ROCr keeps overlapping locks). Unknown pointer -> 713.
TEST_F(HipDouble, OverlapsRegisterAndKeepTheirLocks) {
    Mapping m(Bytes{4 * page()});
    char* p = m.get();
    ASSERT_EQ(hipHostRegister(p + page(), page(), 0), 0);
    ASSERT_EQ(hipHostRegister(p, 2 * page(), 0), 0);
    EXPECT_EQ(lib_->live(), 2);
    EXPECT_EQ(locked_kb(), pages_kb(2));
    ASSERT_EQ(hipHostUnregister(p), 0);
    EXPECT_EQ(locked_kb(), pages_kb(1)) << "page 1 is still registered";
    EXPECT_EQ(hipHostUnregister(p), 713);
    ASSERT_EQ(hipHostUnregister(p + page()), 0);
    EXPECT_EQ(locked_kb(), 0);
    EXPECT_EQ(hipHostUnregister(p + page()), 713);
}

// Rule: unregistering a pointer inside a registration that is not its base aborts the
// process, as clr's guarantee() does.
TEST_F(HipDouble, UnregisterOfAnInteriorPointerAborts) {
    Mapping m(Bytes{2 * page()});
    ASSERT_EQ(hipHostRegister(m.get(), 2 * page(), 0), 0);
    EXPECT_DEATH(hipHostUnregister(m.get() + 8), "clr aborts");
    ASSERT_EQ(hipHostUnregister(m.get()), 0);
}

// Rule: real locking, VmLck; shared edge pages survive a neighbour's unregister.
TEST_F(HipDouble, RegisterReallyLocksPages) {
    Mapping m(Bytes{8 * page()});
    ASSERT_EQ(hipHostRegister(m.get(), 8 * page(), 0), 0);
    EXPECT_EQ(locked_kb(), pages_kb(8));
    ASSERT_EQ(hipHostUnregister(m.get()), 0);
    EXPECT_EQ(locked_kb(), 0);
    char* a = m.get() + 10;
    char* b = m.get() + page() + 10;
    ASSERT_EQ(hipHostRegister(a, page(), 0), 0);  // pages 0, 1
    ASSERT_EQ(hipHostRegister(b, page(), 0), 0);  // pages 1, 2
    EXPECT_EQ(locked_kb(), pages_kb(3));
    ASSERT_EQ(hipHostUnregister(b), 0);
    EXPECT_EQ(locked_kb(), pages_kb(2));
    ASSERT_EQ(hipHostUnregister(a), 0);
    EXPECT_EQ(locked_kb(), 0);
}

// Rule: a failed pin (mem->create) -> hipErrorInvalidValue (1), not 2; nothing left behind.
TEST_F(HipDouble, PinFailureIsInvalidValue) {
    Holey h;
    EXPECT_EQ(hipHostRegister(h.get(), h.size(), 0), 1);
    EXPECT_EQ(lib_->live(), 0);
    EXPECT_EQ(locked_kb(), 0);
}

// Rule: device pointer = host + 0x200000000000; flags != 0, NULL out, unregistered -> 1.
TEST_F(HipDouble, DevicePointerIsNotTheHostAddress) {
    Mapping m(Bytes{2 * page()});
    char* p = m.get();
    ASSERT_EQ(hipHostRegister(p, page(), 0x2), 0);
    void* d = nullptr;
    ASSERT_EQ(hipHostGetDevicePointer(&d, p + 8, 0), 0);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(d), reinterpret_cast<uintptr_t>(p) + 8 + kHipOffset);
    EXPECT_EQ(hipHostGetDevicePointer(&d, p, 1), 1);
    EXPECT_EQ(hipHostGetDevicePointer(nullptr, p, 0), 1);
    EXPECT_EQ(hipHostGetDevicePointer(&d, p + page(), 0), 1);
    unsigned flags = 0;
    EXPECT_EQ(hipHostGetFlags(&flags, p + page()), 1);
    EXPECT_EQ(hipHostGetFlags(nullptr, p), 1);
    ASSERT_EQ(hipHostUnregister(p), 0);
}

TEST_F(HipDouble, ErrorNamesAndStrings) {
    EXPECT_STREQ(hipGetErrorName(712), "hipErrorHostMemoryAlreadyRegistered");
    EXPECT_STREQ(hipGetErrorName(713), "hipErrorHostMemoryNotRegistered");
    EXPECT_STREQ(hipGetErrorName(100), "hipErrorNoDevice");
    EXPECT_STREQ(hipGetErrorName(2), "hipErrorOutOfMemory");
    EXPECT_STREQ(hipGetErrorString(1), "invalid argument");
    EXPECT_STREQ(hipGetErrorName(424242), "hipErrorUnknown");
    EXPECT_NE(hipGetErrorString(424242), nullptr);
}

}  // namespace
