// test_stress.cpp: thread safety. Concurrent registrations of disjoint ranges that share
// pages must neither lose nor invent registrations nor page locks; concurrent attempts on
// the same range must have exactly one winner.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "helpers.hpp"

using namespace hrtest;

namespace {

class Stress : public HostregTest {};

constexpr int kThreads = 8;

// Starts fn(t) on kThreads threads at (nearly) the same moment and joins them.
template <class Fn>
void race(Fn fn) {
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> ts;
    for (int t = 0; t < kThreads; ++t)
        ts.emplace_back([&, t] {
            ready.fetch_add(1);
            while (!go.load(std::memory_order_acquire))
                std::this_thread::yield();
            fn(t);
        });
    while (ready.load() < kThreads)
        std::this_thread::yield();
    go.store(true, std::memory_order_release);
    for (auto& th : ts)
        th.join();
}

// Distinct pages touched by the given [base, base+bytes) ranges, in bytes.
size_t locked_bytes(const std::vector<std::pair<uintptr_t, size_t>>& ranges) {
    std::set<uintptr_t> pages;
    for (const auto& [b, n] : ranges)
        for (uintptr_t pg = b / page(); pg <= (b + n - 1) / page(); ++pg)
            pages.insert(pg);
    return pages.size() * page();
}

struct Slot {
    size_t lo, hi;      // the slot: [lo, hi) offsets into the buffer
    bool live = false;  // a registration of [lo + off, lo + off + bytes) is live
    size_t off = 0, bytes = 0;
    unsigned flags = 0;
};

}  // namespace

// Rule: 8 threads x 2000 random operations on disjoint, unaligned slots of one 64-page
// buffer (neighbouring slots, owned by different threads, share pages). Every answer must
// match the thread's own model, and at the end the registry and the kernel's VmLck must
// match the model exactly; unregistering everything returns to the baseline.
TEST_F(Stress, RandomOperationsOnPageSharingSlots) {
    Mapping m(64);
    ASSERT_NE(m.get(), nullptr);
    char* buf = m.get();

    // Slot boundaries: random unaligned sizes from 1 byte to 3 pages; slot i -> thread i%8.
    std::mt19937_64 layout(12345);
    std::vector<Slot> slots;
    for (size_t pos = 37;;) {
        const size_t n = std::uniform_int_distribution<size_t>(1, 3 * page())(layout);
        if (pos + n > m.size() - 11) break;
        slots.push_back(Slot{pos, pos + n});
        pos += n;
    }
    ASSERT_GE(slots.size(), size_t{4 * kThreads});

    std::atomic<int> failures{0};
    race([&](int t) {
        std::mt19937_64 rng(1000 + t);
        auto pick = [&](size_t lo, size_t hi) {  // uniform in [lo, hi]
            return std::uniform_int_distribution<size_t>(lo, hi)(rng);
        };
        auto check = [&](bool ok) {
            if (!ok) failures.fetch_add(1);
        };
        std::vector<size_t> mine;
        for (size_t i = t; i < slots.size(); i += kThreads)
            mine.push_back(i);
        for (int op = 0; op < 2000; ++op) {
            Slot& s = slots[mine[pick(0, mine.size() - 1)]];
            const size_t len = s.hi - s.lo;
            const int what = static_cast<int>(pick(0, 9));
            if (!s.live) {
                if (what < 6) {  // register a random sub-range of the slot
                    s.off = pick(0, len - 1);
                    s.bytes = pick(1, len - s.off);
                    s.flags = static_cast<unsigned>(pick(0, 15)) & ~HOSTREG_HOST_REGISTER_IO_MEMORY;
                    const int rc = hostregHostRegister(buf + s.lo + s.off, s.bytes, s.flags);
                    check(rc == hostregSuccess);
                    s.live = rc == hostregSuccess;
                } else if (what < 8) {
                    check(hostregHostUnregister(buf + s.lo + pick(0, len - 1)) == hostregErrorHostMemoryNotRegistered);
                } else {
                    check(hostregIsRegistered(buf + s.lo + pick(0, len - 1)) == 0);
                    check(hostregHostRegister(buf + s.lo, len, HOSTREG_HOST_REGISTER_IO_MEMORY) ==
                          hostregErrorNotSupported);
                }
                continue;
            }
            char* base = buf + s.lo + s.off;
            if (what < 4) {  // unregister it
                check(hostregHostUnregister(base) == hostregSuccess);
                s.live = false;
            } else if (what < 6) {                               // any range of the slot touching it is refused
                const size_t in = s.off + pick(0, s.bytes - 1);  // a byte of the registration
                const size_t lo = pick(0, in), hi = pick(in + 1, len);
                check(hostregHostRegister(buf + s.lo + lo, hi - lo, 0) == hostregErrorHostMemoryAlreadyRegistered);
                if (s.bytes > 1)
                    check(hostregHostUnregister(base + pick(1, s.bytes - 1)) == hostregErrorHostMemoryNotRegistered);
            } else if (what < 8) {  // queries agree with the model
                char* q = base + pick(0, s.bytes - 1);
                hostregRegistration r{};
                check(hostregPointerGetRegistration(q, &r) == hostregSuccess && r.base == base && r.bytes == s.bytes &&
                      r.flags == s.flags && r.device_ptr == base);
                unsigned f = ~0u;
                check(hostregHostGetFlags(&f, q) == hostregSuccess && f == s.flags);
                void* dev = nullptr;
                check(hostregHostGetDevicePointer(&dev, q, 0) == hostregSuccess && dev == q);
            } else {  // bytes of the slot outside it are free
                if (s.off > 0) check(hostregIsRegistered(base - 1) == 0);
                if (s.off + s.bytes < len) check(hostregIsRegistered(base + s.bytes) == 0);
                check(hostregIsRegistered(base) == 1);
            }
        }
    });
    EXPECT_EQ(failures.load(), 0) << "answers that disagreed with the per-thread model";

    // Final state: exactly the model's registrations, and exactly their pages locked.
    std::vector<std::pair<uintptr_t, size_t>> live;
    size_t live_bytes = 0;
    for (const Slot& s : slots)
        if (s.live) {
            live.emplace_back(reinterpret_cast<uintptr_t>(buf + s.lo + s.off), s.bytes);
            live_bytes += s.bytes;
        }
    hostregStats st = stats();
    EXPECT_EQ(st.registrations, live.size()) << "lost or phantom registrations";
    EXPECT_EQ(st.bytes_registered, live_bytes);
    EXPECT_EQ(st.bytes_locked, locked_bytes(live));
    EXPECT_EQ(vmlck_kb() - vmlck0_, static_cast<long>(locked_bytes(live) / 1024))
        << "the kernel's locked pages differ from the live registrations' pages";
    std::vector<hostregRegistration> listed(live.size() + 1);
    size_t total = 0;
    ASSERT_EQ(hostregListRegistrations(listed.data(), listed.size(), &total), live.size());
    for (size_t i = 0; i < live.size(); ++i) {
        EXPECT_EQ(reinterpret_cast<uintptr_t>(listed[i].base), live[i].first);
        EXPECT_EQ(listed[i].bytes, live[i].second);
    }

    for (const auto& r : live)
        EXPECT_EQ(hostregHostUnregister(reinterpret_cast<void*>(r.first)), hostregSuccess);
    st = stats();
    EXPECT_EQ(st.registrations, 0u);
    EXPECT_EQ(st.bytes_locked, 0u);
    EXPECT_EQ(vmlck_kb(), vmlck0_);
}

// Rule: while a registration holds a page, neighbours that share it and churn (register /
// unregister in a loop on other threads) never unlock it: VmLck never drops below the
// holders' pages, and ends exactly there.
TEST_F(Stress, ChurningNeighboursNeverUnlockAHeldPage) {
    Mapping m(32);
    ASSERT_NE(m.get(), nullptr);
    // Holders: 2 pages each from page 4k + 100; churners fill the gaps and share the edge
    // pages on both sides (holder k ends in page 4k+2, churner k spans 4k+2 .. 4k+4+100).
    std::vector<std::pair<uintptr_t, size_t>> holders;
    for (int k = 0; k < 8; ++k) {
        char* h = m.page_at(4 * k) + 100;
        ASSERT_EQ(hostregHostRegister(h, 2 * page(), 0), hostregSuccess);
        holders.emplace_back(reinterpret_cast<uintptr_t>(h), 2 * page());
    }
    const long held_kb = static_cast<long>(locked_bytes(holders) / 1024);
    ASSERT_EQ(vmlck_kb() - vmlck0_, held_kb);

    std::atomic<bool> stop{false};
    std::atomic<int> failures{0};
    std::atomic<long> min_kb{held_kb};
    std::thread watcher([&] {
        while (!stop.load()) {
            const long v = vmlck_kb() - vmlck0_;
            long cur = min_kb.load();
            while (v < cur && !min_kb.compare_exchange_weak(cur, v)) {
            }
        }
    });
    race([&](int t) {
        // Churner t: [end of holder t, start of holder t+1) (the last one ends mid-page).
        char* c = m.page_at(4 * t) + 100 + 2 * page();
        const size_t n = (t + 1 < 8) ? 2 * page() : page();
        for (int i = 0; i < 3000; ++i) {
            if (hostregHostRegister(c, n, 0) != hostregSuccess) failures.fetch_add(1);
            if (hostregHostUnregister(c) != hostregSuccess) failures.fetch_add(1);
        }
    });
    stop = true;
    watcher.join();
    EXPECT_EQ(failures.load(), 0);
    EXPECT_GE(min_kb.load(), held_kb) << "a page held by a live registration was unlocked";
    EXPECT_EQ(vmlck_kb() - vmlck0_, held_kb);
    for (const auto& h : holders)
        ASSERT_EQ(hostregHostUnregister(reinterpret_cast<void*>(h.first)), hostregSuccess);
    EXPECT_EQ(vmlck_kb(), vmlck0_);
}

// Rule: when all threads race to register the SAME range exactly one gets 0 and the others
// 712; racing to unregister it, exactly one gets 0 and the others 713. Repeated, with the
// kernel's count checked after each step.
TEST_F(Stress, SameRangeHasExactlyOneWinner) {
    // A large range keeps each backend call long, so the racers really overlap in time.
    Mapping m(258);
    ASSERT_NE(m.get(), nullptr);
    char* p = m.get() + 300;
    const size_t n = 256 * page();  // touches pages 0..256
    for (int round = 0; round < 200; ++round) {
        std::atomic<int> results[3]{};  // 0, 712/713, other
        race([&](int) {
            const int rc = hostregHostRegister(p, n, 0);
            results[rc == 0 ? 0 : rc == hostregErrorHostMemoryAlreadyRegistered ? 1 : 2]++;
        });
        ASSERT_EQ(results[0].load(), 1) << "round " << round;
        ASSERT_EQ(results[1].load(), kThreads - 1) << "round " << round;
        ASSERT_EQ(stats().registrations, 1u);
        ASSERT_EQ(vmlck_kb() - vmlck0_, pages_kb(257)) << "round " << round;

        for (auto& r : results)
            r = 0;
        race([&](int) {
            const int rc = hostregHostUnregister(p);
            results[rc == 0 ? 0 : rc == hostregErrorHostMemoryNotRegistered ? 1 : 2]++;
        });
        ASSERT_EQ(results[0].load(), 1) << "round " << round;
        ASSERT_EQ(results[1].load(), kThreads - 1) << "round " << round;
        ASSERT_EQ(stats().registrations, 0u);
        ASSERT_EQ(vmlck_kb(), vmlck0_) << "round " << round;
    }
}

// Rule: ranges that differ but all contain a common byte also have exactly one winner.
TEST_F(Stress, OverlappingRangesHaveExactlyOneWinner) {
    Mapping m(4);
    ASSERT_NE(m.get(), nullptr);
    for (int round = 0; round < 200; ++round) {
        std::atomic<int> wins{0}, refused{0};
        std::atomic<uintptr_t> winner{0};
        race([&](int t) {  // thread t: [p + 10t, p + 10t + page + 200); all contain p+80..
            char* b = m.get() + 10 * t;
            const int rc = hostregHostRegister(b, page() + 200, 0);
            if (rc == 0) {
                wins++;
                winner = reinterpret_cast<uintptr_t>(b);
            } else if (rc == hostregErrorHostMemoryAlreadyRegistered) {
                refused++;
            }
        });
        ASSERT_EQ(wins.load(), 1) << "round " << round;
        ASSERT_EQ(refused.load(), kThreads - 1) << "round " << round;
        ASSERT_EQ(stats().registrations, 1u);
        ASSERT_EQ(hostregHostUnregister(reinterpret_cast<void*>(winner.load())), hostregSuccess);
    }
    EXPECT_EQ(vmlck_kb(), vmlck0_);
}
