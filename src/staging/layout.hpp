// layout.hpp: where a staged state dict's tensors go, decided over arrays: tensors (byte
// ranges of their storages) that share a storage share one span of the staging buffer, so
// the bytes staged are the unique bytes and a copy is one memcpy per span. The Python layer
// reads each tensor's storage, offset and size from torch and hands them over here at once.
#pragma once

#include <cstddef>
#include <cstdint>

namespace hostreg {

// One input range per tensor: bytes [first, end) of the storage named (key, domain); the
// domain tells address spaces apart (0: host memory; one number per device otherwise).
// Empty ranges (end == first) get group -1; `alone` ranges a span of their own.
struct RangeIn {
    const uint64_t* key;
    const uint32_t* domain;  // may be null: every range in domain 0
    const uint64_t* first;
    const uint64_t* end;
    const unsigned char* alone;  // may be null: none alone
};

// Outputs, arrays of n entries: group[i] (span of range i, -1 when empty), offset[i] (bytes
// from its span's start to first[i]; 0 when alone), span_start[g], span_bytes[g] for g <
// *spans. A span starts at its lowest `first` rounded down to a multiple of `align` (an
// alone range's span is [0, end - first)) and ends at its highest `end`; spans are numbered
// in the order of their first range.
struct RangeOut {
    int64_t* group;
    uint64_t* offset;
    uint64_t* span_start;
    uint64_t* span_bytes;
    size_t* spans;
};

void group_ranges(size_t n, const RangeIn& in, size_t align, const RangeOut& out);

}  // namespace hostreg
