// test_musa_double.cpp: the MUSA double (musa_double.cpp) against the rules it promises.
#include "double_test.hpp"

namespace {

using namespace hrd_test;

TEST(DoubleExports, Musa) {
    expect_exports(HOSTREG_DOUBLE_MUSA_PATH,
                   {"musaGetDeviceCount", "musaRuntimeGetVersion", "musaHostRegister", "musaHostUnregister",
                    "musaHostGetDevicePointer", "musaHostGetFlags", "musaGetErrorName", "musaGetErrorString"});
}

constexpr uintptr_t kMusaOffset = 0x400000000000ull;

class MusaDouble : public DoubleTest {
  protected:
    void SetUp() override {
        ASSERT_NO_FATAL_FAILURE(open(HOSTREG_DOUBLE_MUSA_PATH));
        LOAD(musaGetDeviceCount);
        LOAD(musaRuntimeGetVersion);
        LOAD(musaHostRegister);
        LOAD(musaHostUnregister);
        LOAD(musaHostGetDevicePointer);
        LOAD(musaHostGetFlags);
        LOAD(musaGetErrorName);
        LOAD(musaGetErrorString);
    }
    int (*musaGetDeviceCount)(int*) = nullptr;
    int (*musaRuntimeGetVersion)(int*) = nullptr;
    int (*musaHostRegister)(void*, size_t, unsigned) = nullptr;
    int (*musaHostUnregister)(void*) = nullptr;
    int (*musaHostGetDevicePointer)(void**, void*, unsigned) = nullptr;
    int (*musaHostGetFlags)(unsigned*, void*) = nullptr;
    const char* (*musaGetErrorName)(int) = nullptr;
    const char* (*musaGetErrorString)(int) = nullptr;
};

// Knob: HOSTREG_DOUBLE_DEVICES; 0 devices -> 100 from the count and the memory calls.
TEST_F(MusaDouble, DeviceCountAndVersion) {
    int n = -1, v = 0;
    EXPECT_EQ(musaGetDeviceCount(&n), 0);
    EXPECT_EQ(n, 1);
    EXPECT_EQ(musaRuntimeGetVersion(&v), 0);
    EXPECT_GT(v, 0);
    EXPECT_EQ(musaRuntimeGetVersion(nullptr), 1);
    setenv("HOSTREG_DOUBLE_DEVICES", "0", 1);
    EXPECT_EQ(musaGetDeviceCount(&n), 100);
    EXPECT_EQ(n, 0);
    Mapping m(Bytes{page()});
    EXPECT_EQ(musaHostRegister(m.get(), page(), 0), 100);
    EXPECT_EQ(musaHostUnregister(m.get()), 100);
    EXPECT_EQ(lib_->live(), 0);
}

// Rule: CUDA's flags (0..0xF accepted, other bits -> 1); NULL, 0 bytes, wrap -> 1.
TEST_F(MusaDouble, RegisterValidatesArgumentsAndFlags) {
    Mapping m(Bytes{page()});
    EXPECT_EQ(musaHostRegister(m.get(), page(), 0x10), 1);
    EXPECT_EQ(musaHostRegister(m.get(), page(), 0x80000000u), 1);
    EXPECT_EQ(musaHostRegister(nullptr, page(), 0), 1);
    EXPECT_EQ(musaHostRegister(m.get(), 0, 0), 1);
    EXPECT_EQ(musaHostRegister(reinterpret_cast<void*>(UINTPTR_MAX - 100), 1000, 0), 1);
    for (unsigned flags = 0; flags <= 0xF; ++flags) {
        ASSERT_EQ(musaHostRegister(m.get(), page(), flags), 0) << flags;
        unsigned got = 0xFFFF;
        EXPECT_EQ(musaHostGetFlags(&got, m.get()), 0);
        EXPECT_EQ(got, flags);
        ASSERT_EQ(musaHostUnregister(m.get()), 0);
    }
    EXPECT_EQ(lib_->flags_log().size(), 16u + 5u);
}

// Rule: overlap -> 712; unregister of anything but a live base -> 713; real locking.
TEST_F(MusaDouble, OverlapUnknownPointerAndLocking) {
    Mapping m(Bytes{4 * page()});
    char* p = m.get();
    ASSERT_EQ(musaHostRegister(p + 10, 2 * page(), 0), 0);  // pages 0..2
    EXPECT_EQ(locked_kb(), pages_kb(3));
    EXPECT_EQ(musaHostRegister(p + 10, 2 * page(), 0), 712);
    EXPECT_EQ(musaHostRegister(p, 11, 0), 712);
    EXPECT_EQ(musaHostRegister(p + 2 * page() + 9, 1, 0), 712);
    ASSERT_EQ(musaHostRegister(p + 2 * page() + 10, 1, 0), 0);  // touching, shares page 2
    EXPECT_EQ(locked_kb(), pages_kb(3));
    EXPECT_EQ(musaHostUnregister(p), 713);
    EXPECT_EQ(musaHostUnregister(p + 11), 713);
    ASSERT_EQ(musaHostUnregister(p + 10), 0);
    EXPECT_EQ(locked_kb(), pages_kb(1));  // page 2 still held by the neighbour
    ASSERT_EQ(musaHostUnregister(p + 2 * page() + 10), 0);
    EXPECT_EQ(locked_kb(), 0);
    EXPECT_EQ(musaHostUnregister(p + 10), 713);
}

// Rule: device pointer = host + 0x400000000000; flags != 0, NULL out, unregistered -> 1.
TEST_F(MusaDouble, DevicePointerIsNotTheHostAddress) {
    Mapping m(Bytes{2 * page()});
    char* p = m.get();
    ASSERT_EQ(musaHostRegister(p, page(), 0x2), 0);
    void* d = nullptr;
    ASSERT_EQ(musaHostGetDevicePointer(&d, p + 3, 0), 0);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(d), reinterpret_cast<uintptr_t>(p) + 3 + kMusaOffset);
    EXPECT_EQ(musaHostGetDevicePointer(&d, p, 1), 1);
    EXPECT_EQ(musaHostGetDevicePointer(nullptr, p, 0), 1);
    EXPECT_EQ(musaHostGetDevicePointer(&d, p + page(), 0), 1);
    unsigned flags = 0;
    EXPECT_EQ(musaHostGetFlags(&flags, p + page()), 1);
    ASSERT_EQ(musaHostUnregister(p), 0);
}

// Rule: mlock failure -> musaErrorMemoryAllocation (2).
TEST_F(MusaDouble, MlockFailureIsMemoryAllocation) {
    Holey h;
    EXPECT_EQ(musaHostRegister(h.get(), h.size(), 0), 2);
    EXPECT_EQ(lib_->live(), 0);
    EXPECT_EQ(locked_kb(), 0);
}

TEST_F(MusaDouble, ErrorNamesAndStrings) {
    EXPECT_STREQ(musaGetErrorName(712), "musaErrorHostMemoryAlreadyRegistered");
    EXPECT_STREQ(musaGetErrorName(713), "musaErrorHostMemoryNotRegistered");
    EXPECT_STREQ(musaGetErrorName(2), "musaErrorMemoryAllocation");
    EXPECT_STREQ(musaGetErrorName(100), "musaErrorNoDevice");
    EXPECT_STREQ(musaGetErrorString(1), "invalid argument");
    EXPECT_STREQ(musaGetErrorName(424242), "musaErrorUnknown");
    EXPECT_EQ(lib_->calls("musaGetErrorName"), 5);
}

}  // namespace
