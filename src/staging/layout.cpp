// layout.cpp: see layout.hpp.
#include "staging/layout.hpp"

#include <algorithm>
#include <unordered_map>
#include <utility>
#include <vector>

namespace hostreg {
namespace {

struct StorageId {
    uint64_t key;
    uint32_t domain;
    bool operator==(const StorageId& o) const { return key == o.key && domain == o.domain; }
};

struct StorageIdHash {
    size_t operator()(const StorageId& s) const {
        // Storage addresses differ in their middle bits; mix them with the domain (splitmix64's finaliser).
        uint64_t x = s.key ^ (uint64_t{s.domain} << 56);
        x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
        x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
        return static_cast<size_t>(x ^ (x >> 31));
    }
};

}  // namespace

void group_ranges(size_t n, const RangeIn& in, size_t align, const RangeOut& out) {
    std::unordered_map<StorageId, int64_t, StorageIdHash> index;
    index.reserve(n);
    std::vector<unsigned char> alone_span(n, 0);  // span g is an alone range's own
    size_t spans = 0;
    for (size_t i = 0; i < n; ++i) {
        const uint64_t a = in.first[i], b = in.end[i];
        if (b <= a) {
            out.group[i] = -1;
            continue;
        }
        if (in.alone != nullptr && in.alone[i] != 0) {
            out.group[i] = static_cast<int64_t>(spans);
            out.span_start[spans] = 0;
            out.span_bytes[spans] = b - a;  // [0, size)
            alone_span[spans++] = 1;
            continue;
        }
        const StorageId id{in.key[i], in.domain != nullptr ? in.domain[i] : 0};
        const auto [it, fresh] = index.emplace(id, static_cast<int64_t>(spans));
        const int64_t g = it->second;
        out.group[i] = g;
        if (fresh) {
            out.span_start[spans] = a;  // lo and hi while ranges are gathered
            out.span_bytes[spans] = b;
            ++spans;
        } else {
            out.span_start[g] = std::min(out.span_start[g], a);
            out.span_bytes[g] = std::max(out.span_bytes[g], b);
        }
    }
    // lo, hi -> start (lo rounded down to align), bytes; alone spans are already [0, size).
    for (size_t g = 0; g < spans; ++g) {
        if (alone_span[g]) continue;
        const uint64_t lo = out.span_start[g], hi = out.span_bytes[g];
        const uint64_t start = lo - lo % align;
        out.span_start[g] = start;
        out.span_bytes[g] = hi - start;
    }
    for (size_t i = 0; i < n; ++i) {
        const int64_t g = out.group[i];
        out.offset[i] = (g < 0 || alone_span[g]) ? 0 : in.first[i] - out.span_start[g];
    }
    *out.spans = spans;
}

}  // namespace hostreg
