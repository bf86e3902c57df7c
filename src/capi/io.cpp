// io.cpp: the C ABI of file transfers (include/hostreg/io.h) over src/io/.
// Each function only converts arguments and records failures for hostregGetLastError.
#include "hostreg/io.h"

#include "capi/capi.hpp"
#include "io/file_io.hpp"

using hostreg::record;

extern "C" {

int hostregFileWrite(int fd, const hostregFileSegment* segments, size_t count, const hostregCrcPatch* patches,
                     size_t patch_count, unsigned int threads, int flags, hostregFileStats* stats) {
    return record(hostreg::file_write(fd, segments, count, patches, patch_count, threads, flags, stats), __func__);
}

int hostregFileRead(int fd, const hostregFileSegment* segments, size_t count, unsigned int threads,
                    hostregFileStats* stats) {
    return record(hostreg::file_read(fd, segments, count, threads, stats), __func__);
}

int hostregCrc32Batch(const void* const* memory, const uint64_t* lengths, size_t count, uint32_t* out,
                      unsigned int threads) {
    return record(hostreg::crc32_batch(memory, lengths, count, out, threads), __func__);
}

}  // extern "C"
