// memory_map.cpp: see memory_map.hpp.
#include "core/memory_map.hpp"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

namespace hostreg {

size_t page_size() {
    static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return p;
}

Status check_range(const void* ptr, size_t bytes) {
    const auto lo = reinterpret_cast<uintptr_t>(ptr);
    if (ptr == nullptr) return Status::error(hostregErrorInvalidValue, "pointer is NULL");
    if (bytes == 0) return Status::error(hostregErrorInvalidValue, "byte count is 0");
    if (lo + bytes < lo) {
        char text[96];
        std::snprintf(text, sizeof text, "range 0x%llx + %zu bytes wraps past the end of the address space",
                      static_cast<unsigned long long>(lo), bytes);
        return Status::error(hostregErrorInvalidValue, text);
    }
    return Status::ok();
}

bool range_mapped(uintptr_t lo, size_t bytes) {
    const uintptr_t first = lo & ~(page_size() - 1);
    const size_t len = lo + bytes - first;
    const size_t chunk = 4096 * page_size();
    std::vector<unsigned char> vec(4096);
    for (size_t off = 0; off < len; off += chunk)
        if (mincore(reinterpret_cast<void*>(first + off), std::min(chunk, len - off), vec.data()) != 0) return false;
    return true;
}

namespace {

// One line of /proc/self/maps.
struct Vma {
    unsigned long start = 0, end = 0, offset = 0, inode = 0;
    char perms[8] = {};
};

// Calls visit(vma) for every mapping that intersects [lo, lo + bytes) until it returns true;
// answers whether one did.
template <class F>
bool any_vma(uintptr_t lo, size_t bytes, F visit) {
    FILE* f = std::fopen("/proc/self/maps", "re");
    if (!f) return false;
    char line[512];
    bool found = false;
    while (!found && std::fgets(line, sizeof line, f)) {
        Vma v;
        unsigned dev_major = 0, dev_minor = 0;
        if (std::sscanf(line, "%lx-%lx %7s %lx %x:%x %lu", &v.start, &v.end, v.perms, &v.offset, &dev_major, &dev_minor,
                        &v.inode) == 7 &&
            v.start < lo + bytes && v.end > lo)
            found = visit(v);
    }
    std::fclose(f);
    return found;
}

}  // namespace

bool range_past_file_end(uintptr_t lo, size_t bytes) {
    return any_vma(lo, bytes, [&](const Vma& v) {
        if (v.inode == 0) return false;
        // The mapped file itself, also when it has no name (memfd, O_TMPFILE, deleted).
        char path[64];
        std::snprintf(path, sizeof path, "/proc/self/map_files/%lx-%lx", v.start, v.end);
        struct stat st{};
        if (stat(path, &st) != 0) return false;
        const unsigned long last = std::min<unsigned long>(v.end, lo + bytes);  // end of the range in this VMA
        return v.offset + (last - v.start) > static_cast<unsigned long>(st.st_size) + page_size() - 1;
    });
}

bool range_vm_locked(uintptr_t lo, size_t bytes) {
    FILE* f = std::fopen("/proc/self/smaps", "re");
    if (!f) return false;
    char line[1024];
    bool inside = false, any = false;
    while (std::fgets(line, sizeof line, f)) {
        unsigned long start = 0, end = 0;
        if (std::sscanf(line, "%lx-%lx ", &start, &end) == 2) {  // a VMA's first line
            inside = start < lo + bytes && end > lo;
        } else if (inside && std::strncmp(line, "VmFlags:", 8) == 0) {
            any = any || std::strstr(line, " lo") != nullptr;
        }
    }
    std::fclose(f);
    return any;
}

bool range_has_no_access_pages(uintptr_t lo, size_t bytes) {
    return any_vma(lo, bytes, [](const Vma& v) { return v.perms[0] == '-' && v.perms[1] == '-' && v.perms[2] == '-'; });
}

}  // namespace hostreg
