// file_io.hpp: files written and read at the disk's own speed (include/hostreg/io.h).
//
// A transfer is planned as requests over the file's blocks, then run by a few threads:
// direct requests move a congruent segment's aligned middle straight between its memory and
// the disk; bounce requests gather (or scatter) everything else through page-aligned
// buffers. For writes, CRC-32 checksums of chosen segments are computed by the same threads
// meanwhile, and a request whose bytes hold a checksum waits for it (its only dependency).
#pragma once

#include <cstddef>

#include "core/status.hpp"
#include "hostreg/io.h"

namespace hostreg {

Status file_write(int fd, const hostregFileSegment* segments, size_t count, const hostregCrcPatch* patches,
                  size_t patch_count, unsigned threads, bool sync, hostregFileStats* stats);

Status file_read(int fd, const hostregFileSegment* segments, size_t count, unsigned threads,
                 hostregFileStats* stats);

}  // namespace hostreg
