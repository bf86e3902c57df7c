// codes.cpp: see codes.hpp.
#include "backends/codes.hpp"

namespace hostreg {

int translate(long long native, const CodeMap* map, size_t n) {
    for (size_t i = 0; i < n; ++i)
        if (map[i].native == native) return map[i].code;
    return hostregErrorUnknown;
}

int mirror_cuda(long long native) { return is_known_code(native) ? static_cast<int>(native) : hostregErrorUnknown; }

}  // namespace hostreg
