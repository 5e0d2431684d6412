#include "cache/index.h"

#include <algorithm>
#include <cstring>

namespace mpnfs::cache {
namespace {

constexpr uint32_t kHeaderMagic = 0x494e504d;  // "MPNI"
constexpr uint32_t kPageMagic = 0x474e504d;    // "MPNG"
constexpr size_t kPageHead = 16;               // magic, version, count, seq
constexpr size_t kCrcAt = kPage - 4;

template <class T>
void Put(char* out, size_t at, T v) {
  std::memcpy(out + at, &v, sizeof(v));
}
template <class T>
T Get(const char* in, size_t at) {
  T v;
  std::memcpy(&v, in + at, sizeof(v));
  return v;
}

uint32_t PerPage(const Geometry& g) {
  const uint32_t fit = static_cast<uint32_t>((kCrcAt - kPageHead) / RecordBytes(g.pages()));
  return g.per_page == 0 ? fit : std::min(fit, g.per_page);
}

std::string HeaderPage(const Geometry& g) {
  std::string page(kPage, '\0');
  Put<uint32_t>(page.data(), 0, kHeaderMagic);
  Put<uint32_t>(page.data(), 4, kFormatVersion);
  Put<uint32_t>(page.data(), 8, g.block);
  Put<uint32_t>(page.data(), 12, g.slots);
  Put<uint32_t>(page.data(), 16, RecordBytes(g.pages()));
  Put<uint32_t>(page.data(), 20, g.per_page);
  Put<uint32_t>(page.data(), kCrcAt, Crc(page.data(), kCrcAt));
  return page;
}

bool SaneGeometry(const Geometry& g) {
  return g.block >= 64 * 1024 && g.block <= kMaxPages * kPage && (g.block & (g.block - 1)) == 0 &&
         g.slots > 0 && g.per_page < kPage;
}

}  // namespace

uint64_t Index::FileBytes(const Geometry& g) {
  const uint32_t per = PerPage(g);
  const uint64_t groups = (uint64_t{g.slots} + per - 1) / per;
  return (1 + 2 * groups) * kPage;
}

Result<std::optional<Geometry>> Index::Probe(Disk& disk, const std::string& dir) {
  const std::string path = dir + "/" + kName;
  if (!disk.Exists(path)) return std::optional<Geometry>();
  auto f = disk.Open(path, 0);
  if (!f) return f.error();
  const uint64_t size = (*f)->Size();
  if (size == 0) return std::optional<Geometry>();
  auto bad = [&](const std::string& why) {
    return Error::Errno(EINVAL, path + " " + why + "; it may hold write-back data not yet on the "
                                "server. Mount it with the mpnfs that wrote it to flush that data; "
                                "to discard the cache instead (losing any such data), remove " +
                                path);
  };
  std::string page(kPage, '\0');
  if (size < kPage || !(*f)->ReadAt(page.data(), kPage, 0)) {
    return bad(std::string("cannot be read (") + std::strerror(errno ? errno : EIO) + ")");
  }
  if (Get<uint32_t>(page.data(), 0) != kHeaderMagic ||
      Get<uint32_t>(page.data(), kCrcAt) != Crc(page.data(), kCrcAt)) {
    return bad("is not an mpnfs cache index of a known format, or is damaged");
  }
  if (Get<uint32_t>(page.data(), 4) != kFormatVersion) {
    return bad("has format " + std::to_string(Get<uint32_t>(page.data(), 4)) + ", this mpnfs reads " +
               std::to_string(kFormatVersion));
  }
  Geometry g{Get<uint32_t>(page.data(), 8), Get<uint32_t>(page.data(), 12), Get<uint32_t>(page.data(), 20)};
  if (!SaneGeometry(g) || Get<uint32_t>(page.data(), 16) != RecordBytes(g.pages()) ||
      size != FileBytes(g)) {
    return bad("has an impossible geometry or size");
  }
  return std::optional<Geometry>(g);
}

Status Index::Create(Disk& disk, const std::string& dir, const Geometry& g) {
  const std::string tmp = dir + "/" + kName + ".tmp", path = dir + "/" + kName;
  disk.Remove(tmp);
  auto f = disk.Open(tmp, Disk::kCreate);
  if (!f) return f.error();
  const std::string header = HeaderPage(g);
  auto fail = [&](const char* what) {
    const int e = errno ? errno : EIO;
    disk.Remove(tmp);
    return Error::Errno(e, std::string(what) + " " + tmp + ": " + std::strerror(e));
  };
  if (!(*f)->Truncate(0) || !(*f)->Truncate(FileBytes(g)) || !(*f)->Allocate(FileBytes(g))) {
    return fail("sizing");
  }
  if (!(*f)->WriteAt(header.data(), header.size(), 0)) return fail("writing");
  if (!(*f)->Sync()) return fail("syncing");
  f->reset();
  if (!disk.Rename(tmp, path)) return fail("renaming");
  if (!disk.SyncDir(dir)) return fail("syncing the directory of");
  return Ok{};
}

Result<std::unique_ptr<Index>> Index::Open(Disk& disk, const std::string& dir, const Geometry& g) {
  auto f = disk.Open(dir + "/" + kName, 0);
  if (!f) return f.error();
  return std::unique_ptr<Index>(new Index(std::move(*f), g));
}

Index::Index(std::unique_ptr<File> file, const Geometry& g)
    : file_(std::move(file)), g_(g), record_bytes_(RecordBytes(g.pages())), per_page_(PerPage(g)) {
  durable_copy_.assign(groups(), 1);  // until loaded: write copy 0 first
  pending_.assign(groups(), 0);
}

uint64_t Index::CopyOffset(uint32_t group, int copy) const {
  // The copies of a group are far apart (one in each half of the file): a
  // device that damages neighbouring pages on power loss hits one only.
  return (1 + uint64_t{group} + static_cast<uint64_t>(copy) * groups()) * kPage;
}

Status Index::Load(const std::function<void(uint32_t, Record&&)>& fn) {
  // What is read here may still be only in the page cache (the last mount
  // was killed, the host was not): make it durable before anything is
  // written over the other copies.
  if (!file_->Sync()) {
    return Error::Errno(errno ? errno : EIO, std::string("syncing the cache index: ") +
                                                 std::strerror(errno ? errno : EIO));
  }
  const uint32_t chunk = 256;  // groups per read
  std::string buf[2];
  for (uint32_t first = 0; first < groups(); first += chunk) {
    const uint32_t n = std::min(chunk, groups() - first);
    for (int c = 0; c < 2; ++c) {
      buf[c].resize(size_t{n} * kPage);
      if (!file_->ReadAt(buf[c].data(), buf[c].size(), CopyOffset(first, c))) {
        return Error::Errno(errno ? errno : EIO, std::string("reading the cache index: ") +
                                                     std::strerror(errno ? errno : EIO));
      }
    }
    for (uint32_t i = 0; i < n; ++i) {
      const uint32_t group = first + i;
      int best = -1;
      uint64_t best_seq = 0;
      bool written = false;
      for (int c = 0; c < 2; ++c) {
        const char* page = buf[c].data() + size_t{i} * kPage;
        written = written || std::any_of(page, page + kPage, [](char ch) { return ch != 0; });
        if (Get<uint32_t>(page, 0) != kPageMagic || Get<uint16_t>(page, 4) != kFormatVersion ||
            Get<uint16_t>(page, 6) != per_page_ || Get<uint32_t>(page, kCrcAt) != Crc(page, kCrcAt)) {
          continue;
        }
        const uint64_t seq = Get<uint64_t>(page, 8);
        seq_ = std::max(seq_, seq + 1);
        if (best < 0 || seq > best_seq) {
          best = c;
          best_seq = seq;
        }
      }
      if (best < 0 && written) {
        // Both copies damaged (the placement rules never leave that): the
        // records of these slots are unknown, and may be unflushed writes.
        return Error::Errno(EIO, "cache index page " + std::to_string(group) +
                                     " is damaged in both copies");
      }
      if (best < 0) continue;  // never written
      durable_copy_[group] = static_cast<uint8_t>(best);
      const char* page = buf[best].data() + size_t{i} * kPage;
      for (uint32_t k = 0; k < per_page_; ++k) {
        const uint32_t slot = group * per_page_ + k;
        if (slot >= g_.slots) break;
        auto r = DecodeRecord(std::string_view(page + kPageHead + size_t{k} * record_bytes_, record_bytes_),
                              g_.pages());
        if (r && !r->fh.empty()) fn(slot, std::move(*r));
      }
    }
  }
  return Ok{};
}

bool Index::WriteGroup(uint32_t group, const std::vector<Record>& records) {
  std::string page(kPage, '\0');
  Put<uint32_t>(page.data(), 0, kPageMagic);
  Put<uint16_t>(page.data(), 4, kFormatVersion);
  Put<uint16_t>(page.data(), 6, static_cast<uint16_t>(per_page_));
  Put<uint64_t>(page.data(), 8, seq_++);
  for (size_t k = 0; k < records.size() && k < per_page_; ++k) {
    const std::string r = EncodeRecord(records[k], g_.pages());
    std::memcpy(page.data() + kPageHead + k * record_bytes_, r.data(), r.size());
  }
  Put<uint32_t>(page.data(), kCrcAt, Crc(page.data(), kCrcAt));
  // Never over the copy the last sync left: over the older one, or over
  // this group's unsynced write.
  const int copy = 1 - durable_copy_[group];
  if (!file_->WriteAt(page.data(), page.size(), CopyOffset(group, copy))) return false;
  if (!pending_[group]) {
    pending_[group] = 1;
    pending_list_.push_back(group);
  }
  return true;
}

bool Index::Sync() {
  if (!file_->Sync()) return false;
  for (uint32_t g : pending_list_) {
    durable_copy_[g] = static_cast<uint8_t>(1 - durable_copy_[g]);
    pending_[g] = 0;
  }
  pending_list_.clear();
  return true;
}

bool Index::Discard() { return file_->Truncate(0) && file_->Sync(); }

}  // namespace mpnfs::cache
