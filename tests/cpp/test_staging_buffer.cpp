// test_staging_buffer.cpp: finding a live staging buffer from an address inside it
// (hostregStagingBufferFind, staging.h) and the pointer a caller keeps with it.
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "helpers.hpp"
#include "hostreg/staging.h"

namespace {

class StagingBufferFind : public hrtest::HostregTest {};

char* data_of(hostregStagingBuffer* b) { return static_cast<char*>(hostregStagingBufferData(b)); }

}  // namespace

// Any range inside the buffer leads to it, an empty one at its end too; a range reaching past
// either end does not.
TEST_F(StagingBufferFind, EveryRangeInsideTheBufferAndNoneOutside) {
    const size_t n = 3 * hrtest::page();
    hostregStagingBuffer* b = nullptr;
    ASSERT_EQ(hostregStagingBufferCreate(n, 1, 1, 0, 0, &b), hostregSuccess) << hrtest::last_message();
    char* d = data_of(b);
    EXPECT_EQ(hostregStagingBufferFind(d, n), b);
    EXPECT_EQ(hostregStagingBufferFind(d + 1, n - 1), b);
    EXPECT_EQ(hostregStagingBufferFind(d + n - 1, 1), b);
    EXPECT_EQ(hostregStagingBufferFind(d + n, 0), b);
    EXPECT_EQ(hostregStagingBufferFind(d, n + 1), nullptr);
    EXPECT_EQ(hostregStagingBufferFind(d + 1, n), nullptr);
    EXPECT_EQ(hostregStagingBufferFind(d + n, 1), nullptr);
    EXPECT_EQ(hostregStagingBufferFind(d - 1, 1), nullptr);
    EXPECT_EQ(hostregStagingBufferFind(d, SIZE_MAX), nullptr);  // no wrap-around
    EXPECT_EQ(hostregStagingBufferFind(nullptr, 1), nullptr);
    hostregStagingBufferDestroy(b);
    EXPECT_EQ(hostregStagingBufferFind(d, 1), nullptr) << "a destroyed buffer is not found";
}

// Private and attached buffers are found too, each by its own mapping, with its own user data.
TEST_F(StagingBufferFind, EachBufferKeepsItsOwnUserData) {
    const size_t n = 2 * hrtest::page();
    hostregStagingBuffer *shared = nullptr, *priv = nullptr, *attached = nullptr;
    ASSERT_EQ(hostregStagingBufferCreate(n, 1, 0, 0, 0, &shared), hostregSuccess);
    ASSERT_EQ(hostregStagingBufferCreate(n, 0, 0, 0, 0, &priv), hostregSuccess);
    ASSERT_EQ(hostregStagingBufferAttach(dup(hostregStagingBufferFd(shared)), n, &attached), hostregSuccess);
    EXPECT_EQ(hostregStagingBufferUserData(shared), nullptr);
    int tag[3];
    hostregStagingBufferSetUserData(shared, &tag[0]);
    hostregStagingBufferSetUserData(priv, &tag[1]);
    hostregStagingBufferSetUserData(attached, &tag[2]);
    hostregStagingBufferSetUserData(nullptr, &tag[0]);  // a no-op
    EXPECT_EQ(hostregStagingBufferUserData(nullptr), nullptr);
    EXPECT_EQ(hostregStagingBufferUserData(hostregStagingBufferFind(data_of(shared) + 5, 8)), &tag[0]);
    EXPECT_EQ(hostregStagingBufferUserData(hostregStagingBufferFind(data_of(priv) + 5, 8)), &tag[1]);
    EXPECT_EQ(hostregStagingBufferUserData(hostregStagingBufferFind(data_of(attached) + 5, 8)), &tag[2]);
    for (auto* b : {shared, priv, attached})
        hostregStagingBufferDestroy(b);
}

// A fork child finds the buffers it inherited (their mappings are its own now), and the lookup
// does not wait forever on the index's lock, held by another thread of the parent at the fork.
TEST_F(StagingBufferFind, AForkChildFindsWhatItInherited) {
    const size_t n = hrtest::page();
    hostregStagingBuffer* b = nullptr;
    ASSERT_EQ(hostregStagingBufferCreate(n, 1, 0, 0, 0, &b), hostregSuccess);
    std::atomic<bool> stop{false};
    std::thread busy([&] {  // holds the index's lock most of the time
        while (!stop)
            hostregStagingBufferFind(data_of(b), 1);
    });
    std::string failed;
    for (int i = 0; i < 200 && failed.empty(); ++i) {
        const pid_t pid = fork();
        if (pid == 0) {
            alarm(10);  // a child stuck on the lock dies of SIGALRM
            _exit(hostregStagingBufferFind(data_of(b), n) == b ? 0 : 1);
        }
        int status = 0;
        if (pid < 0 || waitpid(pid, &status, 0) != pid)
            failed = "fork or waitpid failed";
        else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            failed =
                "fork " + std::to_string(i) + (WIFSIGNALED(status) ? ": the child hung on the lock" : ": not found");
    }
    stop = true;
    busy.join();
    EXPECT_EQ(failed, "");
    hostregStagingBufferDestroy(b);
}

// Threads making, finding and destroying buffers side by side each find their own, always.
TEST_F(StagingBufferFind, ThreadsFindTheirOwnWhileOthersComeAndGo) {
    std::atomic<int> wrong{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
        threads.emplace_back([&] {
            for (int i = 0; i < 200; ++i) {
                hostregStagingBuffer* b = nullptr;
                if (hostregStagingBufferCreate(hrtest::page(), 0, 0, 0, 0, &b) != hostregSuccess) {
                    ++wrong;
                    return;
                }
                if (hostregStagingBufferFind(data_of(b) + 1, 1) != b) ++wrong;
                hostregStagingBufferDestroy(b);
            }
        });
    for (auto& t : threads)
        t.join();
    EXPECT_EQ(wrong.load(), 0);
}
