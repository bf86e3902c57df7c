// register_buffer.cpp: page-lock a buffer with hostreg's C ABI, show that the lock is real,
// and undo it. Uses nothing but <hostreg/hostreg.h> and the standard library.
//
// Build against an installed hostreg (see README.md in this folder):
//   cmake -S examples -B build/example -DCMAKE_PREFIX_PATH=<prefix> && cmake --build build/example
//   c++ -std=c++17 examples/register_buffer.cpp $(pkg-config --cflags --libs hostreg) -o register_buffer
//
// Exits 0 when every step behaved as CUDA's cudaHostRegister/cudaHostUnregister would, 1 otherwise.
#include <hostreg/hostreg.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>

namespace {

// The kernel's count of this process's locked memory (VmLck in /proc/self/status), in kB;
// -1 when it cannot be read.
long vmlck_kb() {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line)) {
        if (line.rfind("VmLck:", 0) == 0) return std::stol(line.substr(6));
    }
    return -1;
}

// Prints what went wrong with a hostreg call, as CUDA names it, plus the calling thread's
// last failure (the backend's native code and explanation).
int fail(const char* what, int code) {
    long long native = 0;
    const char* message = nullptr;
    hostregGetLastError(&native, &message);
    std::fprintf(stderr, "register_buffer: %s failed: %s (%d): %s\n", what, hostregGetErrorName(code), code,
                 hostregGetErrorString(code));
    if (message != nullptr && message[0] != '\0') {
        std::fprintf(stderr, "register_buffer:   backend says (native code %lld): %s\n", native, message);
    }
    return 1;
}

}  // namespace

int main() {
    std::setvbuf(stdout, nullptr, _IOLBF, 0);  // keep the report in order with stderr's messages
    constexpr size_t kBytes = 1u << 20;        // 1 MiB: well inside the default RLIMIT_MEMLOCK (8 MiB)
    std::unique_ptr<unsigned char[]> buffer(new unsigned char[kBytes]);
    std::memset(buffer.get(), 0x5a, kBytes);
    void* ptr = buffer.get();

    const char* backend = hostregBackendName();
    std::printf("hostreg %s, backend %s\n", hostregVersion(), backend);

    const long before_kb = vmlck_kb();
    int rc = hostregHostRegister(ptr, kBytes, HOSTREG_HOST_REGISTER_PORTABLE);
    if (rc != hostregSuccess) return fail("hostregHostRegister(Portable)", rc);
    std::printf("registered %zu bytes at %p (Portable): %s\n", kBytes, ptr, hostregGetErrorName(rc));

    if (hostregIsRegistered(ptr) != 1 || hostregIsRegistered(buffer.get() + kBytes - 1) != 1) {
        std::fprintf(stderr, "register_buffer: hostregIsRegistered does not see the registration\n");
        hostregHostUnregister(ptr);
        return 1;
    }
    std::printf("hostregIsRegistered: first and last byte are registered\n");

    const long locked_kb = vmlck_kb();
    const long rise_kb = locked_kb - before_kb;
    std::printf("VmLck: %ld kB before, %ld kB while registered (+%ld kB)\n", before_kb, locked_kb, rise_kb);
    // posix locks with mlock(2), which the kernel counts in VmLck; a vendor runtime may pin
    // pages without VmLck seeing them, so there the count is only shown.
    if (std::strcmp(backend, "posix") == 0 && (before_kb < 0 || rise_kb < static_cast<long>(kBytes / 1024))) {
        std::fprintf(stderr, "register_buffer: VmLck rose by %ld kB, less than the %zu kB registered\n", rise_kb,
                     kBytes / 1024);
        hostregHostUnregister(ptr);
        return 1;
    }

    rc = hostregHostUnregister(ptr);
    if (rc != hostregSuccess) return fail("hostregHostUnregister", rc);
    std::printf("unregistered: %s; VmLck now %ld kB; registered: %d\n", hostregGetErrorName(rc), vmlck_kb(),
                hostregIsRegistered(ptr));
    if (hostregIsRegistered(ptr) != 0) {
        std::fprintf(stderr, "register_buffer: still registered after hostregHostUnregister\n");
        return 1;
    }

    rc = hostregHostUnregister(ptr);
    if (rc != hostregErrorHostMemoryNotRegistered) {
        std::fprintf(stderr, "register_buffer: unregistering twice answered %s (%d), expected %s (%d)\n",
                     hostregGetErrorName(rc), rc, hostregGetErrorName(hostregErrorHostMemoryNotRegistered),
                     static_cast<int>(hostregErrorHostMemoryNotRegistered));
        return 1;
    }
    std::printf("unregistering again: %s (%d), as CUDA answers\n", hostregGetErrorName(rc), rc);
    std::printf("register_buffer: OK\n");
    return 0;
}
