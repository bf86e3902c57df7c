/*
 * hostreg.h: the C ABI of hostreg.
 *
 * hostreg page-locks existing host memory through the interface PyTorch already uses,
 * CUDA's cudaHostRegister / cudaHostUnregister, on any accelerator runtime and on hosts
 * with none. Every success means the range really is page-locked: by the vendor runtime,
 * or (posix backend, no accelerator) by the OS with mlock(2).
 *
 * Error codes are CUDA's cudaError_t numbers (CUDA 13.0 driver_types.h; every member of its
 * enum cudaError has its CUDA name and message through hostregGetErrorName/String; the
 * vendors' facts hostreg relies on are in docs/vendors.md). Whatever the backend, the
 * registry enforces CUDA's rules itself:
 *   - hostregHostRegister: 1 (cudaErrorInvalidValue) for a NULL pointer, 0 bytes, a range
 *     that wraps past the end of the address space, or flag bits outside
 *     Portable|Mapped|IoMemory|ReadOnly; 712 (cudaErrorHostMemoryAlreadyRegistered) when
 *     any byte of the range is already registered; 801 (cudaErrorNotSupported) for a flag
 *     the active backend cannot honour; 2 (cudaErrorMemoryAllocation) when the memory
 *     cannot be locked (e.g. RLIMIT_MEMLOCK).
 *   - hostregHostUnregister: 713 (cudaErrorHostMemoryNotRegistered) unless the pointer is
 *     the base of a live registration.
 *   - Pointers need not be page-aligned; the backend handles pages.
 * All functions are thread-safe. Details of the last failure of the calling thread (the
 * backend's native code and a human explanation) come from hostregGetLastError.
 */
#ifndef HOSTREG_HOSTREG_H
#define HOSTREG_HOSTREG_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define HOSTREG_API __attribute__((visibility("default")))
#else
#define HOSTREG_API
#endif

/* cudaError_t numbers hostreg itself answers (CUDA 13.0 driver_types.h). A vendor runtime's
 * failure may reach callers as any other member of CUDA's enum cudaError (e.g. 201
 * cudaErrorDeviceUninitialized, "invalid device context"); hostregGetErrorName names them all. */
typedef enum hostregError {
    hostregSuccess = 0,
    hostregErrorInvalidValue = 1,
    hostregErrorMemoryAllocation = 2,
    hostregErrorInitializationError = 3,
    hostregErrorCudartUnloading = 4,
    hostregErrorStubLibrary = 34,
    hostregErrorInsufficientDriver = 35,
    hostregErrorNoDevice = 100,
    hostregErrorInvalidDevice = 101,
    hostregErrorHostMemoryAlreadyRegistered = 712,
    hostregErrorHostMemoryNotRegistered = 713,
    hostregErrorNotPermitted = 800,
    hostregErrorNotSupported = 801,
    hostregErrorUnknown = 999
} hostregError;

/* cudaHostRegister flags (CUDA 13.0 cuda_runtime_api.h; same bits as the driver's
 * CU_MEMHOSTREGISTER_*). */
#define HOSTREG_HOST_REGISTER_DEFAULT 0x0u
#define HOSTREG_HOST_REGISTER_PORTABLE 0x1u
#define HOSTREG_HOST_REGISTER_MAPPED 0x2u
#define HOSTREG_HOST_REGISTER_IO_MEMORY 0x4u
#define HOSTREG_HOST_REGISTER_READ_ONLY 0x8u
#define HOSTREG_HOST_REGISTER_ALL_FLAGS 0xFu

/* One live registration, as reported by the queries below. */
typedef struct hostregRegistration {
    void* base;          /* the pointer passed to hostregHostRegister */
    size_t bytes;        /* the byte count passed to hostregHostRegister */
    unsigned int flags;  /* the flags passed to hostregHostRegister */
    void* device_ptr;    /* device address of base (posix backend: base itself) */
    const char* backend; /* static string: "posix", "cuda", ... */
} hostregRegistration;

/* Process-wide counters. */
typedef struct hostregStats {
    size_t registrations;    /* live registrations */
    size_t bytes_registered; /* sum of their byte counts */
    size_t bytes_locked;     /* distinct whole pages they cover, in bytes */
} hostregStats;

/* Page-lock [ptr, ptr + bytes) and record the registration. Mirrors cudaHostRegister.
 * Returns 0, 1, 2, 3 (backend unavailable), 712, 801, or another code from the backend. */
HOSTREG_API int hostregHostRegister(void* ptr, size_t bytes, unsigned int flags);

/* Undo the registration whose base is ptr. Mirrors cudaHostUnregister. Returns 0 or 713. */
HOSTREG_API int hostregHostUnregister(void* ptr);

/* Device address of a registered host address (any address inside a registration).
 * flags must be 0. Returns 0, or 1 (unregistered pointer, flags != 0, NULL out, or a
 * registration the runtime gave no single device address: none for its flags, or, where
 * hostreg registered it in whole pages, pieces the runtime did not map back to back). */
HOSTREG_API int hostregHostGetDevicePointer(void** device_ptr, void* host_ptr, unsigned int flags);

/* Flags of the registration containing host_ptr. Returns 0, or 1 (unregistered, NULL out). */
HOSTREG_API int hostregHostGetFlags(unsigned int* flags, void* host_ptr);

/* 1 if ptr lies inside a live registration, else 0. */
HOSTREG_API int hostregIsRegistered(const void* ptr);

/* Fills *out with the registration containing ptr. Returns 0, 713 if none, 1 if out is NULL. */
HOSTREG_API int hostregPointerGetRegistration(const void* ptr, hostregRegistration* out);

/* Copies up to capacity live registrations, in address order, into out (may be NULL when
 * capacity is 0) and stores the total number live in *total (may be NULL). Returns the
 * number copied. */
HOSTREG_API size_t hostregListRegistrations(hostregRegistration* out, size_t capacity,
                                            size_t* total);

/* Fills *out. Returns 0, or 1 if out is NULL. */
HOSTREG_API int hostregGetStats(hostregStats* out);

/* CUDA's name for a code ("cudaErrorInvalidValue"), or "unrecognized error code". */
HOSTREG_API const char* hostregGetErrorName(int code);

/* CUDA's message for a code ("invalid argument"), or "unrecognized error code". */
HOSTREG_API const char* hostregGetErrorString(int code);

/* The calling thread's last failure: returns its code (0 if this thread has had none),
 * stores the backend's native code (errno, CUresult, aclError, ...; 0 if none) in
 * *native_code and a human explanation in *message (each may be NULL). The message stays
 * valid until this thread's next failing hostreg call. */
HOSTREG_API int hostregGetLastError(long long* native_code, const char** message);

/* Name of the backend in use ("posix", ...), selecting it if none is yet; "none" when
 * HOSTREG_BACKEND=none or selection failed (see hostregGetLastError). */
HOSTREG_API const char* hostregBackendName(void);

/* ---- Arenas: one region (a whole state dict's staging memory) registered as a unit ---- */

typedef struct hostregArena hostregArena;

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

/* Allocates and maps every page of [ptr, ptr + bytes) inside the kernel, with several
 * threads, without changing a byte (MADV_POPULATE_WRITE, Linux 5.14; skipped on older
 * kernels). Afterwards no write to the range can fault for lack of memory: a full /dev/shm
 * answers 2 here (with fd >= 0, the file the range maps, the message names its
 * filesystem, size, free bytes and the bytes needed), never a SIGBUS later. Returns 0, 1
 * (NULL or 0 bytes) or 2. */
HOSTREG_API int hostregPrepareMemory(void* ptr, size_t bytes, int fd);

/* Registers [ptr, ptr + bytes) as page-aligned chunks of at most max_chunk_bytes (0: the
 * backend's cap, e.g. 256 GiB for CUDA, whose driver r580+ refuses 512 GiB or more in one
 * registration, or $HOSTREG_MAX_REGISTRATION bytes when that is smaller), each an ordinary
 * registration. On success *arena owns them; on failure
 * none stays registered and the first failing chunk's code is returned (as
 * hostregHostRegister's). */
HOSTREG_API int hostregArenaRegister(void* ptr, size_t bytes, unsigned int flags, size_t max_chunk_bytes,
                                     hostregArena** arena);

/* Unregisters every chunk of the arena and frees the handle (always, even on failure).
 * Returns 0, or the first chunk's failure code. NULL answers 1. */
HOSTREG_API int hostregArenaUnregister(hostregArena* arena);

/* Number of registrations (chunks) the arena holds. */
HOSTREG_API size_t hostregArenaChunkCount(const hostregArena* arena);

/* Copies n buffers (memcpy(dst[i], src[i], bytes[i])) using up to `threads` threads (0: one
 * per hardware thread) when the total is large enough to gain; for re-staging a state dict
 * into its arena. Buffers must not overlap. Returns 0, or 1 when n > 0 and an array is NULL. */
HOSTREG_API int hostregCopyBatch(void* const* dst, const void* const* src, const size_t* bytes, size_t n,
                                 unsigned int threads);

/* ---- Staging buffers: a state dict's staging memory, owned whole ---- */

typedef struct hostregStagingBuffer hostregStagingBuffer;

/* Makes `bytes` (> 0) of staging memory in one call that leaves nothing behind on failure:
 * shared (shared != 0: an unnamed file from hostregSharedMemoryCreate, mapped MAP_SHARED) or
 * private anonymous memory; every page allocated (hostregPrepareMemory); registered with
 * flags, in chunks of at most max_chunk_bytes, when pin != 0 (hostregArenaRegister). On
 * success *out owns the file, the mapping and the registration; hostregStagingBufferDestroy
 * releases all three. Returns 0, or the first failing step's code (1, 2, 712, 801, ...) with
 * *out NULL. */
HOSTREG_API int hostregStagingBufferCreate(size_t bytes, int shared, int pin, unsigned int flags,
                                           size_t max_chunk_bytes, hostregStagingBuffer** out);

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

/* Names of the backends compiled in, in the order HOSTREG_BACKEND=auto tries them
 * ("cuda", "hip", "acl", "ze", "musa", "posix"), NULL-terminated. Static storage. */
HOSTREG_API const char* const* hostregBackendNames(void);

/* Probes one backend by name (loading and initialising its runtime once per process; it
 * registers nothing). Returns 0 when it is usable, with *detail describing it (library
 * path and version), else the cudaError that selecting it would give, with *detail saying
 * why (no library, no device, stub driver, ...); 1 for an unknown name. *detail (may be
 * NULL) stays valid until this thread's next call of this function. */
HOSTREG_API int hostregProbeBackend(const char* name, const char** detail);

/* What one backend can do here, as its probe found it (hostregBackendCapabilities). Strings
 * are static: valid for the life of the process, never NULL (empty when unknown). */
typedef struct hostregCapabilities {
    unsigned int flags;      /* cudaHostRegister flags honoured (others answer 801); 0 if unavailable */
    size_t max_registration; /* most bytes one registration may span; arenas split below it */
    size_t granule;          /* 1: any address and size; else the runtime registers only whole
                                granules of this many bytes, and hostreg rounds out to them,
                                sharing partial edge granules between neighbours */
    const char* library;     /* the runtime file loaded ("" for posix, or when none loaded) */
    const char* version;     /* the runtime's version in its own terms */
    const char* note;        /* what a success means with this backend */
    const char* reason;      /* why the backend is unavailable ("" when it is available) */
} hostregCapabilities;

/* Probes the backend `name` (as hostregProbeBackend) and fills *out. Returns 0 when it is
 * usable, else the cudaError selecting it would give (out is filled either way: library and
 * version are known as soon as the runtime loads); 1 for an unknown name or a NULL out. */
HOSTREG_API int hostregBackendCapabilities(const char* name, hostregCapabilities* out);

/* The library's version string, "MAJOR.MINOR.PATCH". */
HOSTREG_API const char* hostregVersion(void);

#ifdef __cplusplus
}
#endif

#endif /* HOSTREG_HOSTREG_H */
