// test_file_io.cpp: hostregFileWrite / hostregFileRead (include/hostreg/io.h) on a real file
// of this machine's disk, with O_DIRECT and without: bytes, checksums, errors.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "hostreg/io.h"

namespace {

constexpr size_t kBlock = HOSTREG_IO_BLOCK;

// A page-aligned buffer of n bytes (+ one block of slack) filled with a pattern.
struct Buf {
    explicit Buf(size_t n, unsigned seed) : size(n) {
        EXPECT_EQ(posix_memalign(reinterpret_cast<void**>(&base), kBlock, n + kBlock), 0);
        std::mt19937 gen(seed);
        for (size_t i = 0; i < n + kBlock; ++i)
            base[i] = static_cast<char>(gen());
    }
    ~Buf() { std::free(base); }
    char* at(size_t shift) { return base + shift; }
    char* base = nullptr;
    size_t size;
};

// A temporary file on the disk that holds the build tree (ext4 here: O_DIRECT works).
struct TempFile {
    TempFile() {
        char tmpl[] = "/tmp/hostreg-io-XXXXXX";
        int fd = mkstemp(tmpl);
        EXPECT_GE(fd, 0);
        close(fd);
        path = tmpl;
    }
    ~TempFile() { unlink(path.c_str()); }
    int open_for(int flags) const { return ::open(path.c_str(), flags | O_CLOEXEC, 0600); }
    std::string contents() const {
        std::string s;
        int fd = ::open(path.c_str(), O_RDONLY);
        char b[65536];
        for (ssize_t n; (n = read(fd, b, sizeof b)) > 0;)
            s.append(b, static_cast<size_t>(n));
        close(fd);
        return s;
    }
    std::string path;
};

// The file hostregFileWrite should make from these segments.
// The calling thread's last failure: its native code and message.
struct Last {
    long long native = 0;
    std::string message;
};
Last last() {
    Last l;
    const char* m = nullptr;
    hostregGetLastError(&l.native, &m);
    l.message = m ? m : "";
    return l;
}

std::string expected(const std::vector<hostregFileSegment>& segs) {
    std::string s;
    for (const auto& g : segs)
        s.append(static_cast<const char*>(g.memory), g.length);
    return s;
}

// Header, a congruent 3 MiB + 123 segment, a small trailer, a non-congruent 700 KiB segment, a tail.
struct Layout {
    Buf meta{8192, 1}, big{(3u << 20) + 123, 2}, odd{700u << 10, 3};
    std::vector<hostregFileSegment> segs;
    Layout() {
        uint64_t pos = 0;
        auto add = [&](void* mem, uint64_t len) {
            segs.push_back({pos, len, mem});
            pos += len;
        };
        add(meta.at(0), 1000);
        add(big.at(1000 % kBlock), big.size);  // memory congruent to its file offset: direct
        add(meta.at(1000), 300);
        add(odd.at(7), odd.size);  // never congruent: bounced
        add(meta.at(1300), 77);
    }
};

// Writes l to f through the page cache, for the tests of reading.
void write_plain(const Layout& l, const TempFile& f) {
    int fd = f.open_for(O_WRONLY | O_TRUNC);
    ASSERT_EQ(hostregFileWrite(fd, l.segs.data(), l.segs.size(), nullptr, 0, 2, 0, nullptr), 0) << last().message;
    close(fd);
}

TEST(FileIo, WriteWithDirectIoMakesExactlyTheSegmentsBytes) {
    Layout l;
    TempFile f;
    int fd = f.open_for(O_WRONLY | O_TRUNC | O_DIRECT);
    ASSERT_GE(fd, 0) << strerror(errno);
    hostregFileStats st{};
    ASSERT_EQ(hostregFileWrite(fd, l.segs.data(), l.segs.size(), nullptr, 0, 4, 1, &st), 0) << last().message;
    close(fd);
    EXPECT_EQ(f.contents(), expected(l.segs));  // truncated to the real size, no padding left
    EXPECT_EQ(st.direct, 1);
    EXPECT_GE(st.direct_bytes, (3u << 20) - 2 * kBlock);  // the congruent segment's middle
    EXPECT_LE(st.direct_bytes, 3u << 20);
    EXPECT_GE(st.bounced_bytes, (700u << 10));  // the other one went through a bounce buffer
}

TEST(FileIo, WriteWithoutDirectIoAndOneThread) {
    Layout l;
    TempFile f;
    int fd = f.open_for(O_WRONLY | O_TRUNC);
    hostregFileStats st{};
    ASSERT_EQ(hostregFileWrite(fd, l.segs.data(), l.segs.size(), nullptr, 0, 1, 0, &st), 0);
    close(fd);
    EXPECT_EQ(f.contents(), expected(l.segs));
    EXPECT_EQ(st.direct, 0);
}

TEST(FileIo, AFileWrittenInPartsIsTheirBytesInOrder) {
    // Part one: the layout, then zeros up to the next block; part two: the same layout's
    // segments moved to start there, one call after the other, with O_DIRECT.
    Layout l;
    const uint64_t end1 = l.segs.back().file_offset + l.segs.back().length;
    const uint64_t start2 = (end1 + kBlock - 1) / kBlock * kBlock;
    std::vector<char> zeros(start2 - end1, 0);
    std::vector<hostregFileSegment> one = l.segs, two;
    one.push_back({end1, start2 - end1, zeros.data()});
    Buf mem2{(3u << 20) + 8192, 4};
    for (const auto& g : l.segs)
        two.push_back({start2 + g.file_offset, g.length, g.memory});
    two[1].memory = mem2.at((start2 + two[1].file_offset) % kBlock);  // congruent again: direct
    TempFile f;
    const uint64_t old_size = 3 * start2;  // an older, longer file is written over in place
    {
        std::string old(old_size, 'x');
        int fd = f.open_for(O_WRONLY);
        ASSERT_EQ(write(fd, old.data(), old.size()), static_cast<ssize_t>(old.size()));
        close(fd);
    }
    int fd = f.open_for(O_WRONLY | O_DIRECT);
    ASSERT_GE(fd, 0) << strerror(errno);
    hostregFileStats st{};
    ASSERT_EQ(hostregFileWrite(fd, one.data(), one.size(), nullptr, 0, 4, HOSTREG_IO_MORE, nullptr), 0)
        << last().message;
    struct stat sb;
    ASSERT_EQ(fstat(fd, &sb), 0);
    EXPECT_EQ(static_cast<uint64_t>(sb.st_size), old_size);  // a part cuts nothing
    ASSERT_EQ(hostregFileWrite(fd, two.data(), two.size(), nullptr, 0, 4, HOSTREG_IO_SYNC, &st), 0) << last().message;
    close(fd);
    std::vector<hostregFileSegment> all = one;
    all.insert(all.end(), two.begin(), two.end());
    EXPECT_EQ(f.contents(), expected(all));
    EXPECT_GE(st.direct_bytes, (3u << 20) - 2 * kBlock);  // the second part's big segment went direct too
    // A part must end at a block boundary (its padding would lie under the next part), and
    // unknown flag bits are refused.
    fd = f.open_for(O_WRONLY);
    EXPECT_EQ(hostregFileWrite(fd, l.segs.data(), l.segs.size(), nullptr, 0, 1, HOSTREG_IO_MORE, nullptr),
              hostregErrorInvalidValue);
    EXPECT_NE(std::string(last().message).find("HOSTREG_IO_MORE"), std::string::npos);
    EXPECT_EQ(hostregFileWrite(fd, one.data(), one.size(), nullptr, 0, 1, 4, nullptr), hostregErrorInvalidValue);
    close(fd);
    EXPECT_EQ(f.contents(), expected(all));  // refusals write nothing
}

TEST(FileIo, ChecksumsArePatchedInBeforeTheirBytesAreWritten) {
    Layout l;
    // The CRC-32 of the 3 MiB segment at byte 10 of the trailer, and of the odd one at byte 40
    // of the tail; a 9 MiB segment checks that pieces combine.
    Buf nine{(9u << 20) + 5, 4};
    l.segs.push_back({l.segs.back().file_offset + l.segs.back().length, nine.size, nine.at(0)});
    Buf tail{64, 5};
    l.segs.push_back({l.segs.back().file_offset + l.segs.back().length, 64, tail.at(0)});
    std::vector<hostregCrcPatch> patches = {{1, 2, 10}, {3, 4, 40}, {5, 6, 0}, {5, 6, 60}};
    TempFile f;
    int fd = f.open_for(O_WRONLY | O_TRUNC | O_DIRECT);
    ASSERT_EQ(hostregFileWrite(fd, l.segs.data(), l.segs.size(), patches.data(), patches.size(), 3, 1, nullptr), 0)
        << last().message;
    close(fd);
    const std::string got = f.contents();
    EXPECT_EQ(got, expected(l.segs));  // with the checksums now in the memory of segments 2, 4, 6
    auto crc_at = [&](size_t seg, size_t off) {
        uint32_t v;
        std::memcpy(&v, got.data() + l.segs[seg].file_offset + off, 4);
        return v;
    };
    auto crc_of = [&](size_t seg) {
        return static_cast<uint32_t>(crc32_z(0, static_cast<const Bytef*>(l.segs[seg].memory), l.segs[seg].length));
    };
    EXPECT_EQ(crc_at(2, 10), crc_of(1));
    EXPECT_EQ(crc_at(4, 40), crc_of(3));
    EXPECT_EQ(crc_at(6, 0), crc_of(5));
    EXPECT_EQ(crc_at(6, 60), crc_of(5));
}

TEST(FileIo, ReadsSegmentsWithGapsIntoAnyMemory) {
    Layout l;
    TempFile f;
    write_plain(l, f);
    const std::string file = f.contents();
    // Back into fresh memory: the big one congruent (direct), the odd one not, a gap between.
    Buf a{l.segs[1].length, 9}, b{l.segs[3].length, 10}, c{50, 11};
    std::vector<hostregFileSegment> want = {
        {l.segs[1].file_offset, l.segs[1].length, a.at(l.segs[1].file_offset % kBlock)},
        {l.segs[3].file_offset + 5, l.segs[3].length - 5, b.at(1)},
        {file.size() - 50, 50, c.at(3)},
    };
    int fd = f.open_for(O_RDONLY | O_DIRECT);
    hostregFileStats st{};
    ASSERT_EQ(hostregFileRead(fd, want.data(), want.size(), 4, &st), 0) << last().message;
    close(fd);
    for (const auto& w : want)
        EXPECT_EQ(std::memcmp(w.memory, file.data() + w.file_offset, w.length), 0) << "at " << w.file_offset;
    EXPECT_EQ(st.direct, 1);
    EXPECT_GT(st.direct_bytes, 0u);
}

// 64 page-aligned 256 KiB tensors, each between a 1,000-byte header and a 500-byte trailer
// that holds its checksum, padded so that every tensor lies congruent: the file a checkpoint
// of many small tensors makes.
struct ManyTensors {
    static constexpr size_t kCount = 64, kTensor = 256u << 10;
    Buf data{kCount * kTensor, 21}, meta{kCount * 3 * kBlock, 22};  // per tensor: header (<= 5,095 bytes), trailer
    std::vector<hostregFileSegment> segs;
    std::vector<hostregCrcPatch> patches;
    ManyTensors() {
        uint64_t pos = 0;
        for (size_t i = 0; i < kCount; ++i) {
            const uint64_t pad = (kBlock - (pos + 1000) % kBlock) % kBlock;
            segs.push_back({pos, 1000 + pad, meta.at(i * 3 * kBlock)});
            pos += 1000 + pad;
            segs.push_back({pos, kTensor, data.at(i * kTensor)});
            pos += kTensor;
            patches.push_back({segs.size() - 1, segs.size(), 8});
            segs.push_back({pos, 500, meta.at(i * 3 * kBlock + 2 * kBlock)});
            pos += 500;
        }
    }
};

TEST(FileIo, ManyTensorsBetweenSmallRecordsGoInFewLargeRequests) {
    ManyTensors m;
    TempFile f;
    int fd = f.open_for(O_WRONLY | O_TRUNC | O_DIRECT);
    hostregFileStats st{};
    ASSERT_EQ(hostregFileWrite(fd, m.segs.data(), m.segs.size(), m.patches.data(), m.patches.size(), 4, 1, &st), 0)
        << last().message;
    close(fd);
    const std::string got = f.contents();
    ASSERT_EQ(got, expected(m.segs));
    for (const auto& p : m.patches) {  // every checksum in its trailer
        const auto& t = m.segs[p.crc_of];
        uint32_t v;
        std::memcpy(&v, got.data() + m.segs[p.into].file_offset + p.offset, 4);
        EXPECT_EQ(v, static_cast<uint32_t>(crc32_z(0, static_cast<const Bytef*>(t.memory), t.length)));
    }
    // Every tensor straight from its memory, and the records between them in the same
    // requests (vectored), not one request per piece: the file is about 16.3 MiB.
    EXPECT_EQ(st.direct_bytes, ManyTensors::kCount * ManyTensors::kTensor);
    EXPECT_LE(st.requests, 4u) << st.requests;

    // Read back: the tensors straight into fresh congruent memory, the records not asked for.
    Buf back{ManyTensors::kCount * ManyTensors::kTensor, 23};
    std::vector<hostregFileSegment> want;
    for (size_t i = 0; i < ManyTensors::kCount; ++i)
        want.push_back({m.segs[3 * i + 1].file_offset, ManyTensors::kTensor, back.at(i * ManyTensors::kTensor)});
    fd = f.open_for(O_RDONLY | O_DIRECT);
    ASSERT_EQ(hostregFileRead(fd, want.data(), want.size(), 4, &st), 0) << last().message;
    close(fd);
    EXPECT_EQ(std::memcmp(back.base, m.data.base, ManyTensors::kCount * ManyTensors::kTensor), 0);
    EXPECT_EQ(st.direct_bytes, ManyTensors::kCount * ManyTensors::kTensor);
    EXPECT_LE(st.bounced_bytes, ManyTensors::kCount * kBlock);  // the records between, read through
    EXPECT_LE(st.requests, 4u) << st.requests;

    // With the records too (no gaps): few requests again.
    Buf meta_back{ManyTensors::kCount * 3 * kBlock, 24};
    want.clear();
    for (size_t i = 0; i < m.segs.size(); ++i) {
        const auto& s = m.segs[i];
        char* mem = i % 3 == 1 ? back.at(i / 3 * ManyTensors::kTensor)
                               : meta_back.at(i / 3 * 3 * kBlock + (i % 3 ? 2 * kBlock : 0));
        want.push_back({s.file_offset, s.length, mem});
    }
    fd = f.open_for(O_RDONLY | O_DIRECT);
    ASSERT_EQ(hostregFileRead(fd, want.data(), want.size(), 4, &st), 0) << last().message;
    close(fd);
    for (const auto& w : want)
        EXPECT_EQ(std::memcmp(w.memory, got.data() + w.file_offset, w.length), 0) << "at " << w.file_offset;
    EXPECT_EQ(st.direct_bytes, ManyTensors::kCount * ManyTensors::kTensor);
    EXPECT_LE(st.requests, 4u) << st.requests;
}

TEST(FileIo, ReadingPastTheEndIsATruncatedFile) {
    Layout l;
    TempFile f;
    write_plain(l, f);
    Buf a{1 << 20, 3};
    const uint64_t size = l.segs.back().file_offset + l.segs.back().length;
    hostregFileSegment s{size - 100, 200, a.at(0)};
    int fd = f.open_for(O_RDONLY | O_DIRECT);
    EXPECT_EQ(hostregFileRead(fd, &s, 1, 1, nullptr), hostregErrorUnknown);
    close(fd);
    EXPECT_EQ(last().native, EIO);
    EXPECT_NE(std::string(last().message).find("truncated"), std::string::npos);
}

TEST(FileIo, BadArgumentsAnswerInvalidValue) {
    Buf a{8192, 1};
    std::vector<hostregFileSegment> gap = {{0, 100, a.at(0)}, {200, 100, a.at(100)}};
    TempFile f;
    int fd = f.open_for(O_WRONLY | O_TRUNC);
    EXPECT_EQ(hostregFileWrite(fd, gap.data(), gap.size(), nullptr, 0, 1, 0, nullptr), hostregErrorInvalidValue);
    EXPECT_NE(std::string(last().message).find("tile"), std::string::npos);
    std::vector<hostregFileSegment> ok = {{0, 100, a.at(0)}, {100, 100, a.at(100)}};
    hostregCrcPatch outside{0, 1, 97};
    EXPECT_EQ(hostregFileWrite(fd, ok.data(), ok.size(), &outside, 1, 1, 0, nullptr), hostregErrorInvalidValue);
    EXPECT_EQ(hostregFileWrite(-1, ok.data(), ok.size(), nullptr, 0, 1, 0, nullptr), hostregErrorInvalidValue);
    hostregFileSegment midblock{100, 100, a.at(0)};  // a part must start at a block boundary
    EXPECT_EQ(hostregFileWrite(fd, &midblock, 1, nullptr, 0, 1, 0, nullptr), hostregErrorInvalidValue);
    EXPECT_NE(std::string(last().message).find("multiple of"), std::string::npos);
    std::vector<hostregFileSegment> overlap = {{0, 100, a.at(0)}, {50, 100, a.at(100)}};
    EXPECT_EQ(hostregFileRead(fd, overlap.data(), overlap.size(), 1, nullptr), hostregErrorInvalidValue);
    close(fd);
}

TEST(FileIo, TheOperatingSystemsRefusalKeepsItsErrno) {
    Buf a{8192, 1};
    hostregFileSegment s{0, 8192, a.at(0)};
    TempFile f;
    int fd = f.open_for(O_RDONLY);  // not open for writing: EBADF
    EXPECT_EQ(hostregFileWrite(fd, &s, 1, nullptr, 0, 2, 0, nullptr), hostregErrorUnknown);
    EXPECT_EQ(last().native, EBADF);
    EXPECT_NE(std::string(last().message).find("pwritev"), std::string::npos);
    close(fd);
}

}  // namespace

namespace {

TEST(Crc32Batch, EachRangeGetsZlibsCrcAcrossPiecesAndThreads) {
    // Ranges of 0 bytes, odd sizes, and ones cut into several 4 MiB pieces, against zlib's
    // crc32 of the same bytes (ZIP's checksum).
    const size_t big = (size_t{9} << 20) + 12345;
    Buf a{big, 7};
    std::vector<const void*> memory = {a.at(0), a.at(3), a.at(1), a.at(0), nullptr};
    std::vector<uint64_t> lengths = {big, 1000, 4u << 20, 0, 0};
    for (unsigned threads : {1u, 3u, 16u}) {
        std::vector<uint32_t> out(memory.size(), 0xdeadbeef);
        ASSERT_EQ(hostregCrc32Batch(memory.data(), lengths.data(), memory.size(), out.data(), threads), 0);
        for (size_t i = 0; i < memory.size(); ++i) {
            const uLong want = crc32_z(0, static_cast<const Bytef*>(memory[i]), static_cast<z_size_t>(lengths[i]));
            EXPECT_EQ(out[i], static_cast<uint32_t>(want)) << "range " << i << ", " << threads << " threads";
        }
    }
}

TEST(Crc32Batch, BadArgumentsAreInvalidValue) {
    uint64_t len = 10;
    const void* none = nullptr;
    uint32_t out = 0;
    EXPECT_EQ(hostregCrc32Batch(&none, &len, 1, &out, 1), hostregErrorInvalidValue);
    EXPECT_EQ(hostregCrc32Batch(nullptr, &len, 1, &out, 1), hostregErrorInvalidValue);
    EXPECT_EQ(hostregCrc32Batch(nullptr, nullptr, 0, nullptr, 1), 0);  // nothing to do
}

}  // namespace
