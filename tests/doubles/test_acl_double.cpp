// test_acl_double.cpp: the AscendCL doubles (acl_double.cpp, V2 and V1-only) against the rules they promise.
#include "double_test.hpp"

namespace {

using namespace hrd_test;

const std::vector<std::string> kAclV1Symbols = {"aclInit",
                                                "aclFinalize",
                                                "aclrtSetDevice",
                                                "aclrtResetDevice",
                                                "aclrtGetDevice",
                                                "aclrtGetDeviceCount",
                                                "aclrtHostRegister",
                                                "aclrtHostGetDevicePointer",
                                                "aclrtHostUnregister",
                                                "aclGetRecentErrMsg",
                                                "aclrtGetVersion",
                                                "hostreg_double_acl_pinned_records",
                                                "hostreg_double_acl_device_of",
                                                "hostreg_double_acl_context_refs",
                                                "aclrtGetCurrentContext",
                                                "aclrtSetCurrentContext"};

TEST(DoubleExports, AclWithV2) {
    std::vector<std::string> symbols = kAclV1Symbols;
    symbols.push_back("aclrtHostRegisterV2");
    expect_exports(HOSTREG_DOUBLE_ACL_PATH, symbols);
}

// Rule: the older-CANN double does not have aclrtHostRegisterV2 at all.
TEST(DoubleExports, AclV1OnlyLacksRegisterV2) {
    expect_exports(HOSTREG_DOUBLE_ACL_V1_PATH, kAclV1Symbols);
    void* h = dlopen(HOSTREG_DOUBLE_ACL_V1_PATH, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(h, nullptr);
    EXPECT_EQ(dlsym(h, "aclrtHostRegisterV2"), nullptr);
}

constexpr uintptr_t kAclOffset = 0x300000000000ull;
constexpr size_t k64K = 64 * 1024;
constexpr uint32_t kMapped = 0x2, kIoMemory = 0x4, kReadOnly = 0x8, kPinned = 0x10000000;

class AclDoubleBase : public DoubleTest {
  protected:
    void load_acl(const char* path) {
        ASSERT_NO_FATAL_FAILURE(open(path));
        LOAD(aclInit);
        LOAD(aclFinalize);
        LOAD(aclrtSetDevice);
        LOAD(aclrtResetDevice);
        LOAD(aclrtGetDevice);
        LOAD(aclrtGetDeviceCount);
        LOAD(aclrtHostRegister);
        LOAD(aclrtHostGetDevicePointer);
        LOAD(aclrtHostUnregister);
        LOAD(aclGetRecentErrMsg);
        LOAD(aclrtGetVersion);
    }
    // What a backend does first (the official sample): aclInit, then aclrtSetDevice(0).
    void init_and_set() {
        ASSERT_EQ(aclInit(nullptr), 0);
        ASSERT_EQ(aclrtSetDevice(0), 0);
    }
    std::string recent() {
        const char* msg = aclGetRecentErrMsg();
        return msg ? msg : "<none>";
    }

    int (*aclInit)(const char*) = nullptr;
    int (*aclFinalize)() = nullptr;
    int (*aclrtSetDevice)(int32_t) = nullptr;
    int (*aclrtResetDevice)(int32_t) = nullptr;
    int (*aclrtGetDevice)(int32_t*) = nullptr;
    int (*aclrtGetDeviceCount)(uint32_t*) = nullptr;
    int (*aclrtHostRegister)(void*, uint64_t, int, void**) = nullptr;
    int (*aclrtHostGetDevicePointer)(void*, void**, uint32_t) = nullptr;
    int (*aclrtHostUnregister)(void*) = nullptr;
    const char* (*aclGetRecentErrMsg)() = nullptr;
    int (*aclrtGetVersion)(int32_t*, int32_t*, int32_t*) = nullptr;
};

class AclDouble : public AclDoubleBase {
  protected:
    void SetUp() override {
        ASSERT_NO_FATAL_FAILURE(load_acl(HOSTREG_DOUBLE_ACL_PATH));
        LOAD(aclrtHostRegisterV2);
    }
    int (*aclrtHostRegisterV2)(void*, uint64_t, uint32_t) = nullptr;
};

// Rule: a thread's current context is its device's primary one; Get answers 107002 without
// one, Set refuses NULL (100000) and a reset device's context, and takes no retain.
TEST_F(AclDouble, CurrentContextGetAndSet) {
    auto get = reinterpret_cast<int (*)(void**)>(lib_->sym("aclrtGetCurrentContext"));
    auto set = reinterpret_cast<int (*)(void*)>(lib_->sym("aclrtSetCurrentContext"));
    auto refs = reinterpret_cast<int (*)(int)>(lib_->sym("hostreg_double_acl_context_refs"));
    ASSERT_TRUE(get && set && refs);
    void* ctx = nullptr;
    EXPECT_EQ(get(&ctx), 107002);
    ASSERT_NO_FATAL_FAILURE(init_and_set());
    ASSERT_EQ(get(&ctx), 0);
    EXPECT_NE(ctx, nullptr);
    EXPECT_EQ(set(nullptr), 100000);
    EXPECT_EQ(refs(0), 1);
    EXPECT_EQ(set(ctx), 0);
    EXPECT_EQ(refs(0), 1) << "setting a context takes no retain";
    ASSERT_EQ(aclrtResetDevice(0), 0);
    EXPECT_EQ(set(ctx), 107000) << "the device was reset";
}

// Rule: aclInit answers 0 the first time and 100002 after; aclFinalize undoes it.
TEST_F(AclDouble, InitOnceThenRepeatInitialize) {
    EXPECT_EQ(aclFinalize(), 100001);
    EXPECT_EQ(aclInit(nullptr), 0);
    EXPECT_EQ(aclInit(nullptr), 100002);
    EXPECT_EQ(aclInit("/nonexistent.json"), 100002);
    EXPECT_EQ(aclFinalize(), 0);
    EXPECT_EQ(aclInit(nullptr), 0);
}

// Rule: aclrtSetDevice: 100001 before aclInit; 107001 (ACL_ERROR_RT_INVALID_DEVICEID) for a
// bad id; sets this thread's context, which aclrtGetDevice reports (107002 without one).
TEST_F(AclDouble, SetDeviceNeedsInitAndAValidId) {
    setenv("HOSTREG_DOUBLE_DEVICES", "2", 1);
    int32_t dev = -1;
    EXPECT_EQ(aclrtSetDevice(0), 100001);
    EXPECT_EQ(aclrtGetDevice(&dev), 107002);
    ASSERT_EQ(aclInit(nullptr), 0);
    EXPECT_EQ(aclrtGetDevice(&dev), 107002);
    EXPECT_EQ(aclrtSetDevice(2), 107001);
    EXPECT_EQ(aclrtSetDevice(-1), 107001);
    ASSERT_EQ(aclrtSetDevice(1), 0);
    EXPECT_EQ(aclrtGetDevice(&dev), 0);
    EXPECT_EQ(dev, 1);
    EXPECT_EQ(aclrtGetDevice(nullptr), 100000);
    uint32_t count = 0;
    EXPECT_EQ(aclrtGetDeviceCount(&count), 0);
    EXPECT_EQ(count, 2u);
    EXPECT_EQ(aclrtGetDeviceCount(nullptr), 100000);

    // The context is per thread.
    int other = 0;
    std::thread t([&] { other = aclrtGetDevice(&dev); });
    t.join();
    EXPECT_EQ(other, 107002);

    // Reset drops it; the thread has no context again.
    ASSERT_EQ(aclrtResetDevice(1), 0);
    EXPECT_EQ(aclrtGetDevice(&dev), 107002);
}

// Knob: HOSTREG_DOUBLE_DEVICES=0: the count is 0 and aclrtSetDevice answers 207004.
TEST_F(AclDouble, NoDeviceKnob) {
    setenv("HOSTREG_DOUBLE_DEVICES", "0", 1);
    ASSERT_EQ(aclInit(nullptr), 0);
    uint32_t count = 7;
    EXPECT_EQ(aclrtGetDeviceCount(&count), 0);
    EXPECT_EQ(count, 0u);
    EXPECT_EQ(aclrtSetDevice(0), 207004);
    EXPECT_EQ(aclrtSetDevice(5), 207004);
}

// Rule: every memory call with valid arguments needs a current context on the calling
// thread, else 107002: before SetDevice, on another thread, after ResetDevice, after
// aclFinalize.
TEST_F(AclDouble, MemoryCallsNeedACurrentContext) {
    Mapping m(Bytes{k64K}, k64K);
    void* d = nullptr;
    auto all_107002 = [&](const char* when) {
        EXPECT_EQ(aclrtHostRegister(m.get(), k64K, 0, &d), 107002) << when;
        EXPECT_EQ(aclrtHostRegisterV2(m.get(), k64K, kPinned | kMapped), 107002) << when;
        EXPECT_EQ(aclrtHostGetDevicePointer(m.get(), &d, 0), 107002) << when;
        EXPECT_EQ(aclrtHostUnregister(m.get()), 107002) << when;
    };
    all_107002("before aclInit");
    ASSERT_EQ(aclInit(nullptr), 0);
    all_107002("before aclrtSetDevice");
    ASSERT_EQ(aclrtSetDevice(0), 0);
    ASSERT_EQ(aclrtHostRegister(m.get(), k64K, 0, &d), 0);
    std::thread t([&] { all_107002("on another thread"); });
    t.join();
    ASSERT_EQ(aclrtHostUnregister(m.get()), 0);
    ASSERT_EQ(aclrtResetDevice(0), 0);
    all_107002("after aclrtResetDevice");
    ASSERT_EQ(aclrtSetDevice(0), 0);
    ASSERT_EQ(aclFinalize(), 0);
    all_107002("after aclFinalize");
    EXPECT_EQ(lib_->live(), 0);
}

// Rule: the checks come in the runtime's order: NULL / size 0 (aclrt layer, 100000), then
// the flag or type (api_error.cc: 107000 / 207000), then the context (107002), then the
// driver (alignment 507899).
TEST_F(AclDouble, ChecksComeInTheRuntimesOrder) {
    Mapping m(Bytes{2 * k64K}, k64K);
    void* d = nullptr;
    ASSERT_EQ(aclInit(nullptr), 0);  // no device set: no context
    EXPECT_EQ(aclrtHostRegisterV2(nullptr, k64K, 0x1), 100000);
    EXPECT_EQ(aclrtHostRegisterV2(m.get(), 0, 0x1), 100000);
    EXPECT_EQ(aclrtHostRegisterV2(m.get() + 1, k64K, 0x1), 107000);
    EXPECT_EQ(aclrtHostRegisterV2(m.get() + 1, k64K, kMapped), 107002);
    EXPECT_EQ(aclrtHostRegister(nullptr, k64K, 1, nullptr), 100000);
    EXPECT_EQ(aclrtHostRegister(m.get(), k64K, 1, nullptr), 100000);
    EXPECT_EQ(aclrtHostRegister(m.get() + 1, k64K, 1, &d), 207000);
    EXPECT_EQ(aclrtHostRegister(m.get() + 1, k64K, 0, &d), 107002);
    ASSERT_EQ(aclrtSetDevice(0), 0);
    EXPECT_EQ(aclrtHostRegisterV2(m.get() + 1, k64K, kMapped), 507899);
    EXPECT_EQ(aclrtHostRegister(m.get() + 1, k64K, 0, &d), 507899);
    EXPECT_EQ(lib_->live(), 0);
}

// Rule: NULL pointer or size 0 -> 100000 (and NULL devPtr for V1, NULL out pointers).
TEST_F(AclDouble, NullPointerOrSizeZeroIsInvalidParam) {
    ASSERT_NO_FATAL_FAILURE(init_and_set());
    Mapping m(Bytes{k64K}, k64K);
    void* d = nullptr;
    EXPECT_EQ(aclrtHostRegister(nullptr, k64K, 0, &d), 100000);
    EXPECT_EQ(aclrtHostRegister(m.get(), 0, 0, &d), 100000);
    EXPECT_EQ(aclrtHostRegister(m.get(), k64K, 0, nullptr), 100000);
    EXPECT_EQ(aclrtHostRegisterV2(nullptr, k64K, kPinned), 100000);
    EXPECT_EQ(aclrtHostRegisterV2(m.get(), 0, kPinned), 100000);
    EXPECT_EQ(aclrtHostRegisterV2(reinterpret_cast<void*>(UINTPTR_MAX - 100), 1000, kPinned), 100000);
    EXPECT_EQ(aclrtHostGetDevicePointer(nullptr, &d, 0), 100000);
    EXPECT_EQ(aclrtHostGetDevicePointer(m.get(), nullptr, 0), 100000);
    EXPECT_EQ(aclrtHostUnregister(nullptr), 100000);
    EXPECT_EQ(lib_->live(), 0);
}

// Rule: the V2 flag must be non-zero with only MAPPED|IOMEMORY|READONLY|PINNED (else 107000;
// CUDA's Default 0 and Portable 0x1 are refused); the runtime passes IOMEMORY and READONLY
// on, and the driver refuses them as reserved (207000), with or without pin-register.
TEST_F(AclDouble, RegisterV2ValidatesTheFlag) {
    ASSERT_NO_FATAL_FAILURE(init_and_set());
    Mapping m(Bytes{k64K}, k64K);
    EXPECT_EQ(aclrtHostRegisterV2(m.get(), k64K, 0), 107000);
    EXPECT_EQ(aclrtHostRegisterV2(m.get(), k64K, 0x1), 107000);  // CUDA's Portable
    EXPECT_EQ(aclrtHostRegisterV2(m.get(), k64K, 0x20000000), 107000);
    EXPECT_EQ(aclrtHostRegisterV2(m.get(), k64K, kPinned | 0x1), 107000);
    for (const char* pin : {"0", "1"}) {
        setenv("HOSTREG_DOUBLE_ACL_PIN_REGISTER", pin, 1);
        for (uint32_t flag : {kIoMemory, kReadOnly, kPinned | kReadOnly, kMapped | kIoMemory}) {
            EXPECT_EQ(aclrtHostRegisterV2(m.get(), k64K, flag), 207000) << std::hex << flag << " pin " << pin;
            EXPECT_NE(recent().find("driver"), std::string::npos) << recent();
        }
        EXPECT_EQ(lib_->live(), 0);
        for (uint32_t flag : {kMapped, kPinned, kPinned | kMapped}) {
            ASSERT_EQ(aclrtHostRegisterV2(m.get(), k64K, flag), 0) << std::hex << flag;
            EXPECT_EQ(lib_->last_flags(), flag);
            ASSERT_EQ(aclrtHostUnregister(m.get()), 0);
        }
    }
    EXPECT_EQ(lib_->kind(m.get()), "<unregistered>");
}

// Rule: V1 types 0, 4, 8, 12 pass the runtime's check (api_error.cc), others -> 207000 there;
// the driver refuses IOMEMORY (4) and READONLY (8) as reserved (207000 too).
TEST_F(AclDouble, RegisterV1Types) {
    ASSERT_NO_FATAL_FAILURE(init_and_set());
    Mapping m(Bytes{k64K}, k64K);
    void* d = nullptr;
    for (int type : {1, 2, 16, -1}) {
        EXPECT_EQ(aclrtHostRegister(m.get(), k64K, type, &d), 207000) << type;
        EXPECT_EQ(recent().find("driver"), std::string::npos) << recent();
        EXPECT_EQ(lib_->last_flags(), static_cast<unsigned>(type));
    }
    for (int type : {4, 8, 12}) {
        EXPECT_EQ(aclrtHostRegister(m.get(), k64K, type, &d), 207000) << type;
        EXPECT_NE(recent().find("driver"), std::string::npos) << recent();
    }
    EXPECT_EQ(lib_->live(), 0);
}

// Rule: whatever reaches the driver must be 4 KiB-aligned (CANN docs), else 507899; on a
// driver without pin-register a PINNED-only request never reaches it, so it "succeeds" at any
// address.
TEST_F(AclDouble, WhatReachesTheDriverNeeds4KiBAlignment) {
    ASSERT_NO_FATAL_FAILURE(init_and_set());
    Mapping m(Bytes{2 * k64K}, k64K);
    char* odd = m.get() + 100;
    void* d = nullptr;
    for (const char* pin : {"0", "1"}) {
        setenv("HOSTREG_DOUBLE_ACL_PIN_REGISTER", pin, 1);
        EXPECT_EQ(aclrtHostRegisterV2(odd, 100, kMapped), 507899) << pin;
        EXPECT_EQ(aclrtHostRegisterV2(odd, 100, kMapped | kPinned), 507899) << pin;
        EXPECT_EQ(aclrtHostRegister(odd, 100, 0, &d), 507899) << pin;
        EXPECT_EQ(aclrtHostRegisterV2(m.get() + 4096, 100, kMapped | kPinned), 0) << pin;  // size need not be
        ASSERT_EQ(aclrtHostUnregister(m.get() + 4096), 0);
    }
    setenv("HOSTREG_DOUBLE_ACL_PIN_REGISTER", "1", 1);
    EXPECT_EQ(aclrtHostRegisterV2(odd, 100, kPinned), 507899);
    setenv("HOSTREG_DOUBLE_ACL_PIN_REGISTER", "0", 1);
    ASSERT_EQ(aclrtHostRegisterV2(odd, 100, kPinned), 0);
    ASSERT_EQ(aclrtHostUnregister(odd), 0);
    EXPECT_EQ(lib_->live(), 0);
}

// Rule (api_impl.cc, the point of this double): without pin-register support a PINNED-only
// registration is only recorded: success, nothing locked, no driver registration. MAPPED
// reaches the driver and locks.
TEST_F(AclDouble, PinnedOnlyLocksNothingWithoutPinRegister) {
    ASSERT_NO_FATAL_FAILURE(init_and_set());
    auto records = reinterpret_cast<long (*)()>(lib_->sym("hostreg_double_acl_pinned_records"));
    ASSERT_NE(records, nullptr);
    Mapping m(Bytes{k64K}, k64K);
    ASSERT_EQ(aclrtHostRegisterV2(m.get(), k64K, kPinned), 0);
    EXPECT_EQ(locked_kb(), 0) << "a PINNED-only range is not locked";
    EXPECT_EQ(records(), 1);
    EXPECT_EQ(lib_->live(), 0) << "and the driver holds nothing";
    EXPECT_EQ(aclrtHostRegisterV2(m.get() + 4096, 4096, kMapped), 507910) << "the runtime's record overlaps";
    ASSERT_EQ(aclrtHostUnregister(m.get()), 0);
    EXPECT_EQ(records(), 0);
    EXPECT_EQ(aclrtHostUnregister(m.get()), 507911);

    ASSERT_EQ(aclrtHostRegisterV2(m.get(), k64K, kPinned | kMapped), 0);
    EXPECT_EQ(locked_kb(), static_cast<long>(k64K / 1024)) << "MAPPED reached the driver";
    EXPECT_EQ(records(), 1);
    EXPECT_EQ(lib_->live(), 1);
    ASSERT_EQ(aclrtHostUnregister(m.get()), 0);
    EXPECT_EQ(locked_kb(), 0);
    EXPECT_EQ(records(), 0);
}

// Rule: with pin-register support the whole flag reaches the driver: PINNED locks too.
TEST_F(AclDouble, PinnedLocksWithPinRegister) {
    ASSERT_NO_FATAL_FAILURE(init_and_set());
    setenv("HOSTREG_DOUBLE_ACL_PIN_REGISTER", "1", 1);
    Mapping m(Bytes{k64K}, k64K);
    for (uint32_t flag : {kPinned, kMapped, kPinned | kMapped}) {
        ASSERT_EQ(aclrtHostRegisterV2(m.get(), k64K, flag), 0) << std::hex << flag;
        EXPECT_EQ(locked_kb(), static_cast<long>(k64K / 1024)) << std::hex << flag;
        ASSERT_EQ(aclrtHostUnregister(m.get()), 0);
        EXPECT_EQ(locked_kb(), 0);
    }
}

// Rule: any overlap with a live registration -> 507910 (the runtime's records, or the driver
// busy); unregister of anything but a live base -> 507911.
TEST_F(AclDouble, OverlapAndUnknownPointer) {
    ASSERT_NO_FATAL_FAILURE(init_and_set());
    Mapping m(Bytes{2 * k64K}, k64K);
    char* p = m.get();
    void* d = nullptr;
    for (const char* pin : {"0", "1"}) {
        setenv("HOSTREG_DOUBLE_ACL_PIN_REGISTER", pin, 1);
        ASSERT_EQ(aclrtHostRegister(p, k64K, 0, &d), 0);
        EXPECT_EQ(aclrtHostRegister(p, k64K, 0, &d), 507910);
        EXPECT_EQ(aclrtHostRegisterV2(p, 4096, kPinned | kMapped), 507910);
        EXPECT_EQ(aclrtHostRegisterV2(p + k64K - 4096, 2 * 4096, kMapped), 507910);
        ASSERT_EQ(aclrtHostRegisterV2(p + k64K, 4096, kPinned | kMapped), 0);  // touching
        EXPECT_EQ(aclrtHostRegister(p + k64K, 10, 0, &d), 507910);
        EXPECT_EQ(aclrtHostUnregister(p + 1), 507911);
        EXPECT_EQ(aclrtHostUnregister(p + k64K + 4096), 507911);
        ASSERT_EQ(aclrtHostUnregister(p), 0);
        ASSERT_EQ(aclrtHostUnregister(p + k64K), 0);
        EXPECT_EQ(aclrtHostUnregister(p), 507911);
    }
}

// Rule: aclrtHostGetDevicePointer answers only for the exact base of a MAPPED registration
// (register_memory.cc GetMappedDevicePointer); flag != 0 -> 100000; else 107000.
TEST_F(AclDouble, DevicePointerOnlyAtTheBaseOfAMappedRegistration) {
    ASSERT_NO_FATAL_FAILURE(init_and_set());
    Mapping m(Bytes{3 * k64K}, k64K);
    char* v1 = m.get();
    char* v2_mapped = m.get() + k64K;
    char* v2_pinned = m.get() + 2 * k64K + 3;
    void* d = nullptr;
    ASSERT_EQ(aclrtHostRegister(v1, 100, 0, &d), 0);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(d), reinterpret_cast<uintptr_t>(v1) + kAclOffset);
    ASSERT_EQ(aclrtHostRegisterV2(v2_mapped, 100, kMapped | kPinned), 0);
    ASSERT_EQ(aclrtHostRegisterV2(v2_pinned, 100, kPinned), 0);

    ASSERT_EQ(aclrtHostGetDevicePointer(v1, &d, 0), 0);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(d), reinterpret_cast<uintptr_t>(v1) + kAclOffset);
    ASSERT_EQ(aclrtHostGetDevicePointer(v2_mapped, &d, 0), 0);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(d), reinterpret_cast<uintptr_t>(v2_mapped) + kAclOffset);
    EXPECT_EQ(aclrtHostGetDevicePointer(v1 + 10, &d, 0), 107000) << "only the exact base";
    EXPECT_EQ(aclrtHostGetDevicePointer(v2_pinned, &d, 0), 107000);
    EXPECT_EQ(aclrtHostGetDevicePointer(v1, &d, 1), 100000);

    for (char* p : {v1, v2_mapped, v2_pinned})
        ASSERT_EQ(aclrtHostUnregister(p), 0);
    EXPECT_EQ(aclrtHostGetDevicePointer(v1, &d, 0), 107000);
}

// Rule: the driver failing to lock -> RT_MEMORY_ALLOCATION (207001), nothing left behind.
TEST_F(AclDouble, LockFailureIsMemoryAllocation) {
    ASSERT_NO_FATAL_FAILURE(init_and_set());
    Holey h;
    EXPECT_EQ(aclrtHostRegisterV2(h.get(), h.size(), kPinned | kMapped), 207001);
    EXPECT_EQ(lib_->live(), 0);
    EXPECT_EQ(locked_kb(), 0);
}

// Rule: every failure sets the calling thread's aclGetRecentErrMsg text (NULL before any
// failure); the text names the code. Another thread has its own.
TEST_F(AclDouble, EveryFailureSetsTheRecentErrorMessage) {
    EXPECT_EQ(aclGetRecentErrMsg(), nullptr);
    Mapping m(Bytes{2 * k64K}, k64K);
    void* d = nullptr;
    int32_t dev = 0;
    std::vector<std::pair<int, std::function<int()>>> failing = {
        {100001, [&] { return aclrtSetDevice(0); }},
        {107002, [&] { return aclrtGetDevice(&dev); }},
        {107002, [&] { return aclrtHostRegisterV2(m.get(), page(), kPinned); }},
        {0, [&] { return aclInit(nullptr); }},
        {100002, [&] { return aclInit(nullptr); }},
        {107001, [&] { return aclrtSetDevice(9); }},
        {0, [&] { return aclrtSetDevice(0); }},
        {100000, [&] { return aclrtHostRegister(nullptr, 1, 0, &d); }},
        {207000, [&] { return aclrtHostRegister(m.get(), k64K, 1, &d); }},
        {507899, [&] { return aclrtHostRegister(m.get() + 1, page(), 0, &d); }},
        {107000, [&] { return aclrtHostRegisterV2(m.get(), page(), 0); }},
        {207000, [&] { return aclrtHostRegisterV2(m.get(), page(), kReadOnly); }},
        {507899, [&] { return aclrtHostRegisterV2(m.get() + 1, page(), kMapped); }},
        {0, [&] { return aclrtHostRegisterV2(m.get(), page(), kPinned | kMapped); }},
        {507910, [&] { return aclrtHostRegisterV2(m.get(), page(), kPinned); }},
        {107000, [&] { return aclrtHostGetDevicePointer(m.get() + 8, &d, 0); }},
        {100000, [&] { return aclrtHostGetDevicePointer(m.get(), &d, 5); }},
        {507911, [&] { return aclrtHostUnregister(m.get() + 1); }},
        {0, [&] { return aclrtHostUnregister(m.get()); }},
        {100000, [&] { return aclrtGetVersion(nullptr, nullptr, nullptr); }},
    };
    for (size_t i = 0; i < failing.size(); ++i) {
        const int want = failing[i].first;
        const std::string before = recent();
        ASSERT_EQ(failing[i].second(), want) << "step " << i;
        if (want == 0) {
            EXPECT_EQ(recent(), before) << "step " << i << ": a success keeps the text";
        } else {
            EXPECT_NE(recent().find(std::to_string(want)), std::string::npos) << "step " << i << ": " << recent();
        }
    }
    const char* other = reinterpret_cast<const char*>(1);
    std::thread t([&] { other = aclGetRecentErrMsg(); });
    t.join();
    EXPECT_EQ(other, nullptr);
}

TEST_F(AclDouble, GetVersion) {
    int32_t major = -1, minor = -1, patch = -1;
    ASSERT_EQ(aclrtGetVersion(&major, &minor, &patch), 0);
    EXPECT_EQ(major, 1);
    EXPECT_EQ(minor, 15);
    EXPECT_EQ(patch, 0);
}

// The older-CANN build: V1 only, same rules.
class AclV1Double : public AclDoubleBase {
  protected:
    void SetUp() override { ASSERT_NO_FATAL_FAILURE(load_acl(HOSTREG_DOUBLE_ACL_V1_PATH)); }
};

TEST_F(AclV1Double, HasNoRegisterV2AndV1Works) {
    EXPECT_EQ(lib_->sym("aclrtHostRegisterV2"), nullptr);
    ASSERT_NO_FATAL_FAILURE(init_and_set());
    Mapping m(Bytes{k64K}, k64K);
    void* d = nullptr;
    EXPECT_EQ(aclrtHostRegister(m.get() + 8, page(), 0, &d), 507899);
    EXPECT_EQ(aclrtHostRegister(m.get(), k64K, 8, &d), 207000);
    ASSERT_EQ(aclrtHostRegister(m.get() + 4096, k64K - 4096, 0, &d), 0);  // 4 KiB is enough
    EXPECT_EQ(reinterpret_cast<uintptr_t>(d), reinterpret_cast<uintptr_t>(m.get()) + 4096 + kAclOffset);
    EXPECT_EQ(locked_kb(), static_cast<long>((k64K - 4096) / 1024));
    EXPECT_EQ(aclrtHostRegister(m.get(), k64K, 0, &d), 507910);
    ASSERT_EQ(aclrtHostGetDevicePointer(m.get() + 4096, &d, 0), 0);
    ASSERT_EQ(aclrtHostUnregister(m.get() + 4096), 0);
    EXPECT_EQ(aclrtHostUnregister(m.get() + 4096), 507911);
    EXPECT_EQ(locked_kb(), 0);
    EXPECT_EQ(lib_->calls("aclrtHostRegister"), 4);
    EXPECT_EQ(lib_->calls("aclrtHostRegisterV2"), 0);
    int32_t major = -1, minor = -1, patch = -1;
    ASSERT_EQ(aclrtGetVersion(&major, &minor, &patch), 0);
    EXPECT_EQ(minor, 10);
}

}  // namespace
