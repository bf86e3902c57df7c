// checksum.cpp: CRC-32 of many memory ranges at once (hostregCrc32Batch, include/hostreg/io.h),
// the checkpoint reader's verification of ZIP records (docs/checkpoint.md).
//
// Ranges are cut into pieces of kCrcPiece bytes (requests.hpp); the pieces are shared out over
// the threads (parallel.hpp: a refused thread's share runs on the caller), and each range's
// checksum is its pieces' combined with zlib's crc32_combine, in order.
#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <new>
#include <string>
#include <vector>

#include "io/file_io.hpp"
#include "io/requests.hpp"
#include "staging/parallel.hpp"

namespace hostreg {

using io::crc32_of;
using io::kCrcPiece;
using io::thread_count;

Status crc32_batch(const void* const* memory, const uint64_t* lengths, size_t count, uint32_t* out, unsigned threads) {
    if (count == 0) return Status::ok();
    if (memory == nullptr || lengths == nullptr || out == nullptr)
        return Status::error(hostregErrorInvalidValue, "memory, lengths and out must not be NULL");
    struct Piece {
        size_t range;
        uint64_t offset, length;
    };
    std::vector<Piece> pieces;
    std::vector<size_t> first(count + 1);
    try {
        for (size_t i = 0; i < count; ++i) {
            if (memory[i] == nullptr && lengths[i] != 0)
                return Status::error(hostregErrorInvalidValue, "range " + std::to_string(i) + " has no memory but " +
                                                                   std::to_string(lengths[i]) + " bytes");
            first[i] = pieces.size();
            for (uint64_t off = 0; off < lengths[i]; off += kCrcPiece)
                pieces.push_back(Piece{i, off, std::min(kCrcPiece, lengths[i] - off)});
        }
        first[count] = pieces.size();
    } catch (const std::bad_alloc&) {
        return Status::error(hostregErrorMemoryAllocation, "no memory for the checksums' plan");
    }
    std::vector<uint32_t> crc(pieces.size());
    const size_t parts = std::max<size_t>(1, std::min<size_t>(thread_count(threads), pieces.size()));
    run_parts(parts, [&](size_t p) {
        for (size_t k = p; k < pieces.size(); k += parts) {
            const Piece& piece = pieces[k];
            crc[k] = crc32_of(static_cast<const char*>(memory[piece.range]) + piece.offset, piece.length);
        }
    });
    for (size_t i = 0; i < count; ++i) {
        uLong c = 0;
        for (size_t k = first[i]; k < first[i + 1]; ++k)
            c = crc32_combine(c, crc[k], static_cast<z_off_t>(pieces[k].length));
        out[i] = static_cast<uint32_t>(c);
    }
    return Status::ok();
}

}  // namespace hostreg
