// batch.cpp: the calls that take a whole state dict's tensors at once, as lists (one number
// per tensor): the memcpy batch of a restage and the grouping of tensors into spans
// (include/hostreg/staging.h); see common.hpp for the extension's files.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

#include "common.hpp"
#include "hostreg/staging.h"

namespace hostreg_py {

void bind_batch(nb::module_& m) {
    m.def(
        "copy_batch",
        [](const std::vector<uintptr_t>& dst, const std::vector<uintptr_t>& src, const std::vector<size_t>& nbytes,
           unsigned threads) {
            if (dst.size() != src.size() || dst.size() != nbytes.size())
                throw nb::value_error("copy_batch: dst, src and nbytes must have the same length");
            nb::gil_scoped_release nogil;
            return hostregCopyBatch(reinterpret_cast<void* const*>(dst.data()),
                                    reinterpret_cast<const void* const*>(src.data()), nbytes.data(), dst.size(),
                                    threads);
        },
        nb::arg("dst"), nb::arg("src"), nb::arg("nbytes"), nb::arg("threads") = 0,
        "hostregCopyBatch over lists of addresses and byte counts (the caller vouches for them).");
    m.def(
        "group_ranges",
        [](const std::vector<uint64_t>& key, const std::optional<std::vector<uint32_t>>& domain,
           const std::vector<uint64_t>& first, const std::vector<uint64_t>& end, const std::vector<size_t>& alone,
           size_t align) {
            const size_t n = key.size();
            if (first.size() != n || end.size() != n || (domain && domain->size() != n))
                throw nb::value_error("group_ranges: key, domain, first and end must have the same length");
            std::vector<unsigned char> alone_flags;
            if (!alone.empty()) {
                alone_flags.assign(n, 0);
                for (size_t i : alone) {
                    if (i >= n) throw nb::index_error("group_ranges: an index in alone is out of range");
                    alone_flags[i] = 1;
                }
            }
            std::vector<int64_t> group(n);
            std::vector<uint64_t> offset(n), span_start(n), span_bytes(n);
            size_t spans = 0;
            if (hostregGroupRanges(n, key.data(), domain ? domain->data() : nullptr, first.data(), end.data(),
                                   alone_flags.empty() ? nullptr : alone_flags.data(), align, group.data(),
                                   offset.data(), span_start.data(), span_bytes.data(), &spans) != 0)
                throw nb::value_error("group_ranges: align must be > 0");
            span_start.resize(spans);
            span_bytes.resize(spans);
            return std::make_tuple(std::move(group), std::move(offset), std::move(span_start), std::move(span_bytes));
        },
        nb::arg("key"), nb::arg("domain"), nb::arg("first"), nb::arg("end"), nb::arg("alone"), nb::arg("align"),
        "hostregGroupRanges over lists: (group, offset, span_start, span_bytes); alone lists the indices of the "
        "ranges that get a span of their own.");
}

}  // namespace hostreg_py
