// test_posix.cpp: the posix backend really page-locks, as the kernel reports it (VmLck in
// /proc/self/status), keeps pages shared by neighbouring registrations locked while either
// holds them, leaves the data alone, and maps RLIMIT_MEMLOCK failures to 2.
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <linux/capability.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "helpers.hpp"
#include "hostreg/staging.h"

using namespace hrtest;

namespace {
class Posix : public HostregTest {};
}  // namespace

// Rule: a success means the pages are locked: registering N pages raises VmLck by N pages,
// unregistering lowers it back.
TEST_F(Posix, RegisterLocksEveryPage) {
    for (size_t n : {size_t{1}, size_t{2}, size_t{3}, size_t{17}, size_t{256}}) {
        Mapping m(n);
        ASSERT_NE(m.get(), nullptr);
        ASSERT_EQ(hostregHostRegister(m.get(), m.size(), 0), hostregSuccess) << n;
        EXPECT_EQ(vmlck_kb() - vmlck0_, pages_kb(n)) << n << " pages";
        EXPECT_EQ(stats().bytes_locked, m.size());
        ASSERT_EQ(hostregHostUnregister(m.get()), hostregSuccess);
        EXPECT_EQ(vmlck_kb(), vmlck0_) << n << " pages";
    }
}

// Rule: pointers need not be page-aligned; every page touched by the range is locked.
TEST_F(Posix, UnalignedRangeLocksEveryTouchedPage) {
    Mapping m(5);
    ASSERT_NE(m.get(), nullptr);
    ASSERT_EQ(hostregHostRegister(m.get() + page() - 1, 2 * page() + 2, 0), hostregSuccess);
    EXPECT_EQ(vmlck_kb() - vmlck0_, pages_kb(4));  // pages 0..3
    ASSERT_EQ(hostregHostUnregister(m.get() + page() - 1), hostregSuccess);
    EXPECT_EQ(vmlck_kb(), vmlck0_);
}

// Rule: a page shared by two registrations stays locked until both are gone, whichever
// is unregistered first. A=[p, p+page+100), B=[p+page+100, p+3*page) share page 1.
TEST_F(Posix, SharedPageStaysLockedWhileANeighbourHoldsIt) {
    Mapping m(3);
    ASSERT_NE(m.get(), nullptr);
    char* p = m.get();
    char* a = p;
    char* b = p + page() + 100;
    for (bool a_first : {true, false}) {
        ASSERT_EQ(hostregHostRegister(a, page() + 100, 0), hostregSuccess);
        ASSERT_EQ(hostregHostRegister(b, 2 * page() - 100, 0), hostregSuccess);
        EXPECT_EQ(vmlck_kb() - vmlck0_, pages_kb(3));
        EXPECT_EQ(stats().bytes_locked, 3 * page());
        ASSERT_EQ(hostregHostUnregister(a_first ? a : b), hostregSuccess);
        EXPECT_EQ(vmlck_kb() - vmlck0_, pages_kb(2))
            << "unregistering " << (a_first ? "A" : "B") << " unlocked the shared page";
        EXPECT_EQ(stats().bytes_locked, 2 * page());
        ASSERT_EQ(hostregHostUnregister(a_first ? b : a), hostregSuccess);
        EXPECT_EQ(vmlck_kb(), vmlck0_);
    }
}

// Rule: as above, with several registrations inside one page and a page shared on both
// sides of a multi-page range.
TEST_F(Posix, PageSharedByManyRegistrations) {
    Mapping m(4);
    ASSERT_NE(m.get(), nullptr);
    char* p = m.get();
    ASSERT_EQ(hostregHostRegister(p, 100, 0), hostregSuccess);        // page 0
    ASSERT_EQ(hostregHostRegister(p + 100, 100, 0), hostregSuccess);  // page 0
    ASSERT_EQ(hostregHostRegister(p + 200, 100, 0), hostregSuccess);  // page 0
    EXPECT_EQ(vmlck_kb() - vmlck0_, pages_kb(1));
    ASSERT_EQ(hostregHostUnregister(p + 100), hostregSuccess);
    ASSERT_EQ(hostregHostUnregister(p), hostregSuccess);
    EXPECT_EQ(vmlck_kb() - vmlck0_, pages_kb(1)) << "page 0 still has one registration";
    // M spans pages 0..3 from p+300; L sits in page 3 after it.
    char* mid = p + 300;
    const size_t mid_n = 3 * page() - 300 + 50;  // ends at page 3 + 50
    ASSERT_EQ(hostregHostRegister(mid, mid_n, 0), hostregSuccess);
    ASSERT_EQ(hostregHostRegister(m.page_at(3) + 50, 10, 0), hostregSuccess);
    EXPECT_EQ(vmlck_kb() - vmlck0_, pages_kb(4));
    ASSERT_EQ(hostregHostUnregister(mid), hostregSuccess);
    EXPECT_EQ(vmlck_kb() - vmlck0_, pages_kb(2)) << "pages 0 and 3 are still held";
    ASSERT_EQ(hostregHostUnregister(p + 200), hostregSuccess);
    EXPECT_EQ(vmlck_kb() - vmlck0_, pages_kb(1));
    ASSERT_EQ(hostregHostUnregister(m.page_at(3) + 50), hostregSuccess);
    EXPECT_EQ(vmlck_kb(), vmlck0_);
}

// Rule: a rejected register (712, 1, 801) does not unlock pages of live neighbours.
TEST_F(Posix, FailedRegisterKeepsNeighboursLocked) {
    Mapping m(3);
    ASSERT_NE(m.get(), nullptr);
    char* p = m.get();
    ASSERT_EQ(hostregHostRegister(p + 10, 2 * page(), 0), hostregSuccess);  // pages 0..2
    EXPECT_EQ(vmlck_kb() - vmlck0_, pages_kb(3));
    EXPECT_EQ(hostregHostRegister(p + 5, 10, 0), hostregErrorHostMemoryAlreadyRegistered);
    EXPECT_EQ(hostregHostRegister(p, 5, HOSTREG_HOST_REGISTER_IO_MEMORY), hostregErrorNotSupported);
    EXPECT_EQ(hostregHostRegister(p, 5, 0x100), hostregErrorInvalidValue);
    EXPECT_EQ(vmlck_kb() - vmlck0_, pages_kb(3));
    ASSERT_EQ(hostregHostUnregister(p + 10), hostregSuccess);
    EXPECT_EQ(vmlck_kb(), vmlck0_);
}

// Rule: registering and unregistering leave the bytes unchanged.
TEST_F(Posix, DataIsUnchanged) {
    Mapping m(9);
    ASSERT_NE(m.get(), nullptr);
    std::vector<unsigned char> pattern(m.size());
    for (size_t i = 0; i < pattern.size(); ++i)
        pattern[i] = static_cast<unsigned char>(i * 131 + 7);
    std::memcpy(m.get(), pattern.data(), m.size());
    ASSERT_EQ(hostregHostRegister(m.get() + 33, 8 * page(), HOSTREG_HOST_REGISTER_MAPPED), hostregSuccess);
    EXPECT_EQ(std::memcmp(m.get(), pattern.data(), m.size()), 0);
    m.get()[100] = 1;  // still writable
    pattern[100] = 1;
    ASSERT_EQ(hostregHostUnregister(m.get() + 33), hostregSuccess);
    EXPECT_EQ(std::memcmp(m.get(), pattern.data(), m.size()), 0);
}

// Rule: when RLIMIT_MEMLOCK forbids the lock (no CAP_IPC_LOCK), register answers 2
// (cudaErrorMemoryAllocation) with a message naming RLIMIT_MEMLOCK, records nothing and
// locks nothing, while a registration within the limit still succeeds. Runs in a forked
// child that drops CAP_IPC_LOCK; the child reports the first failed check as exit code.
namespace {

bool drop_cap_ipc_lock() {
    __user_cap_header_struct hdr{};
    hdr.version = _LINUX_CAPABILITY_VERSION_3;
    hdr.pid = 0;
    __user_cap_data_struct data[2]{};
    if (syscall(SYS_capget, &hdr, data) != 0) return false;
    data[0].effective &= ~(1u << CAP_IPC_LOCK);
    data[0].permitted &= ~(1u << CAP_IPC_LOCK);
    data[0].inheritable &= ~(1u << CAP_IPC_LOCK);
    return syscall(SYS_capset, &hdr, data) == 0;
}

int rlimit_child() {
    const size_t limit = 64 * 1024;
    struct rlimit rl{limit, limit};
    if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0) return 10;
    if (!drop_cap_ipc_lock()) return 11;
    const long before = vmlck_kb();
    Mapping big((1 << 20) / page());
    if (!big.get()) return 12;
    std::memset(big.get(), 0x5a, big.size());
    if (hostregHostRegister(big.get(), big.size(), 0) != hostregErrorMemoryAllocation) return 20;
    long long native = 0;
    const char* msg = nullptr;
    if (hostregGetLastError(&native, &msg) != hostregErrorMemoryAllocation) return 21;
    if (native != ENOMEM) return 22;
    if (!msg || !std::strstr(msg, "RLIMIT_MEMLOCK")) return 23;
    if (hostregIsRegistered(big.get()) != 0) return 24;
    hostregStats s{};
    if (hostregGetStats(&s) != 0 || s.registrations != 0 || s.bytes_locked != 0) return 25;
    if (vmlck_kb() != before) return 26;
    // 17 pages from an unaligned base: the 15 interior pages and the first page fit in the
    // limit, the last page does not; what was locked before the failure must be undone.
    if (hostregHostRegister(big.get() + 10, 16 * page(), 0) != hostregErrorMemoryAllocation) return 27;
    if (hostregIsRegistered(big.get() + 10) != 0) return 28;
    if (vmlck_kb() != before) return 29;

    // The room check answers the same before any memory is made: 2 naming RLIMIT_MEMLOCK
    // for 1 MiB (past the 64 KiB limit), 0 for 16 KiB and for memory that is not pinned.
    if (hostregStagingBufferRoom(1 << 20, 0, 1) != hostregErrorMemoryAllocation) return 13;
    if (hostregGetLastError(nullptr, &msg) != hostregErrorMemoryAllocation || !msg ||
        !std::strstr(msg, "RLIMIT_MEMLOCK"))
        return 14;
    if (hostregStagingBufferRoom(16 * 1024, 0, 1) != hostregSuccess) return 15;
    if (hostregStagingBufferRoom(1 << 20, 0, 0) != hostregSuccess) return 16;
    if (vmlck_kb() != before) return 17;

    Mapping small((16 * 1024) / page());
    if (!small.get()) return 30;
    if (hostregHostRegister(small.get(), small.size(), 0) != hostregSuccess) return 31;
    if (vmlck_kb() - before != 16) return 32;
    if (hostregHostUnregister(small.get()) != hostregSuccess) return 33;
    if (vmlck_kb() != before) return 34;
    for (size_t i = 0; i < big.size(); ++i)
        if (static_cast<unsigned char>(big.get()[i]) != 0x5a) return 35;
    return 0;
}

}  // namespace

TEST_F(Posix, RlimitMemlockAnswers2) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0) << std::strerror(errno);
    if (pid == 0) _exit(rlimit_child());
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status)) << "child died, status " << status;
    EXPECT_EQ(WEXITSTATUS(status), 0)
        << "failed check " << WEXITSTATUS(status)
        << " (10-12 setup, 13-17 the room check, 20-29 the over-limit register, 30-35 within the limit)";
}

// Rule: hostregStagingBufferRoom answers what hostregStagingBufferCreate would for lack of
// room, making nothing: 1 for 0 bytes, 2 naming the directory when the shared-memory
// filesystem has fewer bytes free than asked, 0 when the room is there.
TEST_F(Posix, StagingBufferRoomAnswersBeforeAnythingIsMade) {
    EXPECT_EQ(hostregStagingBufferRoom(0, 1, 1), hostregErrorInvalidValue);
    const size_t huge = size_t{1} << 60;  // no /dev/shm has an exabyte free
    EXPECT_EQ(hostregStagingBufferRoom(huge, 1, 0), hostregErrorMemoryAllocation);
    const char* msg = nullptr;
    hostregGetLastError(nullptr, &msg);
    ASSERT_NE(msg, nullptr);
    EXPECT_NE(std::strstr(msg, "is too small: staging needs 1,152,921,504,606,846,976 bytes"), nullptr) << msg;
    int fd = -1;
    EXPECT_EQ(hostregSharedMemoryCreate(huge, &fd), hostregErrorMemoryAllocation);  // the same answer
    EXPECT_EQ(fd, -1);
    EXPECT_EQ(hostregStagingBufferRoom(1 << 20, 1, 1), hostregSuccess) << hrtest::last_message();
    EXPECT_EQ(hostregStagingBufferRoom(huge, 0, 0), hostregSuccess);  // private, unpinned: no limit to check
}
