// The file layer's direct I/O (core/files_internal.h): what goes around the page cache and what
// through it gives the same bytes as a plain buffered write, read back with std::ifstream (an
// independent reader), on the build tree's filesystem (ext4 or xfs: O_DIRECT) and on tmpfs
// (/dev/shm: O_DIRECT since Linux 6.6, before that everything buffered); reads at every
// alignment, and a read past the end named as truncated on either path.
#include <gtest/gtest.h>
#include <linux/magic.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/files_internal.h"
#include "storage/io.h"

namespace hsdp::ckpt {
namespace {

constexpr size_t kBytes = (size_t{3} << 20) + 4321;  // not a whole number of blocks

struct Aligned {
  explicit Aligned(size_t n)
      : p(static_cast<char*>(std::aligned_alloc(4096, n / 4096 * 4096 + 8192))) {}
  ~Aligned() { std::free(p); }
  char* p;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

bool supportsDirect(const std::string& dir) {
  struct statfs s;
  if (::statfs(dir.c_str(), &s) != 0) return false;
  return s.f_type == EXT4_SUPER_MAGIC || s.f_type == XFS_SUPER_MAGIC;
}

class DirectIo : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    base_ =
        GetParam() == "tmpfs" ? std::string("/dev/shm") : std::filesystem::current_path().string();
    if (GetParam() == "tmpfs" && !std::filesystem::is_directory(base_))
      GTEST_SKIP() << "no /dev/shm";
    dir_ = base_ + "/ckpt_io_test." + std::to_string(::getpid());
    std::filesystem::create_directories(dir_);
    std::mt19937 rng(7);
    data_.resize(kBytes + 8192);
    for (char& c : data_) c = static_cast<char>(rng());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  bool expectDirect() const { return GetParam() != "tmpfs" && supportsDirect(base_); }

  std::string base_, dir_;
  std::string data_;
};

// Appends in pieces whose memory and file offset agree modulo 4 KiB (the direct path: an
// unaligned head and tail around whole blocks), disagree (buffered), and are small (buffered).
TEST_P(DirectIo, WritesGiveTheBytesOfABufferedWrite) {
  const std::string path = dir_ + "/w.bin";
  Aligned mem(kBytes + 8192);
  auto f = files::createNew(path, /*direct=*/true);
  ASSERT_TRUE(f.ok()) << f.status().toString();
  if (expectDirect()) EXPECT_TRUE(files::isDirect(*f)) << base_;
  const size_t a = 5000, b = a + (size_t{2} << 20) + 77, c = b + 100 * 1024 + 3;
  // [0, a) small; [a, b) with memory at a's offset within a block; [b, c) one byte off; the rest.
  std::memcpy(mem.p, data_.data(), a);
  ASSERT_TRUE(f->writeAll(mem.p, a).ok());
  char* p = mem.p + a % 4096;
  std::memcpy(p, data_.data() + a, b - a);
  ASSERT_TRUE(f->writeAll(p, b - a).ok());
  char* q = mem.p + (b % 4096) + 1;
  std::memcpy(q, data_.data() + b, c - b);
  ASSERT_TRUE(f->writeAll(q, c - b).ok());
  char* r = mem.p + c % 4096;
  std::memcpy(r, data_.data() + c, kBytes - c);
  ASSERT_TRUE(f->writeAll(r, kBytes - c).ok());
  ASSERT_TRUE(f->sync().ok());
  ASSERT_TRUE(f->close().ok());
  const std::string got = slurp(path);
  ASSERT_EQ(got.size(), kBytes);
  EXPECT_TRUE(got == data_.substr(0, kBytes));
}

TEST_P(DirectIo, ReadsAtEveryAlignment) {
  const std::string path = dir_ + "/r.bin";
  {
    std::ofstream out(path, std::ios::binary);
    out.write(data_.data(), static_cast<std::streamsize>(kBytes));
  }
  auto f = files::openRead(path, /*direct=*/true);
  ASSERT_TRUE(f.ok()) << f.status().toString();
  if (expectDirect()) EXPECT_TRUE(files::isDirect(*f)) << base_;
  Aligned mem(kBytes + 8192);
  struct Case {
    uint64_t offset;
    size_t bytes;
    size_t mem_shift;  // where in its block the destination starts
  };
  const Case cases[] = {
      {0, kBytes, 0},              // the whole file, aligned: all but the tail direct
      {8192, size_t{1} << 20, 0},  // whole blocks only
      {4000, (size_t{1} << 20) + 9, 4000 % 4096},  // head, blocks, tail
      {4000, size_t{1} << 20, 17},                 // memory and file disagree: buffered
      {12345, 1000, 12345 % 4096},                 // below the direct minimum
  };
  for (const Case& k : cases) {
    std::memset(mem.p, 0, kBytes + 4096);
    char* dst = mem.p + k.mem_shift;
    ASSERT_TRUE(f->preadAll(dst, k.bytes, k.offset).ok()) << k.offset << " " << k.bytes;
    EXPECT_EQ(std::memcmp(dst, data_.data() + k.offset, k.bytes), 0)
        << "offset " << k.offset << " bytes " << k.bytes << " shift " << k.mem_shift;
  }
  // Past the end, on the direct path and off it: named as truncated, with the file.
  for (size_t shift : {size_t{0}, size_t{5}}) {
    Status s = f->preadAll(mem.p + shift, size_t{1} << 20, kBytes - 100000);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("unexpected end of file"), std::string::npos) << s.toString();
    EXPECT_NE(s.message().find(path), std::string::npos) << s.toString();
  }
}

INSTANTIATE_TEST_SUITE_P(Filesystems, DirectIo, ::testing::Values("build_tree", "tmpfs"));

}  // namespace
}  // namespace hsdp::ckpt
