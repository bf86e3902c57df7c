// file_io.cpp: see file_io.hpp.
#include "io/file_io.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "staging/parallel.hpp"

namespace hostreg {
namespace {

constexpr uint64_t kBlock = HOSTREG_IO_BLOCK;
constexpr uint64_t kMinDirect = HOSTREG_IO_MIN_DIRECT;
constexpr uint64_t kDirectMax = uint64_t{16} << 20;  // one direct request at most
constexpr uint64_t kBounce = uint64_t{1} << 20;      // one bounce buffer
constexpr uint64_t kCrcPiece = uint64_t{4} << 20;    // checksummed by one task
constexpr unsigned kDefaultThreads = 4;

uint64_t down(uint64_t x) { return x / kBlock * kBlock; }
uint64_t up(uint64_t x) { return (x + kBlock - 1) / kBlock * kBlock; }
bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kBlock == 0; }

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
        if (buf == nullptr) return Status::error(hostregErrorMemoryAllocation, "cannot allocate a 1 MiB I/O bounce buffer");
        *out = buf;
        return Status::ok();
    }
};

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

// pwrite (write) or pread of len bytes at off, resuming after EINTR and short transfers, and
// retrying once buffered when O_DIRECT is refused with EINVAL. *got: bytes moved (a read
// moves fewer only at the end of the file; a write always all, or fails).
Status transfer(bool write, int fd, char* p, uint64_t len, uint64_t off, std::atomic<int>* direct, uint64_t* got) {
    const char* call = write ? "pwrite" : "pread";
    bool retried = false;
    *got = 0;
    while (len > 0) {
        const ssize_t n = write ? pwrite(fd, p, len, static_cast<off_t>(off)) : pread(fd, p, len, static_cast<off_t>(off));
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EINVAL && !retried && drop_direct(fd, direct)) {
                retried = true;
                continue;
            }
            return os_error(call, len, off, errno);
        }
        if (n == 0) {
            if (write) return os_error(call, len, off, EIO);
            break;  // end of file
        }
        p += n;
        off += static_cast<uint64_t>(n);
        len -= static_cast<uint64_t>(n);
        *got += static_cast<uint64_t>(n);
    }
    return Status::ok();
}

Status write_all(int fd, const char* p, uint64_t len, uint64_t off, std::atomic<int>* direct) {
    uint64_t got;  // pwrite never writes through p
    return transfer(true, fd, const_cast<char*>(p), len, off, direct, &got);
}

Status truncated(uint64_t need, uint64_t have) {
    return Status::error(hostregErrorUnknown,
                         "the file ends at byte " + with_commas(have) + ", before byte " + with_commas(need) +
                             " that a segment needs (a truncated file)",
                         EIO)
        .blame_environment();
}

// A queue of task numbers run by several threads until every task is done or one failed.
// Tasks may make others ready (push) while running.
class TaskQueue {
  public:
    explicit TaskQueue(size_t total) : total_(total) {}
    void push(size_t task) {
        {
            std::lock_guard<std::mutex> g(mu_);
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

unsigned thread_count(unsigned threads) { return threads == 0 ? kDefaultThreads : threads; }

// ---- Writes -------------------------------------------------------------------------------

struct WriteRequest {
    uint64_t off, len;
    const char* direct;          // source memory of a direct request; nullptr: bounce
    std::atomic<int> waiting{0};  // checksums still missing
};

struct CrcJob {  // one segment to checksum, in pieces
    size_t segment;
    std::vector<uint32_t> piece_crc;
    std::atomic<size_t> left{0};
    std::vector<size_t> patches;    // indices into the patch array
    std::vector<size_t> dependents;  // write requests waiting for it
};

class Writer {
  public:
    Writer(int fd, const hostregFileSegment* s, size_t n, const hostregCrcPatch* p, size_t np)
        : fd_(fd), seg_(s), n_(n), patch_(p), np_(np) {}

    Status plan() {
        uint64_t end = 0;
        for (size_t i = 0; i < n_; ++i) {
            if (seg_[i].file_offset != end)
                return Status::error(hostregErrorInvalidValue, "segment " + std::to_string(i) + " starts at byte " +
                                                                   with_commas(seg_[i].file_offset) + ", not at " +
                                                                   with_commas(end) + " (segments must tile the file)");
            if (seg_[i].length > 0 && seg_[i].memory == nullptr)
                return Status::error(hostregErrorInvalidValue, "segment " + std::to_string(i) + " has no memory");
            end += seg_[i].length;
        }
        total_ = end;
        target_of_.assign(n_, {});
        job_of_.assign(n_, SIZE_MAX);
        for (size_t k = 0; k < np_; ++k) {
            const hostregCrcPatch& p = patch_[k];
            if (p.crc_of >= n_ || p.into >= n_ || p.offset + 4 > seg_[p.into].length)
                return Status::error(hostregErrorInvalidValue, "patch " + std::to_string(k) + " lies outside its segments");
            if (job_of_[p.crc_of] == SIZE_MAX) {
                job_of_[p.crc_of] = jobs_.size();
                jobs_.emplace_back(new CrcJob());
                jobs_.back()->segment = p.crc_of;
            }
            jobs_[job_of_[p.crc_of]]->patches.push_back(k);
            target_of_[p.into].push_back(job_of_[p.crc_of]);
        }
        cut_requests();
        return Status::ok();
    }

    Status run(unsigned threads, std::atomic<int>* direct, hostregFileStats* st) {
        direct_ = direct;
        // Tasks: 0..R-1 the write requests, then the checksum pieces.
        std::vector<std::pair<size_t, uint64_t>> pieces;  // (job, piece index)
        for (size_t j = 0; j < jobs_.size(); ++j) {
            const uint64_t len = seg_[jobs_[j]->segment].length;
            const size_t count = static_cast<size_t>((len + kCrcPiece - 1) / kCrcPiece);
            jobs_[j]->piece_crc.assign(count, 0);
            jobs_[j]->left = count;
            for (size_t i = 0; i < count; ++i) pieces.emplace_back(j, i);
            if (count == 0) finish_job(j, nullptr);  // an empty segment: crc32 of nothing is 0
        }
        TaskQueue q(reqs_.size() + pieces.size());
        // Ready now, in file order, checksum pieces and writes interleaved: the threads then
        // checksum one part of the file while the disk takes another.
        std::vector<std::pair<uint64_t, size_t>> ready;  // (file offset, task)
        for (size_t i = 0; i < pieces.size(); ++i)
            ready.emplace_back(seg_[jobs_[pieces[i].first]->segment].file_offset + pieces[i].second * kCrcPiece,
                               reqs_.size() + i);
        for (size_t r = 0; r < reqs_.size(); ++r)
            if (reqs_[r]->waiting.load() == 0) ready.emplace_back(reqs_[r]->off, r);
        std::stable_sort(ready.begin(), ready.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
        for (const auto& [off, task] : ready) q.push(task);
        std::atomic<uint64_t> direct_bytes{0}, bounced{0};
        run_parts(std::max(1u, thread_count(threads)), [&](size_t) {
            Bounce bounce;
            q.work([&](size_t t) -> Status {
                if (t >= reqs_.size()) {
                    const auto [j, i] = pieces[t - reqs_.size()];
                    CrcJob& job = *jobs_[j];
                    const hostregFileSegment& s = seg_[job.segment];
                    const uint64_t off = i * kCrcPiece, len = std::min(kCrcPiece, s.length - off);
                    job.piece_crc[i] = static_cast<uint32_t>(crc32_z(0, static_cast<const Bytef*>(s.memory) + off, len));
                    if (job.left.fetch_sub(1) == 1) finish_job(j, &q);
                    return Status::ok();
                }
                WriteRequest& r = *reqs_[t];
                if (r.direct) {
                    direct_bytes += r.len;
                    return write_all(fd_, r.direct, r.len, r.off, direct_);
                }
                char* buf = nullptr;
                Status s = bounce.get(&buf);
                if (!s.is_ok()) return s;
                gather(r.off, r.len, buf);
                bounced += r.len;
                return write_all(fd_, buf, r.len, r.off, direct_);
            });
        });
        if (st) {
            st->direct_bytes = direct_bytes;
            st->bounced_bytes = bounced;
            st->requests = reqs_.size();
        }
        return q.failure();
    }

    uint64_t total() const { return total_; }

  private:
    // Segment index holding file byte `pos` (>= the cursor's), skipping empty segments.
    size_t seek(size_t from, uint64_t pos) const {
        size_t hi = n_;  // ends never decrease (the segments tile the file): bisect
        while (from < hi) {
            const size_t mid = from + (hi - from) / 2;
            if (seg_[mid].file_offset + seg_[mid].length <= pos)
                from = mid + 1;
            else
                hi = mid;
        }
        return from;
    }
    // Can a direct request start at block-aligned `pos` in segment i?
    bool direct_at(size_t i, uint64_t pos) const {
        if (i >= n_ || !target_of_[i].empty()) return false;
        const hostregFileSegment& s = seg_[i];
        return aligned(static_cast<const char*>(s.memory) + (pos - s.file_offset)) &&
               s.file_offset + s.length - pos >= kMinDirect;
    }

    void cut_requests() {
        size_t cur = 0;
        for (uint64_t pos = 0; pos < total_;) {
            cur = seek(cur, pos);
            auto r = std::make_unique<WriteRequest>();
            r->off = pos;
            if (direct_at(cur, pos)) {
                const hostregFileSegment& s = seg_[cur];
                r->len = std::min(kDirectMax, down(s.file_offset + s.length - pos));
                r->direct = static_cast<const char*>(s.memory) + (pos - s.file_offset);
            } else {
                uint64_t q = pos + kBlock;
                for (size_t c = cur; q < total_ && q - pos < kBounce; q += kBlock) {
                    c = seek(c, q);
                    if (direct_at(c, q)) break;
                }
                r->len = std::min(q, up(total_)) - pos;
                r->direct = nullptr;
                // Checksums this request's bytes hold.
                std::vector<size_t> needs;
                for (size_t c = cur; c < n_ && seg_[c].file_offset < pos + r->len; ++c)
                    for (size_t j : target_of_[c])
                        if (std::find(needs.begin(), needs.end(), j) == needs.end()) needs.push_back(j);
                r->waiting = static_cast<int>(needs.size());
                for (size_t j : needs) jobs_[j]->dependents.push_back(reqs_.size());
            }
            pos += r->len;
            reqs_.push_back(std::move(r));
        }
    }

    // The job's last piece is done: combine, patch the checksum in, release its dependents.
    void finish_job(size_t j, TaskQueue* q) {
        CrcJob& job = *jobs_[j];
        const uint64_t len = seg_[job.segment].length;
        uLong crc = 0;
        for (size_t i = 0; i < job.piece_crc.size(); ++i)
            crc = crc32_combine(crc, job.piece_crc[i], static_cast<z_off_t>(std::min(kCrcPiece, len - i * kCrcPiece)));
        for (size_t k : job.patches) {
            unsigned char* at = static_cast<unsigned char*>(seg_[patch_[k].into].memory) + patch_[k].offset;
            for (int b = 0; b < 4; ++b) at[b] = static_cast<unsigned char>((crc >> (8 * b)) & 0xff);
        }
        for (size_t r : job.dependents)
            if (reqs_[r]->waiting.fetch_sub(1) == 1 && q) q->push(r);
    }

    // Copies file bytes [off, off + len) into buf (zeros past the end of the file).
    void gather(uint64_t off, uint64_t len, char* buf) const {
        size_t c = seek(0, off);
        uint64_t pos = off;
        const uint64_t end = off + len;
        for (; pos < end && c < n_; ++c) {
            const hostregFileSegment& s = seg_[c];
            const uint64_t a = std::max(pos, s.file_offset), b = std::min(end, s.file_offset + s.length);
            if (b <= a) continue;
            std::memcpy(buf + (a - off), static_cast<const char*>(s.memory) + (a - s.file_offset), b - a);
            pos = b;
        }
        if (pos < end) std::memset(buf + (pos - off), 0, end - pos);
    }

    int fd_;
    const hostregFileSegment* seg_;
    size_t n_;
    const hostregCrcPatch* patch_;
    size_t np_;
    uint64_t total_ = 0;
    std::vector<std::vector<size_t>> target_of_;  // per segment: jobs whose checksum it holds
    std::vector<size_t> job_of_;                  // per segment: its checksum job, or SIZE_MAX
    std::vector<std::unique_ptr<CrcJob>> jobs_;
    std::vector<std::unique_ptr<WriteRequest>> reqs_;
    std::atomic<int>* direct_ = nullptr;
};

bool has_direct(int fd) {
    const int fl = fcntl(fd, F_GETFL);
    return fl >= 0 && (fl & O_DIRECT);
}

}  // namespace

Status file_write(int fd, const hostregFileSegment* segments, size_t count, const hostregCrcPatch* patches,
                  size_t patch_count, unsigned threads, bool sync, hostregFileStats* stats) {
    if (fd < 0 || (count > 0 && segments == nullptr) || (patch_count > 0 && patches == nullptr))
        return Status::error(hostregErrorInvalidValue, "bad descriptor, or NULL segments or patches");
    Writer w(fd, segments, count, patches, patch_count);
    Status s = w.plan();
    if (!s.is_ok()) return s;
    std::atomic<int> direct{has_direct(fd) ? 1 : 0};
    s = w.run(threads, &direct, stats);
    if (stats) stats->direct = direct.load();
    if (!s.is_ok()) return s;
    if (ftruncate(fd, static_cast<off_t>(w.total())) != 0) return os_error("ftruncate", w.total(), 0, errno);
    if (sync && fdatasync(fd) != 0) return os_error("fdatasync", w.total(), 0, errno);
    return Status::ok();
}

// ---- Reads --------------------------------------------------------------------------------

namespace {

struct Piece {  // file bytes [off, off + len) go to mem
    uint64_t off, len;
    char* mem;
};
struct ReadRequest {
    uint64_t off, len;  // block-aligned
    char* direct;       // destination of a direct request; nullptr: bounce, then pieces
    std::vector<Piece> pieces;
};

void plan_reads(const hostregFileSegment* seg, size_t n, std::vector<ReadRequest>* out) {
    size_t open = SIZE_MAX;  // the bounce request pieces are still added to
    auto bounce = [&](uint64_t off, uint64_t len, char* mem) {
        while (len > 0) {
            const uint64_t a = down(off);
            if (open == SIZE_MAX || a > (*out)[open].off + (*out)[open].len || a >= (*out)[open].off + kBounce) {
                out->push_back(ReadRequest{a, 0, nullptr, {}});
                open = out->size() - 1;
            }
            ReadRequest& r = (*out)[open];
            const uint64_t take = std::min(len, r.off + kBounce - off);  // as much as fits in its buffer
            r.pieces.push_back(Piece{off, take, mem});
            r.len = std::max(r.len, up(off + take) - r.off);
            off += take, len -= take, mem += take;
        }
    };
    for (size_t i = 0; i < n; ++i) {
        const uint64_t f = seg[i].file_offset, len = seg[i].length;
        char* m = static_cast<char*>(seg[i].memory);
        if (len == 0) continue;
        const bool congruent = (reinterpret_cast<uintptr_t>(m) - f) % kBlock == 0;
        const uint64_t a = up(f), b = down(f + len);
        if (!congruent || b <= a || b - a < kMinDirect) {
            bounce(f, len, m);
            continue;
        }
        if (a > f) bounce(f, a - f, m);
        open = SIZE_MAX;
        for (uint64_t p = a; p < b; p += kDirectMax)
            out->push_back(ReadRequest{p, std::min(kDirectMax, b - p), m + (p - f), {}});
        if (f + len > b) bounce(b, f + len - b, m + (b - f));
    }
}

}  // namespace

Status file_read(int fd, const hostregFileSegment* segments, size_t count, unsigned threads,
                 hostregFileStats* stats) {
    if (fd < 0 || (count > 0 && segments == nullptr))
        return Status::error(hostregErrorInvalidValue, "bad descriptor, or NULL segments");
    for (size_t i = 0; i < count; ++i) {
        if (segments[i].length > 0 && segments[i].memory == nullptr)
            return Status::error(hostregErrorInvalidValue, "segment " + std::to_string(i) + " has no memory");
        if (i > 0 && segments[i].file_offset < segments[i - 1].file_offset + segments[i - 1].length)
            return Status::error(hostregErrorInvalidValue,
                                 "segment " + std::to_string(i) + " overlaps or precedes the one before it");
    }
    std::vector<ReadRequest> reqs;
    plan_reads(segments, count, &reqs);
    std::atomic<int> direct{has_direct(fd) ? 1 : 0};
    std::atomic<uint64_t> direct_bytes{0}, bounced{0};
    TaskQueue q(reqs.size());
    for (size_t r = 0; r < reqs.size(); ++r) q.push(r);
    run_parts(std::max(1u, thread_count(threads)), [&](size_t) {
        Bounce bounce;
        q.work([&](size_t t) -> Status {
            const ReadRequest& r = reqs[t];
            uint64_t got = 0;
            if (r.direct) {
                Status s = transfer(false, fd, r.direct, r.len, r.off, &direct, &got);
                if (s.is_ok() && got < r.len) s = truncated(r.off + r.len, r.off + got);
                direct_bytes += got;
                return s;
            }
            char* buf = nullptr;
            Status s = bounce.get(&buf);
            if (s.is_ok()) s = transfer(false, fd, buf, r.len, r.off, &direct, &got);
            if (!s.is_ok()) return s;
            bounced += got;
            for (const Piece& p : r.pieces) {
                if (p.off + p.len > r.off + got) return truncated(p.off + p.len, r.off + got);
                std::memcpy(p.mem, buf + (p.off - r.off), p.len);
            }
            return Status::ok();
        });
    });
    if (stats) {
        stats->direct_bytes = direct_bytes;
        stats->bounced_bytes = bounced;
        stats->requests = reqs.size();
        stats->direct = direct.load();
    }
    return q.failure();
}

}  // namespace hostreg
