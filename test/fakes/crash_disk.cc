#include "test/fakes/crash_disk.h"

#include <algorithm>
#include <cerrno>
#include <optional>
#include <cstdio>
#include <set>

namespace mpnfs::test {

class CrashFile : public cache::File {
 public:
  CrashFile(CrashDisk* disk, int inode) : disk_(disk), inode_(inode) {}

  bool ReadAt(char* p, size_t n, uint64_t off) override {
    MutexLock lock(disk_->mu_);
    const std::string& f = disk_->files_[inode_];
    if (off + n > f.size()) {
      errno = EIO;
      return false;
    }
    std::copy_n(f.data() + off, n, p);
    return true;
  }
  bool WriteAt(const char* p, size_t n, uint64_t off) override {
    CrashDisk::Op op{CrashDisk::Op::kWrite};
    op.inode = inode_;
    op.off = off;
    op.data.assign(p, n);
    return disk_->Apply(std::move(op));
  }
  bool Sync() override {
    CrashDisk::Op op{CrashDisk::Op::kSync};
    op.inode = inode_;
    return disk_->Apply(std::move(op));
  }
  bool Truncate(uint64_t size) override {
    CrashDisk::Op op{CrashDisk::Op::kTruncate};
    op.inode = inode_;
    op.size = size;
    return disk_->Apply(std::move(op));
  }
  bool Allocate(uint64_t size) override {
    if (Size() >= size) return true;
    return Truncate(size);
  }
  uint64_t Size() override {
    MutexLock lock(disk_->mu_);
    return disk_->files_[inode_].size();
  }

 private:
  CrashDisk* const disk_;
  const int inode_;
};

namespace {

constexpr uint64_t kPage = 4096;

void ApplyData(std::string& f, uint64_t off, const std::string& data) {
  if (f.size() < off + data.size()) f.resize(off + data.size(), '\0');
  std::copy(data.begin(), data.end(), f.begin() + static_cast<ptrdiff_t>(off));
}

void ApplyToDir(std::map<std::string, int>& names, const CrashDisk::Op& op) {
  switch (op.kind) {
    case CrashDisk::Op::kCreate: names[op.path] = op.inode; break;
    case CrashDisk::Op::kRename:
      if (auto it = names.find(op.path); it != names.end()) {
        const int ino = it->second;
        names.erase(it);
        names[op.to] = ino;
      }
      break;
    case CrashDisk::Op::kRemove: names.erase(op.path); break;
    default: break;
  }
}

}  // namespace

size_t CrashDisk::Mark() const {
  MutexLock lock(mu_);
  return log_.size();
}

void CrashDisk::set_fail(std::function<bool(const Op&)> f) {
  MutexLock lock(mu_);
  fail_ = std::move(f);
}

bool CrashDisk::Apply(Op op) {
  std::function<bool(const Op&)> fail;
  {
    MutexLock lock(mu_);
    fail = fail_;
  }
  // (Unlocked: a hook may wait for another thread that uses this disk.)
  if (fail && fail(op)) {
    errno = EIO;
    return false;
  }
  MutexLock lock(mu_);
  switch (op.kind) {
    case Op::kWrite: ApplyData(files_[op.inode], op.off, op.data); break;
    case Op::kTruncate: files_[op.inode].resize(op.size, '\0'); break;
    case Op::kCreate:
    case Op::kRename:
    case Op::kRemove: ApplyToDir(names_, op); break;
    default: break;
  }
  log_.push_back(std::move(op));
  return true;
}

Result<std::unique_ptr<cache::File>> CrashDisk::Open(const std::string& path, int flags) {
  int inode;
  {
    MutexLock lock(mu_);
    auto it = names_.find(path);
    if (it != names_.end()) {
      inode = it->second;
    } else if (!(flags & kCreate)) {
      return Error::Errno(ENOENT, path + ": no such file");
    } else {
      inode = static_cast<int>(files_.size());
      files_.emplace_back();
      inode = -1 - inode;  // (created below, through the log)
    }
  }
  if (inode < 0) {
    Op op{Op::kCreate};
    op.path = path;
    op.inode = -1 - inode;
    if (!Apply(op)) return Error::Errno(EIO, path + ": injected failure");
    inode = op.inode;
  }
  return std::unique_ptr<cache::File>(new CrashFile(this, inode));
}

bool CrashDisk::Exists(const std::string& path) {
  MutexLock lock(mu_);
  return names_.count(path) != 0;
}

bool CrashDisk::Rename(const std::string& from, const std::string& to) {
  {
    MutexLock lock(mu_);
    if (!names_.count(from)) {
      errno = ENOENT;
      return false;
    }
  }
  Op op{Op::kRename};
  op.path = from;
  op.to = to;
  return Apply(std::move(op));
}

bool CrashDisk::Remove(const std::string& path) {
  {
    MutexLock lock(mu_);
    if (!names_.count(path)) return true;
  }
  Op op{Op::kRemove};
  op.path = path;
  return Apply(std::move(op));
}

bool CrashDisk::SyncDir(const std::string& /*dir*/) { return Apply(Op{Op::kSyncDir}); }

uint64_t CrashDisk::Allocated(const std::string& path) {
  MutexLock lock(mu_);
  auto it = names_.find(path);
  return it == names_.end() ? 0 : files_[it->second].size();
}

std::optional<std::string> CrashDisk::Content(const std::string& path) const {
  MutexLock lock(mu_);
  auto it = names_.find(path);
  if (it == names_.end()) return std::nullopt;
  return files_[it->second];
}

std::unique_ptr<CrashDisk> CrashDisk::CrashState(size_t point, const Chooser& choose) const {
  MutexLock lock(mu_);
  std::map<std::string, int> names = base_names_;
  std::vector<std::string> files = base_files_;
  files.resize(files_.size());
  std::vector<Op> pending_dir;
  std::map<int, std::vector<const Op*>> pending;  // by inode
  for (size_t i = 0; i < point && i < log_.size(); ++i) {
    const Op& op = log_[i];
    switch (op.kind) {
      case Op::kCreate:
      case Op::kRename:
      case Op::kRemove: pending_dir.push_back(op); break;
      case Op::kSyncDir:
        for (const Op& d : pending_dir) ApplyToDir(names, d);
        pending_dir.clear();
        break;
      case Op::kWrite:
      case Op::kTruncate: pending[op.inode].push_back(&op); break;
      case Op::kSync:
        for (const Op* w : pending[op.inode]) {
          if (w->kind == Op::kWrite) {
            ApplyData(files[op.inode], w->off, w->data);
          } else {
            files[op.inode].resize(w->size, '\0');
          }
        }
        pending.erase(op.inode);
        break;
    }
  }
  // Directory operations: a prefix.
  const size_t dir_n = choose(pending_dir.size() + 1);
  for (size_t i = 0; i < dir_n; ++i) ApplyToDir(names, pending_dir[i]);
  for (auto& [inode, ops] : pending) {
    std::string& f = files[inode];
    // Size changes: a prefix (asked only where there are any).
    bool resizes = false;
    for (const Op* o : ops) {
      resizes = resizes || o->kind == Op::kTruncate || o->off + o->data.size() > f.size();
    }
    const size_t m = resizes ? choose(ops.size() + 1) : ops.size();
    for (size_t i = 0; i < m; ++i) {
      if (ops[i]->kind == Op::kTruncate) {
        f.resize(ops[i]->size, '\0');
      } else if (f.size() < ops[i]->off + ops[i]->data.size()) {
        f.resize(ops[i]->off + ops[i]->data.size(), '\0');
      }
    }
    // Page contents: for each page, a prefix of the writes touching it.
    std::map<uint64_t, std::vector<const Op*>> by_page;
    for (const Op* w : ops) {
      if (w->kind != Op::kWrite || w->data.empty()) continue;
      for (uint64_t p = w->off / kPage; p * kPage < w->off + w->data.size(); ++p) by_page[p].push_back(w);
    }
    for (auto& [page, ws] : by_page) {
      const size_t j = choose(ws.size() + 1);
      for (size_t i = 0; i < j; ++i) {
        const Op* w = ws[i];
        const uint64_t lo = std::max(w->off, page * kPage);
        const uint64_t hi = std::min(w->off + w->data.size(), (page + 1) * kPage);
        if (lo >= f.size()) continue;  // the size did not reach it
        const uint64_t end = std::min<uint64_t>(hi, f.size());
        std::copy(w->data.begin() + static_cast<ptrdiff_t>(lo - w->off),
                  w->data.begin() + static_cast<ptrdiff_t>(end - w->off),
                  f.begin() + static_cast<ptrdiff_t>(lo));
      }
    }
  }
  auto out = std::make_unique<CrashDisk>();
  MutexLock out_lock(out->mu_);  // (nobody else has it yet)
  // Keep only named files; inode numbers are renumbered.
  for (const auto& [name, inode] : names) {
    out->base_names_[name] = static_cast<int>(out->base_files_.size());
    out->base_files_.push_back(files[inode]);
  }
  out->names_ = out->base_names_;
  out->files_ = out->base_files_;
  return out;
}

void CrashDisk::DumpLog(size_t n) const {
  MutexLock lock(mu_);
  static const char* kinds[] = {"create", "write", "truncate", "sync", "rename", "remove", "syncdir"};
  std::map<int, std::string> inode_names;
  for (size_t i = 0; i < n && i < log_.size(); ++i) {
    const Op& op = log_[i];
    if (op.kind == Op::kCreate) inode_names[op.inode] = op.path.substr(op.path.rfind('/') + 1);
    std::printf("  %3zu %-8s %s %s off %llu len %zu size %llu\n", i, kinds[op.kind],
                op.inode >= 0 ? inode_names[op.inode].c_str() : op.path.c_str(), op.to.c_str(),
                static_cast<unsigned long long>(op.off), op.data.size(),
                static_cast<unsigned long long>(op.size));
  }
}

std::vector<size_t> CrashDisk::Questions(size_t point) const {
  std::vector<size_t> q;
  CrashState(point, [&q](size_t n) {
    q.push_back(n);
    return size_t{0};
  });
  return q;
}

}  // namespace mpnfs::test
