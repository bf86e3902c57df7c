// test_page_share.cpp: core/page_share.cpp on its own, against a recording fake backend: how a
// range becomes granule pieces, how edge granules are shared and released, what a failure
// half-way leaves (nothing), and when a registration has one device address. The fake is
// not a vendor double: it only records calls (no memory is touched).
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/page_share.hpp"

namespace {

using hostreg::Backend;
using hostreg::PageShare;
using hostreg::Piece;
using hostreg::Status;

constexpr uintptr_t G = 4096;        // the granule
constexpr uintptr_t B = 0x10000000;  // a granule-aligned base for the test's addresses

struct Fake {
    std::vector<std::pair<uintptr_t, size_t>> registered, unregistered, shared;
    std::set<uintptr_t> live;
    uintptr_t fail_at = 0;    // host_register of this address fails
    uintptr_t gone_at = 0;    // host_unregister of this address answers 713 (runtime lost it)
    uintptr_t refuse_at = 0;  // host_unregister of this address fails (2), keeping it
    bool no_device = false;   // pieces get no device address
    bool scatter = false;     // give each piece a device address of its own
    uintptr_t next_device = 0x7000000000;
};
Fake* fake = nullptr;

Status reg(void* p, size_t n, unsigned, Piece* piece) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    EXPECT_EQ(a % G, 0u) << "a piece must be whole granules";
    EXPECT_EQ(n % G, 0u) << "a piece must be whole granules";
    if (a == fake->fail_at) return Status::error(2, "fake failure");
    EXPECT_TRUE(fake->live.insert(a).second) << "registered twice: " << a;
    fake->registered.emplace_back(a, n);
    piece->device = fake->no_device
                        ? nullptr
                        : reinterpret_cast<void*>(fake->scatter ? (fake->next_device += 0x100000) : a + 0x100000000);
    return Status::ok();
}
Status unreg(void* p, size_t n, const Piece&) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    if (a == fake->refuse_at) return Status::error(2, "fake refusal");
    EXPECT_EQ(fake->live.erase(a), 1u) << "unregistered what is not registered: " << a;
    fake->unregistered.emplace_back(a, n);
    if (a == fake->gone_at) return Status::error(713, "fake: not registered");
    return Status::ok();
}
Status share(void* p, size_t n, const Piece&) {
    fake->shared.emplace_back(reinterpret_cast<uintptr_t>(p), n);
    return Status::ok();
}
const hostreg::Probe& probe() {
    static hostreg::Probe p;
    return p;
}
const Backend kFake = {"fake", probe, reg, unreg, share, nullptr, nullptr};

class PageShareTest : public ::testing::Test {
  protected:
    void SetUp() override { fake = &f_; }
    void TearDown() override {
        EXPECT_TRUE(f_.live.empty()) << "pieces left registered";
        fake = nullptr;
    }
    Status acquire(uintptr_t lo, size_t bytes, Piece* mid, void** dev) {
        return ps_.acquire(kFake, lo, bytes, 0, G, mid, dev);
    }
    Status release(uintptr_t lo, size_t bytes, const Piece& mid) {
        bool released = false;
        Status s = ps_.release(kFake, lo, bytes, G, mid, &released);
        EXPECT_TRUE(released);
        return s;
    }
    using Calls = std::vector<std::pair<uintptr_t, size_t>>;
    bool released_ = false;
    Fake f_;
    PageShare ps_;
};

TEST_F(PageShareTest, AnAlignedRangeIsOnePiece) {
    Piece mid;
    void* dev = nullptr;
    ASSERT_TRUE(acquire(B, 3 * G, &mid, &dev).is_ok());
    EXPECT_EQ(f_.registered, (Calls{{B, 3 * G}}));
    EXPECT_EQ(dev, reinterpret_cast<void*>(B + 0x100000000));
    ASSERT_TRUE(release(B, 3 * G, mid).is_ok());
    EXPECT_EQ(f_.unregistered, (Calls{{B, 3 * G}}));
}

TEST_F(PageShareTest, UnalignedEndsAreEdgesOfOneGranule) {
    Piece mid;
    void* dev = nullptr;
    ASSERT_TRUE(acquire(B + 100, 2 * G, &mid, &dev).is_ok());  // [B+100, B+2G+100)
    EXPECT_EQ(f_.registered, (Calls{{B, G}, {B + G, G}, {B + 2 * G, G}}));
    EXPECT_EQ(dev, reinterpret_cast<void*>(B + 100 + 0x100000000)) << "contiguous pieces: one device address";
    ASSERT_TRUE(release(B + 100, 2 * G, mid).is_ok());
    EXPECT_EQ(f_.unregistered.size(), 3u);
}

TEST_F(PageShareTest, TwoPartialGranulesHaveNoMiddle) {
    Piece mid;
    void* dev = nullptr;
    ASSERT_TRUE(acquire(B + G - 8, 16, &mid, &dev).is_ok());
    EXPECT_EQ(f_.registered, (Calls{{B, G}, {B + G, G}}));
    EXPECT_EQ(mid.device, nullptr);
    ASSERT_TRUE(release(B + G - 8, 16, mid).is_ok());
}

TEST_F(PageShareTest, ARangeInsideOneGranuleIsOneEdge) {
    Piece mid;
    void* dev = nullptr;
    ASSERT_TRUE(acquire(B + 10, 20, &mid, &dev).is_ok());
    EXPECT_EQ(f_.registered, (Calls{{B, G}}));
    ASSERT_TRUE(release(B + 10, 20, mid).is_ok());
}

TEST_F(PageShareTest, NeighboursShareAnEdgeUntilTheLastLeaves) {
    Piece a, b;
    void* dev = nullptr;
    ASSERT_TRUE(acquire(B + 10, G, &a, &dev).is_ok());        // edges B and B+G
    ASSERT_TRUE(acquire(B + G + 10, 100, &b, &dev).is_ok());  // inside granule B+G: shared
    EXPECT_EQ(f_.registered, (Calls{{B, G}, {B + G, G}})) << "the shared granule is registered once";
    EXPECT_EQ(f_.shared, (Calls{{B + G, G}})) << "the backend is told of the new holder";
    ASSERT_TRUE(release(B + 10, G, a).is_ok());
    EXPECT_EQ(f_.unregistered, (Calls{{B, G}})) << "B+G is still held by the neighbour";
    ASSERT_TRUE(release(B + G + 10, 100, b).is_ok());
    EXPECT_EQ(f_.unregistered, (Calls{{B, G}, {B + G, G}}));
}

TEST_F(PageShareTest, AFailureHalfWayLeavesNothing) {
    Piece mid;
    void* dev = nullptr;
    f_.fail_at = B + 3 * G;  // the tail edge
    EXPECT_EQ(acquire(B + 100, 3 * G, &mid, &dev).code, 2);
    EXPECT_TRUE(f_.live.empty());
    EXPECT_EQ(f_.unregistered.size(), 2u) << "head and middle undone";
    f_.fail_at = B + G;  // the middle
    f_.unregistered.clear();
    EXPECT_EQ(acquire(B + 100, 3 * G, &mid, &dev).code, 2);
    EXPECT_EQ(f_.unregistered, (Calls{{B, G}}));
    // A failure must not disturb an edge someone else holds.
    Piece n;
    ASSERT_TRUE(acquire(B + 10, 20, &n, &dev).is_ok());  // holds granule B
    f_.unregistered.clear();
    EXPECT_EQ(acquire(B + 100, 3 * G, &mid, &dev).code, 2);
    EXPECT_TRUE(f_.unregistered.empty()) << "granule B stays with its other holder";
    ASSERT_TRUE(release(B + 10, 20, n).is_ok());
}

TEST_F(PageShareTest, PiecesMappedApartHaveNoSingleDeviceAddress) {
    f_.scatter = true;
    Piece mid;
    void* dev = reinterpret_cast<void*>(1);
    ASSERT_TRUE(acquire(B + 100, 2 * G, &mid, &dev).is_ok());
    EXPECT_EQ(dev, nullptr);
    ASSERT_TRUE(release(B + 100, 2 * G, mid).is_ok());
    ASSERT_TRUE(acquire(B, 2 * G, &mid, &dev).is_ok());  // one piece: its own address
    EXPECT_NE(dev, nullptr);
    ASSERT_TRUE(release(B, 2 * G, mid).is_ok());
}

TEST_F(PageShareTest, AFailedFreshEdgeIsForgotten) {
    Piece mid;
    void* dev = nullptr;
    f_.fail_at = B;
    EXPECT_EQ(acquire(B + 10, 20, &mid, &dev).code, 2);
    f_.fail_at = 0;
    ASSERT_TRUE(acquire(B + 40, 20, &mid, &dev).is_ok());
    EXPECT_EQ(f_.registered, (Calls{{B, G}})) << "its next holder registers it";
    EXPECT_TRUE(f_.shared.empty());
    ASSERT_TRUE(release(B + 40, 20, mid).is_ok());
}

TEST_F(PageShareTest, AMiddleTheRuntimeNoLongerKnowsReleasesTheEdges) {
    Piece mid;
    void* dev = nullptr;
    ASSERT_TRUE(acquire(B + 100, 3 * G, &mid, &dev).is_ok());
    f_.gone_at = B + G;
    bool released = false;
    EXPECT_EQ(ps_.release(kFake, B + 100, 3 * G, G, mid, &released).code, 713);
    EXPECT_TRUE(released);
    EXPECT_TRUE(f_.live.empty()) << "the edges must go with it";
}

TEST_F(PageShareTest, AnEdgeTheRuntimeRefusesToReleaseIsTakenOverNotRegisteredAgain) {
    Piece mid;
    void* dev = nullptr;
    ASSERT_TRUE(acquire(B + 10, 20, &mid, &dev).is_ok());
    f_.refuse_at = B;
    EXPECT_EQ(ps_.release(kFake, B + 10, 20, G, mid, &released_).code, 2);
    f_.refuse_at = 0;
    ASSERT_TRUE(acquire(B + 100, 20, &mid, &dev).is_ok());
    EXPECT_EQ(f_.registered, (Calls{{B, G}})) << "still registered with the runtime: taken over";
    ASSERT_TRUE(release(B + 100, 20, mid).is_ok());
}

TEST_F(PageShareTest, AnEdgeWithoutADeviceAddressGivesNone) {
    f_.no_device = true;
    Piece mid;
    void* dev = reinterpret_cast<void*>(1);
    ASSERT_TRUE(acquire(B + 10, 20, &mid, &dev).is_ok());
    EXPECT_EQ(dev, nullptr);
    ASSERT_TRUE(release(B + 10, 20, mid).is_ok());
}

}  // namespace
