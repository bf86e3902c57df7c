// io.cpp: checkpoint files written and read at the disk's speed (include/hostreg/io.h); see
// common.hpp for the extension's files.
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <tuple>
#include <vector>

#include "common.hpp"
#include "hostreg/io.h"

namespace hostreg_py {

void bind_io(nb::module_& m) {
    m.attr("IO_SYNC") = HOSTREG_IO_SYNC;
    m.attr("IO_MORE") = HOSTREG_IO_MORE;
    static_assert(sizeof(hostregFileSegment) == 24 && sizeof(hostregCrcPatch) == 24,
                  "file_write/file_read take arrays of three 64-bit words per entry");
    m.def(
        "file_write",
        [](int fd, uintptr_t segments, size_t count, uintptr_t patches, size_t patch_count, unsigned threads,
           int flags) {
            hostregFileStats st{};
            int code;
            {
                nb::gil_scoped_release nogil;
                code = hostregFileWrite(fd, static_cast<const hostregFileSegment*>(as_ptr(segments)), count,
                                        static_cast<const hostregCrcPatch*>(as_ptr(patches)), patch_count, threads,
                                        flags, &st);
            }
            raise_pending();
            return std::make_tuple(code, st.direct_bytes, st.bounced_bytes, st.requests, st.direct != 0);
        },
        nb::arg("fd"), nb::arg("segments"), nb::arg("count"), nb::arg("patches"), nb::arg("patch_count"),
        nb::arg("threads") = 0, nb::arg("flags") = HOSTREG_IO_SYNC,
        "hostregFileWrite over arrays at the given addresses (three 64-bit words per segment: file offset, "
        "length, memory; per patch: crc_of, into, offset; the caller vouches for them); flags: HOSTREG_IO_SYNC, "
        "HOSTREG_IO_MORE. Returns (cudaError "
        "number, direct bytes, bounced bytes, requests, O_DIRECT to the end).");
    m.def(
        "file_read",
        [](int fd, uintptr_t segments, size_t count, unsigned threads) {
            hostregFileStats st{};
            int code;
            {
                nb::gil_scoped_release nogil;
                code =
                    hostregFileRead(fd, static_cast<const hostregFileSegment*>(as_ptr(segments)), count, threads, &st);
            }
            raise_pending();
            return std::make_tuple(code, st.direct_bytes, st.bounced_bytes, st.requests, st.direct != 0);
        },
        nb::arg("fd"), nb::arg("segments"), nb::arg("count"), nb::arg("threads") = 0,
        "hostregFileRead over an array of segments at the given address (as file_write's). Returns (cudaError "
        "number, direct bytes, bounced bytes, requests, O_DIRECT to the end).");
    m.def(
        "crc32_batch",
        [](const std::vector<uintptr_t>& memory, const std::vector<uint64_t>& lengths, unsigned threads) {
            if (memory.size() != lengths.size())
                throw nb::value_error("crc32_batch: memory and lengths must have the same length");
            std::vector<uint32_t> out(memory.size());
            int code;
            {
                nb::gil_scoped_release nogil;
                code = hostregCrc32Batch(reinterpret_cast<const void* const*>(memory.data()), lengths.data(),
                                         memory.size(), out.data(), threads);
            }
            raise_pending();
            return std::make_tuple(code, std::move(out));
        },
        nb::arg("memory"), nb::arg("lengths"), nb::arg("threads") = 0,
        "hostregCrc32Batch over lists of addresses and byte counts (the caller vouches for them). Returns "
        "(cudaError number, the checksums).");
}

}  // namespace hostreg_py
