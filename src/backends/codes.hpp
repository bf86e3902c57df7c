// codes.hpp: turning a runtime's own error numbers into the cudaError a CUDA caller expects.
// The native number and the runtime's message always travel beside it in the Status.
#pragma once

#include <cstddef>

#include "core/status.hpp"

namespace hostreg {

// One of a runtime's numbers and the cudaError it means.
struct CodeMap {
    long long native;
    int code;
};

// The cudaError for native through map (n entries); hostregErrorUnknown (999) if not listed.
int translate(long long native, const CodeMap* map, size_t n);
template <size_t N>
int translate(long long native, const CodeMap (&map)[N]) {
    return translate(native, map, N);
}

// For runtimes whose numbers are CUDA's (the CUDA driver's CUresult, HIP's hipError_t,
// MUSA's musaError_t): a number that is a member of CUDA 13.0's enum cudaError keeps its
// number (numbers CUresult and cudaError share mean the same, e.g. 201 "invalid device
// context", 709 context destroyed); any other becomes 999, cudaErrorUnknown.
int mirror_cuda(long long native);

}  // namespace hostreg
