#include "cache/cache_dir.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "common/log.h"

namespace mpnfs::cache {
namespace {

constexpr mode_t kOthersWrite = S_IWGRP | S_IWOTH;

Error Sys(int err, const std::string& what) {
  return Error::Errno(err, what + ": " + std::strerror(err));
}

std::string Octal(mode_t m) {
  char buf[16];
  snprintf(buf, sizeof(buf), "%04o", static_cast<unsigned>(m & 07777));
  return buf;
}

Error Untrusted(const std::string& dir, const std::string& why) {
  return Error::Errno(EPERM, "cache_dir " + dir + ": " + why +
                                 "; refusing it (other users could plant links in it or forge "
                                 "cached data: see cache_dir in mpnfs(8))");
}

// A cache file found in the directory (lstat or fstat result) that is not
// one we can use; the reason, or "" if it is fine.
std::string BadFile(const struct stat& st) {
  if (S_ISLNK(st.st_mode)) return "is a symbolic link";
  if (!S_ISREG(st.st_mode)) return "is not a regular file";
  if (st.st_uid != geteuid()) return "is owned by uid " + std::to_string(st.st_uid);
  if (st.st_nlink != 1) return "has " + std::to_string(st.st_nlink) + " hard links";
  return "";
}

// The pid a holder wrote into the lock file, or 0.
long HolderPid(int fd) {
  char buf[32] = {};
  const ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
  return n > 0 ? std::strtol(buf, nullptr, 10) : 0;
}

std::string Holder(long pid) {
  return pid > 0 ? "process " + std::to_string(pid) : std::string("another process");
}

}  // namespace

Result<std::string> CheckCacheDir(const std::string& dir) {
  char real[PATH_MAX];
  if (realpath(dir.c_str(), real) == nullptr) return Sys(errno, "cache_dir " + dir + ": not a directory");
  struct stat st {};
  if (stat(real, &st) != 0) return Sys(errno, "cache_dir " + dir);
  if (!S_ISDIR(st.st_mode)) return Error::Errno(ENOTDIR, "cache_dir " + dir + ": not a directory");
  const uid_t me = geteuid();
  if (st.st_uid != me) {
    return Untrusted(dir, "owned by uid " + std::to_string(st.st_uid) + ", not by uid " +
                              std::to_string(me) + " that mpnfs runs as");
  }
  if (st.st_mode & kOthersWrite) {
    return Untrusted(dir, "writable by other users (mode " + Octal(st.st_mode) + "; chmod go-w it)");
  }
  // The directories above: whoever may rename entries there may swap the
  // cache directory for another.
  std::string up = real;
  while (up != "/") {
    up = up.substr(0, std::max<size_t>(up.rfind('/'), 1));
    struct stat ust {};
    if (stat(up.c_str(), &ust) != 0) return Sys(errno, "cache_dir " + dir + ": " + up);
    if (ust.st_uid != 0 && ust.st_uid != me) {
      return Untrusted(dir, "the directory " + up + " above it is owned by uid " +
                                std::to_string(ust.st_uid));
    }
    if ((ust.st_mode & kOthersWrite) && !(ust.st_mode & S_ISVTX)) {
      return Untrusted(dir, "the directory " + up + " above it is writable by other users (mode " +
                                Octal(ust.st_mode) + ")");
    }
  }
  for (const char* name : kCacheFiles) {
    struct stat fst {};
    const std::string path = std::string(real) + "/" + name;
    if (lstat(path.c_str(), &fst) != 0) {
      if (errno == ENOENT) continue;
      return Sys(errno, "cache_dir " + dir + ": " + name);
    }
    if (auto why = BadFile(fst); !why.empty()) {
      return Untrusted(dir, std::string(name) + " in it " + why);
    }
  }
  return std::string(real);
}

Result<int> OpenCacheFile(const std::string& dir, const std::string& name, int flags, mode_t mode) {
  const std::string path = dir + "/" + name;
  // O_NONBLOCK: a FIFO planted there must not block the open; taken off below.
  const int fd = open(path.c_str(), flags | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, mode);
  if (fd < 0) {
    if (errno == ELOOP) {
      return Error::Errno(ELOOP, "cache_dir " + dir + ": " + name +
                                     " is a symbolic link; refusing to follow it");
    }
    return Sys(errno, "cache file " + path);
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return Sys(err, "cache file " + path);
  }
  if (auto why = BadFile(st); !why.empty()) {
    close(fd);
    return Untrusted(dir, name + " in it " + why);
  }
  if (!(flags & O_NONBLOCK)) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

Result<int> LockCacheDir(const std::string& dir, std::chrono::seconds wait) {
  auto opened = OpenCacheFile(dir, "lock", O_RDWR | O_CREAT);
  if (!opened) return opened.error();
  const int fd = *opened;
  // While the lock is held elsewhere: woken when the holder closes its fd
  // (which releases its lock), at the latest every second (a lock released
  // without a close). The watch is made only then: closing an inotify
  // instance waits for an RCU grace period, milliseconds on every open.
  int events = -1;
  bool watched = false;
  const auto deadline = std::chrono::steady_clock::now() + wait;
  bool told = false;
  Result<int> out = fd;
  while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK) {
      out = Sys(errno, "locking cache_dir " + dir);
      break;
    }
    const auto left = deadline - std::chrono::steady_clock::now();
    if (left <= std::chrono::seconds(0)) {
      out = Error::Errno(EBUSY, "cache_dir " + dir + " is in use by another mount (" +
                                    Holder(HolderPid(fd)) + ")" +
                                    (told ? ", which did not release it within " +
                                                std::to_string(wait.count()) + " s"
                                          : std::string()));
      break;
    }
    if (!watched) {
      // (then tried again at once: a close before the watch made no event)
      watched = true;
      events = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
      if (events >= 0) inotify_add_watch(events, (dir + "/lock").c_str(), IN_CLOSE);
      continue;
    }
    if (!told) {
      Log("cache")->warn("cache_dir {} is in use by another mount ({}; an earlier mount still "
                         "flushing?): waiting up to {} s for it to release the directory",
                         dir, Holder(HolderPid(fd)), wait.count());
      told = true;
    }
    pollfd p{events, POLLIN, 0};
    const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
    poll(&p, events >= 0 ? 1 : 0, static_cast<int>(std::min<long long>(ms, 1000)));
    char buf[4096];
    while (events >= 0 && read(events, buf, sizeof(buf)) > 0) {
    }
  }
  if (events >= 0) close(events);
  if (!out) {
    close(fd);
    return out;
  }
  if (told) Log("cache")->info("cache_dir {} is free now", dir);
  // Who holds it, for the message of a mount that finds it taken.
  const std::string pid = std::to_string(getpid()) + "\n";
  if (ftruncate(fd, 0) != 0 || pwrite(fd, pid.data(), pid.size(), 0) < 0) {
    Log("cache")->debug("cache_dir {}: cannot note the pid in the lock file", dir);
  }
  return fd;
}

}  // namespace mpnfs::cache
