// shared_memory.cpp: see shared_memory.hpp.
#include "staging/shared_memory.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/memory_map.hpp"
#include "staging/parallel.hpp"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14 (madvise(2); docs/vendors.md "POSIX")
#endif

namespace hostreg {
namespace {

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

// An error naming dir, the filesystem st describes, when it has less than bytes free (or err
// says it ran out), else ok. err: the errno that prompted the question, 0 if none.
Status shortage_in(const struct statvfs& st, const std::string& dir, size_t bytes, int err) {
    // No size limit to check against: ramfs, tmpfs mounted with size=0, hugetlbfs without
    // size= report 0 blocks (statfs(2)); only a refusal (err) says the memory ran out.
    if (st.f_blocks == 0 && err == 0) return Status::ok();
    const unsigned long long free_bytes = static_cast<unsigned long long>(st.f_bavail) * st.f_frsize;
    if (free_bytes >= bytes && err == 0) return Status::ok();
    if (dir == "memfd" && err == 0) return Status::ok();  // memfd has no filesystem limit of its own
    return Status::error(hostregErrorMemoryAllocation,
                         dir + " is too small: staging needs " + with_commas(bytes) + " bytes; it has " +
                             with_commas(free_bytes) + " bytes free of " +
                             with_commas(static_cast<unsigned long long>(st.f_blocks) * st.f_frsize) +
                             " (enlarge it: docker run --shm-size, or mount -o remount,size=... " + dir + ")",
                         err ? err : ENOSPC);
}

Status shortage(int fd, size_t bytes, int err) {
    struct statvfs st{};
    if (fstatvfs(fd, &st) != 0) return Status::ok();
    return shortage_in(st, backing_dir(fd), bytes, err);
}

}  // namespace

Status shared_memory_room(size_t bytes) {
    std::string dir;
    if (Status s = shared_memory_dir(&dir); !s.is_ok()) return s;
    struct statvfs st{};
    if (statvfs(dir.c_str(), &st) != 0) return Status::ok();  // no such directory: memfd, with no limit of its own
    return shortage_in(st, dir, bytes, 0);
}

Status shared_memory_dir(std::string* dir) {
    const char* env = std::getenv("HOSTREG_SHM_DIR");
    if (!env || !*env) {
        *dir = "/dev/shm";
        return Status::ok();
    }
    const std::string d = env;
    auto bad = [&](const std::string& why) {
        return Status::error(hostregErrorInvalidValue, "HOSTREG_SHM_DIR=" + d + " " + why +
                                                           " (it must name an existing tmpfs directory, e.g. /dev/shm)")
            .blame_environment();
    };
    if (d[0] != '/') return bad("is not an absolute path");
    struct stat st{};
    if (stat(d.c_str(), &st) != 0)
        return bad(errno == ENOENT ? "does not exist" : std::string("cannot be read: ") + std::strerror(errno));
    if (!S_ISDIR(st.st_mode)) return bad("is not a directory");
    struct statfs fs{};
    if (statfs(d.c_str(), &fs) != 0) return bad(std::string("cannot be read: ") + std::strerror(errno));
    // Staging memory must be memory: a disk directory would put staging memory on disk.
    constexpr long kTmpfs = 0x01021994, kRamfs = static_cast<long>(0x858458f6),
                   kHugetlbfs = static_cast<long>(0x958458f6);
    if (fs.f_type != kTmpfs && fs.f_type != kRamfs && fs.f_type != kHugetlbfs)
        return bad("is not a tmpfs (a disk directory would put staging memory on disk)");
    *dir = d;
    return Status::ok();
}

Status create_shared_memory(size_t bytes, int* fd_out) {
    if (fd_out == nullptr || bytes == 0) return Status::error(hostregErrorInvalidValue, "0 bytes or NULL fd");
    std::string dir;
    if (Status s = shared_memory_dir(&dir); !s.is_ok()) return s;
    // An unnamed file: nothing to guess, nothing to clean up; gone with its last descriptor.
    int fd = open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
    if (fd < 0) {
        const int err = errno;
        const bool chosen = std::getenv("HOSTREG_SHM_DIR") && *std::getenv("HOSTREG_SHM_DIR");
        if (chosen || (err != EOPNOTSUPP && err != EISDIR && err != ENOENT))
            return Status::error(hostregErrorMemoryAllocation,
                                 "cannot create staging memory in " + dir + (chosen ? " (HOSTREG_SHM_DIR)" : "") +
                                     ": " + std::strerror(err),
                                 err);
        fd = static_cast<int>(syscall(SYS_memfd_create, "hostreg-arena", MFD_CLOEXEC));  // no /dev/shm
        if (fd < 0)
            return Status::error(hostregErrorMemoryAllocation,
                                 std::string("memfd_create failed: ") + std::strerror(errno), errno);
    }
    Status s = shortage(fd, bytes, 0);  // plainly too small: say so before allocating anything
    // Files on hugetlbfs take only whole huge pages (ftruncate answers EINVAL otherwise): the
    // file is sized up to the filesystem's block size (the page size elsewhere, a no-op there).
    struct statvfs vfs{};
    const size_t block = fstatvfs(fd, &vfs) == 0 && vfs.f_bsize > 0 ? static_cast<size_t>(vfs.f_bsize) : 1;
    const size_t sized = bytes > SIZE_MAX - block ? bytes : (bytes + block - 1) / block * block;
    if (s.is_ok() && ftruncate(fd, static_cast<off_t>(sized)) != 0)
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
    if (Status s = check_range(ptr, bytes); !s.is_ok()) return s;
    const auto lo = reinterpret_cast<uintptr_t>(ptr);
    if (!range_mapped(lo, bytes))  // checked here so that EINVAL below can only mean an old kernel
        return Status::error(hostregErrorInvalidValue, "range is not (fully) mapped memory", ENOMEM);
    // Populated by several threads at once: the kernel zeroes new pages, and that scales with
    // cores (in-kernel population is several times faster than user faults; docs/staging.md).
    const uintptr_t page = page_size();
    const uintptr_t first = reinterpret_cast<uintptr_t>(ptr) & ~(page - 1);
    const size_t len = reinterpret_cast<uintptr_t>(ptr) + bytes - first;
    const size_t threads = std::max<size_t>(1, std::min<size_t>(usable_cpus(), len / kMinPopulateBytes));
    std::vector<int> errs(threads, 0);
    run_parts(threads, [&](size_t t) {
        const Span s = part_of(len, threads, page, t);
        if (s.end > s.begin &&
            madvise(reinterpret_cast<void*>(first + s.begin), s.end - s.begin, MADV_POPULATE_WRITE) != 0)
            errs[t] = errno;
    });
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

}  // namespace hostreg
