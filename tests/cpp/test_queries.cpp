// test_queries.cpp: the query functions, statistics, error names and the per-thread last
// error of the C ABI (hostreg.h).
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "helpers.hpp"

using namespace hrtest;

namespace {
class Queries : public HostregTest {};
}  // namespace

// Rule: hostregIsRegistered is 1 exactly for bytes inside a live registration.
TEST_F(Queries, IsRegistered) {
    Mapping m(3);
    ASSERT_NE(m.get(), nullptr);
    char* p = m.get() + 50;
    EXPECT_EQ(hostregIsRegistered(p), 0);
    EXPECT_EQ(hostregIsRegistered(nullptr), 0);
    ASSERT_EQ(hostregHostRegister(p, 5000, 0), hostregSuccess);
    EXPECT_EQ(hostregIsRegistered(p), 1);
    EXPECT_EQ(hostregIsRegistered(p + 4999), 1);
    EXPECT_EQ(hostregIsRegistered(p + 5000), 0);
    EXPECT_EQ(hostregIsRegistered(p - 1), 0);
    EXPECT_EQ(hostregIsRegistered(m.get()), 0);  // same page, outside the range
    ASSERT_EQ(hostregHostUnregister(p), hostregSuccess);
    EXPECT_EQ(hostregIsRegistered(p), 0);
}

// Rule: hostregPointerGetRegistration describes the registration containing ptr (posix:
// device_ptr == base, backend "posix"); 713 outside, 1 for a NULL out.
TEST_F(Queries, PointerGetRegistration) {
    Mapping m(4);
    ASSERT_NE(m.get(), nullptr);
    char* p = m.get() + 123;
    const size_t n = 2 * page() + 7;
    const unsigned f = HOSTREG_HOST_REGISTER_PORTABLE | HOSTREG_HOST_REGISTER_READ_ONLY;
    hostregRegistration r{};
    EXPECT_EQ(hostregPointerGetRegistration(p, &r), hostregErrorHostMemoryNotRegistered);
    ASSERT_EQ(hostregHostRegister(p, n, f), hostregSuccess);
    for (char* q : {p, p + 1, p + n / 2, p + n - 1}) {
        r = hostregRegistration{};
        ASSERT_EQ(hostregPointerGetRegistration(q, &r), hostregSuccess);
        EXPECT_EQ(r.base, p);
        EXPECT_EQ(r.bytes, n);
        EXPECT_EQ(r.flags, f);
        EXPECT_EQ(r.device_ptr, p);
        ASSERT_NE(r.backend, nullptr);
        EXPECT_STREQ(r.backend, "posix");
    }
    EXPECT_EQ(hostregPointerGetRegistration(p + n, &r), hostregErrorHostMemoryNotRegistered);
    EXPECT_EQ(hostregPointerGetRegistration(p - 1, &r), hostregErrorHostMemoryNotRegistered);
    EXPECT_EQ(hostregPointerGetRegistration(nullptr, &r), hostregErrorHostMemoryNotRegistered);
    EXPECT_EQ(hostregPointerGetRegistration(p, nullptr), hostregErrorInvalidValue);
    ASSERT_EQ(hostregHostUnregister(p), hostregSuccess);
    EXPECT_EQ(hostregPointerGetRegistration(p, &r), hostregErrorHostMemoryNotRegistered);
}

// Rule: hostregHostGetFlags gives the flags of the containing registration; 1 when
// unregistered or out is NULL.
TEST_F(Queries, HostGetFlags) {
    Mapping m(2);
    ASSERT_NE(m.get(), nullptr);
    char* a = m.get();
    char* b = m.get() + 64;
    unsigned f = 0xdead;
    EXPECT_EQ(hostregHostGetFlags(&f, a), hostregErrorInvalidValue);
    EXPECT_EQ(f, 0xdeadu) << "a failed query must not write *flags";
    ASSERT_EQ(hostregHostRegister(a, 64, HOSTREG_HOST_REGISTER_MAPPED), hostregSuccess);
    ASSERT_EQ(hostregHostRegister(b, 64, HOSTREG_HOST_REGISTER_PORTABLE), hostregSuccess);
    EXPECT_EQ(hostregHostGetFlags(&f, a + 63), hostregSuccess);
    EXPECT_EQ(f, HOSTREG_HOST_REGISTER_MAPPED);
    EXPECT_EQ(hostregHostGetFlags(&f, b), hostregSuccess);
    EXPECT_EQ(f, HOSTREG_HOST_REGISTER_PORTABLE);
    EXPECT_EQ(hostregHostGetFlags(&f, b + 64), hostregErrorInvalidValue);
    EXPECT_EQ(hostregHostGetFlags(nullptr, a), hostregErrorInvalidValue);
    EXPECT_EQ(hostregHostGetFlags(&f, nullptr), hostregErrorInvalidValue);
    EXPECT_EQ(hostregHostUnregister(a), hostregSuccess);
    EXPECT_EQ(hostregHostUnregister(b), hostregSuccess);
    EXPECT_EQ(hostregHostGetFlags(&f, a), hostregErrorInvalidValue);
}

// Rule: hostregHostGetDevicePointer maps any interior address to device_ptr + offset (posix:
// the address itself); 1 for flags != 0, an unregistered pointer, or a NULL out.
TEST_F(Queries, HostGetDevicePointer) {
    Mapping m(3);
    ASSERT_NE(m.get(), nullptr);
    char* p = m.get() + 10;
    const size_t n = 2 * page();
    void* dev = reinterpret_cast<void*>(0x1);
    EXPECT_EQ(hostregHostGetDevicePointer(&dev, p, 0), hostregErrorInvalidValue);
    ASSERT_EQ(hostregHostRegister(p, n, HOSTREG_HOST_REGISTER_MAPPED), hostregSuccess);
    hostregRegistration r{};
    ASSERT_EQ(hostregPointerGetRegistration(p, &r), hostregSuccess);
    for (size_t off : {size_t{0}, size_t{1}, page(), n - 1}) {
        dev = nullptr;
        ASSERT_EQ(hostregHostGetDevicePointer(&dev, p + off, 0), hostregSuccess) << off;
        EXPECT_EQ(dev, static_cast<char*>(r.device_ptr) + off);
        EXPECT_EQ(dev, p + off);
    }
    EXPECT_EQ(hostregHostGetDevicePointer(&dev, p, 1), hostregErrorInvalidValue);
    EXPECT_EQ(hostregHostGetDevicePointer(&dev, p, HOSTREG_HOST_REGISTER_MAPPED), hostregErrorInvalidValue);
    EXPECT_EQ(hostregHostGetDevicePointer(&dev, p + n, 0), hostregErrorInvalidValue);
    EXPECT_EQ(hostregHostGetDevicePointer(&dev, p - 1, 0), hostregErrorInvalidValue);
    EXPECT_EQ(hostregHostGetDevicePointer(nullptr, p, 0), hostregErrorInvalidValue);
    ASSERT_EQ(hostregHostUnregister(p), hostregSuccess);
    EXPECT_EQ(hostregHostGetDevicePointer(&dev, p, 0), hostregErrorInvalidValue);
}

// Rule: hostregListRegistrations copies up to capacity live registrations in address
// order and reports the total; out may be NULL with capacity 0.
TEST_F(Queries, ListRegistrations) {
    Mapping m(6);
    ASSERT_NE(m.get(), nullptr);
    // Registered out of address order on purpose.
    char* bases[] = {m.page_at(4) + 1, m.get() + 5, m.page_at(2), m.get() + 100};
    size_t sizes[] = {page(), 95, 3, page()};
    for (int i = 0; i < 4; ++i)
        ASSERT_EQ(hostregHostRegister(bases[i], sizes[i], unsigned(i) & 3u), hostregSuccess);

    size_t total = 0;
    EXPECT_EQ(hostregListRegistrations(nullptr, 0, &total), 0u);
    EXPECT_EQ(total, 4u);
    EXPECT_EQ(hostregListRegistrations(nullptr, 10, nullptr), 0u);

    hostregRegistration out[6]{};
    total = 0;
    ASSERT_EQ(hostregListRegistrations(out, 6, &total), 4u);
    EXPECT_EQ(total, 4u);
    char* sorted[] = {m.get() + 5, m.get() + 100, m.page_at(2), m.page_at(4) + 1};
    size_t sorted_sizes[] = {95, page(), 3, page()};
    unsigned sorted_flags[] = {1, 3, 2, 0};
    for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(out[i].base, sorted[i]) << i;
        EXPECT_EQ(out[i].bytes, sorted_sizes[i]) << i;
        EXPECT_EQ(out[i].flags, sorted_flags[i]) << i;
        EXPECT_EQ(out[i].device_ptr, sorted[i]) << i;
        EXPECT_STREQ(out[i].backend, "posix");
    }
    EXPECT_EQ(out[4].base, nullptr) << "wrote past the live registrations";

    hostregRegistration two[2]{};
    total = 0;
    EXPECT_EQ(hostregListRegistrations(two, 2, &total), 2u);  // truncated, total still 4
    EXPECT_EQ(total, 4u);
    EXPECT_EQ(two[0].base, sorted[0]);
    EXPECT_EQ(two[1].base, sorted[1]);

    for (char* b : bases)
        ASSERT_EQ(hostregHostUnregister(b), hostregSuccess);
    EXPECT_EQ(hostregListRegistrations(out, 6, &total), 0u);
    EXPECT_EQ(total, 0u);
}

// Rule: hostregGetStats counts live registrations, their bytes, and the distinct whole
// pages they cover (a page shared by neighbours counts once); 1 for NULL.
TEST_F(Queries, Stats) {
    EXPECT_EQ(hostregGetStats(nullptr), hostregErrorInvalidValue);
    hostregStats s = stats();
    EXPECT_EQ(s.registrations, 0u);
    EXPECT_EQ(s.bytes_registered, 0u);
    EXPECT_EQ(s.bytes_locked, 0u);

    Mapping m(8);
    ASSERT_NE(m.get(), nullptr);
    char* p = m.get();
    // Two ranges in one page: one page.
    ASSERT_EQ(hostregHostRegister(p, 100, 0), hostregSuccess);
    ASSERT_EQ(hostregHostRegister(p + 100, 100, 0), hostregSuccess);
    s = stats();
    EXPECT_EQ(s.registrations, 2u);
    EXPECT_EQ(s.bytes_registered, 200u);
    EXPECT_EQ(s.bytes_locked, page());
    // [p+200, p+page+1) adds page 1 only (page 0 is shared).
    ASSERT_EQ(hostregHostRegister(p + 200, page() - 199, 0), hostregSuccess);
    s = stats();
    EXPECT_EQ(s.bytes_registered, 200u + page() - 199);
    EXPECT_EQ(s.bytes_locked, 2 * page());
    // A range inside page 1 after it adds nothing; one in page 5 alone adds a page.
    ASSERT_EQ(hostregHostRegister(p + page() + 10, 10, 0), hostregSuccess);
    ASSERT_EQ(hostregHostRegister(m.page_at(5) + 4000 % page(), 1, 0), hostregSuccess);
    s = stats();
    EXPECT_EQ(s.registrations, 5u);
    EXPECT_EQ(s.bytes_locked, 3 * page());
    EXPECT_EQ(vmlck_kb() - vmlck0_, pages_kb(3)) << "the kernel disagrees with bytes_locked";
    // Page-aligned whole pages count exactly.
    ASSERT_EQ(hostregHostRegister(m.page_at(6), 2 * page(), 0), hostregSuccess);
    s = stats();
    EXPECT_EQ(s.bytes_locked, 5 * page());
    EXPECT_EQ(vmlck_kb() - vmlck0_, pages_kb(5));

    for (char* b : {p, p + 100, p + 200, p + page() + 10, m.page_at(5) + 4000 % page(), m.page_at(6)})
        ASSERT_EQ(hostregHostUnregister(b), hostregSuccess);
    s = stats();
    EXPECT_EQ(s.registrations, 0u);
    EXPECT_EQ(s.bytes_registered, 0u);
    EXPECT_EQ(s.bytes_locked, 0u);
}

// Rule: every hostregError code has CUDA's name and message; other numbers answer
// "unrecognized error code".
TEST(ErrorNames, EveryCodeHasCudasNameAndMessage) {
    struct {
        int code;
        const char* name;
        const char* message;
    } const known[] = {
        {hostregSuccess, "cudaSuccess", "no error"},
        {hostregErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
        {hostregErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
        {hostregErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
        {hostregErrorCudartUnloading, "cudaErrorCudartUnloading", "driver shutting down"},
        {hostregErrorStubLibrary, "cudaErrorStubLibrary", "CUDA driver is a stub library"},
        {hostregErrorInsufficientDriver, "cudaErrorInsufficientDriver",
         "CUDA driver version is insufficient for CUDA runtime version"},
        {hostregErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
        {hostregErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
        {hostregErrorHostMemoryAlreadyRegistered, "cudaErrorHostMemoryAlreadyRegistered",
         "part or all of the requested memory range is already mapped"},
        {hostregErrorHostMemoryNotRegistered, "cudaErrorHostMemoryNotRegistered",
         "pointer does not correspond to a registered memory region"},
        {hostregErrorNotPermitted, "cudaErrorNotPermitted", "operation not permitted"},
        {hostregErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
        {hostregErrorUnknown, "cudaErrorUnknown", "unknown error"},
    };
    for (const auto& k : known) {
        ASSERT_NE(hostregGetErrorName(k.code), nullptr);
        ASSERT_NE(hostregGetErrorString(k.code), nullptr);
        EXPECT_STREQ(hostregGetErrorName(k.code), k.name) << k.code;
        EXPECT_STREQ(hostregGetErrorString(k.code), k.message) << k.code;
    }
    EXPECT_STREQ(hostregGetErrorName(712), "cudaErrorHostMemoryAlreadyRegistered");
    // Every member of CUDA 13.0's enum cudaError has its name, also those hostreg never
    // answers itself (tests/real compares all of them with the real libcudart.so.13).
    const struct {
        int code;
        const char* name;
    } others[] = {{5, "cudaErrorProfilerDisabled"},
                  {36, "cudaErrorCallRequiresNewerDriver"},
                  {46, "cudaErrorDevicesUnavailable"},
                  {201, "cudaErrorDeviceUninitialized"},
                  {709, "cudaErrorContextIsDestroyed"},
                  {803, "cudaErrorSystemDriverMismatch"},
                  {804, "cudaErrorCompatNotSupportedOnDevice"}};
    for (const auto& o : others)
        EXPECT_STREQ(hostregGetErrorName(o.code), o.name) << o.code;
    EXPECT_STREQ(hostregGetErrorString(201), "invalid device context");
    for (int code : {-1, 33, 998, 1000, 12345, 1 << 30}) {
        EXPECT_STREQ(hostregGetErrorName(code), "unrecognized error code") << code;
        EXPECT_STREQ(hostregGetErrorString(code), "unrecognized error code") << code;
    }
}

// Rule: hostregVersion is "MAJOR.MINOR.PATCH"; hostregBackendName is "posix" here.
TEST(Library, VersionAndBackend) {
    const std::string v = hostregVersion();
    int a = -1, b = -1, c = -1;
    char tail = 0;
    EXPECT_EQ(std::sscanf(v.c_str(), "%d.%d.%d%c", &a, &b, &c, &tail), 3) << v;
    EXPECT_STREQ(hostregBackendName(), "posix");
}

// Rule: hostregGetLastError reports the calling thread's last failure: its code, native
// code and a message that explains it (e.g. "overlaps" for 712); NULL outs are allowed.
TEST_F(Queries, LastErrorDescribesTheFailure) {
    Mapping m(2);
    ASSERT_NE(m.get(), nullptr);
    ASSERT_EQ(hostregHostRegister(m.get(), 100, 0), hostregSuccess);
    ASSERT_EQ(hostregHostRegister(m.get() + 50, 100, 0), hostregErrorHostMemoryAlreadyRegistered);
    long long native = -1;
    const char* msg = nullptr;
    EXPECT_EQ(hostregGetLastError(&native, &msg), hostregErrorHostMemoryAlreadyRegistered);
    EXPECT_EQ(native, 0);
    ASSERT_NE(msg, nullptr);
    EXPECT_NE(std::string(msg).find("overlaps"), std::string::npos) << msg;
    EXPECT_EQ(hostregGetLastError(nullptr, nullptr), hostregErrorHostMemoryAlreadyRegistered);

    ASSERT_EQ(hostregHostUnregister(m.get() + 1), hostregErrorHostMemoryNotRegistered);
    EXPECT_EQ(hostregGetLastError(nullptr, &msg), hostregErrorHostMemoryNotRegistered);
    EXPECT_NE(std::string(msg).find("not the base"), std::string::npos) << msg;

    ASSERT_EQ(hostregHostRegister(m.get() + 200, 8, 0x40), hostregErrorInvalidValue);
    EXPECT_EQ(hostregGetLastError(nullptr, &msg), hostregErrorInvalidValue);
    EXPECT_NE(std::string(msg).find("flag"), std::string::npos) << msg;

    ASSERT_EQ(hostregHostRegister(m.get() + 200, 0, 0), hostregErrorInvalidValue);
    EXPECT_NE(last_message().find("byte"), std::string::npos) << last_message();

    ASSERT_EQ(hostregHostRegister(m.get() + 200, 8, HOSTREG_HOST_REGISTER_IO_MEMORY), hostregErrorNotSupported);
    EXPECT_EQ(hostregGetLastError(nullptr, &msg), hostregErrorNotSupported);
    EXPECT_NE(std::string(msg).find("posix"), std::string::npos) << msg;

    ASSERT_EQ(hostregHostUnregister(m.get()), hostregSuccess);
}

// Rule: the last error is per thread: a fresh thread has none (0), and a failure in one
// thread does not change another thread's last error.
TEST_F(Queries, LastErrorIsPerThread) {
    Mapping m(1);
    ASSERT_NE(m.get(), nullptr);
    ASSERT_EQ(hostregHostUnregister(m.get()), hostregErrorHostMemoryNotRegistered);
    const std::string mine = last_message();
    ASSERT_FALSE(mine.empty());

    int fresh = -1, theirs = -1;
    std::string their_msg;
    std::thread t([&] {
        fresh = hostregGetLastError(nullptr, nullptr);
        hostregHostRegister(nullptr, 8, 0);
        const char* msg = nullptr;
        theirs = hostregGetLastError(nullptr, &msg);
        their_msg = msg ? msg : "";
    });
    t.join();
    EXPECT_EQ(fresh, hostregSuccess) << "a new thread inherited a last error";
    EXPECT_EQ(theirs, hostregErrorInvalidValue);
    EXPECT_NE(their_msg.find("NULL"), std::string::npos) << their_msg;
    const char* msg = nullptr;
    EXPECT_EQ(hostregGetLastError(nullptr, &msg), hostregErrorHostMemoryNotRegistered);
    EXPECT_EQ(std::string(msg), mine);
}

namespace {
struct Event {
    int level, code;
    long long native;
    std::string call, message;
};
void collect(void* context, int level, const char* call, int code, long long native, const char* message) {
    static_cast<std::vector<Event>*>(context)->push_back(Event{level, code, native, call, message});
}
}  // namespace

// Rule: with a log handler, every failure reaches it exactly once, naming the C function,
// at the one severity rule's level: the caller's mistakes (1, 712, 713) debug, the
// environment's (801 here: posix cannot honour IoMemory) warning; successes are not events.
TEST_F(Queries, LogHandlerGetsEachFailureOnceAtItsLevel) {
    Mapping m(2);
    ASSERT_NE(m.get(), nullptr);
    std::vector<Event> events;
    hostregBackendName();  // the backend's selection (an info event) is not part of this test
    hostregSetLogHandler(collect, &events);
    EXPECT_EQ(hostregHostUnregister(m.get()), hostregErrorHostMemoryNotRegistered);
    EXPECT_EQ(hostregHostRegister(m.get(), page(), HOSTREG_HOST_REGISTER_IO_MEMORY), hostregErrorNotSupported);
    ASSERT_EQ(hostregHostRegister(m.get(), page(), 0), hostregSuccess);
    EXPECT_EQ(hostregHostRegister(m.get(), page(), 0), hostregErrorHostMemoryAlreadyRegistered);
    ASSERT_EQ(hostregHostUnregister(m.get()), hostregSuccess);
    hostregSetLogHandler(nullptr, nullptr);
    EXPECT_EQ(hostregHostUnregister(m.get()), hostregErrorHostMemoryNotRegistered);  // not collected

    ASSERT_EQ(events.size(), 3u);
    EXPECT_EQ(events[0].call, "hostregHostUnregister");
    EXPECT_EQ(events[0].code, hostregErrorHostMemoryNotRegistered);
    EXPECT_EQ(events[0].level, HOSTREG_LOG_DEBUG);
    EXPECT_EQ(events[1].call, "hostregHostRegister");
    EXPECT_EQ(events[1].code, hostregErrorNotSupported);
    EXPECT_EQ(events[1].level, HOSTREG_LOG_WARNING);
    EXPECT_FALSE(events[1].message.empty());
    EXPECT_EQ(events[2].code, hostregErrorHostMemoryAlreadyRegistered);
    EXPECT_EQ(events[2].level, HOSTREG_LOG_DEBUG);
}

namespace {

// hostregFormatLogEvent is the one format of hostreg's diagnostic lines (the stderr default's,
// after "hostreg <level>: ", and the Python logger's): snprintf's contract, parts only when given.
TEST(LogFormat, OneEventAsTheStderrLinesSayIt) {
    char out[256];
    const size_t n = hostregFormatLogEvent("hostregHostRegister", 2, 12, "mlock failed", out, sizeof out);
    EXPECT_STREQ(out, "hostregHostRegister: cudaErrorMemoryAllocation (2), native 12: mlock failed");
    EXPECT_EQ(n, std::strlen(out));
    hostregFormatLogEvent("", 0, 0, "backend posix selected", out, sizeof out);
    EXPECT_STREQ(out, "backend posix selected");
    char small[8];
    EXPECT_EQ(hostregFormatLogEvent("call", 0, 0, "a longer message", small, sizeof small), 22u);  // the whole length
    EXPECT_STREQ(small, "call: a");  // cut, NUL-terminated
    EXPECT_EQ(hostregFormatLogEvent(nullptr, 0, 0, nullptr, nullptr, 0), 0u);
}

}  // namespace
