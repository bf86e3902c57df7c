// test_ze_double.cpp: the Level Zero double (ze_double.cpp) against the rules it promises.
#include "double_test.hpp"

namespace {

using namespace hrd_test;

TEST(DoubleExports, Ze) {
    // The zex* import functions are the driver's, handed out by
    // zeDriverGetExtensionFunctionAddress: never exported.
    expect_exports(HOSTREG_DOUBLE_ZE_PATH, {"zeInit", "zeDriverGet", "zeDriverGetApiVersion", "zeDeviceGet",
                                            "zeDriverGetExtensionFunctionAddress", "zelLoaderGetVersions"});
}

using ze_result_t = int;
struct Driver;
using ze_driver_handle_t = Driver*;
constexpr ze_result_t kUninitialized = 0x78000001, kUnsupported = 0x78000003, kInvalidArgument = 0x78000004,
                      kInUse = 0x78000006, kInvalidSize = 0x78000008, kOverlapping = 0x7800001a,
                      kOutOfHostMemory = 0x70000002, kInvalidEnumeration = 0x7800000c;

class ZeDouble : public DoubleTest {
  protected:
    void SetUp() override {
        ASSERT_NO_FATAL_FAILURE(open(HOSTREG_DOUBLE_ZE_PATH));
        LOAD(zeInit);
        LOAD(zeDriverGet);
        LOAD(zeDriverGetApiVersion);
        LOAD(zeDeviceGet);
        LOAD(zeDriverGetExtensionFunctionAddress);
        LOAD(zelLoaderGetVersions);
    }
    // zeInit(0), the one driver, and its import functions, as the ze backend does.
    void init() {
        ASSERT_EQ(zeInit(0), 0);
        uint32_t n = 0;
        ASSERT_EQ(zeDriverGet(&n, nullptr), 0);
        ASSERT_EQ(n, 1u);
        ASSERT_EQ(zeDriverGet(&n, &driver_), 0);
        void* fn = nullptr;
        ASSERT_EQ(zeDriverGetExtensionFunctionAddress(driver_, "zexDriverImportExternalPointer", &fn), 0);
        import_ = reinterpret_cast<decltype(import_)>(fn);
        ASSERT_EQ(zeDriverGetExtensionFunctionAddress(driver_, "zexDriverReleaseImportedPointer", &fn), 0);
        release_ = reinterpret_cast<decltype(release_)>(fn);
        ASSERT_EQ(zeDriverGetExtensionFunctionAddress(driver_, "zexDriverGetHostPointerBaseAddress", &fn), 0);
        base_of_ = reinterpret_cast<decltype(base_of_)>(fn);
    }
    ze_result_t (*zeInit)(unsigned) = nullptr;
    ze_result_t (*zeDriverGet)(uint32_t*, ze_driver_handle_t*) = nullptr;
    ze_result_t (*zeDriverGetApiVersion)(ze_driver_handle_t, int*) = nullptr;
    ze_result_t (*zeDeviceGet)(ze_driver_handle_t, uint32_t*, void**) = nullptr;
    ze_result_t (*zeDriverGetExtensionFunctionAddress)(ze_driver_handle_t, const char*, void**) = nullptr;
    ze_result_t (*zelLoaderGetVersions)(size_t*, void*) = nullptr;
    ze_driver_handle_t driver_ = nullptr;
    ze_result_t (*import_)(ze_driver_handle_t, void*, size_t) = nullptr;
    ze_result_t (*release_)(ze_driver_handle_t, void*) = nullptr;
    ze_result_t (*base_of_)(ze_driver_handle_t, void*, void**) = nullptr;
};

// Rule: with no driver (HOSTREG_DOUBLE_DEVICES=0) zeInit answers UNINITIALIZED, as the real
// loader does; before a successful zeInit zeDriverGet answers UNINITIALIZED; bad init flags
// -> INVALID_ENUMERATION.
TEST_F(ZeDouble, InitFindsTheDriverOrNone) {
    uint32_t n = 0;
    EXPECT_EQ(zeDriverGet(&n, nullptr), kUninitialized);
    EXPECT_EQ(zeInit(0x100), kInvalidEnumeration);
    setenv("HOSTREG_DOUBLE_DEVICES", "0", 1);
    EXPECT_EQ(zeInit(0), kUninitialized);
    EXPECT_EQ(zeDriverGet(&n, nullptr), kUninitialized);
    setenv("HOSTREG_DOUBLE_DEVICES", "3", 1);
    ASSERT_NO_FATAL_FAILURE(init());
    uint32_t devices = 0;
    ASSERT_EQ(zeDeviceGet(driver_, &devices, nullptr), 0);
    EXPECT_EQ(devices, 3u);
    int version = 0;
    ASSERT_EQ(zeDriverGetApiVersion(driver_, &version), 0);
    EXPECT_EQ(version >> 16, 1);
    void* fn = nullptr;
    EXPECT_EQ(zeDriverGetExtensionFunctionAddress(driver_, "zexNoSuchThing", &fn), kInvalidArgument);
    EXPECT_EQ(lib_->sym("zexDriverImportExternalPointer"), nullptr) << "not an exported symbol";
}

// Rule (host_pointer_manager.cpp): the import's answers, in its order; it locks nothing.
TEST_F(ZeDouble, ImportFollowsTheHostPointerManager) {
    ASSERT_NO_FATAL_FAILURE(init());
    Mapping m(Bytes{8 * page()});
    char* p = m.get();
    EXPECT_EQ(import_(driver_, nullptr, page()), kInvalidArgument);
    EXPECT_EQ(import_(driver_, p, 0), kInvalidArgument);
    ASSERT_EQ(import_(driver_, p + 2 * page(), 2 * page()), 0);
    EXPECT_EQ(locked_kb(), 0) << "an import is not a lock";
    EXPECT_EQ(import_(driver_, p + 2 * page(), 2 * page()), 0) << "identical re-import";
    EXPECT_EQ(import_(driver_, p + 2 * page() + 8, 100), 0) << "inside an import";
    EXPECT_EQ(lib_->live(), 1);
    EXPECT_EQ(import_(driver_, p + 3 * page(), 2 * page()), kInUse) << "first byte inside";
    EXPECT_EQ(import_(driver_, p + page(), 2 * page()), kInvalidSize) << "last byte inside";
    ASSERT_EQ(import_(driver_, p + 4 * page(), page()), 0);
    EXPECT_EQ(import_(driver_, p + 3 * page(), 2 * page()), kOverlapping) << "first and last in two imports";
    void* base = nullptr;
    ASSERT_EQ(base_of_(driver_, p + 3 * page() + 5, &base), 0);
    EXPECT_EQ(base, p + 2 * page());
    EXPECT_EQ(release_(driver_, p), kInvalidArgument);
    ASSERT_EQ(release_(driver_, p + 2 * page() + 64), 0) << "an interior pointer releases the whole import";
    EXPECT_EQ(base_of_(driver_, p + 2 * page(), &base), kInvalidArgument);
    ASSERT_EQ(release_(driver_, p + 4 * page()), 0);
    EXPECT_EQ(lib_->live(), 0);
    Holey h;
    EXPECT_EQ(import_(driver_, h.get(), h.size()), kOutOfHostMemory);
}

// Knob: HOSTREG_DOUBLE_ZE_NO_IMPORT=1 (EnableHostPointerImport=0): UNSUPPORTED_FEATURE.
TEST_F(ZeDouble, NoHostPointerManager) {
    ASSERT_NO_FATAL_FAILURE(init());
    setenv("HOSTREG_DOUBLE_ZE_NO_IMPORT", "1", 1);
    Mapping m(Bytes{page()});
    EXPECT_EQ(import_(driver_, m.get(), page()), kUnsupported);
    EXPECT_EQ(release_(driver_, m.get()), kUnsupported);
}

// Rule: the loader names its own version once zeInit found a driver.
TEST_F(ZeDouble, LoaderVersion) {
    size_t n = 5;
    ASSERT_EQ(zelLoaderGetVersions(&n, nullptr), 0);
    EXPECT_EQ(n, 0u);
    ASSERT_NO_FATAL_FAILURE(init());
    ASSERT_EQ(zelLoaderGetVersions(&n, nullptr), 0);
    EXPECT_EQ(n, 1u);
}

}  // namespace
