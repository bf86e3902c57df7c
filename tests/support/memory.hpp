// memory.hpp: memory helpers every C++ test suite shares (the GoogleTest suite, the
// conformance suite and the tests of the vendor doubles): the page size, the kernel's count
// of locked memory (VmLck), and a private anonymous mapping unmapped on destruction.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>

namespace hrtest {

inline size_t page() {
    static const size_t p = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return p;
}

// The kernel's count of this process's locked memory (VmLck in /proc/self/status), in kB;
// -1 when it cannot be read.
inline long vmlck_kb() {
    std::ifstream f("/proc/self/status");
    std::string line;
    while (std::getline(f, line))
        if (line.rfind("VmLck:", 0) == 0) return std::stol(line.substr(6));
    return -1;
}

inline long pages_kb(size_t n) { return static_cast<long>(n * page() / 1024); }

// A byte count, to say Mapping(Bytes{n}) where a size is not a number of pages.
struct Bytes {
    size_t n;
};

// A fresh private anonymous mapping, unmapped on destruction: `pages` pages with protection
// `prot`, or (Bytes) `n` read-write bytes whose start get() is aligned to `align` (a power of
// two, at least a page; 0: a page). get() is NULL when mmap failed.
class Mapping {
  public:
    explicit Mapping(size_t pages, int prot = PROT_READ | PROT_WRITE) : Mapping(pages * page(), 0, prot) {}
    explicit Mapping(Bytes bytes, size_t align = 0) : Mapping(bytes.n, align, PROT_READ | PROT_WRITE) {}
    ~Mapping() {
        if (raw_) munmap(raw_, raw_len_);
    }
    Mapping(const Mapping&) = delete;
    Mapping& operator=(const Mapping&) = delete;
    char* get() const { return base_; }
    char* page_at(size_t i) const { return base_ + i * page(); }
    size_t size() const { return len_; }

  private:
    Mapping(size_t bytes, size_t align, int prot) : len_(bytes), raw_len_(bytes + align) {
        void* p = mmap(nullptr, raw_len_, prot, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        raw_ = (p == MAP_FAILED) ? nullptr : static_cast<char*>(p);
        uintptr_t a = reinterpret_cast<uintptr_t>(raw_);
        if (raw_ && align) a = (a + align - 1) & ~(uintptr_t{align} - 1);
        base_ = reinterpret_cast<char*>(a);
    }
    size_t len_, raw_len_;
    char* raw_ = nullptr;
    char* base_ = nullptr;
};

}  // namespace hrtest
