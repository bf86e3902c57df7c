// requests.cpp: see requests.hpp.
#include "io/requests.hpp"

#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>
#include <zlib.h>
#ifdef HOSTREG_HAVE_LIBDEFLATE
#include <libdeflate.h>
#endif

#include <cerrno>
#include <cstring>

namespace hostreg {
namespace io {

Status os_error(const char* call, uint64_t len, uint64_t off, int err) {
    return Status::error(hostregErrorUnknown,
                         std::string(call) + "(" + with_commas(len) + " bytes at offset " + with_commas(off) +
                             ") failed: " + std::strerror(err),
                         err)
        .blame_environment();
}

// Clears O_DIRECT on fd after the filesystem refused an aligned request with EINVAL (its
// alignment is stricter than kBlock): the retry goes through the page cache.
bool drop_direct(int fd, std::atomic<int>* direct) {
    const int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || !(fl & O_DIRECT)) return false;
    if (fcntl(fd, F_SETFL, fl & ~O_DIRECT) != 0) return false;
    direct->store(0);
    return true;
}

// Moves request r between fd and memory (pwritev when write, else preadv), the bounce runs
// from or into buf, resuming after EINTR and short transfers and retrying once buffered when
// O_DIRECT is refused with EINVAL. *got: bytes moved (a read moves fewer only at the end of
// the file; a write always all, or fails).
Status transfer(bool write, int fd, const Request& r, char* buf, std::atomic<int>* direct, uint64_t* got) {
    const char* call = write ? "pwritev" : "preadv";
    iovec iov[kMaxIov];
    size_t n = 0;
    uint64_t boff = 0;
    for (const Run& run : r.runs) {
        iov[n].iov_base = run.mem ? run.mem : buf + boff;
        iov[n++].iov_len = run.len;
        if (!run.mem) boff += run.len;
    }
    bool retried = false;
    *got = 0;
    size_t first = 0;
    while (first < n) {
        const off_t at = static_cast<off_t>(r.off + *got);
        const int cnt = static_cast<int>(n - first);
        const ssize_t k = write ? pwritev(fd, iov + first, cnt, at) : preadv(fd, iov + first, cnt, at);
        if (k < 0) {
            if (errno == EINTR) continue;
            if (errno == EINVAL && !retried && drop_direct(fd, direct)) {
                retried = true;
                continue;
            }
            return os_error(call, r.len - *got, r.off + *got, errno);
        }
        if (k == 0) {
            if (write) return os_error(call, r.len - *got, r.off + *got, EIO);
            break;  // end of file
        }
        *got += static_cast<uint64_t>(k);
        for (uint64_t left = static_cast<uint64_t>(k); left > 0;) {  // skip what moved
            const uint64_t take = std::min<uint64_t>(left, iov[first].iov_len);
            iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + take;
            iov[first].iov_len -= take;
            left -= take;
            if (iov[first].iov_len == 0) ++first;
        }
    }
    return Status::ok();
}

// Index of the first segment at or after `from` that ends after file byte `pos`.
size_t seek(const hostregFileSegment* seg, size_t n, size_t from, uint64_t pos) {
    size_t hi = n;  // ends never decrease (segments are in file order, not overlapping): bisect
    while (from < hi) {
        const size_t mid = from + (hi - from) / 2;
        if (seg[mid].file_offset + seg[mid].length <= pos)
            from = mid + 1;
        else
            hi = mid;
    }
    return from;
}

Status truncated(uint64_t need, uint64_t have) {
    return Status::error(hostregErrorUnknown,
                         "the file ends at byte " + with_commas(have) + ", before byte " + with_commas(need) +
                             " that a segment needs (a truncated file)",
                         EIO)
        .blame_environment();
}

uint32_t crc32_of(const void* p, uint64_t len) {
#ifdef HOSTREG_HAVE_LIBDEFLATE
    return libdeflate_crc32(0, p, static_cast<size_t>(len));
#else
    return static_cast<uint32_t>(crc32_z(0, static_cast<const Bytef*>(p), static_cast<z_size_t>(len)));
#endif
}

unsigned thread_count(unsigned threads) { return threads == 0 ? kDefaultThreads : threads; }

bool has_direct(int fd) {
    const int fl = fcntl(fd, F_GETFL);
    return fl >= 0 && (fl & O_DIRECT);
}

}  // namespace io
}  // namespace hostreg
