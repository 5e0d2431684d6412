#include "cache/cache_dir.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/base_sink.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>

#include "common/log.h"

namespace mpnfs::cache {
namespace {

namespace stdfs = std::filesystem;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteAll(const std::string& path, const std::string& s) { std::ofstream(path) << s; }

class CacheDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/mpnfs-cachedir-test-XXXXXX";
    top_ = mkdtemp(tmpl);  // 0700, ours
    dir_ = top_ + "/cache";
    ASSERT_EQ(mkdir(dir_.c_str(), 0755), 0);
    outside_ = top_ + "/victim";
    WriteAll(outside_, "precious");
  }
  void TearDown() override { stdfs::remove_all(top_); }

  std::string top_, dir_, outside_;
};

TEST_F(CacheDirTest, AcceptsADirectoryOnlyItsOwnerCanWrite) {
  auto r = CheckCacheDir(dir_);
  EXPECT_TRUE(r.ok()) << r.error().what;
  WriteAll(dir_ + "/data", "");
  r = CheckCacheDir(dir_);
  EXPECT_TRUE(r.ok()) << r.error().what;
}

TEST_F(CacheDirTest, ACheckedPathIsTheResolvedDirectory) {
  // A link on the way to the cache, in a directory others could write to,
  // could be swapped after the check: the check hands back where it points.
  const std::string link = top_ + "/link";
  ASSERT_EQ(symlink(dir_.c_str(), link.c_str()), 0);
  auto r = CheckCacheDir(link + "/");
  ASSERT_TRUE(r.ok()) << r.error().what;
  EXPECT_EQ(*r, stdfs::canonical(dir_).string());
}

TEST_F(CacheDirTest, RefusesADirectoryOtherUsersCanWrite) {
  for (mode_t m : {0777, 0775, 0757, 01777}) {
    ASSERT_EQ(chmod(dir_.c_str(), m), 0);
    auto r = CheckCacheDir(dir_);
    ASSERT_FALSE(r.ok()) << std::oct << m;
    EXPECT_EQ(r.error().err, EPERM);
    EXPECT_NE(r.error().what.find("writable by other users"), std::string::npos) << r.error().what;
  }
}

TEST_F(CacheDirTest, RefusesADirectoryOwnedByAnotherUser) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to give the directory away";
  ASSERT_EQ(chown(dir_.c_str(), 12345, 12345), 0);
  auto r = CheckCacheDir(dir_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().err, EPERM);
  EXPECT_NE(r.error().what.find("owned by uid 12345"), std::string::npos) << r.error().what;
}

TEST_F(CacheDirTest, RefusesADirectoryUnderOneOthersCanRenameIn) {
  ASSERT_EQ(chmod(top_.c_str(), 0777), 0);
  auto r = CheckCacheDir(dir_);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().what.find("the directory " + top_ + " above it"), std::string::npos)
      << r.error().what;
  // Sticky (as /tmp): nobody else can rename or remove our entries there.
  ASSERT_EQ(chmod(top_.c_str(), 01777), 0);
  r = CheckCacheDir(dir_);
  EXPECT_TRUE(r.ok()) << r.error().what;
}

TEST_F(CacheDirTest, RefusesLinksAndOddFilesWhereCacheFilesGo) {
  ASSERT_EQ(symlink(outside_.c_str(), (dir_ + "/data").c_str()), 0);
  auto r = CheckCacheDir(dir_);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().what.find("data in it is a symbolic link"), std::string::npos)
      << r.error().what;
  ASSERT_EQ(unlink((dir_ + "/data").c_str()), 0);

  ASSERT_EQ(link(outside_.c_str(), (dir_ + "/index").c_str()), 0);
  r = CheckCacheDir(dir_);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().what.find("index in it has 2 hard links"), std::string::npos)
      << r.error().what;
  ASSERT_EQ(unlink((dir_ + "/index").c_str()), 0);

  ASSERT_EQ(mkfifo((dir_ + "/meta").c_str(), 0600), 0);
  r = CheckCacheDir(dir_);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().what.find("meta in it is not a regular file"), std::string::npos)
      << r.error().what;
  EXPECT_EQ(ReadAll(outside_), "precious");
}

TEST_F(CacheDirTest, OpenCacheFileNeverFollowsALink) {
  ASSERT_EQ(symlink(outside_.c_str(), (dir_ + "/index").c_str()), 0);
  auto r = OpenCacheFile(dir_, "index", O_RDWR | O_CREAT | O_TRUNC);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().err, ELOOP);
  EXPECT_NE(r.error().what.find("symbolic link"), std::string::npos) << r.error().what;
  EXPECT_EQ(ReadAll(outside_), "precious");
  // A dangling link: its target is not created either.
  const std::string nowhere = top_ + "/created-through-a-link";
  ASSERT_EQ(symlink(nowhere.c_str(), (dir_ + "/probe").c_str()), 0);
  r = OpenCacheFile(dir_, "probe", O_RDWR | O_CREAT);
  ASSERT_FALSE(r.ok());
  EXPECT_FALSE(stdfs::exists(nowhere));
}

TEST_F(CacheDirTest, OpenCacheFileRefusesWhatIsNotOurOwnRegularFile) {
  ASSERT_EQ(mkfifo((dir_ + "/data").c_str(), 0600), 0);
  auto r = OpenCacheFile(dir_, "data", O_RDONLY);  // would block on a FIFO without O_NONBLOCK
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().err, EPERM);
  ASSERT_EQ(link(outside_.c_str(), (dir_ + "/index").c_str()), 0);
  r = OpenCacheFile(dir_, "index", O_RDWR);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().what.find("hard links"), std::string::npos) << r.error().what;

  r = OpenCacheFile(dir_, "id", O_RDWR | O_CREAT);
  ASSERT_TRUE(r.ok()) << r.error().what;
  EXPECT_EQ(fcntl(*r, F_GETFL) & O_NONBLOCK, 0);
  struct stat st {};
  ASSERT_EQ(fstat(*r, &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  close(*r);
}

TEST_F(CacheDirTest, LockIsExclusiveAndNamesItsHolder) {
  auto a = LockCacheDir(dir_, std::chrono::seconds(0));
  ASSERT_TRUE(a.ok()) << a.error().what;
  auto b = LockCacheDir(dir_, std::chrono::seconds(0));
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.error().err, EBUSY);
  EXPECT_NE(b.error().what.find("in use by another mount (process " + std::to_string(getpid()) + ")"),
            std::string::npos)
      << b.error().what;
  b = LockCacheDir(dir_, std::chrono::seconds(1));
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.error().what.find("did not release it within 1 s"), std::string::npos)
      << b.error().what;
  close(*a);
  b = LockCacheDir(dir_, std::chrono::seconds(0));
  EXPECT_TRUE(b.ok()) << b.error().what;
  close(*b);
}

// Notifies when the cache layer logs a message containing `want`.
class WatchSink : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit WatchSink(std::string want) : want_(std::move(want)) {}
  void WaitSeen() {
    std::unique_lock lock(seen_mu_);
    seen_cv_.wait(lock, [this] { return seen_; });
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (std::string_view(msg.payload.data(), msg.payload.size()).find(want_) == std::string::npos) {
      return;
    }
    std::lock_guard lock(seen_mu_);
    seen_ = true;
    seen_cv_.notify_all();
  }
  void flush_() override {}

 private:
  const std::string want_;
  std::mutex seen_mu_;
  std::condition_variable seen_cv_;
  bool seen_ = false;
};

TEST_F(CacheDirTest, LockWaitsForTheHolderToReleaseIt) {
  auto held = LockCacheDir(dir_, std::chrono::seconds(0));
  ASSERT_TRUE(held.ok());
  auto sink = std::make_shared<WatchSink>("waiting up to 600 s");
  auto logger = Log("cache");
  logger->sinks().push_back(sink);
  std::atomic<bool> released{false};
  auto waiter = std::async(std::launch::async, [&] {
    auto r = LockCacheDir(dir_, std::chrono::seconds(600));
    const bool after = released.load();
    if (r.ok()) close(*r);
    return std::make_pair(r.ok(), after);
  });
  sink->WaitSeen();  // it says it waits, and for how long
  released = true;
  close(*held);  // the holder ends: the waiter gets the directory
  auto [ok, after_release] = waiter.get();
  logger->sinks().pop_back();
  EXPECT_TRUE(ok);
  EXPECT_TRUE(after_release);
}

}  // namespace
}  // namespace mpnfs::cache
