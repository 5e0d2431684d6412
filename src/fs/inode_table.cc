#include "fs/inode_table.h"

#include <algorithm>

namespace mpnfs::fs {

InodeTable::InodeTable(nfs::Fh root_fh) {
  auto root = std::make_shared<Inode>(kRootIno, root_fh);
  root->nlookup_ = 1;
  by_fh_.emplace(std::move(root_fh), kRootIno);
  by_ino_.emplace(kRootIno, std::move(root));
}

std::shared_ptr<Inode> InodeTable::Find(const nfs::Fh& fh) const {
  MutexLock lock(mu_);
  auto it = by_fh_.find(fh);
  if (it == by_fh_.end()) {
    auto f = forgotten_.find(fh);
    return f == forgotten_.end() ? nullptr : f->second.lock();
  }
  auto in = by_ino_.find(it->second);
  return in == by_ino_.end() ? nullptr : in->second;
}

bool InodeTable::Known(const nfs::Fh& fh) const {
  MutexLock lock(mu_);
  return by_fh_.count(fh) != 0;
}

std::shared_ptr<Inode> InodeTable::Intern(const nfs::Fh& fh) {
  MutexLock lock(mu_);
  auto it = by_fh_.find(fh);
  if (it != by_fh_.end()) {
    auto& inode = by_ino_.at(it->second);
    ++inode->nlookup_;
    return inode;
  }
  if (auto f = forgotten_.find(fh); f != forgotten_.end()) {
    std::shared_ptr<Inode> inode = f->second.lock();
    forgotten_.erase(f);
    if (inode) {
      inode->nlookup_ = 1;
      by_fh_.emplace(fh, inode->ino());
      by_ino_.emplace(inode->ino(), inode);
      return inode;
    }
  }
  uint64_t ino = next_ino_++;
  auto inode = std::make_shared<Inode>(ino, fh);
  inode->nlookup_ = 1;
  by_fh_.emplace(fh, ino);
  by_ino_.emplace(ino, inode);
  return inode;
}

std::shared_ptr<Inode> InodeTable::Get(uint64_t ino) const {
  MutexLock lock(mu_);
  auto it = by_ino_.find(ino);
  return it == by_ino_.end() ? nullptr : it->second;
}

std::shared_ptr<Inode> InodeTable::Forget(uint64_t ino, uint64_t n) {
  MutexLock lock(mu_);
  auto it = by_ino_.find(ino);
  if (it == by_ino_.end()) return nullptr;
  std::shared_ptr<Inode> inode = it->second;
  inode->nlookup_ = n >= inode->nlookup_ ? 0 : inode->nlookup_ - n;
  if (inode->nlookup_ != 0 || ino == kRootIno) return nullptr;
  by_fh_.erase(inode->fh());
  by_ino_.erase(it);
  if (forgotten_.size() >= sweep_at_) {
    std::erase_if(forgotten_, [](const auto& e) { return e.second.expired(); });
    sweep_at_ = std::max<size_t>(64, 2 * forgotten_.size());
  }
  forgotten_[inode->fh()] = inode;
  return inode;
}

size_t InodeTable::ForgottenEntries() const {
  MutexLock lock(mu_);
  return forgotten_.size();
}

size_t InodeTable::size() const {
  MutexLock lock(mu_);
  return by_ino_.size();
}

uint64_t InodeTable::LookupCount(uint64_t ino) const {
  MutexLock lock(mu_);
  auto it = by_ino_.find(ino);
  return it == by_ino_.end() ? 0 : it->second->nlookup_;
}

}  // namespace mpnfs::fs
