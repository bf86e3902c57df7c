// copy.hpp: copying many buffers at once, spread over threads by bytes, for re-staging a
// state dict into its staging buffer (thousands of small tensors or a few large ones alike).
#pragma once

#include <cstddef>

namespace hostreg {

// memcpy(dst[i], src[i], bytes[i]) for i < n, using up to `threads` threads (0: the
// hardware's count) when the total is large enough to gain from them. Ranges must not overlap.
// Returns SIZE_MAX, or the index of a buffer whose memory faulted (SIGSEGV or SIGBUS: unmapped
// meanwhile); that share of the copy stopped there, the others ran to their end.
size_t copy_batch(void* const* dst, const void* const* src, const size_t* bytes, size_t n, unsigned threads);

}  // namespace hostreg
