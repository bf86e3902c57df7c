// file_io.hpp: files written and read at the disk's own speed (include/hostreg/io.h).
//
// A transfer is planned as requests over the file's blocks, then run by a few threads. Each
// request is up to 16 MiB of consecutive file bytes moved by one pwritev / preadv: the
// aligned middles of congruent segments straight from or into their memory, everything else
// gathered into (or scattered from) the request's page-aligned bounce buffer. For writes,
// CRC-32 checksums of chosen segments are computed by the same threads meanwhile, and a
// request whose bytes hold a checksum waits for it (its only dependency).
#pragma once

#include <cstddef>

#include "core/status.hpp"
#include "hostreg/io.h"

namespace hostreg {

Status file_write(int fd, const hostregFileSegment* segments, size_t count, const hostregCrcPatch* patches,
                  size_t patch_count, unsigned threads, int flags, hostregFileStats* stats);

Status file_read(int fd, const hostregFileSegment* segments, size_t count, unsigned threads, hostregFileStats* stats);

Status crc32_batch(const void* const* memory, const uint64_t* lengths, size_t count, uint32_t* out, unsigned threads);

}  // namespace hostreg
