// test_cuda_double.cpp: the CUDA driver double (cuda_driver_double.cpp) against the rules it promises.
#include "double_test.hpp"

namespace {

using namespace hrd_test;

TEST(DoubleExports, CudaDriver) {
    expect_exports(
        HOSTREG_DOUBLE_CUDA_PATH,
        {"cuInit", "cuDriverGetVersion", "cuDeviceGetCount", "cuDeviceGet", "cuDeviceGetAttribute",
         "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease_v2", "cuCtxGetCurrent", "cuCtxSetCurrent",
         "cuCtxPushCurrent_v2", "cuCtxPopCurrent_v2", "cuCtxGetDevice", "cuMemHostRegister_v2", "cuMemHostUnregister",
         "cuMemHostGetDevicePointer_v2", "cuMemHostGetFlags", "cuGetErrorName", "cuGetErrorString"});
}

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st* CUcontext;
typedef unsigned long long CUdeviceptr;

constexpr unsigned long long kCudaOffset = 0x100000000000ull;

class CudaDouble : public DoubleTest {
  protected:
    void SetUp() override {
        ASSERT_NO_FATAL_FAILURE(open(HOSTREG_DOUBLE_CUDA_PATH));
        LOAD(cuInit);
        LOAD(cuDriverGetVersion);
        LOAD(cuDeviceGetCount);
        LOAD(cuDeviceGet);
        LOAD(cuDeviceGetAttribute);
        LOAD(cuDevicePrimaryCtxRetain);
        LOAD(cuDevicePrimaryCtxRelease_v2);
        LOAD(cuCtxGetCurrent);
        LOAD(cuCtxSetCurrent);
        LOAD(cuCtxPushCurrent_v2);
        LOAD(cuCtxPopCurrent_v2);
        LOAD(cuCtxGetDevice);
        LOAD(cuMemHostRegister_v2);
        LOAD(cuMemHostUnregister);
        LOAD(cuMemHostGetDevicePointer_v2);
        LOAD(cuMemHostGetFlags);
        LOAD(cuGetErrorName);
        LOAD(cuGetErrorString);
    }
    // What a backend does first: cuInit(0), retain device 0's primary context, push it.
    void init_and_push() {
        ASSERT_EQ(cuInit(0), 0);
        ASSERT_EQ(cuDevicePrimaryCtxRetain(&ctx_, 0), 0);
        ASSERT_NE(ctx_, nullptr);
        ASSERT_EQ(cuCtxPushCurrent_v2(ctx_), 0);
    }

    CUresult (*cuInit)(unsigned) = nullptr;
    CUresult (*cuDriverGetVersion)(int*) = nullptr;
    CUresult (*cuDeviceGetCount)(int*) = nullptr;
    CUresult (*cuDeviceGet)(CUdevice*, int) = nullptr;
    CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice) = nullptr;
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice) = nullptr;
    CUresult (*cuDevicePrimaryCtxRelease_v2)(CUdevice) = nullptr;
    CUresult (*cuCtxGetCurrent)(CUcontext*) = nullptr;
    CUresult (*cuCtxSetCurrent)(CUcontext) = nullptr;
    CUresult (*cuCtxPushCurrent_v2)(CUcontext) = nullptr;
    CUresult (*cuCtxPopCurrent_v2)(CUcontext*) = nullptr;
    CUresult (*cuCtxGetDevice)(CUdevice*) = nullptr;
    CUresult (*cuMemHostRegister_v2)(void*, size_t, unsigned) = nullptr;
    CUresult (*cuMemHostUnregister)(void*) = nullptr;
    CUresult (*cuMemHostGetDevicePointer_v2)(CUdeviceptr*, void*, unsigned) = nullptr;
    CUresult (*cuMemHostGetFlags)(unsigned*, void*) = nullptr;
    CUresult (*cuGetErrorName)(CUresult, const char**) = nullptr;
    CUresult (*cuGetErrorString)(CUresult, const char**) = nullptr;
    CUcontext ctx_ = nullptr;
};

// Rule: before cuInit(0) succeeds every call answers 3, except cuDriverGetVersion and
// cuGetError*; nothing gets registered.
TEST_F(CudaDouble, EveryCallAnswersNotInitializedBeforeCuInit) {
    Mapping m(Bytes{page()});
    int n = 0;
    CUdevice dev = 0;
    CUcontext ctx = nullptr;
    CUdeviceptr dptr = 0;
    unsigned flags = 0;
    EXPECT_EQ(cuDeviceGetCount(&n), 3);
    EXPECT_EQ(cuDeviceGet(&dev, 0), 3);
    EXPECT_EQ(cuDevicePrimaryCtxRetain(&ctx, 0), 3);
    EXPECT_EQ(cuDevicePrimaryCtxRelease_v2(0), 3);
    EXPECT_EQ(cuCtxGetCurrent(&ctx), 3);
    EXPECT_EQ(cuCtxSetCurrent(nullptr), 3);
    EXPECT_EQ(cuCtxPushCurrent_v2(nullptr), 3);
    EXPECT_EQ(cuCtxPopCurrent_v2(&ctx), 3);
    EXPECT_EQ(cuCtxGetDevice(&dev), 3);
    EXPECT_EQ(cuMemHostRegister_v2(m.get(), page(), 0), 3);
    EXPECT_EQ(cuMemHostUnregister(m.get()), 3);
    EXPECT_EQ(cuMemHostGetDevicePointer_v2(&dptr, m.get(), 0), 3);
    EXPECT_EQ(cuMemHostGetFlags(&flags, m.get()), 3);
    EXPECT_EQ(lib_->live(), 0);
    EXPECT_EQ(locked_kb(), 0);

    int version = 0;
    EXPECT_EQ(cuDriverGetVersion(&version), 0);
    EXPECT_EQ(version, 13000);
    const char* text = nullptr;
    EXPECT_EQ(cuGetErrorName(3, &text), 0);
    EXPECT_STREQ(text, "CUDA_ERROR_NOT_INITIALIZED");
    EXPECT_EQ(cuGetErrorString(3, &text), 0);
    EXPECT_NE(text, nullptr);
}

// Rule: cuInit with flags != 0 answers 1 and initializes nothing; cuInit(0) then works.
TEST_F(CudaDouble, CuInitNeedsZeroFlags) {
    int n = -1;
    EXPECT_EQ(cuInit(1), 1);
    EXPECT_EQ(cuDeviceGetCount(&n), 3);
    EXPECT_EQ(cuInit(0), 0);
    EXPECT_EQ(cuInit(0), 0);  // again: still fine
    EXPECT_EQ(cuDeviceGetCount(&n), 0);
    EXPECT_EQ(n, 1);  // default HOSTREG_DOUBLE_DEVICES
}

// Knob: HOSTREG_DOUBLE_DEVICES=0 makes cuInit answer 100 (and stay uninitialized).
TEST_F(CudaDouble, NoDeviceKnobMakesCuInitAnswerNoDevice) {
    setenv("HOSTREG_DOUBLE_DEVICES", "0", 1);
    int n = -1;
    EXPECT_EQ(cuInit(0), 100);
    EXPECT_EQ(cuDeviceGetCount(&n), 3);
    unsetenv("HOSTREG_DOUBLE_DEVICES");
    EXPECT_EQ(cuInit(0), 0);
}

// Knob: HOSTREG_DOUBLE_STUB=1 behaves like the toolkit's stub libcuda.so: 34 everywhere,
// read at every call.
TEST_F(CudaDouble, StubKnobAnswersStubLibraryEverywhere) {
    setenv("HOSTREG_DOUBLE_STUB", "1", 1);
    int v = 0;
    const char* text = nullptr;
    EXPECT_EQ(cuInit(0), 34);
    EXPECT_EQ(cuDriverGetVersion(&v), 34);
    EXPECT_EQ(cuGetErrorName(34, &text), 34);
    EXPECT_EQ(cuGetErrorString(34, &text), 34);
    unsetenv("HOSTREG_DOUBLE_STUB");
    ASSERT_NO_FATAL_FAILURE(init_and_push());
    setenv("HOSTREG_DOUBLE_STUB", "1", 1);
    Mapping m(Bytes{page()});
    EXPECT_EQ(cuDeviceGetCount(&v), 34);
    EXPECT_EQ(cuMemHostRegister_v2(m.get(), page(), 0), 34);
    EXPECT_EQ(lib_->live(), 0);
}

// Knob: HOSTREG_DOUBLE_DEVICES sets the count, read at every call; bad ordinals -> 101.
TEST_F(CudaDouble, DeviceCountAndOrdinalsFollowTheKnob) {
    setenv("HOSTREG_DOUBLE_DEVICES", "3", 1);
    ASSERT_EQ(cuInit(0), 0);
    int n = 0;
    CUdevice dev = -1;
    CUcontext ctx = nullptr;
    EXPECT_EQ(cuDeviceGetCount(&n), 0);
    EXPECT_EQ(n, 3);
    EXPECT_EQ(cuDeviceGet(&dev, 2), 0);
    EXPECT_EQ(dev, 2);
    EXPECT_EQ(cuDeviceGet(&dev, 3), 101);
    EXPECT_EQ(cuDeviceGet(&dev, -1), 101);
    EXPECT_EQ(cuDevicePrimaryCtxRetain(&ctx, 3), 101);
    EXPECT_EQ(cuDevicePrimaryCtxRelease_v2(3), 101);
    EXPECT_EQ(cuDeviceGetCount(nullptr), 1);
    setenv("HOSTREG_DOUBLE_DEVICES", "2", 1);
    EXPECT_EQ(cuDeviceGetCount(&n), 0);
    EXPECT_EQ(n, 2);
    EXPECT_EQ(cuDeviceGet(&dev, 2), 101);
}

// Rule: the current context is per thread and starts NULL; memory calls without one -> 201.
TEST_F(CudaDouble, MemoryCallsNeedACurrentContextOnTheCallingThread) {
    ASSERT_EQ(cuInit(0), 0);
    Mapping m(Bytes{page()});
    CUcontext cur = reinterpret_cast<CUcontext>(1);
    CUdeviceptr dptr = 0;
    unsigned flags = 0;
    CUdevice dev = -1;
    EXPECT_EQ(cuCtxGetCurrent(&cur), 0);
    EXPECT_EQ(cur, nullptr);
    EXPECT_EQ(cuMemHostRegister_v2(m.get(), page(), 0), 201);
    EXPECT_EQ(cuMemHostUnregister(m.get()), 201);
    EXPECT_EQ(cuMemHostGetDevicePointer_v2(&dptr, m.get(), 0), 201);
    EXPECT_EQ(cuMemHostGetFlags(&flags, m.get()), 201);
    EXPECT_EQ(cuCtxGetDevice(&dev), 201);

    ASSERT_NO_FATAL_FAILURE(init_and_push());
    EXPECT_EQ(cuCtxGetCurrent(&cur), 0);
    EXPECT_EQ(cur, ctx_);
    EXPECT_EQ(cuCtxGetDevice(&dev), 0);
    EXPECT_EQ(dev, 0);
    ASSERT_EQ(cuMemHostRegister_v2(m.get(), page(), 0), 0);

    // Another thread has no current context until it sets one.
    CUresult other_get = -1, other_reg = -1, other_unreg_before = -1, other_unreg_after = -1;
    CUcontext other_cur = reinterpret_cast<CUcontext>(1);
    std::thread t([&] {
        other_get = cuCtxGetCurrent(&other_cur);
        other_reg = cuMemHostRegister_v2(m.get(), page(), 0);
        other_unreg_before = cuMemHostUnregister(m.get());
        cuCtxSetCurrent(ctx_);
        other_unreg_after = cuMemHostUnregister(m.get());
    });
    t.join();
    EXPECT_EQ(other_get, 0);
    EXPECT_EQ(other_cur, nullptr);
    EXPECT_EQ(other_reg, 201);
    EXPECT_EQ(other_unreg_before, 201);
    EXPECT_EQ(other_unreg_after, 0);  // the registry is process-wide
    EXPECT_EQ(lib_->live(), 0);
}

// Rule (cuda.h, CU_MEMHOSTREGISTER_PORTABLE): a registration belongs to the context it was
// made in. Another context cannot unregister it (713) and, unless it is Portable, does not
// see it (cuMemHostGetDevicePointer / GetFlags -> 1).
TEST_F(CudaDouble, RegistrationsBelongToTheirContext) {
    setenv("HOSTREG_DOUBLE_DEVICES", "2", 1);
    ASSERT_NO_FATAL_FAILURE(init_and_push());  // device 0's primary context current
    CUcontext other = nullptr;
    ASSERT_EQ(cuDevicePrimaryCtxRetain(&other, 1), 0);
    Mapping m(Bytes{2 * page()});
    char* plain = m.get();
    char* portable = m.get() + page();
    ASSERT_EQ(cuMemHostRegister_v2(plain, page(), 0), 0);
    ASSERT_EQ(cuMemHostRegister_v2(portable, page(), 0x1), 0);
    ASSERT_EQ(cuCtxPushCurrent_v2(other), 0);
    CUdeviceptr d = 0;
    unsigned flags = 0;
    EXPECT_EQ(cuMemHostGetDevicePointer_v2(&d, plain, 0), 1);
    EXPECT_EQ(cuMemHostGetFlags(&flags, plain), 1);
    EXPECT_EQ(cuMemHostGetDevicePointer_v2(&d, portable, 0), 0);
    EXPECT_EQ(cuMemHostUnregister(plain), 713);
    EXPECT_EQ(cuMemHostUnregister(portable), 713);
    CUcontext popped = nullptr;
    ASSERT_EQ(cuCtxPopCurrent_v2(&popped), 0);
    EXPECT_EQ(cuMemHostUnregister(plain), 0);
    EXPECT_EQ(cuMemHostUnregister(portable), 0);
    ASSERT_EQ(cuDevicePrimaryCtxRelease_v2(1), 0);
}

// Rule: attribute 113 (READ_ONLY_HOST_REGISTER_SUPPORTED) is 1 unless the knob says not.
TEST_F(CudaDouble, ReadOnlyAttributeFollowsTheKnob) {
    ASSERT_EQ(cuInit(0), 0);
    int v = -1;
    ASSERT_EQ(cuDeviceGetAttribute(&v, 113, 0), 0);
    EXPECT_EQ(v, 1);
    setenv("HOSTREG_DOUBLE_NO_READONLY", "1", 1);
    ASSERT_EQ(cuDeviceGetAttribute(&v, 113, 0), 0);
    EXPECT_EQ(v, 0);
    EXPECT_EQ(cuDeviceGetAttribute(&v, 113, 5), 101);
    EXPECT_EQ(cuDeviceGetAttribute(nullptr, 113, 0), 1);
}

// Rule: the context stack: push/pop, SetCurrent replaces the top (NULL pops it), pop of an
// empty stack and unknown handles -> 201; cuCtxGetDevice names the context's device.
TEST_F(CudaDouble, ContextStackPushPopAndSetCurrent) {
    setenv("HOSTREG_DOUBLE_DEVICES", "2", 1);
    ASSERT_EQ(cuInit(0), 0);
    CUcontext c0 = nullptr, c1 = nullptr, cur = nullptr;
    ASSERT_EQ(cuDevicePrimaryCtxRetain(&c0, 0), 0);
    ASSERT_EQ(cuDevicePrimaryCtxRetain(&c1, 1), 0);
    EXPECT_NE(c0, c1);
    CUdevice dev = -1;

    EXPECT_EQ(cuCtxPopCurrent_v2(&cur), 201);  // empty
    EXPECT_EQ(cuCtxPushCurrent_v2(nullptr), 201);
    EXPECT_EQ(cuCtxPushCurrent_v2(reinterpret_cast<CUcontext>(&dev)), 201);
    EXPECT_EQ(cuCtxSetCurrent(reinterpret_cast<CUcontext>(&dev)), 201);

    ASSERT_EQ(cuCtxPushCurrent_v2(c0), 0);
    ASSERT_EQ(cuCtxPushCurrent_v2(c1), 0);
    EXPECT_EQ(cuCtxGetDevice(&dev), 0);
    EXPECT_EQ(dev, 1);
    ASSERT_EQ(cuCtxPopCurrent_v2(&cur), 0);
    EXPECT_EQ(cur, c1);
    EXPECT_EQ(cuCtxGetDevice(&dev), 0);
    EXPECT_EQ(dev, 0);
    ASSERT_EQ(cuCtxSetCurrent(c1), 0);  // replaces c0
    EXPECT_EQ(cuCtxGetDevice(&dev), 0);
    EXPECT_EQ(dev, 1);
    ASSERT_EQ(cuCtxSetCurrent(nullptr), 0);  // pops it: empty again
    EXPECT_EQ(cuCtxGetCurrent(&cur), 0);
    EXPECT_EQ(cur, nullptr);
    EXPECT_EQ(cuCtxSetCurrent(nullptr), 0);  // no-op on an empty stack
    ASSERT_EQ(cuCtxSetCurrent(c0), 0);       // empty stack: pushes
    EXPECT_EQ(cuCtxPopCurrent_v2(nullptr), 0);
    EXPECT_EQ(cuCtxPopCurrent_v2(nullptr), 201);
}

// Rule: a primary context released as often as retained is inactive: a thread that still
// has it current gets 201 from memory calls; releasing again -> 201.
TEST_F(CudaDouble, ReleasedPrimaryContextIsNotUsable) {
    ASSERT_NO_FATAL_FAILURE(init_and_push());
    Mapping m(Bytes{page()});
    ASSERT_EQ(cuDevicePrimaryCtxRelease_v2(0), 0);
    EXPECT_EQ(cuMemHostRegister_v2(m.get(), page(), 0), 201);
    EXPECT_EQ(cuDevicePrimaryCtxRelease_v2(0), 201);
    EXPECT_EQ(cuCtxSetCurrent(ctx_), 201);
    CUcontext again = nullptr;
    ASSERT_EQ(cuDevicePrimaryCtxRetain(&again, 0), 0);
    EXPECT_EQ(again, ctx_);
    ASSERT_EQ(cuMemHostRegister_v2(m.get(), page(), 0), 0);
    ASSERT_EQ(cuMemHostUnregister(m.get()), 0);
}

// Rule: register: NULL, 0 bytes, flag bits outside 0xF, a wrapping range -> 1.
TEST_F(CudaDouble, RegisterRejectsInvalidArguments) {
    ASSERT_NO_FATAL_FAILURE(init_and_push());
    Mapping m(Bytes{page()});
    EXPECT_EQ(cuMemHostRegister_v2(nullptr, page(), 0), 1);
    EXPECT_EQ(cuMemHostRegister_v2(m.get(), 0, 0), 1);
    EXPECT_EQ(cuMemHostRegister_v2(m.get(), page(), 0x10), 1);
    EXPECT_EQ(cuMemHostRegister_v2(m.get(), page(), 0x80000000u), 1);
    EXPECT_EQ(cuMemHostRegister_v2(reinterpret_cast<void*>(UINTPTR_MAX - 100), 1000, 0), 1);
    EXPECT_EQ(lib_->live(), 0);
    EXPECT_EQ(locked_kb(), 0);
}

// Rule: every combination of PORTABLE, DEVICEMAP, IOMEMORY, READ_ONLY is accepted, and
// cuMemHostGetFlags returns the flags registered.
TEST_F(CudaDouble, RegisterAcceptsEveryDocumentedFlag) {
    ASSERT_NO_FATAL_FAILURE(init_and_push());
    Mapping m(Bytes{page()});
    for (unsigned flags = 0; flags <= 0xF; ++flags) {
        ASSERT_EQ(cuMemHostRegister_v2(m.get(), 100, flags), 0) << flags;
        unsigned got = 0xFFFF;
        EXPECT_EQ(cuMemHostGetFlags(&got, m.get() + 50), 0);
        EXPECT_EQ(got, flags);
        EXPECT_EQ(lib_->last_flags(), flags);
        ASSERT_EQ(cuMemHostUnregister(m.get()), 0);
    }
}

// Knob: HOSTREG_DOUBLE_NO_READONLY=1 (no device attribute 113): READ_ONLY -> 801.
TEST_F(CudaDouble, NoReadOnlyKnobRefusesReadOnly) {
    ASSERT_NO_FATAL_FAILURE(init_and_push());
    setenv("HOSTREG_DOUBLE_NO_READONLY", "1", 1);
    Mapping m(Bytes{page()});
    EXPECT_EQ(cuMemHostRegister_v2(m.get(), page(), 0x8), 801);
    EXPECT_EQ(cuMemHostRegister_v2(m.get(), page(), 0x9), 801);
    ASSERT_EQ(cuMemHostRegister_v2(m.get(), page(), 0x1), 0);
    ASSERT_EQ(cuMemHostUnregister(m.get()), 0);
}

// Rule: any byte in common with a live registration -> 712; touching ranges are fine.
TEST_F(CudaDouble, AnyOverlapIsAlreadyRegistered) {
    ASSERT_NO_FATAL_FAILURE(init_and_push());
    Mapping m(Bytes{5 * page()});
    char* p = m.get();
    const size_t pg = page();
    ASSERT_EQ(cuMemHostRegister_v2(p + pg, 2 * pg, 0), 0);        // [1, 3) pages
    EXPECT_EQ(cuMemHostRegister_v2(p + pg, 2 * pg, 0), 712);      // exact repeat
    EXPECT_EQ(cuMemHostRegister_v2(p + pg, 1, 0), 712);           // same base, shorter
    EXPECT_EQ(cuMemHostRegister_v2(p, pg + 1, 0), 712);           // front overlap
    EXPECT_EQ(cuMemHostRegister_v2(p + 3 * pg - 1, pg, 0), 712);  // back overlap
    EXPECT_EQ(cuMemHostRegister_v2(p + pg + 10, 10, 0), 712);     // inside
    EXPECT_EQ(cuMemHostRegister_v2(p, 5 * pg, 0), 712);           // containing
    EXPECT_EQ(lib_->live(), 1);
    ASSERT_EQ(cuMemHostRegister_v2(p, pg, 0), 0);           // touching below
    ASSERT_EQ(cuMemHostRegister_v2(p + 3 * pg, pg, 0), 0);  // touching above
    EXPECT_EQ(lib_->live(), 3);
    for (char* base : {p, p + pg, p + 3 * pg})
        ASSERT_EQ(cuMemHostUnregister(base), 0);
}

// Rule: unregister needs the exact base of a live registration, else 713.
TEST_F(CudaDouble, UnregisterNeedsTheExactBase) {
    ASSERT_NO_FATAL_FAILURE(init_and_push());
    Mapping m(Bytes{2 * page()});
    EXPECT_EQ(cuMemHostUnregister(m.get()), 713);  // never registered
    ASSERT_EQ(cuMemHostRegister_v2(m.get(), 2 * page(), 0), 0);
    EXPECT_EQ(cuMemHostUnregister(m.get() + 1), 713);       // interior
    EXPECT_EQ(cuMemHostUnregister(m.get() + page()), 713);  // interior page
    EXPECT_EQ(cuMemHostUnregister(nullptr), 713);
    ASSERT_EQ(cuMemHostUnregister(m.get()), 0);
    EXPECT_EQ(cuMemHostUnregister(m.get()), 713);  // twice
}

// Rule: when mlock fails (here: a hole in the range) register answers 2 and leaves
// nothing locked or registered.
TEST_F(CudaDouble, MlockFailureIsOutOfMemory) {
    ASSERT_NO_FATAL_FAILURE(init_and_push());
    Holey h;
    EXPECT_EQ(cuMemHostRegister_v2(h.get(), h.size(), 0), 2);
    EXPECT_EQ(lib_->live(), 0);
    EXPECT_EQ(locked_kb(), 0);
}

// Rule: a success really locks every page the range touches (VmLck); unregister unlocks.
TEST_F(CudaDouble, RegisterReallyLocksPages) {
    ASSERT_NO_FATAL_FAILURE(init_and_push());
    Mapping m(Bytes{16 * page()});
    ASSERT_EQ(cuMemHostRegister_v2(m.get(), 16 * page(), 0), 0);
    EXPECT_EQ(locked_kb(), pages_kb(16));
    ASSERT_EQ(cuMemHostUnregister(m.get()), 0);
    EXPECT_EQ(locked_kb(), 0);

    ASSERT_EQ(cuMemHostRegister_v2(m.get() + page() - 1, 2 * page() + 2, 0), 0);  // pages 0..3
    EXPECT_EQ(locked_kb(), pages_kb(4));
    ASSERT_EQ(cuMemHostUnregister(m.get() + page() - 1), 0);
    EXPECT_EQ(locked_kb(), 0);
}

// Rule: a page two registrations share stays locked until both are gone.
TEST_F(CudaDouble, SharedEdgePageStaysLockedWhileANeighbourHoldsIt) {
    ASSERT_NO_FATAL_FAILURE(init_and_push());
    Mapping m(Bytes{3 * page()});
    char* a = m.get();                 // [0, 1.5 pages)
    char* b = m.get() + page() + 100;  // [1.5 pages, 3 pages)
    for (bool a_first : {true, false}) {
        ASSERT_EQ(cuMemHostRegister_v2(a, page() + 100, 0), 0);
        ASSERT_EQ(cuMemHostRegister_v2(b, 2 * page() - 100, 0), 0);
        EXPECT_EQ(locked_kb(), pages_kb(3));
        ASSERT_EQ(cuMemHostUnregister(a_first ? a : b), 0);
        EXPECT_EQ(locked_kb(), pages_kb(2)) << "the shared page must stay locked";
        ASSERT_EQ(cuMemHostUnregister(a_first ? b : a), 0);
        EXPECT_EQ(locked_kb(), 0);
    }
}

// Rule: the device pointer is host + 0x100000000000 (plus the offset inside the
// registration); flags != 0, NULL out or an unregistered address -> 1.
TEST_F(CudaDouble, DevicePointerIsNotTheHostAddress) {
    ASSERT_NO_FATAL_FAILURE(init_and_push());
    Mapping m(Bytes{2 * page()});
    char* p = m.get();
    ASSERT_EQ(cuMemHostRegister_v2(p, page(), 0), 0);
    CUdeviceptr d = 0;
    ASSERT_EQ(cuMemHostGetDevicePointer_v2(&d, p, 0), 0);
    EXPECT_EQ(d, reinterpret_cast<uintptr_t>(p) + kCudaOffset);
    EXPECT_NE(d, reinterpret_cast<uintptr_t>(p));
    ASSERT_EQ(cuMemHostGetDevicePointer_v2(&d, p + 100, 0), 0);
    EXPECT_EQ(d, reinterpret_cast<uintptr_t>(p) + 100 + kCudaOffset);
    EXPECT_EQ(cuMemHostGetDevicePointer_v2(&d, p, 1), 1);
    EXPECT_EQ(cuMemHostGetDevicePointer_v2(nullptr, p, 0), 1);
    EXPECT_EQ(cuMemHostGetDevicePointer_v2(&d, p + page(), 0), 1);  // just past the end
    unsigned flags = 0;
    EXPECT_EQ(cuMemHostGetFlags(&flags, p + page()), 1);
    EXPECT_EQ(cuMemHostGetFlags(nullptr, p), 1);
    ASSERT_EQ(cuMemHostUnregister(p), 0);
    EXPECT_EQ(cuMemHostGetDevicePointer_v2(&d, p, 0), 1);
    EXPECT_EQ(cuMemHostGetFlags(&flags, p), 1);
}

// Rule: cuGetErrorName/String: CUDA's names; unknown code -> 1 and NULL; NULL out -> 1.
TEST_F(CudaDouble, ErrorNamesAndStrings) {
    const char* text = nullptr;
    EXPECT_EQ(cuGetErrorName(712, &text), 0);
    EXPECT_STREQ(text, "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED");
    EXPECT_EQ(cuGetErrorName(713, &text), 0);
    EXPECT_STREQ(text, "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED");
    EXPECT_EQ(cuGetErrorName(201, &text), 0);
    EXPECT_STREQ(text, "CUDA_ERROR_INVALID_CONTEXT");
    EXPECT_EQ(cuGetErrorString(1, &text), 0);
    EXPECT_STREQ(text, "invalid argument");
    EXPECT_EQ(cuGetErrorName(123456, &text), 1);
    EXPECT_EQ(text, nullptr);
    text = "x";
    EXPECT_EQ(cuGetErrorString(123456, &text), 1);
    EXPECT_EQ(text, nullptr);
    EXPECT_EQ(cuGetErrorName(0, nullptr), 1);
}

// Inspection API: calls per symbol, the raw flags of the last register call (even a
// rejected one), live registrations; reset zeroes counters but keeps registrations.
TEST_F(CudaDouble, InspectionApiRecordsCalls) {
    ASSERT_NO_FATAL_FAILURE(init_and_push());
    Mapping m(Bytes{page()});
    EXPECT_EQ(lib_->calls("cuInit"), 1);
    EXPECT_EQ(lib_->calls("cuCtxPushCurrent_v2"), 1);
    EXPECT_EQ(lib_->calls("cuMemHostRegister_v2"), 0);
    EXPECT_EQ(cuMemHostRegister_v2(m.get(), page(), 0x30), 1);
    EXPECT_EQ(lib_->last_flags(), 0x30u);
    ASSERT_EQ(cuMemHostRegister_v2(m.get(), page(), 0x3), 0);
    EXPECT_EQ(lib_->last_flags(), 0x3u);
    EXPECT_EQ(lib_->calls("cuMemHostRegister_v2"), 2);
    EXPECT_EQ(lib_->calls(nullptr), 5);  // cuInit, Retain, Push, 2 x register
    EXPECT_EQ(lib_->flags_log(), (std::vector<unsigned>{0x30, 0x3}));
    EXPECT_EQ(lib_->live(), 1);
    EXPECT_EQ(lib_->kind(m.get()), "");
    lib_->reset();
    EXPECT_EQ(lib_->calls("cuInit"), 0);
    EXPECT_EQ(lib_->calls("cuMemHostRegister_v2"), 0);
    EXPECT_EQ(lib_->last_flags(), 0u);
    EXPECT_TRUE(lib_->flags_log().empty());
    EXPECT_EQ(lib_->live(), 1);  // kept
    ASSERT_EQ(cuMemHostUnregister(m.get()), 0);
    EXPECT_EQ(lib_->calls("cuMemHostUnregister"), 1);
    EXPECT_EQ(lib_->kind(m.get()), "<unregistered>");
}

// Rule: the registry is thread-safe and its page bookkeeping holds under concurrency:
// 8 threads register and unregister interleaved slices that share edge pages; at every
// quiescent point VmLck is exactly the pages covered.
TEST_F(CudaDouble, ConcurrentRegistrationsKeepLocksExact) {
    ASSERT_NO_FATAL_FAILURE(init_and_push());
    constexpr int kThreads = 8, kSlices = 64, kRounds = 30;
    Mapping m(Bytes{(kSlices + 1) * page()});
    auto slice = [&](int i) { return m.get() + page() / 2 + static_cast<size_t>(i) * page(); };
    std::vector<int> failures(kThreads, 0);
    auto phase = [&](bool reg) {
        std::vector<std::thread> threads;
        for (int t = 0; t < kThreads; ++t)
            threads.emplace_back([&, t] {
                cuCtxSetCurrent(ctx_);
                for (int i = t; i < kSlices; i += kThreads) {  // neighbours: other threads
                    CUresult r = reg ? cuMemHostRegister_v2(slice(i), page(), 0) : cuMemHostUnregister(slice(i));
                    if (r != 0) ++failures[static_cast<size_t>(t)];
                }
            });
        for (std::thread& th : threads)
            th.join();
    };
    for (int round = 0; round < kRounds; ++round) {
        phase(true);
        ASSERT_EQ(lib_->live(), kSlices);
        ASSERT_EQ(locked_kb(), pages_kb(kSlices + 1)) << "round " << round;
        phase(false);
        ASSERT_EQ(lib_->live(), 0);
        ASSERT_EQ(locked_kb(), 0) << "round " << round;
    }
    for (int f : failures)
        EXPECT_EQ(f, 0);
}

}  // namespace
