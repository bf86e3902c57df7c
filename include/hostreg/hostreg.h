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
HOSTREG_API size_t hostregListRegistrations(hostregRegistration* out, size_t capacity, size_t* total);

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
    size_t max_registration; /* most bytes one registration may span; hostregChunkedRegister splits below it */
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

/* The device that registrations made on threads without a current device context of their
 * own are for. AscendCL's contexts are per thread and a registration is made for the device
 * of the calling thread's context; a staging thread (hostreg.torch.Stager's, DCP's
 * DefaultStager's executor) has none. The acl backend then registers for the process's
 * device: the one set here, else the device it saw current on the first thread that used
 * hostreg with a context; with neither it refuses with 201 (cudaErrorDeviceUninitialized)
 * rather than create a context on NPU 0 (docs/vendors.md, "AscendCL"). device >= 0 names
 * the device; HOSTREG_DEVICE_OF_THIS_THREAD takes the calling thread's current one. The other
 * backends accept and ignore it: posix and ze register for no one device; cuda, hip and musa
 * use their runtime's own current device, device 0 on a thread that chose none, as CUDA's
 * runtime does. Returns 0; 1 for device < -1; 101 (cudaErrorInvalidDevice) for a device the
 * runtime does not have; 201 for HOSTREG_DEVICE_OF_THIS_THREAD on a thread without a current
 * context; or the backend selection's failure (for HOSTREG_DEVICE_OF_THIS_THREAD, a question,
 * failures are answers: hostregGetLastError has them, the log does not). */
#define HOSTREG_DEVICE_OF_THIS_THREAD (-1)
HOSTREG_API int hostregSetDefaultDevice(int device);

/* This process's allowance for page-locking, read from the kernel now: *memlock_bytes gets
 * RLIMIT_MEMLOCK's soft limit in bytes (ULLONG_MAX when unlimited) and *cap_ipc_lock 1 when the
 * process holds CAP_IPC_LOCK (CapEff in /proc/self/status), which lifts that limit for
 * mlock(2), else 0. Either may be NULL. Returns 0. */
HOSTREG_API int hostregLockAllowance(unsigned long long* memlock_bytes, int* cap_ipc_lock);

/* ---- Diagnostics ---- */

/* Levels of hostreg's diagnostics. Backend selection is INFO; a failure is DEBUG when it is
 * the caller's mistake (1, 712, 713) and WARNING otherwise (the environment's: 2, 3, 801, ...,
 * and 1 or 713 that the environment caused: a bad HOSTREG_* variable, a CUDA context gone).
 * Lookups that answer "none" (hostregPointerGetRegistration, hostregBackendName) set the last
 * error but are not logged. */
#define HOSTREG_LOG_DEBUG 0
#define HOSTREG_LOG_INFO 1
#define HOSTREG_LOG_WARNING 2

/* Receives one diagnostic: its level, the hostreg function that failed ("" for other events),
 * the cudaError code and the backend's native code (0 for other events), and the message
 * (valid during the call only). Called on the thread of the event, possibly while hostreg
 * holds internal locks: it must not call hostreg. */
typedef void (*hostregLogHandler)(void* context, int level, const char* call, int code, long long native_code,
                                  const char* message);

/* Sends every diagnostic, each once, to handler (with context) instead of stderr; the handler
 * decides what to keep. NULL restores the default: stderr, filtered by HOSTREG_LOG_LEVEL
 * (debug, info or warning; unset: silent). Meant to be set once, by a language binding. */
HOSTREG_API void hostregSetLogHandler(hostregLogHandler handler, void* context);

/* HOSTREG_LOG_LEVEL as hostreg reads it: HOSTREG_LOG_DEBUG, _INFO or _WARNING, or -1 when it is
 * unset, off, or not one of debug, info, warning (warn), off, in any case; the last is said
 * once on stderr. For a handler that should print what the stderr default would. */
HOSTREG_API int hostregLogLevelFromEnvironment(void);

/* Formats one event as hostreg's own stderr lines do after their "hostreg <level>: " prefix:
 * "<call>: <cudaError name> (<code>), native <native_code>: <message>", the call part only
 * for a non-empty call and the code part only for code != 0. Writes at most size bytes,
 * NUL-terminated, into out (may be NULL when size is 0) and returns the length of the whole
 * text, as snprintf does. For a log handler that wants hostreg's format. */
HOSTREG_API size_t hostregFormatLogEvent(const char* call, int code, long long native_code, const char* message,
                                         char* out, size_t size);

/* The library's version string, "MAJOR.MINOR.PATCH". */
HOSTREG_API const char* hostregVersion(void);

#ifdef __cplusplus
}
#endif

#endif /* HOSTREG_HOSTREG_H */
