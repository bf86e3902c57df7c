// requests.hpp: what file_write.cpp and file_read.cpp share (see file_io.hpp for the plan):
// the sizes, requests of runs cut from segments, moving one request, bounce buffers and the
// task queue their threads share, CRC-32, and the errors they report.
#pragma once

#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.hpp"
#include "hostreg/io.h"

namespace hostreg {
namespace io {

constexpr uint64_t kBlock = HOSTREG_IO_BLOCK;
constexpr uint64_t kMinDirect = HOSTREG_IO_MIN_DIRECT;
constexpr uint64_t kRequestMax = uint64_t{16} << 20;   // one request at most
constexpr uint64_t kBounce = uint64_t{1} << 20;        // one bounce buffer: a request's bounced bytes
constexpr size_t kMaxIov = IOV_MAX;                    // runs of one request (1,024 on Linux)
constexpr uint64_t kReadThrough = uint64_t{64} << 10;  // a gap read rather than a request ended
constexpr uint64_t kCrcPiece = uint64_t{4} << 20;      // checksummed by one task
constexpr unsigned kDefaultThreads = 4;

inline uint64_t down(uint64_t x) { return x / kBlock * kBlock; }
inline bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kBlock == 0; }

// Page-aligned bounce buffers, kept for the next transfer (at most kKeep of them).
class BouncePool {
  public:
    static BouncePool& instance() {
        static BouncePool* pool = new BouncePool();  // never destroyed: threads may outlive exit
        return *pool;
    }
    char* acquire() {
        {
            std::lock_guard<std::mutex> g(mu_);
            if (!free_.empty()) {
                char* b = free_.back();
                free_.pop_back();
                return b;
            }
        }
        void* p = nullptr;
        return posix_memalign(&p, kBlock, kBounce) == 0 ? static_cast<char*>(p) : nullptr;
    }
    void release(char* b) {
        if (b == nullptr) return;
        std::lock_guard<std::mutex> g(mu_);
        if (free_.size() < kKeep) {
            free_.push_back(b);
            return;
        }
        std::free(b);
    }

  private:
    static constexpr size_t kKeep = 16;
    std::mutex mu_;
    std::vector<char*> free_;
};

// One thread's bounce buffer, taken at its first bounce request and given back at its end.
struct Bounce {
    char* buf = nullptr;
    ~Bounce() { BouncePool::instance().release(buf); }
    Status get(char** out) {
        if (buf == nullptr) buf = BouncePool::instance().acquire();
        if (buf == nullptr)
            return Status::error(hostregErrorMemoryAllocation, "cannot allocate a 1 MiB I/O bounce buffer");
        *out = buf;
        return Status::ok();
    }
};

// One request: file bytes [off, off + len) as runs in file order, each straight from or into
// its memory (a congruent segment's aligned middle) or through the request's bounce buffer,
// moved by one pwritev / preadv.
struct Run {
    uint64_t off, len;
    char* mem;  // nullptr: through the bounce buffer
};
struct Request {
    uint64_t off = 0, len = 0, bounced = 0;  // bounced: bytes of runs through the buffer
    std::vector<Run> runs;

    // Bytes a run of this kind may still add (a multiple of the block; 0: start another).
    uint64_t room(bool direct_run) const {
        if (runs.size() >= kMaxIov) return 0;
        uint64_t r = kRequestMax - len;
        if (!direct_run) r = std::min(r, kBounce - bounced);
        return down(r);
    }
    void add(uint64_t at, uint64_t n, char* mem) {
        if (runs.empty()) off = at;
        if (!mem) bounced += n;
        if (!runs.empty() && !mem && !runs.back().mem) {
            runs.back().len += n;  // one bounce run
        } else if (!runs.empty() && mem && runs.back().mem && runs.back().mem + runs.back().len == mem) {
            runs.back().len += n;  // one memory range
        } else {
            runs.push_back(Run{at, n, mem});
        }
        len += n;
    }
};

// A queue of task numbers run by several threads until every task is done or one failed.
// Tasks may make others ready (push) while running.
class TaskQueue {
  public:
    explicit TaskQueue(size_t total) : total_(total) {}
    // Queues a task behind the ready ones, or before them when first (a write whose
    // checksums are now done: it goes to the disk before more checksums are computed).
    void push(size_t task, bool first = false) {
        {
            std::lock_guard<std::mutex> g(mu_);
            if (first)
                ready_.push_front(task);
            else
                ready_.push_back(task);
        }
        cv_.notify_one();
    }
    // Runs tasks with run(task) -> Status until none is left; the first failure stops all.
    template <class F>
    void work(F run) {
        for (;;) {
            size_t task;
            {
                std::unique_lock<std::mutex> l(mu_);
                cv_.wait(l, [&] { return !ready_.empty() || done_ == total_ || !failure_.is_ok(); });
                if (done_ == total_ || !failure_.is_ok()) return;
                task = ready_.front();
                ready_.pop_front();
            }
            Status s = run(task);
            {
                std::lock_guard<std::mutex> g(mu_);
                ++done_;
                if (!s.is_ok() && failure_.is_ok()) failure_ = std::move(s);
            }
            cv_.notify_all();
        }
    }
    const Status& failure() const { return failure_; }

  private:
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<size_t> ready_;
    size_t total_, done_ = 0;
    Status failure_;
};

Status os_error(const char* call, uint64_t len, uint64_t off, int err);

// Clears O_DIRECT on fd after the filesystem refused an aligned request with EINVAL (its
// alignment is stricter than kBlock): the retry goes through the page cache.
bool drop_direct(int fd, std::atomic<int>* direct);

// Moves request r between fd and memory (pwritev when write, else preadv), the bounce runs
// from or into buf, resuming after EINTR and short transfers and retrying once buffered when
// O_DIRECT is refused with EINVAL. *got: bytes moved (a read moves fewer only at the end of
// the file; a write always all, or fails).
Status transfer(bool write, int fd, const Request& r, char* buf, std::atomic<int>* direct, uint64_t* got);

// Index of the first segment at or after `from` that ends after file byte `pos`.
size_t seek(const hostregFileSegment* seg, size_t n, size_t from, uint64_t pos);

// The error for a file that ends at byte `have`, before byte `need`.
Status truncated(uint64_t need, uint64_t have);

// CRC-32 (ISO-HDLC, the ZIP format's) of len bytes at p: libdeflate's where built with it,
// else zlib's; the two give the same value.
uint32_t crc32_of(const void* p, uint64_t len);

// Whether fd is open with O_DIRECT.
bool has_direct(int fd);

// `threads`, or the default (4) for 0.
unsigned thread_count(unsigned threads);

// Cuts the blocks that segments[0..n) touch into requests. A run from block-aligned `pos`
// goes straight from segment i's memory when may_direct(i), its memory there is aligned
// (congruent) and its aligned middle has at least kMinDirect bytes; every other block is
// bounced. Blocks that no
// segment touches (gaps of a read) are read through into the bounce buffer when there are at
// most kReadThrough bytes of them (the headers between a checkpoint's tensors), else they
// end a request.
template <class MayDirect>
std::vector<Request> cut(const hostregFileSegment* seg, size_t n, MayDirect may_direct) {
    auto direct_at = [&](size_t i, uint64_t pos) {
        if (i >= n || !may_direct(i)) return false;
        const hostregFileSegment& s = seg[i];
        const uint64_t a = down(s.file_offset + kBlock - 1), b = down(s.file_offset + s.length);  // aligned middle
        return pos >= a && pos < b && b - a >= kMinDirect &&
               aligned(static_cast<const char*>(s.memory) + (pos - s.file_offset));
    };
    auto touched = [&](size_t i, uint64_t pos) { return i < n && seg[i].file_offset < pos + kBlock; };
    std::vector<Request> out;
    Request cur;
    auto flush = [&] {
        if (cur.len) out.push_back(std::move(cur));
        cur = Request();
    };
    size_t c = 0;
    for (uint64_t pos = 0;;) {
        c = seek(seg, n, c, pos);
        while (c < n && seg[c].length == 0)
            ++c;
        if (c >= n) break;
        if (!touched(c, pos)) {  // a gap: read through a short one, else a new request
            const uint64_t next = down(seg[c].file_offset);
            if (cur.len && next - pos <= kReadThrough && cur.room(false) >= next - pos) {
                cur.add(pos, next - pos, nullptr);
            } else {
                flush();
            }
            pos = next;
            continue;
        }
        const bool d = direct_at(c, pos);
        const uint64_t room = cur.room(d);
        if (room < kBlock) {
            flush();
            continue;
        }
        if (d) {
            const uint64_t len = std::min(room, down(seg[c].file_offset + seg[c].length) - pos);
            cur.add(pos, len, static_cast<char*>(seg[c].memory) + (pos - seg[c].file_offset));
            pos += len;
            continue;
        }
        uint64_t q = pos + kBlock;  // bounce blocks up to the next direct one, gap or full buffer
        for (size_t k = c; q - pos < room; q += kBlock) {
            k = seek(seg, n, k, q);
            while (k < n && seg[k].length == 0)
                ++k;
            if (!touched(k, q) || direct_at(k, q)) break;
        }
        cur.add(pos, q - pos, nullptr);
        pos = q;
    }
    flush();
    return out;
}

// Calls f(segment, file offset, bytes) for every part of a segment inside [off, off + len).
template <class F>
void overlaps(const hostregFileSegment* seg, size_t n, uint64_t off, uint64_t len, F f) {
    for (size_t c = seek(seg, n, 0, off); c < n && seg[c].file_offset < off + len; ++c) {
        const uint64_t a = std::max(off, seg[c].file_offset),
                       b = std::min(off + len, seg[c].file_offset + seg[c].length);
        if (b > a) f(c, a, b - a);
    }
}

}  // namespace io
}  // namespace hostreg
