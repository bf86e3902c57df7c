// copy.cpp: see copy.hpp. The total byte count is cut into equal shares, one per thread; a
// share may begin or end inside a buffer, so one large tensor is split as well as many small
// ones are grouped.
#include "staging/copy.hpp"

#include "staging/parallel.hpp"

#include <algorithm>
#include <cstring>
#include <thread>

namespace hostreg {
namespace {

constexpr size_t kMinBytesPerThread = size_t{8} << 20;  // below this a thread costs more than it gains
constexpr size_t kPiece = size_t{256} << 10;

// Copies the bytes in [lo, hi) of the concatenation of all buffers.
void copy_span(void* const* dst, const void* const* src, const size_t* bytes, size_t n, size_t lo, size_t hi) {
    size_t start = 0;  // offset of buffer i in the concatenation
    for (size_t i = 0; i < n && start < hi; start += bytes[i], ++i) {
        const size_t end = start + bytes[i];
        if (end <= lo) continue;
        const size_t a = std::max(lo, start), b = std::min(hi, end);
        // In pieces: glibc switches to non-temporal stores for one large memcpy, which ran
        // slower than cached stores here (measured against torch's copy_, 2 GiB warm).
        for (size_t off = a; off < b; off += kPiece)
            std::memcpy(static_cast<char*>(dst[i]) + (off - start), static_cast<const char*>(src[i]) + (off - start),
                        std::min(kPiece, b - off));
    }
}

}  // namespace

void copy_batch(void* const* dst, const void* const* src, const size_t* bytes, size_t n, unsigned threads) {
    size_t total = 0;
    for (size_t i = 0; i < n; ++i)
        total += bytes[i];
    if (threads == 0) threads = usable_cpus();
    threads = static_cast<unsigned>(std::min<size_t>(threads, std::max<size_t>(1, total / kMinBytesPerThread)));
    if (threads <= 1) return copy_span(dst, src, bytes, n, 0, total);
    run_parts(threads, [&](size_t t) {  // a refused thread's share is copied here instead
        const Span s = part_of(total, threads, 1, t);
        copy_span(dst, src, bytes, n, s.begin, s.end);
    });
}

}  // namespace hostreg
