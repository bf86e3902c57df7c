/*
 * staging.h: hostreg's staging memory, the C ABI beneath hostreg.torch's arenas.
 *
 * A state dict is staged into one buffer of shared memory (an unnamed /dev/shm file, so
 * another process maps it without a copy) or private memory, with every page allocated up
 * front and the whole buffer registered through hostregHostRegister's registry, in chunks
 * where the backend caps one registration. Codes and hostregGetLastError are hostreg.h's.
 * All functions are thread-safe.
 */
#ifndef HOSTREG_STAGING_H
#define HOSTREG_STAGING_H

#include <stddef.h>
#include <stdint.h>

#include "hostreg/hostreg.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Chunked registrations: one large range registered as several ordinary ones ---- */

typedef struct hostregChunkedRegistration hostregChunkedRegistration;

/* Registers [ptr, ptr + bytes) as page-aligned chunks of at most max_chunk_bytes (0: the
 * backend's cap, e.g. 256 GiB for CUDA, whose driver r580+ refuses 512 GiB or more in one
 * registration, or $HOSTREG_MAX_REGISTRATION bytes when that is smaller), each an ordinary
 * registration (hostregListRegistrations shows each). On success *out owns them; on failure
 * none stays registered, *out is NULL and the first failing chunk's code is returned (as
 * hostregHostRegister's). */
HOSTREG_API int hostregChunkedRegister(void* ptr, size_t bytes, unsigned int flags, size_t max_chunk_bytes,
                                       hostregChunkedRegistration** out);

/* Unregisters every chunk and frees the handle (always, even on failure). Returns 0, or the
 * first chunk's failure code. NULL answers 1. */
HOSTREG_API int hostregChunkedUnregister(hostregChunkedRegistration* registration);

/* Number of registrations (chunks) the handle holds; 0 for NULL. */
HOSTREG_API size_t hostregChunkedCount(const hostregChunkedRegistration* registration);

/* Creates an unnamed shared-memory file of `bytes` bytes for staging and stores its
 * descriptor (close-on-exec; the caller owns it) in *fd: O_TMPFILE in /dev/shm (or
 * $HOSTREG_SHM_DIR), mode 0600, so it has no name to guess and vanishes with its last
 * descriptor; memfd_create where that is impossible. Answers 2 (cudaErrorMemoryAllocation)
 * at once, with a message naming /dev/shm, its size, its free bytes and the bytes needed,
 * when it plainly lacks the space. Pages are allocated by hostregPrepareMemory on a mapping
 * of it. Nothing is left behind on failure. Returns 0, 1 (0 bytes, NULL fd) or 2. */
HOSTREG_API int hostregSharedMemoryCreate(size_t bytes, int* fd);

/* The directory hostregSharedMemoryCreate makes staging memory in: $HOSTREG_SHM_DIR when set,
 * else /dev/shm. Stores it in *dir (static until the next call; may be NULL) and returns 0, or
 * 1 when HOSTREG_SHM_DIR is not an absolute path to an existing tmpfs (or ramfs, hugetlbfs)
 * directory, the reason in hostregGetLastError (*dir then holds the value given). */
HOSTREG_API int hostregSharedMemoryDirectory(const char** dir);

/* HOSTREG_MAX_REGISTRATION as staging reads it: stores the most bytes one registration of a
 * chunked registration may span in *bytes (SIZE_MAX when unset; may be NULL) and returns 0, or
 * 1 when it is set to anything but a positive decimal number of bytes, which makes every
 * chunked registration (every arena) fail, the reason in hostregGetLastError. */
HOSTREG_API int hostregMaxRegistration(size_t* bytes);

/* Allocates and maps every page of [ptr, ptr + bytes) inside the kernel, with several
 * threads, without changing a byte (MADV_POPULATE_WRITE, Linux 5.14; skipped on older
 * kernels). Afterwards no write to the range can fault for lack of memory: a full /dev/shm
 * answers 2 here (with fd >= 0, the file the range maps, the message names its
 * filesystem, size, free bytes and the bytes needed), never a SIGBUS later. Returns 0, 1
 * (NULL or 0 bytes) or 2. */
HOSTREG_API int hostregPrepareMemory(void* ptr, size_t bytes, int fd);

/* Copies n buffers (memcpy(dst[i], src[i], bytes[i])) using up to `threads` threads (0: one
 * per CPU the calling thread may run on, sched_getaffinity) when the total is large enough
 * to gain; for re-staging a state dict into its staging buffer. Buffers must not overlap.
 * A buffer whose memory is unmapped during the copy (SIGSEGV, SIGBUS) does not end the
 * process: the copy answers 1 naming it (the other buffers may be partly copied). For that,
 * the first call installs process-wide SIGSEGV and SIGBUS handlers that jump back into the
 * copy when the fault is there, and otherwise do what the handlers before them did (a
 * handler installed later, such as Python's faulthandler enabled afterwards, or
 * ThreadSanitizer's, takes the fault first: the guard then does not apply; nor under
 * qemu-user emulation). Returns 0, or 1
 * when n > 0 and an array is NULL, or a buffer faulted. */
HOSTREG_API int hostregCopyBatch(void* const* dst, const void* const* src, const size_t* bytes, size_t n,
                                 unsigned int threads);

/* Groups n byte ranges by the storage they lie in, as staging lays out a state dict: the
 * tensors that share a storage share one span of the staging buffer. Range i is bytes
 * [first[i], end[i]) of the storage whose address is key[i], in address space domain[i] (0:
 * host memory, one number per device otherwise; domain may be NULL: all 0). A range with
 * end[i] <= first[i] is empty: group[i] = -1. A range with alone[i] != 0 (alone may be NULL:
 * none) gets a span of its own, [0, end[i] - first[i]). The others of one storage share a
 * span from their lowest first, rounded down to a multiple of align, to their highest end.
 * Spans are numbered in the order of their first range. Writes group[i] and offset[i] (bytes
 * from the span's start to first[i]; 0 for empty and alone ranges) for i < n, and
 * span_start[g], span_bytes[g] for g < *spans; every output array holds n entries. Returns
 * 0, or 1 when n > 0 and a required array is NULL, or align is 0. */
HOSTREG_API int hostregGroupRanges(size_t n, const uint64_t* key, const uint32_t* domain, const uint64_t* first,
                                   const uint64_t* end, const unsigned char* alone, size_t align, int64_t* group,
                                   uint64_t* offset, uint64_t* span_start, uint64_t* span_bytes, size_t* spans);

/* ---- Staging buffers: a state dict's staging memory, owned whole ---- */

typedef struct hostregStagingBuffer hostregStagingBuffer;

/* Makes `bytes` (> 0) of staging memory in one call that leaves nothing behind on failure:
 * shared (shared != 0: an unnamed file from hostregSharedMemoryCreate, mapped MAP_SHARED) or
 * private anonymous memory; every page allocated (hostregPrepareMemory); registered with
 * flags, in chunks of at most max_chunk_bytes, when pin != 0 (hostregChunkedRegister). On
 * success *out owns the file, the mapping and the registration; hostregStagingBufferDestroy
 * releases all three. Returns 0, or the first failing step's code (1, 2, 712, 801, ...) with
 * *out NULL. */
HOSTREG_API int hostregStagingBufferCreate(size_t bytes, int shared, int pin, unsigned int flags,
                                           size_t max_chunk_bytes, hostregStagingBuffer** out);

/* Whether hostregStagingBufferCreate(bytes, shared, pin, ...) would be refused for lack of
 * room, answered before any memory is made: the shared-memory directory's free space (shared
 * != 0) and the active backend's limit on pinning (pin != 0; posix and ze lock pages with
 * mlock, bounded by RLIMIT_MEMLOCK less VmLck unless the process holds CAP_IPC_LOCK). Returns 0
 * when the room is there (creating may still fail later, e.g. the kernel out of memory), else
 * the code and message (hostregGetLastError) creating would give: 2 (too little room), 1 (0
 * bytes, a bad HOSTREG_SHM_DIR), or the backend selection's failure. A question: the answer
 * is not logged. */
HOSTREG_API int hostregStagingBufferRoom(size_t bytes, int shared, int pin);

/* Maps the shared staging buffer of `bytes` bytes another process made, given a descriptor of
 * its file, which it takes over (closed on failure too). Not registered (its pages are locked
 * by the process that made it). Returns 0, 1 (bad descriptor, file smaller than bytes) or 2. */
HOSTREG_API int hostregStagingBufferAttach(int fd, size_t bytes, hostregStagingBuffer** out);

/* The buffer's first byte (page-aligned), its size in bytes, its file's descriptor (-1 for
 * private memory; owned by the buffer), and the registrations it holds. NULL answers 0/-1. */
HOSTREG_API void* hostregStagingBufferData(const hostregStagingBuffer* buffer);
HOSTREG_API size_t hostregStagingBufferSize(const hostregStagingBuffer* buffer);
HOSTREG_API int hostregStagingBufferFd(const hostregStagingBuffer* buffer);
HOSTREG_API size_t hostregStagingBufferChunks(const hostregStagingBuffer* buffer);

/* Undoes the buffer's registration now; the memory stays mapped. Idempotent. Returns 0 or the
 * first chunk's failure code; NULL answers 1. */
HOSTREG_API int hostregStagingBufferUnregister(hostregStagingBuffer* buffer);

/* Unregisters, unmaps and closes everything the buffer owns, and frees it. NULL is a no-op. */
HOSTREG_API void hostregStagingBufferDestroy(hostregStagingBuffer* buffer);

/* The live staging buffer of this process (made by hostregStagingBufferCreate or Attach, not
 * yet destroyed) whose memory holds [ptr, ptr + bytes), or NULL: how a tensor's bytes lead back
 * to the buffer they were staged in. A fork(2) child finds the buffers it inherited. The answer
 * is only as current as the call: a caller that may destroy buffers in another thread must
 * order the two itself. */
HOSTREG_API hostregStagingBuffer* hostregStagingBufferFind(const void* ptr, size_t bytes);

/* A pointer the caller keeps with the buffer, e.g. the object owning it in a language binding;
 * hostreg never reads it. NULL until set, and for a NULL buffer; setting on NULL is a no-op. */
HOSTREG_API void hostregStagingBufferSetUserData(hostregStagingBuffer* buffer, void* data);
HOSTREG_API void* hostregStagingBufferUserData(const hostregStagingBuffer* buffer);

#ifdef __cplusplus
}
#endif

#endif /* HOSTREG_STAGING_H */
