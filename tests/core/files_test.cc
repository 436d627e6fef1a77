// The file layer (hsdp/files.h) against the file system itself: what it refuses (links inside a
// directory, FIFOs, devices, oversized files, outputs onto inputs), what it leaves (a link's
// target, other jobs' temporaries), how many files it keeps open, and how it escapes echoes.
#include "hsdp/files.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>

#include "core/files_internal.h"

namespace hsdp::files {
namespace {

class FilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/hsdp-files-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { (void)std::system(("rm -rf '" + dir_ + "'").c_str()); }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path(name), std::ios::binary) << text;
  }
  std::string read(const std::string& name) const {
    std::ifstream in(path(name), std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  std::string dir_;
};

TEST_F(FilesTest, QuoteEscapesControlBytesAndCutsLongText) {
  EXPECT_EQ(quote("plain/path.bin"), "plain/path.bin");
  EXPECT_EQ(quote("a\nb\x1b[31m'\\"), "a\\nb\\x1b[31m\\'\\\\");
  EXPECT_EQ(quote("caf\xc3\xa9"), "caf\xc3\xa9");  // UTF-8 stays
  EXPECT_EQ(quote("\xff\xc3"), "\\xff\\xc3");      // not UTF-8: escaped
  const std::string long_text(1000, 'x');
  const std::string q = quote(long_text, 10);
  EXPECT_EQ(q, std::string(10, 'x') + "...(1000 bytes)");
}

TEST_F(FilesTest, ReadBoundedRefusesFifoDeviceDirectoryAndOversizeWithoutBlocking) {
  write("small", "hello");
  auto ok = readBounded(path("small"), 5, "test file");
  ASSERT_TRUE(ok.ok()) << ok.status().toString();
  EXPECT_EQ(*ok, "hello");
  auto big = readBounded(path("small"), 4, "test file");
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.status().message().find("is 5 bytes, over the limit of 4 bytes"), std::string::npos)
      << big.status().message();
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0600), 0);
  const auto t0 = std::chrono::steady_clock::now();
  auto fifo = readBounded(path("fifo"), 100, "test file");  // no writer: open would block
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  ASSERT_FALSE(fifo.ok());
  EXPECT_NE(fifo.status().message().find("is a FIFO, not a regular file"), std::string::npos)
      << fifo.status().message();
  auto dir = readBounded(dir_, 100, "test file");
  ASSERT_FALSE(dir.ok());
  EXPECT_NE(dir.status().message().find("is a directory"), std::string::npos);
  if (::mknod(path("zero").c_str(), S_IFCHR | 0600, makedev(1, 5)) == 0) {
    auto dev = readBounded(path("zero"), 100, "test file");
    ASSERT_FALSE(dev.ok());
    EXPECT_NE(dev.status().message().find("is a device node"), std::string::npos);
  }
}

TEST_F(FilesTest, NamesInsideADirectoryAreNotFollowed) {
  write("target", "secret");
  ASSERT_EQ(::mkdir(path("d").c_str(), 0755), 0);
  ASSERT_EQ(::symlink(path("target").c_str(), path("d/link").c_str()), 0);
  auto d = Dir::open(path("d"));
  ASSERT_TRUE(d.ok());
  auto f = File::openReadAt(*d, "link");
  ASSERT_FALSE(f.ok());
  EXPECT_NE(f.status().message().find("a symbolic link"), std::string::npos)
      << f.status().message();
  EXPECT_FALSE(File::openReadAt(*d, "../target").ok());  // one component only
  // A path the user typed may be a link: followed.
  EXPECT_TRUE(File::openRead(path("d/link")).ok());
}

TEST_F(FilesTest, CreateNewNeverWritesThroughALinkOrTruncates) {
  write("target", "secret");
  ASSERT_EQ(::symlink(path("target").c_str(), path("link").c_str()), 0);
  ASSERT_EQ(::symlink(path("nowhere").c_str(), path("dangling").c_str()), 0);
  EXPECT_FALSE(File::createNew(path("link")).ok());
  EXPECT_FALSE(File::createNew(path("dangling")).ok());
  EXPECT_FALSE(File::createNew(path("target")).ok());
  EXPECT_EQ(read("target"), "secret");
  EXPECT_EQ(::access(path("nowhere").c_str(), F_OK), -1);
}

TEST_F(FilesTest, ReplaceFileReplacesALinkAndLeavesItsTarget) {
  write("target", "secret");
  ASSERT_EQ(::symlink(path("target").c_str(), path("latest").c_str()), 0);
  // A planted temporary of another name: not ours, untouched.
  ASSERT_EQ(::symlink(path("target").c_str(), path("latest.tmp").c_str()), 0);
  auto d = Dir::open(dir_);
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(d->replaceFile("latest", "step-1\n").ok());
  EXPECT_EQ(read("target"), "secret");
  EXPECT_EQ(d->kindOf("latest"), Kind::kRegular);
  EXPECT_EQ(read("latest"), "step-1\n");
  EXPECT_EQ(d->kindOf("latest.tmp"), Kind::kSymlink);
  EXPECT_EQ(d->kindOf(tempName("latest")), Kind::kMissing);
  ASSERT_EQ(::mkdir(path("adir").c_str(), 0755), 0);
  EXPECT_FALSE(d->replaceFile("adir", "x").ok());
  EXPECT_EQ(d->kindOf("adir"), Kind::kDirectory);
}

TEST_F(FilesTest, RemoveTreeRemovesLinksNotWhatTheyName) {
  ASSERT_EQ(::mkdir(path("keep").c_str(), 0755), 0);
  write("keep/data", "user data");
  ASSERT_EQ(::mkdir(path("tree").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(path("tree/sub").c_str(), 0755), 0);
  write("tree/sub/f", "x");
  ASSERT_EQ(::symlink(path("keep").c_str(), path("tree/sub/to_keep").c_str()), 0);
  auto d = Dir::open(dir_);
  ASSERT_TRUE(d.ok());
  ASSERT_TRUE(d->removeTree("tree").ok());
  EXPECT_EQ(d->kindOf("tree"), Kind::kMissing);
  EXPECT_EQ(read("keep/data"), "user data");
  EXPECT_TRUE(d->removeTree("missing").ok());
}

TEST_F(FilesTest, TemporariesCarryThisJobsMarker) {
  const std::string t = tempName("step-00000001");
  EXPECT_TRUE(isOwnTemp(t));
  EXPECT_EQ(t.rfind(".step-00000001.tmp-", 0), 0u);
  EXPECT_FALSE(isOwnTemp(".tmp-step-00000001"));
  EXPECT_FALSE(isOwnTemp(".step-00000001.tmp-otherhost.1"));
  const std::string saved = jobMarker();
  setJobMarker("node7.42");
  EXPECT_EQ(tempName("x"), ".x.tmp-node7.42");
  EXPECT_FALSE(isOwnTemp(t));
  setJobMarker(saved);
}

TEST_F(FilesTest, OutputTargetsThatCannotWork) {
  ASSERT_EQ(::mkdir(path("in").c_str(), 0755), 0);
  write("in/manifest.json", "{}");
  write("file", "x");
  ASSERT_EQ(::symlink(path("nowhere").c_str(), path("dangling").c_str()), 0);
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0600), 0);
  const std::vector<std::string> in = {path("in")};
  auto expect = [&](const std::string& out, OutputTarget t, const std::string& want) {
    Status s = checkOutputTarget(out, t, in);
    EXPECT_FALSE(s.ok()) << out;
    EXPECT_NE(s.message().find(want), std::string::npos) << out << ": " << s.message();
  };
  expect(path("in/manifest.json"), {}, "inside the input");
  expect(path("in"), {.directory = true, .replace_dir = true}, "is the input");
  expect(path("in/new"), {.directory = true}, "inside the input");
  expect(dir_, {.directory = true, .replace_dir = true}, "contains the input");
  expect(path("dangling"), {}, "is a symbolic link");
  expect(path("fifo"), {}, "is a FIFO");
  expect(path("in"), {}, "is an existing directory");
  expect(path("file"), {.directory = true}, "is an existing file");
  expect(path("new/"), {}, "does not end in a file or directory name");
  expect(path("new/."), {}, "does not end in a file or directory name");
  expect("", {}, "empty path");
  expect(path("none/new"), {}, "output's directory");
  EXPECT_TRUE(checkOutputTarget(path("new.safetensors"), {}, in).ok());
  EXPECT_TRUE(checkOutputTarget(path("file"), {}, in).ok());  // an old export: replaced
  EXPECT_TRUE(checkOutputTarget(path("newdir"), {.directory = true}, in).ok());
}

StatusOr<File> openForCache(void* ctx, int i) {
  const std::string& dir = *static_cast<std::string*>(ctx);
  return File::openRead(dir + "/f" + std::to_string(i));
}

TEST_F(FilesTest, FileCacheKeepsAtMostItsCapacityOpen) {
  for (int i = 0; i < 20; ++i) write("f" + std::to_string(i), std::to_string(i));
  FileCache cache(4, [this](int i) { return openForCache(&dir_, i); });
  for (int round = 0; round < 3; ++round)
    for (int i = 0; i < 20; ++i) {
      auto f = cache.get(i);
      ASSERT_TRUE(f.ok());
      char c[2] = {};
      ASSERT_TRUE((*f)->preadAll(c, 1, 0).ok());
      EXPECT_EQ(c[0], std::to_string(i)[0]);
      EXPECT_LE(cache.openCount(), 4u);
    }
  // A file held elsewhere is never closed under its user: the cache grows past capacity instead.
  std::vector<std::shared_ptr<const File>> held;
  for (int i = 0; i < 6; ++i) held.push_back(*cache.get(i));
  for (const auto& f : held) EXPECT_TRUE(f->isOpen());
  held.clear();
  (void)cache.get(7);
  EXPECT_LE(cache.openCount(), 4u);
}

TEST_F(FilesTest, OpenFileBudgetFollowsTheLimit) {
  struct rlimit old;
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &old), 0);
  struct rlimit low = old;
  low.rlim_cur = 256;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  EXPECT_EQ(openFileBudget(), 64u);
  low.rlim_cur = 8;
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  EXPECT_EQ(openFileBudget(), 4u);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &old), 0);
}

TEST_F(FilesTest, WriteFileAtomicallyRefusesLinksAndDevices) {
  write("target", "secret");
  ASSERT_EQ(::symlink(path("target").c_str(), path("chart.svg").c_str()), 0);
  EXPECT_FALSE(writeFileAtomically(path("chart.svg"), "<svg/>").ok());
  EXPECT_EQ(read("target"), "secret");
  ASSERT_EQ(::mkfifo(path("fifo").c_str(), 0600), 0);
  EXPECT_FALSE(writeFileAtomically(path("fifo"), "<svg/>").ok());
  ASSERT_TRUE(writeFileAtomically(path("new.svg"), "<svg/>").ok());
  EXPECT_EQ(read("new.svg"), "<svg/>");
}

}  // namespace
}  // namespace hsdp::files
