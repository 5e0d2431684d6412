#include "cache/disk.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>

namespace mpnfs::cache {
namespace {

class PosixFile : public File {
 public:
  explicit PosixFile(int fd) : fd_(fd) {}
  ~PosixFile() override { close(fd_); }

  bool ReadAt(char* p, size_t n, uint64_t off) override {
    while (n > 0) {
      ssize_t r = pread(fd_, p, n, static_cast<off_t>(off));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        if (r == 0) errno = EIO;  // the file is shorter than its user thinks
        return false;
      }
      p += r;
      n -= static_cast<size_t>(r);
      off += static_cast<uint64_t>(r);
    }
    return true;
  }
  bool WriteAt(const char* p, size_t n, uint64_t off) override {
    while (n > 0) {
      ssize_t w = pwrite(fd_, p, n, static_cast<off_t>(off));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        if (w == 0) errno = EIO;
        return false;
      }
      p += w;
      n -= static_cast<size_t>(w);
      off += static_cast<uint64_t>(w);
    }
    return true;
  }
  bool Sync() override { return fdatasync(fd_) == 0; }
  bool Truncate(uint64_t size) override { return ftruncate(fd_, static_cast<off_t>(size)) == 0; }
  bool Allocate(uint64_t size) override {
    const int rc = posix_fallocate(fd_, 0, static_cast<off_t>(size));
    if (rc == 0 || rc == EOPNOTSUPP || rc == EINVAL) return true;
    errno = rc;
    return false;
  }
  uint64_t Size() override {
    struct stat st{};
    return fstat(fd_, &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  }

 private:
  const int fd_;
};

class PosixDisk : public Disk {
 public:
  Result<std::unique_ptr<File>> Open(const std::string& path, int flags) override {
    int oflags = O_RDWR | O_CLOEXEC | O_NOFOLLOW | ((flags & kCreate) ? O_CREAT : 0);
    int fd = open(path.c_str(), oflags | ((flags & kDirect) ? O_DIRECT : 0), 0600);
    if (fd < 0 && (flags & kDirect) && errno == EINVAL) fd = open(path.c_str(), oflags, 0600);
    if (fd < 0) return Error::Errno(errno, path + ": " + std::strerror(errno));
    struct stat st{};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      close(fd);
      return Error::Errno(EINVAL, path + ": not a regular file");
    }
    return std::unique_ptr<File>(new PosixFile(fd));
  }
  bool Exists(const std::string& path) override {
    struct stat st{};
    return lstat(path.c_str(), &st) == 0;
  }
  bool Rename(const std::string& from, const std::string& to) override {
    return rename(from.c_str(), to.c_str()) == 0;
  }
  bool Remove(const std::string& path) override { return unlink(path.c_str()) == 0 || errno == ENOENT; }
  bool SyncDir(const std::string& dir) override {
    int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) return false;
    const bool ok = fsync(fd) == 0;
    close(fd);
    return ok;
  }
  uint64_t Allocated(const std::string& path) override {
    struct stat st{};
    return lstat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_blocks) * 512 : 0;
  }
};

}  // namespace

Disk& RealDisk() {
  static PosixDisk disk;
  return disk;
}

Result<std::string> ReadWholeFile(Disk& disk, const std::string& path) {
  if (!disk.Exists(path)) return Error::Errno(ENOENT, path + ": no such file");
  auto f = disk.Open(path, 0);
  if (!f) return f.error();
  std::string out((*f)->Size(), '\0');
  if (!out.empty() && !(*f)->ReadAt(out.data(), out.size(), 0)) {
    return Error::Errno(errno, path + ": " + std::strerror(errno));
  }
  return out;
}

Status ReplaceFile(Disk& disk, const std::string& dir, const std::string& name,
                   const std::string& content) {
  const std::string tmp = dir + "/" + name + ".tmp", path = dir + "/" + name;
  auto fail = [&](const std::string& what) {
    const int e = errno ? errno : EIO;
    disk.Remove(tmp);
    return Error::Errno(e, what + " " + path + ": " + std::strerror(e));
  };
  disk.Remove(tmp);
  auto f = disk.Open(tmp, Disk::kCreate);
  if (!f) return f.error();
  if (!(*f)->Truncate(0) || !(*f)->WriteAt(content.data(), content.size(), 0)) return fail("writing");
  if (!(*f)->Sync()) return fail("syncing");
  f->reset();
  if (!disk.Rename(tmp, path)) return fail("renaming over");
  if (!disk.SyncDir(dir)) return fail("syncing the directory of");
  return Ok{};
}

}  // namespace mpnfs::cache
