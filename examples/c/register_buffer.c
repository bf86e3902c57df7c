/* register_buffer.c: page-lock a buffer with hostreg's C ABI from plain C (C99), show that
 * the lock is real, and undo it. Uses nothing but <hostreg/hostreg.h> and the C library.
 *
 * Build against an installed hostreg (see ../README.md):
 *   cmake -S examples/c -B build/example-c -DCMAKE_PREFIX_PATH=<prefix> && cmake --build build/example-c
 *   cc -std=c99 examples/c/register_buffer.c $(pkg-config --cflags --libs hostreg) -Wl,-rpath,<prefix>/lib
 *
 * Exits 0 when every step behaved as CUDA's cudaHostRegister/cudaHostUnregister would, 1 otherwise. */
#include <hostreg/hostreg.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The kernel's count of this process's locked memory (VmLck in /proc/self/status), in kB;
 * -1 when it cannot be read. */
static long vmlck_kb(void) {
    FILE* status = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    if (status == NULL) return -1;
    while (fgets(line, sizeof line, status) != NULL) {
        if (strncmp(line, "VmLck:", 6) == 0) {
            kb = strtol(line + 6, NULL, 10);
            break;
        }
    }
    fclose(status);
    return kb;
}

/* Prints what went wrong with a hostreg call, as CUDA names it, plus the calling thread's
 * last failure (the backend's native code and explanation); returns 1. */
static int fail(const char* what, int code) {
    long long native = 0;
    const char* message = NULL;
    hostregGetLastError(&native, &message);
    fprintf(stderr, "register_buffer: %s failed: %s (%d): %s\n", what, hostregGetErrorName(code), code,
            hostregGetErrorString(code));
    if (message != NULL && message[0] != '\0') {
        fprintf(stderr, "register_buffer:   backend says (native code %lld): %s\n", native, message);
    }
    return 1;
}

int main(void) {
    const size_t bytes = (size_t)1 << 20; /* 1 MiB: well inside the default RLIMIT_MEMLOCK (8 MiB) */
    unsigned char* buffer = malloc(bytes);
    const char* backend = hostregBackendName();
    long before_kb, rise_kb;
    int rc, status = 1;

    if (buffer == NULL) return 1;
    memset(buffer, 0x5a, bytes);
    printf("hostreg %s, backend %s\n", hostregVersion(), backend);

    before_kb = vmlck_kb();
    rc = hostregHostRegister(buffer, bytes, HOSTREG_HOST_REGISTER_PORTABLE);
    if (rc != hostregSuccess) {
        status = fail("hostregHostRegister(Portable)", rc);
        goto out;
    }
    if (hostregIsRegistered(buffer) != 1 || hostregIsRegistered(buffer + bytes - 1) != 1) {
        fprintf(stderr, "register_buffer: hostregIsRegistered does not see the registration\n");
        hostregHostUnregister(buffer);
        goto out;
    }
    rise_kb = vmlck_kb() - before_kb;
    printf("registered %lu bytes; VmLck +%ld kB\n", (unsigned long)bytes, rise_kb);
    /* posix locks with mlock(2), which the kernel counts in VmLck; a vendor runtime may pin
     * pages without VmLck seeing them, so there the count is only shown. */
    if (strcmp(backend, "posix") == 0 && (before_kb < 0 || rise_kb < (long)(bytes / 1024))) {
        fprintf(stderr, "register_buffer: VmLck rose by %ld kB, less than the %lu kB registered\n", rise_kb,
                (unsigned long)(bytes / 1024));
        hostregHostUnregister(buffer);
        goto out;
    }
    rc = hostregHostUnregister(buffer);
    if (rc != hostregSuccess) {
        status = fail("hostregHostUnregister", rc);
        goto out;
    }
    rc = hostregHostUnregister(buffer); /* again: CUDA answers cudaErrorHostMemoryNotRegistered */
    if (rc != hostregErrorHostMemoryNotRegistered) {
        fprintf(stderr, "register_buffer: a second unregister answered %s (%d), not 713\n", hostregGetErrorName(rc),
                rc);
        goto out;
    }
    printf("unregistered; a second unregister answers %s (%d)\n", hostregGetErrorName(rc), rc);
    status = 0;
out:
    free(buffer);
    return status;
}
