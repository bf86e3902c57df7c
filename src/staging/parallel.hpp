// parallel.hpp: splitting one job across threads when the OS may refuse threads.
//
// A thread can be refused at any time (RLIMIT_NPROC, a container's pids limit, an
// address-space limit for its stack): std::thread then throws std::system_error, and a
// std::thread destroyed while joinable ends the process. run_parts never lets either happen:
// a part whose thread is refused runs on the calling thread, and every thread started is
// joined before it returns.
#pragma once

#include <sched.h>

#include <algorithm>
#include <cstddef>
#include <thread>
#include <vector>

namespace hostreg {

// The CPUs the calling thread may run on (sched_getaffinity(2): a container's cpuset, taskset,
// numactl), at least 1: the default thread count of every parallel job here.
// std::thread::hardware_concurrency counts every CPU of the machine instead, which
// oversubscribes a container given a few of them. Falls back to it where the affinity mask
// cannot be read (a machine of more than CPU_SETSIZE, 1,024, CPUs).
inline unsigned usable_cpus() {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return static_cast<unsigned>(CPU_COUNT(&set));
    return std::max(1u, std::thread::hardware_concurrency());
}

// [begin, end) of part i when len bytes are cut into `parts` shares, each a multiple of
// `align` (a power of two) except the last: together they cover [0, len) exactly once.
struct Span {
    size_t begin, end;
};
inline Span part_of(size_t len, size_t parts, size_t align, size_t i) {
    const size_t per = (len + parts - 1) / parts;            // ceil: never short
    const size_t share = (per + align - 1) / align * align;  // then up to the alignment
    const size_t begin = std::min(len, i * share);
    return Span{begin, std::min(len, begin + share)};
}

// Runs work(i) for i in [0, parts): part 0 on the calling thread, the others on threads of
// their own where the OS gives one, else on the calling thread too. Returns the number of
// threads that ran (1 when every extra thread was refused). Never throws.
template <class F>
size_t run_parts(size_t parts, F work) {
    std::vector<std::thread> pool;
    std::vector<size_t> here;  // parts the calling thread runs
    try {
        pool.reserve(parts > 0 ? parts - 1 : 0);
        here.reserve(parts);
    } catch (...) {  // no memory even for the bookkeeping: everything here, in order
        for (size_t i = 0; i < parts; ++i)
            work(i);
        return 1;
    }
    here.push_back(0);
    for (size_t i = 1; i < parts; ++i) {
        try {
            pool.emplace_back(work, i);
        } catch (...) {  // std::system_error (EAGAIN) from pthread_create
            here.push_back(i);
        }
    }
    for (size_t i : here)
        work(i);
    for (auto& t : pool)
        t.join();
    return pool.size() + 1;
}

}  // namespace hostreg
