// file_read.cpp: file_read (see file_io.hpp): requests planned over the segments and read by
// a few threads, the bounced bytes scattered into their memory.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <vector>

#include "io/file_io.hpp"
#include "io/requests.hpp"
#include "staging/parallel.hpp"

namespace hostreg {

using namespace io;

Status file_read(int fd, const hostregFileSegment* segments, size_t count, unsigned threads, hostregFileStats* stats) {
    if (fd < 0 || (count > 0 && segments == nullptr))
        return Status::error(hostregErrorInvalidValue, "bad descriptor, or NULL segments");
    for (size_t i = 0; i < count; ++i) {
        if (segments[i].length > 0 && segments[i].memory == nullptr)
            return Status::error(hostregErrorInvalidValue, "segment " + std::to_string(i) + " has no memory");
        if (i > 0 && segments[i].file_offset < segments[i - 1].file_offset + segments[i - 1].length)
            return Status::error(hostregErrorInvalidValue,
                                 "segment " + std::to_string(i) + " overlaps or precedes the one before it");
    }
    const std::vector<Request> reqs = cut(segments, count, [](size_t) { return true; });
    std::atomic<int> direct{has_direct(fd) ? 1 : 0};
    std::atomic<uint64_t> direct_bytes{0}, bounced{0};
    TaskQueue q(reqs.size());
    for (size_t r = 0; r < reqs.size(); ++r)
        q.push(r);
    run_parts(std::max(1u, thread_count(threads)), [&](size_t) {
        Bounce bounce;
        q.work([&](size_t t) -> Status {
            const Request& r = reqs[t];
            char* buf = nullptr;
            if (r.bounced) {
                Status s = bounce.get(&buf);
                if (!s.is_ok()) return s;
            }
            uint64_t got = 0;
            Status s = transfer(false, fd, r, buf, &direct, &got);
            if (!s.is_ok()) return s;
            const uint64_t end = r.off + got;
            direct_bytes += r.len - r.bounced;
            bounced += r.bounced;
            // Every segment byte of the request must have been read; then the bounced ones
            // go where they belong. (Blocks past the last segment byte may lie past the end.)
            uint64_t boff = 0;
            for (const Run& run : r.runs) {
                if (run.mem && run.off + run.len > end) return truncated(run.off + run.len, end);
                if (run.mem) continue;
                Status bad = Status::ok();
                overlaps(segments, count, run.off, run.len, [&](size_t c, uint64_t at, uint64_t len) {
                    if (at + len > end) {
                        if (bad.is_ok()) bad = truncated(at + len, end);
                        return;
                    }
                    std::memcpy(static_cast<char*>(segments[c].memory) + (at - segments[c].file_offset),
                                buf + boff + (at - run.off), len);
                });
                if (!bad.is_ok()) return bad;
                boff += run.len;
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
