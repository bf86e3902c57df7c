// test_register.cpp: the argument and overlap rules of hostregHostRegister and
// hostregHostUnregister (hostreg.h), as CUDA's cudaHostRegister / cudaHostUnregister define them.
#include <cerrno>
#include <cstdint>

#include "helpers.hpp"

using namespace hrtest;

namespace {

class Register : public HostregTest {};

// Nothing is recorded for [p, p+n): no registration contains p, and none live at all.
void expect_unrecorded(const void* p) {
    EXPECT_EQ(hostregIsRegistered(p), 0);
    EXPECT_EQ(stats().registrations, 0u);
}

}  // namespace

// Rule: NULL, 0 bytes, and a range wrapping past UINTPTR_MAX are invalid (1).
TEST_F(Register, InvalidArgumentsAnswer1) {
    Mapping m(2);
    ASSERT_NE(m.get(), nullptr);
    EXPECT_EQ(hostregHostRegister(nullptr, 4096, 0), hostregErrorInvalidValue);
    EXPECT_EQ(hostregHostRegister(nullptr, 0, 0), hostregErrorInvalidValue);
    EXPECT_EQ(hostregHostRegister(m.get(), 0, 0), hostregErrorInvalidValue);
    EXPECT_EQ(hostregHostRegister(m.get(), SIZE_MAX, 0), hostregErrorInvalidValue);
    auto* top = reinterpret_cast<void*>(UINTPTR_MAX - 10);
    EXPECT_EQ(hostregHostRegister(top, 100, 0), hostregErrorInvalidValue);
    EXPECT_EQ(hostregHostRegister(top, 11, 0), hostregErrorInvalidValue);  // ends at 2^64
    expect_unrecorded(m.get());
    EXPECT_EQ(vmlck_kb(), vmlck0_);
}

// Rule: every flag bit outside Portable|Mapped|IoMemory|ReadOnly is invalid (1), alone or
// beside valid bits.
TEST_F(Register, UnknownFlagBitsAnswer1) {
    Mapping m(1);
    ASSERT_NE(m.get(), nullptr);
    for (unsigned bit = 4; bit < 32; ++bit) {
        const unsigned f = 1u << bit;
        EXPECT_EQ(hostregHostRegister(m.get(), 64, f), hostregErrorInvalidValue) << std::hex << f;
        EXPECT_EQ(hostregHostRegister(m.get(), 64, f | HOSTREG_HOST_REGISTER_PORTABLE), hostregErrorInvalidValue)
            << std::hex << f;
    }
    EXPECT_EQ(hostregHostRegister(m.get(), 64, 0x80000000u), hostregErrorInvalidValue);
    EXPECT_EQ(hostregHostRegister(m.get(), 64, 0xFFFFFFFFu), hostregErrorInvalidValue);
    expect_unrecorded(m.get());
}

// Rule: IoMemory cannot be honoured by mlock: 801 on posix, alone or combined.
TEST_F(Register, IoMemoryNotSupportedOnPosix) {
    Mapping m(1);
    ASSERT_NE(m.get(), nullptr);
    EXPECT_EQ(hostregHostRegister(m.get(), 64, HOSTREG_HOST_REGISTER_IO_MEMORY), hostregErrorNotSupported);
    EXPECT_EQ(hostregHostRegister(m.get(), 64, HOSTREG_HOST_REGISTER_IO_MEMORY | HOSTREG_HOST_REGISTER_MAPPED),
              hostregErrorNotSupported);
    EXPECT_EQ(hostregGetLastError(nullptr, nullptr), hostregErrorNotSupported);
    expect_unrecorded(m.get());
}

// Rule: Default, Portable, Mapped, ReadOnly and their combinations are accepted, and the
// flags are recorded as given.
TEST_F(Register, SupportedFlagsAccepted) {
    const unsigned combos[] = {
        HOSTREG_HOST_REGISTER_DEFAULT,
        HOSTREG_HOST_REGISTER_PORTABLE,
        HOSTREG_HOST_REGISTER_MAPPED,
        HOSTREG_HOST_REGISTER_READ_ONLY,
        HOSTREG_HOST_REGISTER_PORTABLE | HOSTREG_HOST_REGISTER_MAPPED,
        HOSTREG_HOST_REGISTER_MAPPED | HOSTREG_HOST_REGISTER_READ_ONLY,
        HOSTREG_HOST_REGISTER_PORTABLE | HOSTREG_HOST_REGISTER_MAPPED | HOSTREG_HOST_REGISTER_READ_ONLY,
    };
    Mapping m(2);
    ASSERT_NE(m.get(), nullptr);
    for (unsigned f : combos) {
        ASSERT_EQ(hostregHostRegister(m.get() + 10, 5000, f), hostregSuccess) << f;
        unsigned got = ~0u;
        EXPECT_EQ(hostregHostGetFlags(&got, m.get() + 10), hostregSuccess);
        EXPECT_EQ(got, f);
        EXPECT_EQ(hostregHostUnregister(m.get() + 10), hostregSuccess);
    }
}

// Rule: ReadOnly works on memory the process may only read (mlock needs no write access).
TEST_F(Register, ReadOnlyOnReadOnlyMapping) {
    Mapping m(3, PROT_READ);
    ASSERT_NE(m.get(), nullptr);
    ASSERT_EQ(hostregHostRegister(m.get(), m.size(), HOSTREG_HOST_REGISTER_READ_ONLY), hostregSuccess);
    EXPECT_EQ(vmlck_kb() - vmlck0_, pages_kb(3));
    EXPECT_EQ(hostregHostUnregister(m.get()), hostregSuccess);
    EXPECT_EQ(vmlck_kb(), vmlck0_);
}

// Rule: 712 when any byte of the range is already registered: exact repeat (any flags),
// overlap on the left, on the right, nested inside, enclosing; the original is unchanged.
TEST_F(Register, OverlapsAnswer712) {
    Mapping m(8);
    ASSERT_NE(m.get(), nullptr);
    char* a = m.get() + 1000;  // A = [a, a + 3*page)
    const size_t n = 3 * page();
    ASSERT_EQ(hostregHostRegister(a, n, HOSTREG_HOST_REGISTER_MAPPED), hostregSuccess);
    const long locked = vmlck_kb();

    struct Case {
        const char* what;
        char* p;
        size_t bytes;
    } cases[] = {
        {"exact repeat", a, n},
        {"left overlap", a - 500, 501},
        {"left overlap, long", m.get(), n},
        {"right overlap", a + n - 1, 100},
        {"right overlap, long", a + page(), n},
        {"nested", a + 100, 10},
        {"nested, last byte", a + n - 1, 1},
        {"nested, first byte", a, 1},
        {"enclosing", a - 1, n + 2},
        {"enclosing, whole mapping", m.get(), m.size()},
    };
    for (const Case& c : cases) {
        for (unsigned f : {0u, HOSTREG_HOST_REGISTER_MAPPED, HOSTREG_HOST_REGISTER_PORTABLE}) {
            EXPECT_EQ(hostregHostRegister(c.p, c.bytes, f), hostregErrorHostMemoryAlreadyRegistered)
                << c.what << " flags " << f;
        }
    }
    // Nothing was recorded by the failures: A alone is live, with its own flags.
    EXPECT_EQ(hostregIsRegistered(a - 1), 0);
    EXPECT_EQ(hostregIsRegistered(a + n), 0);
    hostregStats s = stats();
    EXPECT_EQ(s.registrations, 1u);
    EXPECT_EQ(s.bytes_registered, n);
    hostregRegistration r{};
    ASSERT_EQ(hostregPointerGetRegistration(a + 5, &r), hostregSuccess);
    EXPECT_EQ(r.base, a);
    EXPECT_EQ(r.bytes, n);
    EXPECT_EQ(r.flags, HOSTREG_HOST_REGISTER_MAPPED);
    EXPECT_EQ(vmlck_kb(), locked) << "a rejected overlap must not lock or unlock anything";
    EXPECT_EQ(hostregHostUnregister(a), hostregSuccess);
    EXPECT_EQ(vmlck_kb(), vmlck0_);
}

// Rule: adjacent ranges share no byte, so both register, even inside one page; the byte
// just past each is free.
TEST_F(Register, AdjacentRangesSucceed) {
    Mapping m(4);
    ASSERT_NE(m.get(), nullptr);
    char* p = m.get();
    ASSERT_EQ(hostregHostRegister(p + 100, 100, 0), hostregSuccess);         // [p+100, p+200)
    EXPECT_EQ(hostregHostRegister(p, 100, 0), hostregSuccess);               // [p, p+100) left of it
    EXPECT_EQ(hostregHostRegister(p + 200, 1, 0), hostregSuccess);           // one byte right of it
    EXPECT_EQ(hostregHostRegister(p + 201, 2 * page(), 0), hostregSuccess);  // across pages
    EXPECT_EQ(hostregHostRegister(p + 201 + 2 * page(), page(), 0), hostregSuccess);
    EXPECT_EQ(stats().registrations, 5u);
    EXPECT_EQ(hostregIsRegistered(p + 200 + 3 * page()), 1);
    EXPECT_EQ(hostregIsRegistered(p + 201 + 3 * page()), 0);
    for (char* b : {p, p + 100, p + 200, p + 201, p + 201 + 2 * page()})
        EXPECT_EQ(hostregHostUnregister(b), hostregSuccess);
    EXPECT_EQ(stats().registrations, 0u);
    EXPECT_EQ(vmlck_kb(), vmlck0_);
}

// Rule: memory that is not mapped cannot be locked: 1 (cudaErrorInvalidValue), with the
// native errno, and nothing is recorded or left locked.
TEST_F(Register, UnmappedMemoryAnswers1) {
    char* hole;
    {
        Mapping m(4);
        ASSERT_NE(m.get(), nullptr);
        hole = m.get();
    }  // unmapped now
    EXPECT_EQ(hostregHostRegister(hole, 4 * page(), 0), hostregErrorInvalidValue);
    long long native = 0;
    EXPECT_EQ(hostregGetLastError(&native, nullptr), hostregErrorInvalidValue);
    EXPECT_EQ(native, ENOMEM);
    EXPECT_NE(last_message().find("mapped"), std::string::npos) << last_message();
    EXPECT_EQ(hostregHostRegister(hole + 10, 20, 0), hostregErrorInvalidValue);      // one page
    EXPECT_EQ(hostregHostRegister(hole + 10, page(), 0), hostregErrorInvalidValue);  // two
    expect_unrecorded(hole);
    EXPECT_EQ(vmlck_kb(), vmlck0_);
}

// Rule: a range only partly mapped is not mapped memory (1), and on failure nothing stays
// locked (backend contract: "On failure nothing stays locked"), wherever the hole is.
// Each case maps n pages, unmaps the pages [hole, hole + holes), registers
// [base + lead, end - trail) and checks nothing was recorded or locked.
namespace {
void partly_mapped_case(long vmlck0, size_t n, size_t hole, size_t holes, size_t lead, size_t trail) {
    void* p = mmap(nullptr, n * page(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ASSERT_NE(p, MAP_FAILED);
    char* base = static_cast<char*>(p);
    ASSERT_EQ(munmap(base + hole * page(), holes * page()), 0);
    EXPECT_EQ(hostregHostRegister(base + lead, n * page() - lead - trail, 0), hostregErrorInvalidValue);
    EXPECT_EQ(hostregIsRegistered(base + n * page() / 2), 0);
    EXPECT_EQ(stats().registrations, 0u);
    EXPECT_EQ(vmlck_kb(), vmlck0) << "pages stayed locked after the failed register";
    // Unmap what is left piece by piece: by now the hole may hold another mapping (the
    // allocator's, say), which must not be unmapped.
    if (hole > 0) munmap(base, hole * page());
    if (hole + holes < n) munmap(base + (hole + holes) * page(), (n - hole - holes) * page());
}
}  // namespace

TEST_F(Register, PartlyMappedHoleAtEndLocksNothing) {
    partly_mapped_case(vmlck0_, 6, 4, 2, 0, 0);  // pages 4, 5 missing
}

TEST_F(Register, PartlyMappedHoleAtStartLocksNothing) {
    partly_mapped_case(vmlck0_, 6, 0, 2, 0, 0);  // pages 0, 1 missing
}

TEST_F(Register, PartlyMappedHoleInMiddleLocksNothing) {
    partly_mapped_case(vmlck0_, 6, 2, 1, 0, 0);  // page 2 missing
}

TEST_F(Register, PartlyMappedLastEdgePageMissingLocksNothing) {
    partly_mapped_case(vmlck0_, 3, 2, 1, 7, 7);  // unaligned range, its last page missing
}

TEST_F(Register, PartlyMappedFirstEdgePageMissingLocksNothing) {
    partly_mapped_case(vmlck0_, 3, 0, 1, 7, 7);  // unaligned range, its first page missing
}

// Rule: unregister answers 713 unless ptr is the base of a live registration: never
// registered, interior pointer, NULL, twice.
TEST_F(Register, UnregisterRules) {
    Mapping m(3);
    ASSERT_NE(m.get(), nullptr);
    char* p = m.get() + 300;
    EXPECT_EQ(hostregHostUnregister(p), hostregErrorHostMemoryNotRegistered);  // never
    EXPECT_EQ(hostregHostUnregister(nullptr), hostregErrorHostMemoryNotRegistered);
    ASSERT_EQ(hostregHostRegister(p, 2 * page(), 0), hostregSuccess);
    EXPECT_EQ(hostregHostUnregister(p + 1), hostregErrorHostMemoryNotRegistered);  // interior
    EXPECT_EQ(hostregHostUnregister(p + page()), hostregErrorHostMemoryNotRegistered);
    EXPECT_EQ(hostregHostUnregister(p - 1), hostregErrorHostMemoryNotRegistered);    // before
    EXPECT_EQ(hostregHostUnregister(m.get()), hostregErrorHostMemoryNotRegistered);  // page start
    EXPECT_EQ(hostregIsRegistered(p), 1) << "a failed unregister must not remove anything";
    EXPECT_EQ(hostregHostUnregister(p), hostregSuccess);
    EXPECT_EQ(hostregHostUnregister(p), hostregErrorHostMemoryNotRegistered);  // twice
    EXPECT_EQ(hostregIsRegistered(p), 0);
    EXPECT_EQ(vmlck_kb(), vmlck0_);
    // The range is free again after unregistering.
    EXPECT_EQ(hostregHostRegister(p, 2 * page(), 0), hostregSuccess);
    EXPECT_EQ(hostregHostUnregister(p), hostregSuccess);
}
