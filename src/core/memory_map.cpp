// memory_map.cpp: see memory_map.hpp.
#include "core/memory_map.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <vector>

namespace hostreg {

size_t page_size() {
    static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return p;
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

bool range_has_no_access_pages(uintptr_t lo, size_t bytes) {
    FILE* f = std::fopen("/proc/self/maps", "re");
    if (!f) return false;
    unsigned long start = 0, end = 0;
    char perms[8] = {};
    char line[512];
    bool found = false;
    while (!found && std::fgets(line, sizeof line, f)) {
        if (std::sscanf(line, "%lx-%lx %7s", &start, &end, perms) == 3 && start < lo + bytes && end > lo)
            found = perms[0] == '-' && perms[1] == '-' && perms[2] == '-';
    }
    std::fclose(f);
    return found;
}

}  // namespace hostreg
