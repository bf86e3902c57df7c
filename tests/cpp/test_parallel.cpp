// test_parallel.cpp: staging/parallel.hpp's split covers every byte exactly once, for lengths and
// part counts chosen at random (a property test: 20,000 cases from a fixed seed, plus the
// edges), run_parts runs every part once whatever the OS refuses, and the default thread count
// follows the affinity mask.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <vector>

#include "staging/parallel.hpp"

namespace {

using hostreg::part_of;
using hostreg::run_parts;
using hostreg::Span;

// Every byte of [0, len) in exactly one part; parts contiguous, in order; every boundary but
// the last on `align`.
void check_split(size_t len, size_t parts, size_t align) {
    size_t at = 0;
    for (size_t i = 0; i < parts; ++i) {
        const Span s = part_of(len, parts, align, i);
        ASSERT_EQ(s.begin, at) << "len " << len << " parts " << parts << " align " << align << " part " << i;
        ASSERT_LE(s.begin, s.end);
        if (s.end < len) {
            ASSERT_EQ(s.end % align, 0u) << "len " << len << " part " << i;
        }
        at = s.end;
    }
    ASSERT_EQ(at, len) << "len " << len << " parts " << parts << " align " << align << ": the tail is missed";
}

TEST(Split, CoversEveryByteForRandomLengthsAndPartCounts) {
    std::mt19937_64 rng(20261201);
    for (int n = 0; n < 20000; ++n) {
        const size_t align = size_t{1} << (rng() % 17);  // 1 .. 64 KiB
        const size_t parts = 1 + rng() % 130;
        size_t len = rng() % (size_t{1} << (rng() % 36));
        if (n % 3 == 0) len = (len / align) * align * parts + rng() % 3;  // exact multiples, and one past
        check_split(len, parts, align);
        if (HasFatalFailure()) return;
    }
}

TEST(Split, TheCaseThatOnceMissedTheLastPage) {
    check_split((size_t{32} << 20) + 1, 2, 4096);  // 32 MiB + 1 byte on 2 threads
    check_split(0, 4, 4096);
    check_split(1, 128, 4096);
}

TEST(RunParts, RunsEveryPartOnce) {
    for (size_t parts : {1, 2, 7, 64}) {
        std::vector<std::atomic<int>> ran(parts);
        run_parts(parts, [&](size_t i) { ran[i]++; });
        for (size_t i = 0; i < parts; ++i)
            EXPECT_EQ(ran[i], 1) << parts << " parts, part " << i;
    }
}

}  // namespace

namespace {

// The default thread count follows the CPUs this thread may run on, not the machine's: a
// container given one CPU of many gets one thread per job.
TEST(UsableCpus, FollowTheAffinityMaskNotTheMachine) {
    cpu_set_t before;
    ASSERT_EQ(sched_getaffinity(0, sizeof before, &before), 0);
    const unsigned all = hostreg::usable_cpus();
    EXPECT_EQ(all, static_cast<unsigned>(CPU_COUNT(&before)));
    int first = 0;
    while (!CPU_ISSET(first, &before))
        ++first;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
    EXPECT_EQ(hostreg::usable_cpus(), 1u);
    ASSERT_EQ(sched_setaffinity(0, sizeof before, &before), 0);
    EXPECT_EQ(hostreg::usable_cpus(), all);
}

}  // namespace
