// test_layout.cpp: hostregGroupRanges (staging.h), the grouping of a state dict's tensors into
// the spans of its staging buffer.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "hostreg/hostreg.h"
#include "hostreg/staging.h"

namespace {

struct Grouped {
    std::vector<int64_t> group;
    std::vector<uint64_t> offset, start, bytes;
    size_t spans = 0;
    int code = -1;
};

Grouped group(const std::vector<uint64_t>& key, const std::vector<uint64_t>& first, const std::vector<uint64_t>& end,
              const std::vector<unsigned char>& alone = {}, const std::vector<uint32_t>& domain = {},
              size_t align = 16) {
    const size_t n = key.size();
    Grouped g;
    g.group.assign(n, 99);
    g.offset.assign(n, 99);
    g.start.assign(n, 99);
    g.bytes.assign(n, 99);
    g.code = hostregGroupRanges(n, key.data(), domain.empty() ? nullptr : domain.data(), first.data(), end.data(),
                                alone.empty() ? nullptr : alone.data(), align, g.group.data(), g.offset.data(),
                                g.start.data(), g.bytes.data(), &g.spans);
    return g;
}

}  // namespace

// Tensors of one storage share a span from their lowest byte (rounded down to align) to their
// highest; spans are numbered by first appearance; empty ranges get -1.
TEST(GroupRanges, RangesOfOneStorageShareASpan) {
    //            storage A       storage B   A again         empty (in A)
    auto g = group({0x1000, 0x9000, 0x1000, 0x1000}, {40, 0, 8, 100}, {72, 64, 24, 100});
    ASSERT_EQ(g.code, 0);
    ASSERT_EQ(g.spans, 2u);
    EXPECT_EQ(g.group, (std::vector<int64_t>{0, 1, 0, -1}));
    EXPECT_EQ(g.start[0], 0u);  // lowest first (8) rounded down to 16
    EXPECT_EQ(g.bytes[0], 72u);
    EXPECT_EQ(g.start[1], 0u);
    EXPECT_EQ(g.bytes[1], 64u);
    EXPECT_EQ(g.offset, (std::vector<uint64_t>{40, 0, 8, 0}));
}

TEST(GroupRanges, SpanStartsAreRoundedDownToTheAlignment) {
    auto g = group({0x2000}, {100}, {120}, {}, {}, 16);
    ASSERT_EQ(g.code, 0);
    EXPECT_EQ(g.start[0], 96u);
    EXPECT_EQ(g.bytes[0], 24u);
    EXPECT_EQ(g.offset[0], 4u);
}

// An alone range (a conjugate view, an expanded tensor, a meta tensor) gets [0, size) of its
// own even when another range names the same storage.
TEST(GroupRanges, AloneRangesGetSpansOfTheirOwn) {
    auto g = group({0x1000, 0x1000, 0x1000}, {0, 0, 16}, {32, 48, 32}, {0, 1, 0});
    ASSERT_EQ(g.code, 0);
    ASSERT_EQ(g.spans, 2u);
    EXPECT_EQ(g.group, (std::vector<int64_t>{0, 1, 0}));
    EXPECT_EQ(g.start[1], 0u);
    EXPECT_EQ(g.bytes[1], 48u);
    EXPECT_EQ(g.offset[1], 0u);
    EXPECT_EQ(g.bytes[0], 32u);
}

// The same address in two address spaces (host memory and a device) is two storages.
TEST(GroupRanges, DomainsTellEqualAddressesApart) {
    auto g = group({0x5000, 0x5000}, {0, 0}, {8, 8}, {}, {0, 1});
    ASSERT_EQ(g.code, 0);
    EXPECT_EQ(g.spans, 2u);
    EXPECT_EQ(g.group, (std::vector<int64_t>{0, 1}));
}

TEST(GroupRanges, NothingToGroupIsNoSpans) {
    size_t spans = 7;
    EXPECT_EQ(hostregGroupRanges(0, nullptr, nullptr, nullptr, nullptr, nullptr, 16, nullptr, nullptr, nullptr, nullptr,
                                 &spans),
              hostregSuccess);
    EXPECT_EQ(spans, 0u);
}

TEST(GroupRanges, BadArgumentsAreInvalidValue) {
    uint64_t k = 1, a = 0, b = 8, off = 0, st = 0, by = 0;
    int64_t grp = 0;
    size_t spans = 0;
    EXPECT_EQ(hostregGroupRanges(1, nullptr, nullptr, &a, &b, nullptr, 16, &grp, &off, &st, &by, &spans),
              hostregErrorInvalidValue);
    EXPECT_EQ(hostregGroupRanges(1, &k, nullptr, &a, &b, nullptr, 16, &grp, &off, &st, &by, nullptr),
              hostregErrorInvalidValue);
    EXPECT_EQ(hostregGroupRanges(1, &k, nullptr, &a, &b, nullptr, 0, &grp, &off, &st, &by, &spans),
              hostregErrorInvalidValue);
    EXPECT_EQ(hostregGetLastError(nullptr, nullptr), hostregErrorInvalidValue);
}
