/*
 * io.h: writing and reading files at the disk's own speed, the C ABI beneath
 * hostreg.torch's checkpoint writer and reader (docs/checkpoint.md).
 *
 * A file is described as segments: byte ranges of the file, each with the memory its bytes
 * come from (writes) or go to (reads). The file is moved in requests of up to 16 MiB of
 * consecutive file bytes, several in flight, each one pwritev / preadv whose pieces are:
 *   - the aligned middle of a segment whose memory address is congruent to its file offset
 *     modulo HOSTREG_IO_BLOCK (address % block == offset % block) and whose aligned middle
 *     is at least HOSTREG_IO_MIN_DIRECT bytes: straight from or into its memory, no copy in
 *     user space;
 *   - everything else (headers, the edges of such segments, small or non-congruent ones, and
 *     for reads gaps of up to 64 KiB between segments, read and dropped): through one
 *     page-aligned 1 MiB bounce buffer per request, reused across calls.
 * So a file of many tensors between small headers still reaches the disk as large requests.
 * Where the file is open with O_DIRECT, every piece is aligned to HOSTREG_IO_BLOCK bytes in
 * file offset, length and memory. A descriptor without O_DIRECT gets the same requests,
 * through the page cache. A request that the filesystem refuses with EINVAL under O_DIRECT
 * (alignment stricter than the block) clears O_DIRECT on the descriptor (fcntl) and is
 * moved again buffered; the stats say so.
 *
 * Failures answer 1 (cudaErrorInvalidValue) for bad arguments and 999 (cudaErrorUnknown)
 * for the operating system's refusal, with errno as the native code of hostregGetLastError
 * (ENOSPC, EIO, ...) and the call, offset and length in its message. All functions are
 * thread-safe.
 */
#ifndef HOSTREG_IO_H
#define HOSTREG_IO_H

#include <stddef.h>
#include <stdint.h>

#include "hostreg/hostreg.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Alignment (bytes) of every O_DIRECT request: a multiple of the logical block size of the
 * disks and filesystems in use (512 or 4,096 bytes), and the page size on x86-64. */
#define HOSTREG_IO_BLOCK 4096
/* A congruent segment moves straight from its memory only when its aligned middle is at
 * least this many bytes; smaller ones are gathered into the bounce buffers (a copy is
 * cheaper than padding each to the block). */
#define HOSTREG_IO_MIN_DIRECT (256 * 1024)

/* One byte range of a file and the memory its bytes come from or go to. */
typedef struct hostregFileSegment {
    uint64_t file_offset; /* where the bytes lie in the file */
    uint64_t length;      /* bytes */
    void* memory;         /* writes: their source; reads: their destination */
} hostregFileSegment;

/* For writes: "store the CRC-32 (zlib's crc32, as ZIP uses) of segment `crc_of`, 4 bytes
 * little-endian, at byte `offset` of segment `into` before writing that segment". The
 * bytes of `into` are written only once the checksum is in place; everything else is
 * written meanwhile. */
typedef struct hostregCrcPatch {
    size_t crc_of;
    size_t into;
    uint64_t offset;
} hostregCrcPatch;

/* What a transfer did, in bytes. */
typedef struct hostregFileStats {
    uint64_t direct_bytes;  /* moved straight between the segments' memory and the file */
    uint64_t bounced_bytes; /* moved through a bounce buffer (including padding) */
    uint64_t requests;      /* requests (each one pwritev / preadv, more if it came back short) */
    int direct;             /* 1 when the descriptor had O_DIRECT to the end */
} hostregFileStats;

/* Flags of hostregFileWrite. */
#define HOSTREG_IO_SYNC 1 /* the data is durable on return (fdatasync) */
#define HOSTREG_IO_MORE                                                  \
    2 /* a part of the file, more follow: the segments must end at a     \
       * multiple of HOSTREG_IO_BLOCK, and the file is neither truncated \
       * nor synced (the last part's call does that) */

/* Writes segments[0..count) to fd with up to `threads` threads (0: 4). The segments must
 * be in file order and tile [start, end) exactly, without gaps or overlaps, where start, the
 * first segment's file offset, is a multiple of HOSTREG_IO_BLOCK (0 for a whole file). A file
 * may be written in parts, one call after another, each starting where the one before it
 * ended (the others with HOSTREG_IO_MORE): the caller can then lay out the next part while
 * this one is written. Unless HOSTREG_IO_MORE is given, the file is then truncated to end
 * (O_DIRECT pads the last block; an older, longer file's bytes past end go too). Bytes before
 * start are left as they are. The blocks of [start, end) are allocated first (fallocate,
 * where the filesystem has it: parallel O_DIRECT writes into allocated blocks do not take
 * turns on ext4's inode lock), so no room fails before a byte is written, and a write that
 * fails later may leave the file longer, its unwritten part reading as zeros.
 * flags: HOSTREG_IO_SYNC, HOSTREG_IO_MORE or 0 (other bits
 * answer 1). Memory of the `into` segments of patches is written to; the rest is only read.
 * stats may be NULL. Returns 0, 1 or 999. */
HOSTREG_API int hostregFileWrite(int fd, const hostregFileSegment* segments, size_t count,
                                 const hostregCrcPatch* patches, size_t patch_count, unsigned int threads, int flags,
                                 hostregFileStats* stats);

/* Reads segments[0..count) (in file order, not overlapping; gaps are skipped) from fd into
 * their memory with up to `threads` threads (0: 4). A segment that reaches past the end of
 * the file answers 999 with native code EIO (a truncated checkpoint), naming the offset.
 * stats may be NULL. Returns 0, 1 or 999. */
HOSTREG_API int hostregFileRead(int fd, const hostregFileSegment* segments, size_t count, unsigned int threads,
                                hostregFileStats* stats);

/* The CRC-32 (zlib's crc32, as ZIP uses; computed by libdeflate where hostreg was built with
 * it) of each memory range i, [memory[i], memory[i] + lengths[i]), into out[i], with up to
 * `threads` threads (0: 4; ranges of over 4 MiB are shared out in 4 MiB pieces). For the
 * checkpoint reader's verification. Returns 0, or 1 for a NULL array (count > 0) or a NULL
 * range of nonzero length, or 2 where the plan's memory cannot be had. */
HOSTREG_API int hostregCrc32Batch(const void* const* memory, const uint64_t* lengths, size_t count, uint32_t* out,
                                  unsigned int threads);

#ifdef __cplusplus
}
#endif

#endif /* HOSTREG_IO_H */
