// arena.cpp: see arena.hpp.
#include "core/arena.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/backend.hpp"
#include "core/registry.hpp"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14 (vendor-abi.md, "POSIX page-locking")
#endif

namespace hostreg {
namespace {

std::string with_commas(unsigned long long n) {
    std::string s = std::to_string(n);
    for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
    return s;
}

// The Status for shared memory in dir too small for bytes (after fallocate answered err).
Status too_small(int fd, const std::string& dir, size_t bytes, int err) {
    struct statvfs st {};
    fstatvfs(fd, &st);
    return Status::error(hostregErrorMemoryAllocation,
                         dir + " is too small: staging needs " + with_commas(bytes) + " bytes; it has " +
                             with_commas(static_cast<unsigned long long>(st.f_bavail) * st.f_frsize) +
                             " bytes free of " +
                             with_commas(static_cast<unsigned long long>(st.f_blocks) * st.f_frsize) +
                             " (enlarge it: docker run --shm-size, or mount -o remount,size=... " + dir + ")",
                         err);
}

}  // namespace

Status create_shared_memory(size_t bytes, int* fd_out) {
    if (fd_out == nullptr || bytes == 0) return Status::error(hostregErrorInvalidValue, "0 bytes or NULL fd");
    const char* env = std::getenv("HOSTREG_SHM_DIR");
    const std::string dir = env && *env ? env : "/dev/shm";
    // An unnamed file: nothing to guess, nothing to clean up; gone with its last descriptor.
    int fd = open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    std::string where = dir;
    if (fd < 0) {
        const int err = errno;
        if (err != EOPNOTSUPP && err != EISDIR && err != ENOENT)
            return Status::error(hostregErrorMemoryAllocation,
                                 "cannot create staging memory in " + dir + ": " + std::strerror(err), err);
        fd = static_cast<int>(syscall(SYS_memfd_create, "hostreg-arena", MFD_CLOEXEC));  // no usable dir
        where = "memfd";
        if (fd < 0)
            return Status::error(hostregErrorMemoryAllocation,
                                 std::string("memfd_create failed: ") + std::strerror(errno), errno);
    }
    // Reserve every page now (tmpfs allocates them), so a full filesystem is this error and
    // never a SIGBUS at a later write. On failure the kernel frees what it allocated.
    if (ftruncate(fd, static_cast<off_t>(bytes)) != 0 || fallocate(fd, 0, 0, static_cast<off_t>(bytes)) != 0) {
        const int err = errno;
        Status s = (err == ENOSPC || err == ENOMEM)
                       ? too_small(fd, where, bytes, err)
                       : Status::error(hostregErrorMemoryAllocation,
                                       "reserving " + with_commas(bytes) + " bytes in " + where +
                                           " failed: " + std::strerror(err),
                                       err);
        close(fd);
        return s;
    }
    *fd_out = fd;
    return Status::ok();
}

Status prepare_memory(void* ptr, size_t bytes) {
    if (ptr == nullptr || bytes == 0) return Status::error(hostregErrorInvalidValue, "empty or NULL range");
    if (madvise(ptr, bytes, MADV_POPULATE_WRITE) != 0) {
        const int err = errno;
        if (err == EINVAL) return Status::ok();  // kernel before 5.14: pages fault in at the first write
        return Status::error(hostregErrorMemoryAllocation,
                             std::string("populating ") + with_commas(bytes) +
                                 " bytes of staging memory failed: " + std::strerror(err) +
                                 (err == EFAULT ? " (shared memory full, or a memory limit reached)" : ""),
                             err);
    }
    return Status::ok();
}

Status Arena::register_range(void* ptr, size_t bytes, unsigned flags, size_t max_chunk) {
    Status why;
    const Backend* be = active_backend(&why);
    if (be == nullptr) return why;
    static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    size_t chunk = max_chunk ? std::min(max_chunk, be->max_registration) : be->max_registration;
    chunk = std::max(page, chunk / page * page);  // chunks of whole pages: none shares a page
    if (ptr == nullptr || bytes == 0) return Status::error(hostregErrorInvalidValue, "empty or NULL range");
    const auto base = reinterpret_cast<uintptr_t>(ptr);
    for (size_t off = 0; off < bytes; off += chunk) {
        const size_t n = std::min(chunk, bytes - off);
        Status s = Registry::instance().host_register(reinterpret_cast<void*>(base + off), n, flags);
        if (!s.is_ok()) {
            unregister_all();
            if (off) s.message += " (arena chunk at offset " + std::to_string(off) + ")";
            return s;
        }
        bases_.push_back(base + off);
    }
    return Status::ok();
}

Status Arena::unregister_all() {
    Status first;
    for (uintptr_t b : bases_) {
        Status s = Registry::instance().host_unregister(reinterpret_cast<void*>(b));
        if (!s.is_ok() && first.is_ok()) first = s;
    }
    bases_.clear();
    return first;
}

}  // namespace hostreg
