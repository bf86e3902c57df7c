// test_doubles.cpp: checks that each vendor TEST DOUBLE enforces the rules it promises
// (vendor-abi.md and the header comment of each double), by calling its exported C ABI
// through dlopen/dlsym exactly as a hostreg backend would.
//
// Every test gets a FRESH instance of its double: the library at its absolute build path
// (HOSTREG_DOUBLE_*_PATH, from CMake) is copied to a private temporary file and dlopened
// from there, so each test starts with the double not initialized, no contexts, no
// registrations and zero counters, whether ctest runs the tests one per process or the
// binary runs them all in one. The export test opens the build paths themselves.
//
// Real locking is checked with the kernel's own count, VmLck in /proc/self/status.
#include <dlfcn.h>
#include <elf.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

// ---------------------------------------------------------------------------------------
// Memory helpers

size_t page() {
    static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return p;
}

// The kernel's count of this process's locked memory, in kB.
long vmlck_kb() {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line))
        if (line.rfind("VmLck:", 0) == 0) return std::stol(line.substr(6));
    return -1;
}

long pages_kb(size_t n) { return static_cast<long>(n * page() / 1024); }

// A private anonymous mapping of `bytes` whose start (get()) is aligned to `align` (a power
// of two, at least a page), unmapped on destruction.
class Mapping {
public:
    explicit Mapping(size_t bytes, size_t align = 0) : len_(bytes + align) {
        void* p = mmap(nullptr, len_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        raw_ = (p == MAP_FAILED) ? nullptr : static_cast<char*>(p);
        uintptr_t a = reinterpret_cast<uintptr_t>(raw_);
        if (raw_ && align) a = (a + align - 1) & ~(uintptr_t{align} - 1);
        base_ = reinterpret_cast<char*>(a);
    }
    ~Mapping() {
        if (raw_) munmap(raw_, len_);
    }
    Mapping(const Mapping&) = delete;
    Mapping& operator=(const Mapping&) = delete;
    char* get() const { return base_; }

private:
    size_t len_;
    char* raw_;
    char* base_;
};

// Three pages with the middle one unmapped: mlock of the whole range fails (ENOMEM).
class Holey {
public:
    Holey() : map_(3 * page()) {
        if (map_.get()) munmap(map_.get() + page(), page());
    }
    char* get() const { return map_.get(); }
    size_t size() const { return 3 * page(); }

private:
    Mapping map_;
};

// ---------------------------------------------------------------------------------------
// Loading doubles

// A fresh instance of the double at `path` (see the header comment). The copy goes to
// $TMPDIR (or /tmp), else, where that is not usable (e.g. mounted noexec), beside the
// original. Never unloaded.
class Lib {
public:
    explicit Lib(const std::string& path) {
        std::ifstream in(path, std::ios::binary);
        const std::string image((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        if (image.empty()) {
            error_ = "cannot read " + path;
            return;
        }
        const char* tmp = getenv("TMPDIR");
        const std::string beside = path.substr(0, path.rfind('/'));
        for (const std::string& parent : {std::string(tmp && *tmp ? tmp : "/tmp"), beside}) {
            if (load_copy(image, parent, path.substr(path.rfind('/') + 1))) return;
        }
    }
    bool loaded() const { return handle_ != nullptr; }
    const std::string& error() const { return error_; }
    void* sym(const char* name) const { return handle_ ? dlsym(handle_, name) : nullptr; }

    // The inspection API every double exports.
    long calls(const char* symbol) const {
        return reinterpret_cast<long (*)(const char*)>(sym("hostreg_double_calls"))(symbol);
    }
    unsigned last_flags() const {
        return reinterpret_cast<unsigned (*)()>(sym("hostreg_double_last_flags"))();
    }
    long live() const { return reinterpret_cast<long (*)()>(sym("hostreg_double_live"))(); }
    void reset() const { reinterpret_cast<void (*)()>(sym("hostreg_double_reset"))(); }
    std::vector<unsigned> flags_log() const {
        auto fn = reinterpret_cast<long (*)(unsigned*, long)>(sym("hostreg_double_flags_log"));
        std::vector<unsigned> out(static_cast<size_t>(fn(nullptr, 0)));
        fn(out.data(), static_cast<long>(out.size()));
        return out;
    }
    std::string kind(const void* p) const {
        const char* k = reinterpret_cast<const char* (*)(const void*)>(sym("hostreg_double_kind"))(p);
        return k ? k : "<unregistered>";
    }

private:
    // Writes image to <parent>/hostreg_double_XXXXXX/<name>, dlopens it, removes the file.
    bool load_copy(const std::string& image, const std::string& parent, const std::string& name) {
        std::string dir = parent + "/hostreg_double_XXXXXX";
        if (!mkdtemp(&dir[0])) {
            error_ += "cannot make a directory in " + parent + "; ";
            return false;
        }
        const std::string copy = dir + "/" + name;
        {
            std::ofstream out(copy, std::ios::binary);
            out.write(image.data(), static_cast<std::streamsize>(image.size()));
        }
        handle_ = dlopen(copy.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!handle_) error_ += std::string(dlerror()) + "; ";
        unlink(copy.c_str());
        rmdir(dir.c_str());
        return handle_ != nullptr;
    }

    void* handle_ = nullptr;
    std::string error_;
};

// Loads the function `name` of the fixture's `lib_` into the member of the same name.
#define LOAD(name)                                                            \
    do {                                                                      \
        name = reinterpret_cast<decltype(name)>(lib_->sym(#name));            \
        ASSERT_NE(reinterpret_cast<void*>(name), nullptr) << #name " missing"; \
    } while (0)

const char* const kKnobs[] = {"HOSTREG_DOUBLE_DEVICES", "HOSTREG_DOUBLE_STUB",
                              "HOSTREG_DOUBLE_NO_READONLY"};

// Common fixture: a fresh double, knobs unset, the VmLck baseline, and at the end the
// promise that the test left no registration (and so no lock) behind.
class DoubleTest : public ::testing::Test {
protected:
    void open(const char* path) {
        for (const char* knob : kKnobs) unsetenv(knob);
        lib_ = std::make_unique<Lib>(path);
        ASSERT_TRUE(lib_->loaded()) << lib_->error();
        vmlck0_ = vmlck_kb();
        ASSERT_GE(vmlck0_, 0);
    }
    void TearDown() override {
        if (lib_ && lib_->loaded()) {
            EXPECT_EQ(lib_->live(), 0) << "test left registrations behind";
        }
        for (const char* knob : kKnobs) unsetenv(knob);
    }
    long locked_kb() const { return vmlck_kb() - vmlck0_; }

    std::unique_ptr<Lib> lib_;
    long vmlck0_ = 0;
};

// ---------------------------------------------------------------------------------------
// Exports: each double exports exactly the vendor functions it promises plus the
// inspection API (-fvisibility=hidden everywhere else), read from the ELF dynamic symbol
// table of the built library.

std::set<std::string> defined_exports(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::string image((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::set<std::string> out;
    if (image.size() < sizeof(Elf64_Ehdr)) return out;
    const char* data = image.data();
    const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(data);
    const auto* sh = reinterpret_cast<const Elf64_Shdr*>(data + eh->e_shoff);
    for (int i = 0; i < eh->e_shnum; ++i) {
        if (sh[i].sh_type != SHT_DYNSYM) continue;
        const char* names = data + sh[sh[i].sh_link].sh_offset;
        const auto* syms = reinterpret_cast<const Elf64_Sym*>(data + sh[i].sh_offset);
        const size_t n = sh[i].sh_size / sizeof(Elf64_Sym);
        for (size_t k = 1; k < n; ++k) {
            const int bind = ELF64_ST_BIND(syms[k].st_info);
            if (syms[k].st_shndx == SHN_UNDEF || (bind != STB_GLOBAL && bind != STB_WEAK)) continue;
            out.insert(names + syms[k].st_name);
        }
    }
    return out;
}

const std::vector<std::string> kInspection = {
    "hostreg_double_calls", "hostreg_double_last_flags", "hostreg_double_live",
    "hostreg_double_reset", "hostreg_double_flags_log",  "hostreg_double_kind"};

void expect_exports(const char* path, std::vector<std::string> vendor) {
    vendor.insert(vendor.end(), kInspection.begin(), kInspection.end());
    const std::set<std::string> expected(vendor.begin(), vendor.end());
    EXPECT_EQ(defined_exports(path), expected) << path;
    void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);  // the build path itself
    ASSERT_NE(h, nullptr) << dlerror();
    for (const std::string& name : expected) EXPECT_NE(dlsym(h, name.c_str()), nullptr) << name;
}

TEST(DoubleExports, CudaDriver) {
    expect_exports(HOSTREG_DOUBLE_CUDA_PATH,
                   {"cuInit", "cuDriverGetVersion", "cuDeviceGetCount", "cuDeviceGet",
                    "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRelease_v2", "cuCtxGetCurrent",
                    "cuCtxSetCurrent", "cuCtxPushCurrent_v2", "cuCtxPopCurrent_v2", "cuCtxGetDevice",
                    "cuMemHostRegister_v2", "cuMemHostUnregister", "cuMemHostGetDevicePointer_v2",
                    "cuMemHostGetFlags", "cuGetErrorName", "cuGetErrorString"});
}

TEST(DoubleExports, Hip) {
    expect_exports(HOSTREG_DOUBLE_HIP_PATH,
                   {"hipGetDeviceCount", "hipRuntimeGetVersion", "hipDriverGetVersion",
                    "hipHostRegister", "hipHostUnregister", "hipHostGetDevicePointer",
                    "hipHostGetFlags", "hipGetErrorName", "hipGetErrorString"});
}

const std::vector<std::string> kAclV1Symbols = {
    "aclInit", "aclFinalize", "aclrtSetDevice", "aclrtResetDevice", "aclrtGetDevice",
    "aclrtGetDeviceCount", "aclrtHostRegister", "aclrtHostGetDevicePointer",
    "aclrtHostUnregister", "aclGetRecentErrMsg", "aclrtGetVersion"};

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

TEST(DoubleExports, Musa) {
    expect_exports(HOSTREG_DOUBLE_MUSA_PATH,
                   {"musaGetDeviceCount", "musaRuntimeGetVersion", "musaHostRegister",
                    "musaHostUnregister", "musaHostGetDevicePointer", "musaHostGetFlags",
                    "musaGetErrorName", "musaGetErrorString"});
}

// =======================================================================================
// CUDA driver double

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
    Mapping m(page());
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
    Mapping m(page());
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
    Mapping m(page());
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
    Mapping m(page());
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
    Mapping m(page());
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
    Mapping m(page());
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
    Mapping m(page());
    EXPECT_EQ(cuMemHostRegister_v2(m.get(), page(), 0x8), 801);
    EXPECT_EQ(cuMemHostRegister_v2(m.get(), page(), 0x9), 801);
    ASSERT_EQ(cuMemHostRegister_v2(m.get(), page(), 0x1), 0);
    ASSERT_EQ(cuMemHostUnregister(m.get()), 0);
}

// Rule: any byte in common with a live registration -> 712; touching ranges are fine.
TEST_F(CudaDouble, AnyOverlapIsAlreadyRegistered) {
    ASSERT_NO_FATAL_FAILURE(init_and_push());
    Mapping m(5 * page());
    char* p = m.get();
    const size_t pg = page();
    ASSERT_EQ(cuMemHostRegister_v2(p + pg, 2 * pg, 0), 0);  // [1, 3) pages
    EXPECT_EQ(cuMemHostRegister_v2(p + pg, 2 * pg, 0), 712);       // exact repeat
    EXPECT_EQ(cuMemHostRegister_v2(p + pg, 1, 0), 712);            // same base, shorter
    EXPECT_EQ(cuMemHostRegister_v2(p, pg + 1, 0), 712);            // front overlap
    EXPECT_EQ(cuMemHostRegister_v2(p + 3 * pg - 1, pg, 0), 712);   // back overlap
    EXPECT_EQ(cuMemHostRegister_v2(p + pg + 10, 10, 0), 712);      // inside
    EXPECT_EQ(cuMemHostRegister_v2(p, 5 * pg, 0), 712);            // containing
    EXPECT_EQ(lib_->live(), 1);
    ASSERT_EQ(cuMemHostRegister_v2(p, pg, 0), 0);           // touching below
    ASSERT_EQ(cuMemHostRegister_v2(p + 3 * pg, pg, 0), 0);  // touching above
    EXPECT_EQ(lib_->live(), 3);
    for (char* base : {p, p + pg, p + 3 * pg}) ASSERT_EQ(cuMemHostUnregister(base), 0);
}

// Rule: unregister needs the exact base of a live registration, else 713.
TEST_F(CudaDouble, UnregisterNeedsTheExactBase) {
    ASSERT_NO_FATAL_FAILURE(init_and_push());
    Mapping m(2 * page());
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
    Mapping m(16 * page());
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
    Mapping m(3 * page());
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
    Mapping m(2 * page());
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
    Mapping m(page());
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
    Mapping m((kSlices + 1) * page());
    auto slice = [&](int i) { return m.get() + page() / 2 + static_cast<size_t>(i) * page(); };
    std::vector<int> failures(kThreads, 0);
    auto phase = [&](bool reg) {
        std::vector<std::thread> threads;
        for (int t = 0; t < kThreads; ++t)
            threads.emplace_back([&, t] {
                cuCtxSetCurrent(ctx_);
                for (int i = t; i < kSlices; i += kThreads) {  // neighbours: other threads
                    CUresult r = reg ? cuMemHostRegister_v2(slice(i), page(), 0)
                                     : cuMemHostUnregister(slice(i));
                    if (r != 0) ++failures[static_cast<size_t>(t)];
                }
            });
        for (std::thread& th : threads) th.join();
    };
    for (int round = 0; round < kRounds; ++round) {
        phase(true);
        ASSERT_EQ(lib_->live(), kSlices);
        ASSERT_EQ(locked_kb(), pages_kb(kSlices + 1)) << "round " << round;
        phase(false);
        ASSERT_EQ(lib_->live(), 0);
        ASSERT_EQ(locked_kb(), 0) << "round " << round;
    }
    for (int f : failures) EXPECT_EQ(f, 0);
}

// =======================================================================================
// HIP double

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
// from the memory calls.
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
    Mapping m(page());
    void* d = nullptr;
    unsigned flags = 0;
    EXPECT_EQ(hipHostRegister(m.get(), page(), 0), 100);
    EXPECT_EQ(hipHostUnregister(m.get()), 100);
    EXPECT_EQ(hipHostGetDevicePointer(&d, m.get(), 0), 100);
    EXPECT_EQ(hipHostGetFlags(&flags, m.get()), 100);
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

// Rule: only 0x1|0x2|0x4|0x8|0x80000000 are known (else 1); IoMemory 0x4 -> 1; NULL,
// 0 bytes, a wrapping range -> 1.
TEST_F(HipDouble, RegisterValidatesArgumentsAndFlags) {
    Mapping m(page());
    EXPECT_EQ(hipHostRegister(m.get(), page(), 0x10), 1);
    EXPECT_EQ(hipHostRegister(m.get(), page(), 0x40000000), 1);
    EXPECT_EQ(hipHostRegister(m.get(), page(), 0x4), 1);
    EXPECT_EQ(hipHostRegister(m.get(), page(), 0x6), 1);
    EXPECT_EQ(hipHostRegister(nullptr, page(), 0), 1);
    EXPECT_EQ(hipHostRegister(m.get(), 0, 0), 1);
    EXPECT_EQ(hipHostRegister(reinterpret_cast<void*>(UINTPTR_MAX - 100), 1000, 0), 1);
    EXPECT_EQ(lib_->live(), 0);
    for (unsigned flags : {0x0u, 0x1u, 0x2u, 0x3u, 0x8u, 0xBu, 0x80000000u, 0x80000003u}) {
        ASSERT_EQ(hipHostRegister(m.get(), page(), flags), 0) << std::hex << flags;
        unsigned got = 0;
        EXPECT_EQ(hipHostGetFlags(&got, m.get()), 0);
        EXPECT_EQ(got, flags);
        ASSERT_EQ(hipHostUnregister(m.get()), 0);
    }
}

// Rule: ReadOnly 0x8 is accepted but recorded as coarse-grained; the raw flags of every
// hipHostRegister call reach the recorder unchanged.
TEST_F(HipDouble, ReadOnlyIsRecordedAsCoarseGrained) {
    Mapping m(2 * page());
    char* a = m.get();
    char* b = m.get() + page();
    EXPECT_EQ(hipHostRegister(a, page(), 0x4), 1);
    ASSERT_EQ(hipHostRegister(a, page(), 0x8), 0);
    ASSERT_EQ(hipHostRegister(b, page(), 0x2), 0);
    EXPECT_EQ(lib_->kind(a + 10), "coarse-grained");
    EXPECT_EQ(lib_->kind(b), "fine-grained");
    EXPECT_EQ(lib_->last_flags(), 0x2u);
    EXPECT_EQ(lib_->flags_log(), (std::vector<unsigned>{0x4, 0x8, 0x2}));
    EXPECT_EQ(lib_->calls("hipHostRegister"), 3);
    ASSERT_EQ(hipHostUnregister(a), 0);
    ASSERT_EQ(hipHostUnregister(b), 0);
}

// Rule: overlap -> 712, unknown pointer on unregister -> 713.
TEST_F(HipDouble, OverlapAndUnknownPointer) {
    Mapping m(3 * page());
    char* p = m.get();
    ASSERT_EQ(hipHostRegister(p + page(), page(), 0), 0);
    EXPECT_EQ(hipHostRegister(p + page(), page(), 0), 712);
    EXPECT_EQ(hipHostRegister(p, page() + 1, 0), 712);
    EXPECT_EQ(hipHostRegister(p + 2 * page() - 1, 10, 0), 712);
    EXPECT_EQ(hipHostUnregister(p), 713);
    EXPECT_EQ(hipHostUnregister(p + page() + 1), 713);
    ASSERT_EQ(hipHostUnregister(p + page()), 0);
    EXPECT_EQ(hipHostUnregister(p + page()), 713);
}

// Rule: real locking, VmLck; shared edge pages survive a neighbour's unregister.
TEST_F(HipDouble, RegisterReallyLocksPages) {
    Mapping m(8 * page());
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

// Rule: mlock failure -> hipErrorOutOfMemory (2), nothing left behind.
TEST_F(HipDouble, MlockFailureIsOutOfMemory) {
    Holey h;
    EXPECT_EQ(hipHostRegister(h.get(), h.size(), 0), 2);
    EXPECT_EQ(lib_->live(), 0);
    EXPECT_EQ(locked_kb(), 0);
}

// Rule: device pointer = host + 0x200000000000; flags != 0, NULL out, unregistered -> 1.
TEST_F(HipDouble, DevicePointerIsNotTheHostAddress) {
    Mapping m(2 * page());
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

// =======================================================================================
// AscendCL doubles

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

// Rule: aclInit answers 0 the first time and 100002 after; aclFinalize undoes it.
TEST_F(AclDouble, InitOnceThenRepeatInitialize) {
    EXPECT_EQ(aclFinalize(), 100001);
    EXPECT_EQ(aclInit(nullptr), 0);
    EXPECT_EQ(aclInit(nullptr), 100002);
    EXPECT_EQ(aclInit("/nonexistent.json"), 100002);
    EXPECT_EQ(aclFinalize(), 0);
    EXPECT_EQ(aclInit(nullptr), 0);
}

// Rule: aclrtSetDevice: 100001 before aclInit; 100000 for a bad id; sets this thread's
// context, which aclrtGetDevice reports (107002 without one).
TEST_F(AclDouble, SetDeviceNeedsInitAndAValidId) {
    setenv("HOSTREG_DOUBLE_DEVICES", "2", 1);
    int32_t dev = -1;
    EXPECT_EQ(aclrtSetDevice(0), 100001);
    EXPECT_EQ(aclrtGetDevice(&dev), 107002);
    ASSERT_EQ(aclInit(nullptr), 0);
    EXPECT_EQ(aclrtGetDevice(&dev), 107002);
    EXPECT_EQ(aclrtSetDevice(2), 100000);
    EXPECT_EQ(aclrtSetDevice(-1), 100000);
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

// Rule: every memory call needs a current context on the calling thread, else 107002:
// before SetDevice, on another thread, after ResetDevice, after aclFinalize.
TEST_F(AclDouble, MemoryCallsNeedACurrentContext) {
    Mapping m(k64K, k64K);
    void* d = nullptr;
    auto all_107002 = [&](const char* when) {
        EXPECT_EQ(aclrtHostRegister(m.get(), k64K, 0, &d), 107002) << when;
        EXPECT_EQ(aclrtHostRegisterV2(m.get(), k64K, kPinned), 107002) << when;
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

// Rule: NULL pointer or size 0 -> 100000 (and NULL devPtr for V1, NULL out pointers).
TEST_F(AclDouble, NullPointerOrSizeZeroIsInvalidParam) {
    ASSERT_NO_FATAL_FAILURE(init_and_set());
    Mapping m(k64K, k64K);
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

// Rule: the V2 flag must be non-zero with only MAPPED|IOMEMORY|READONLY|PINNED (else
// 107000); IOMEMORY and READONLY are reserved (207000). CUDA's Default (0) is refused.
TEST_F(AclDouble, RegisterV2ValidatesTheFlag) {
    ASSERT_NO_FATAL_FAILURE(init_and_set());
    Mapping m(k64K, k64K);
    EXPECT_EQ(aclrtHostRegisterV2(m.get(), k64K, 0), 107000);
    EXPECT_EQ(aclrtHostRegisterV2(m.get(), k64K, 0x1), 107000);  // CUDA's Portable
    EXPECT_EQ(aclrtHostRegisterV2(m.get(), k64K, 0x20000000), 107000);
    EXPECT_EQ(aclrtHostRegisterV2(m.get(), k64K, kPinned | 0x1), 107000);
    EXPECT_EQ(aclrtHostRegisterV2(m.get(), k64K, kIoMemory), 207000);
    EXPECT_EQ(aclrtHostRegisterV2(m.get(), k64K, kReadOnly), 207000);
    EXPECT_EQ(aclrtHostRegisterV2(m.get(), k64K, kPinned | kReadOnly), 207000);
    EXPECT_EQ(aclrtHostRegisterV2(m.get(), k64K, kMapped | kIoMemory), 207000);
    EXPECT_EQ(lib_->live(), 0);
    for (uint32_t flag : {kMapped, kPinned, kPinned | kMapped}) {
        ASSERT_EQ(aclrtHostRegisterV2(m.get(), k64K, flag), 0) << std::hex << flag;
        EXPECT_EQ(lib_->last_flags(), flag);
        ASSERT_EQ(aclrtHostUnregister(m.get()), 0);
    }
    EXPECT_EQ(lib_->kind(m.get()), "<unregistered>");
}

// Rule: the V1 type must be ACL_HOST_REGISTER_MAPPED (0); others, IOMEMORY/READONLY
// included, -> 207000; the raw type is recorded.
TEST_F(AclDouble, RegisterV1TypeMustBeMapped) {
    ASSERT_NO_FATAL_FAILURE(init_and_set());
    Mapping m(k64K, k64K);
    void* d = nullptr;
    for (int type : {1, 2, 4, 8, -1}) {
        EXPECT_EQ(aclrtHostRegister(m.get(), k64K, type, &d), 207000) << type;
        EXPECT_EQ(lib_->last_flags(), static_cast<unsigned>(type));
    }
    EXPECT_EQ(lib_->live(), 0);
}

// Rule: V1 needs a 64 KiB aligned pointer (else 107008) and returns the device pointer,
// host + 0x300000000000. The size need not be aligned.
TEST_F(AclDouble, RegisterV1Needs64KiBAlignment) {
    ASSERT_NO_FATAL_FAILURE(init_and_set());
    Mapping m(2 * k64K, k64K);
    void* d = nullptr;
    EXPECT_EQ(aclrtHostRegister(m.get() + page(), page(), 0, &d), 107008);  // page-aligned only
    EXPECT_EQ(aclrtHostRegister(m.get() + 1, 100, 0, &d), 107008);
    EXPECT_EQ(d, nullptr);
    ASSERT_EQ(aclrtHostRegister(m.get(), 100, 0, &d), 0);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(d), reinterpret_cast<uintptr_t>(m.get()) + kAclOffset);
    EXPECT_EQ(lib_->kind(m.get()), "mapped");
    ASSERT_EQ(aclrtHostUnregister(m.get()), 0);
}

// Rule: V2 with PINNED accepts any alignment; MAPPED alone needs a page-aligned pointer.
TEST_F(AclDouble, RegisterV2AlignmentDependsOnPinned) {
    ASSERT_NO_FATAL_FAILURE(init_and_set());
    Mapping m(2 * k64K, k64K);
    char* odd = m.get() + 1;
    char* paged = m.get() + k64K + page();  // page-aligned, not 64 KiB aligned
    EXPECT_EQ(aclrtHostRegisterV2(odd, 100, kMapped), 107008);
    ASSERT_EQ(aclrtHostRegisterV2(odd, 100, kPinned), 0);
    EXPECT_EQ(lib_->kind(odd), "pinned");
    ASSERT_EQ(aclrtHostUnregister(odd), 0);
    ASSERT_EQ(aclrtHostRegisterV2(odd, 100, kPinned | kMapped), 0);
    EXPECT_EQ(lib_->kind(odd), "pinned+mapped");
    ASSERT_EQ(aclrtHostUnregister(odd), 0);
    ASSERT_EQ(aclrtHostRegisterV2(paged, 100, kMapped), 0);
    EXPECT_EQ(lib_->kind(paged), "mapped");
    ASSERT_EQ(aclrtHostUnregister(paged), 0);
}

// Rule: any overlap with a live registration, V1 or V2, -> 507910; unregister of anything
// but a live base -> 507911.
TEST_F(AclDouble, OverlapAndUnknownPointer) {
    ASSERT_NO_FATAL_FAILURE(init_and_set());
    Mapping m(2 * k64K, k64K);
    char* p = m.get();
    void* d = nullptr;
    ASSERT_EQ(aclrtHostRegister(p, k64K, 0, &d), 0);
    EXPECT_EQ(aclrtHostRegister(p, k64K, 0, &d), 507910);
    EXPECT_EQ(aclrtHostRegisterV2(p, 10, kPinned), 507910);
    EXPECT_EQ(aclrtHostRegisterV2(p + k64K - 1, 10, kPinned), 507910);
    EXPECT_EQ(aclrtHostRegisterV2(p + page(), page(), kMapped), 507910);
    ASSERT_EQ(aclrtHostRegisterV2(p + k64K, 10, kPinned), 0);  // touching
    EXPECT_EQ(aclrtHostRegister(p + k64K, 10, 0, &d), 507910);
    EXPECT_EQ(aclrtHostUnregister(p + 1), 507911);
    EXPECT_EQ(aclrtHostUnregister(p + k64K + 1), 507911);
    ASSERT_EQ(aclrtHostUnregister(p), 0);
    ASSERT_EQ(aclrtHostUnregister(p + k64K), 0);
    EXPECT_EQ(aclrtHostUnregister(p), 507911);
}

// Rule: aclrtHostGetDevicePointer works only inside MAPPED registrations (V1, or V2 with
// 0x2); flag != 0 -> 100000; unregistered or PINNED-only -> 107000.
TEST_F(AclDouble, DevicePointerOnlyForMappedRegistrations) {
    ASSERT_NO_FATAL_FAILURE(init_and_set());
    Mapping m(3 * k64K, k64K);
    char* v1 = m.get();
    char* v2_mapped = m.get() + k64K;
    char* v2_pinned = m.get() + 2 * k64K + 3;
    void* d = nullptr;
    ASSERT_EQ(aclrtHostRegister(v1, 100, 0, &d), 0);
    ASSERT_EQ(aclrtHostRegisterV2(v2_mapped, 100, kMapped), 0);
    ASSERT_EQ(aclrtHostRegisterV2(v2_pinned, 100, kPinned), 0);

    ASSERT_EQ(aclrtHostGetDevicePointer(v1 + 10, &d, 0), 0);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(d), reinterpret_cast<uintptr_t>(v1) + 10 + kAclOffset);
    ASSERT_EQ(aclrtHostGetDevicePointer(v2_mapped, &d, 0), 0);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(d), reinterpret_cast<uintptr_t>(v2_mapped) + kAclOffset);
    EXPECT_EQ(aclrtHostGetDevicePointer(v2_pinned, &d, 0), 107000);
    EXPECT_EQ(aclrtHostGetDevicePointer(v1 + 100, &d, 0), 107000);  // just past the end
    EXPECT_EQ(aclrtHostGetDevicePointer(v1, &d, 1), 100000);

    for (char* p : {v1, v2_mapped, v2_pinned}) ASSERT_EQ(aclrtHostUnregister(p), 0);
    EXPECT_EQ(aclrtHostGetDevicePointer(v1, &d, 0), 107000);
}

// Rule: mlock failure -> RT_MEMORY_ALLOCATION (207001), nothing left behind.
TEST_F(AclDouble, MlockFailureIsMemoryAllocation) {
    ASSERT_NO_FATAL_FAILURE(init_and_set());
    Holey h;
    EXPECT_EQ(aclrtHostRegisterV2(h.get(), h.size(), kPinned), 207001);
    EXPECT_EQ(lib_->live(), 0);
    EXPECT_EQ(locked_kb(), 0);
}

// Rule: real locking (VmLck), V1 and V2, including a page shared by two PINNED ranges.
TEST_F(AclDouble, RegisterReallyLocksPages) {
    ASSERT_NO_FATAL_FAILURE(init_and_set());
    Mapping m(k64K, k64K);
    void* d = nullptr;
    ASSERT_EQ(aclrtHostRegister(m.get(), k64K, 0, &d), 0);
    EXPECT_EQ(locked_kb(), static_cast<long>(k64K / 1024));
    ASSERT_EQ(aclrtHostUnregister(m.get()), 0);
    EXPECT_EQ(locked_kb(), 0);

    char* a = m.get() + 100;           // pages 0, 1
    char* b = m.get() + page() + 200;  // pages 1, 2
    ASSERT_EQ(aclrtHostRegisterV2(a, page(), kPinned), 0);
    ASSERT_EQ(aclrtHostRegisterV2(b, page(), kPinned), 0);
    EXPECT_EQ(locked_kb(), pages_kb(3));
    ASSERT_EQ(aclrtHostUnregister(a), 0);
    EXPECT_EQ(locked_kb(), pages_kb(2));
    ASSERT_EQ(aclrtHostUnregister(b), 0);
    EXPECT_EQ(locked_kb(), 0);
}

// Rule: every failure sets the calling thread's aclGetRecentErrMsg text (NULL before any
// failure); the text names the code. Another thread has its own.
TEST_F(AclDouble, EveryFailureSetsTheRecentErrorMessage) {
    EXPECT_EQ(aclGetRecentErrMsg(), nullptr);
    Mapping m(2 * k64K, k64K);
    void* d = nullptr;
    int32_t dev = 0;
    std::vector<std::pair<int, std::function<int()>>> failing = {
        {100001, [&] { return aclrtSetDevice(0); }},
        {107002, [&] { return aclrtGetDevice(&dev); }},
        {107002, [&] { return aclrtHostRegisterV2(m.get(), page(), kPinned); }},
        {0, [&] { return aclInit(nullptr); }},
        {100002, [&] { return aclInit(nullptr); }},
        {100000, [&] { return aclrtSetDevice(9); }},
        {0, [&] { return aclrtSetDevice(0); }},
        {100000, [&] { return aclrtHostRegister(nullptr, 1, 0, &d); }},
        {207000, [&] { return aclrtHostRegister(m.get(), k64K, 4, &d); }},
        {107008, [&] { return aclrtHostRegister(m.get() + page(), page(), 0, &d); }},
        {107000, [&] { return aclrtHostRegisterV2(m.get(), page(), 0); }},
        {207000, [&] { return aclrtHostRegisterV2(m.get(), page(), kReadOnly); }},
        {107008, [&] { return aclrtHostRegisterV2(m.get() + 1, page(), kMapped); }},
        {0, [&] { return aclrtHostRegisterV2(m.get(), page(), kPinned); }},
        {507910, [&] { return aclrtHostRegisterV2(m.get(), page(), kPinned); }},
        {107000, [&] { return aclrtHostGetDevicePointer(m.get(), &d, 0); }},
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
            EXPECT_NE(recent().find(std::to_string(want)), std::string::npos)
                << "step " << i << ": " << recent();
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
    Mapping m(k64K, k64K);
    void* d = nullptr;
    EXPECT_EQ(aclrtHostRegister(m.get() + page(), page(), 0, &d), 107008);
    EXPECT_EQ(aclrtHostRegister(m.get(), k64K, 8, &d), 207000);
    ASSERT_EQ(aclrtHostRegister(m.get(), k64K, 0, &d), 0);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(d), reinterpret_cast<uintptr_t>(m.get()) + kAclOffset);
    EXPECT_EQ(locked_kb(), static_cast<long>(k64K / 1024));
    EXPECT_EQ(aclrtHostRegister(m.get(), k64K, 0, &d), 507910);
    ASSERT_EQ(aclrtHostGetDevicePointer(m.get() + 5, &d, 0), 0);
    ASSERT_EQ(aclrtHostUnregister(m.get()), 0);
    EXPECT_EQ(aclrtHostUnregister(m.get()), 507911);
    EXPECT_EQ(locked_kb(), 0);
    EXPECT_EQ(lib_->calls("aclrtHostRegister"), 4);
    EXPECT_EQ(lib_->calls("aclrtHostRegisterV2"), 0);
    int32_t major = -1, minor = -1, patch = -1;
    ASSERT_EQ(aclrtGetVersion(&major, &minor, &patch), 0);
    EXPECT_EQ(minor, 10);
}

// =======================================================================================
// MUSA double

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
    Mapping m(page());
    EXPECT_EQ(musaHostRegister(m.get(), page(), 0), 100);
    EXPECT_EQ(musaHostUnregister(m.get()), 100);
    EXPECT_EQ(lib_->live(), 0);
}

// Rule: CUDA's flags (0..0xF accepted, other bits -> 1); NULL, 0 bytes, wrap -> 1.
TEST_F(MusaDouble, RegisterValidatesArgumentsAndFlags) {
    Mapping m(page());
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
    Mapping m(4 * page());
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
    Mapping m(2 * page());
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
