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
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <string>

#include "core/backend.hpp"
#include "core/memory_map.hpp"
#include "core/registry.hpp"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14 (madvise(2); docs/vendors.md "POSIX")
#endif

namespace hostreg {
namespace {

std::string with_commas(unsigned long long n) {
    std::string s = std::to_string(n);
    for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
    return s;
}

constexpr size_t kMinPopulateBytes = size_t{16} << 20;  // below this one thread populates

// The directory of the file behind fd ("/dev/shm"), or "memfd", for messages.
std::string backing_dir(int fd) {
    char link[64], target[PATH_MAX] = {};
    std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    const ssize_t n = readlink(link, target, sizeof target - 1);
    const std::string path(target, n > 0 ? static_cast<size_t>(n) : 0);
    if (path.empty()) return "the shared-memory filesystem";
    if (path.rfind("/memfd:", 0) == 0) return "memfd";
    const size_t slash = path.rfind('/');
    return slash == 0 ? "/" : path.substr(0, slash);
}

// An error naming fd's filesystem when it has less than bytes free (or err says it ran
// out), else ok. err: the errno that prompted the question, 0 if none.
Status shortage(int fd, size_t bytes, int err) {
    struct statvfs st {};
    if (fstatvfs(fd, &st) != 0) return Status::ok();
    const unsigned long long free_bytes = static_cast<unsigned long long>(st.f_bavail) * st.f_frsize;
    if (free_bytes >= bytes && err == 0) return Status::ok();
    const std::string dir = backing_dir(fd);
    if (dir == "memfd" && err == 0) return Status::ok();  // memfd has no filesystem limit of its own
    return Status::error(hostregErrorMemoryAllocation,
                         dir + " is too small: staging needs " + with_commas(bytes) + " bytes; it has " +
                             with_commas(free_bytes) + " bytes free of " +
                             with_commas(static_cast<unsigned long long>(st.f_blocks) * st.f_frsize) +
                             " (enlarge it: docker run --shm-size, or mount -o remount,size=... " + dir + ")",
                         err ? err : ENOSPC);
}

}  // namespace

Status create_shared_memory(size_t bytes, int* fd_out) {
    if (fd_out == nullptr || bytes == 0) return Status::error(hostregErrorInvalidValue, "0 bytes or NULL fd");
    const char* env = std::getenv("HOSTREG_SHM_DIR");
    const std::string dir = env && *env ? env : "/dev/shm";
    // An unnamed file: nothing to guess, nothing to clean up; gone with its last descriptor.
    int fd = open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
        const int err = errno;
        if (err != EOPNOTSUPP && err != EISDIR && err != ENOENT)
            return Status::error(hostregErrorMemoryAllocation,
                                 "cannot create staging memory in " + dir + ": " + std::strerror(err), err);
        fd = static_cast<int>(syscall(SYS_memfd_create, "hostreg-arena", MFD_CLOEXEC));  // no usable dir
        if (fd < 0)
            return Status::error(hostregErrorMemoryAllocation,
                                 std::string("memfd_create failed: ") + std::strerror(errno), errno);
    }
    Status s = shortage(fd, bytes, 0);  // plainly too small: say so before allocating anything
    if (s.is_ok() && ftruncate(fd, static_cast<off_t>(bytes)) != 0)
        s = Status::error(hostregErrorMemoryAllocation,
                          "cannot size staging memory to " + with_commas(bytes) + " bytes: " + std::strerror(errno),
                          errno);
    if (!s.is_ok()) {
        close(fd);
        return s;
    }
    *fd_out = fd;
    return Status::ok();
}

Status prepare_memory(void* ptr, size_t bytes, int fd) {
    if (ptr == nullptr || bytes == 0) return Status::error(hostregErrorInvalidValue, "empty or NULL range");
    const auto lo = reinterpret_cast<uintptr_t>(ptr);
    if (lo + bytes < lo) return Status::error(hostregErrorInvalidValue, "range wraps past the end of the address space");
    if (!range_mapped(lo, bytes))  // checked here so that EINVAL below can only mean an old kernel
        return Status::error(hostregErrorInvalidValue, "range is not (fully) mapped memory", ENOMEM);
    // Populated by several threads at once: the kernel zeroes new pages, and that scales with
    // cores (perf-notes.md: in-kernel population is several times faster than user faults).
    const uintptr_t page = page_size();
    const uintptr_t first = reinterpret_cast<uintptr_t>(ptr) & ~(page - 1);
    const size_t len = reinterpret_cast<uintptr_t>(ptr) + bytes - first;
    const size_t threads =
        std::max<size_t>(1, std::min<size_t>(std::thread::hardware_concurrency(), len / kMinPopulateBytes));
    const size_t share = (len / threads + page - 1) / page * page;
    std::vector<int> errs(threads, 0);
    auto populate = [&](size_t t) {
        const size_t off = t * share;
        if (off < len && madvise(reinterpret_cast<void*>(first + off), std::min(share, len - off), MADV_POPULATE_WRITE) != 0)
            errs[t] = errno;
    };
    std::vector<std::thread> pool;
    for (size_t t = 1; t < threads; ++t) pool.emplace_back(populate, t);
    populate(0);
    for (auto& th : pool) th.join();
    for (int err : errs) {
        if (err == 0 || err == EINVAL) continue;  // EINVAL: kernel before 5.14, pages fault in later
        if (fd >= 0) {
            if (Status s = shortage(fd, bytes, err); !s.is_ok()) return s;
        }
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
    const Capabilities& caps = be->probe().caps;
    const uintptr_t page = std::max(page_size(), caps.granule);  // chunks of whole pages and granules
    size_t chunk = max_chunk ? std::min(max_chunk, caps.max_registration) : caps.max_registration;
    chunk = std::max<size_t>(page, chunk / page * page);
    if (ptr == nullptr || bytes == 0) return Status::error(hostregErrorInvalidValue, "empty or NULL range");
    if (reinterpret_cast<uintptr_t>(ptr) + bytes < reinterpret_cast<uintptr_t>(ptr))
        return Status::error(hostregErrorInvalidValue, "range wraps past the end of the address space");
    // Chunk boundaries fall on page boundaries (counted from the page holding ptr), so no two
    // chunks share a page even when ptr is not page-aligned.
    const auto base = reinterpret_cast<uintptr_t>(ptr);
    const uintptr_t end = base + bytes;
    for (uintptr_t lo = base, next; lo < end; lo = next) {
        const uintptr_t boundary = (lo & ~(page - 1)) + chunk;
        next = (boundary > lo && boundary < end) ? boundary : end;
        Status s = Registry::instance().host_register(reinterpret_cast<void*>(lo), next - lo, flags);
        if (!s.is_ok()) {
            unregister_all();
            if (lo != base) s.message += " (arena chunk at offset " + std::to_string(lo - base) + ")";
            return s;
        }
        bases_.push_back(lo);
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
