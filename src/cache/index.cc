#include "cache/index.h"

#include <algorithm>
#include <cstring>
#include <random>

#include "common/log.h"

namespace mpnfs::cache {
namespace {

constexpr uint32_t kHeaderMagic = 0x494e504d;  // "MPNI"
constexpr uint32_t kPageMagic = 0x474e504d;    // "MPNG"
// magic, version, count, seq | name, synced (format 4 only)
constexpr size_t kPageHead3 = 16;
constexpr size_t kPageHead = 32;
constexpr size_t kCrcAt = kPage - 4;
constexpr uint32_t kFormat3 = 3;

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

uint32_t PerPage(const Geometry& g, size_t head = kPageHead) {
  const uint32_t fit = static_cast<uint32_t>((kCrcAt - head) / RecordBytes(g.pages()));
  return g.per_page == 0 ? fit : std::min(fit, g.per_page);
}

uint64_t Groups(const Geometry& g, size_t head = kPageHead) {
  const uint32_t per = PerPage(g, head);
  return (uint64_t{g.slots} + per - 1) / per;
}

std::string HeaderPage(const Geometry& g, uint64_t name) {
  std::string page(kPage, '\0');
  Put<uint32_t>(page.data(), 0, kHeaderMagic);
  Put<uint32_t>(page.data(), 4, kFormatVersion);
  Put<uint32_t>(page.data(), 8, g.block);
  Put<uint32_t>(page.data(), 12, g.slots);
  Put<uint32_t>(page.data(), 16, RecordBytes(g.pages()));
  Put<uint32_t>(page.data(), 20, g.per_page);
  Put<uint64_t>(page.data(), 24, name);
  Put<uint32_t>(page.data(), kCrcAt, Crc(page.data(), kCrcAt));
  return page;
}

bool SaneGeometry(const Geometry& g) {
  return g.block >= 64 * 1024 && g.block <= kMaxPages * kPage && (g.block & (g.block - 1)) == 0 &&
         g.slots > 0 && g.per_page < kPage;
}

Error Failed(const std::string& what) {
  const int e = errno ? errno : EIO;
  return Error::Errno(e, what + ": " + std::strerror(e));
}

// The header of dir/index, checked: its geometry, format and name.
struct Header {
  Geometry g;
  uint32_t version = 0;
  uint64_t name = 0;
};
Result<std::optional<Header>> ReadHeader(Disk& disk, const std::string& dir) {
  const std::string path = dir + "/" + Index::kName;
  if (!disk.Exists(path)) return std::optional<Header>();
  auto f = disk.Open(path, 0);
  if (!f) return f.error();
  const uint64_t size = (*f)->Size();
  if (size == 0) return std::optional<Header>();
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
  Header h;
  h.version = Get<uint32_t>(page.data(), 4);
  if (h.version != kFormatVersion && h.version != kFormat3) {
    return bad("has format " + std::to_string(h.version) + ", this mpnfs reads " +
               std::to_string(kFormatVersion) + " (and converts " + std::to_string(kFormat3) + ")");
  }
  h.g = Geometry{Get<uint32_t>(page.data(), 8), Get<uint32_t>(page.data(), 12), Get<uint32_t>(page.data(), 20)};
  const uint64_t want = h.version == kFormat3 ? (1 + 2 * Groups(h.g, kPageHead3)) * kPage : kPage;
  if (!SaneGeometry(h.g) || Get<uint32_t>(page.data(), 16) != RecordBytes(h.g.pages()) || size != want) {
    return bad("has an impossible geometry or size");
  }
  if (h.version == kFormatVersion) h.name = Get<uint64_t>(page.data(), 24);
  return std::optional<Header>(h);
}

// Writes dir/index as a new header (via index.tmp, atomically and durably).
Status WriteHeader(Disk& disk, const std::string& dir, const Geometry& g, uint64_t name) {
  const std::string tmp = dir + "/" + Index::kName + ".tmp", path = dir + "/" + Index::kName;
  disk.Remove(tmp);
  auto f = disk.Open(tmp, Disk::kCreate);
  if (!f) return f.error();
  const std::string header = HeaderPage(g, name);
  auto fail = [&](const char* what) {
    const int e = errno ? errno : EIO;
    disk.Remove(tmp);
    return Error::Errno(e, std::string(what) + " " + tmp + ": " + std::strerror(e));
  };
  if (!(*f)->Truncate(0) || !(*f)->WriteAt(header.data(), header.size(), 0)) return fail("writing");
  if (!(*f)->Sync()) return fail("syncing");
  f->reset();
  if (!disk.Rename(tmp, path)) return fail("renaming");
  if (!disk.SyncDir(dir)) return fail("syncing the directory of");
  return Ok{};
}

uint64_t NewName() {
  std::random_device rd;
  uint64_t n = 0;
  while (n == 0) n = (uint64_t{rd()} << 32) | rd();
  return n;
}

}  // namespace

uint64_t Index::RegionBytes(const Geometry& g) { return (2 * Groups(g) + 1) * kPage; }

Result<std::optional<Geometry>> Index::Probe(Disk& disk, const std::string& dir) {
  auto h = ReadHeader(disk, dir);
  if (!h) return h.error();
  if (!*h) return std::optional<Geometry>();
  if ((*h)->version != kFormatVersion) {
    return Error::Errno(EINVAL, dir + "/" + kName + " has format " + std::to_string((*h)->version) +
                                    " and was not converted");
  }
  return std::optional<Geometry>((*h)->g);
}

Status Index::Create(Disk& disk, const std::string& dir, const Geometry& g) {
  return WriteHeader(disk, dir, g, NewName());
}

Status Index::Upgrade(Disk& disk, const std::string& dir) {
  auto h = ReadHeader(disk, dir);
  if (!h) return h.error();
  if (!*h || (*h)->version != kFormat3) return Ok{};
  const Geometry g = (*h)->g;
  const std::string path = dir + "/" + kName;
  auto old = disk.Open(path, 0);
  if (!old) return old.error();
  auto data = disk.Open(dir + "/data", 0);
  if (!data) return data.error();
  const uint64_t size = DataFileBytes(g);
  if ((*data)->Size() < RegionOffset(g)) {
    return Error::Errno(EIO, dir + "/data is shorter than its format-3 index says");
  }
  if (!(*data)->Truncate(size) || !(*data)->Allocate(size)) return Failed("growing " + dir + "/data");
  Index fresh(nullptr, data->get(), g, NewName(), disk, dir);
  // The old layout: groups of PerPage(g, 16) records, copy c of group i
  // at page 1 + i + c * groups. Each group's newest sound copy is kept;
  // a group damaged in both copies refuses the conversion (as a load would).
  const uint32_t per3 = PerPage(g, kPageHead3);
  const uint64_t groups3 = Groups(g, kPageHead3);
  const uint32_t rb = RecordBytes(g.pages());
  std::vector<Record> all(g.slots);
  uint64_t max_seq = 0;
  std::string page[2];
  for (uint64_t i = 0; i < groups3; ++i) {
    int best = -1;
    uint64_t best_seq = 0;
    bool written = false;
    for (int c = 0; c < 2; ++c) {
      page[c].assign(kPage, '\0');
      if (!(*old)->ReadAt(page[c].data(), kPage, (1 + i + c * groups3) * kPage)) {
        return Failed("reading " + path);
      }
      const char* p = page[c].data();
      written = written || std::any_of(p, p + kPage, [](char ch) { return ch != 0; });
      if (Get<uint32_t>(p, 0) != kPageMagic || Get<uint16_t>(p, 4) != kFormat3 ||
          Get<uint16_t>(p, 6) != per3 || Get<uint32_t>(p, kCrcAt) != Crc(p, kCrcAt)) {
        continue;
      }
      const uint64_t seq = Get<uint64_t>(p, 8);
      if (best < 0 || seq > best_seq) {
        best = c;
        best_seq = seq;
      }
    }
    if (best < 0 && written) {
      return Error::Errno(EIO, path + " (format 3): page " + std::to_string(i) + " is damaged in both copies");
    }
    if (best < 0) continue;
    max_seq = std::max(max_seq, best_seq);
    for (uint32_t k = 0; k < per3; ++k) {
      const uint64_t slot = i * per3 + k;
      if (slot >= g.slots) break;
      auto r = DecodeRecord(std::string_view(page[best].data() + kPageHead3 + size_t{k} * rb, rb), g.pages());
      if (r) all[slot] = std::move(*r);
    }
  }
  // Format 3 synced the data before any record declared it: every record
  // is trusted, so the pages are written as synced.
  fresh.seq_ = max_seq + 1;
  for (uint32_t grp = 0; grp < fresh.groups(); ++grp) {
    const uint32_t per = fresh.per_page_;
    const bool any = std::any_of(all.begin() + grp * per, all.begin() + std::min<uint64_t>(uint64_t{grp + 1} * per, g.slots),
                                 [](const Record& r) { return !r.fh.empty(); });
    if (!any) continue;
    std::vector<Record> recs(all.begin() + grp * per, all.begin() + std::min<uint64_t>(uint64_t{grp + 1} * per, g.slots));
    fresh.synced_ = fresh.seq_;
    if (!fresh.WriteGroup(grp, recs)) return Failed("writing the converted index into " + dir + "/data");
  }
  if (!(*data)->Sync()) return Failed("syncing " + dir + "/data");
  return WriteHeader(disk, dir, g, fresh.name_);
}

Result<std::unique_ptr<Index>> Index::Open(Disk& disk, const std::string& dir, const Geometry& g, File* data) {
  auto h = ReadHeader(disk, dir);
  if (!h) return h.error();
  if (!*h || (*h)->version != kFormatVersion || !((*h)->g == g)) {
    return Error::Errno(EINVAL, dir + "/" + kName + ": not an index of the expected format and geometry");
  }
  if (data->Size() < DataFileBytes(g)) {
    return Error::Errno(EIO, dir + "/data is missing or shorter than its index says (it holds the "
                             "index's records); to discard the cache, remove " + dir + "/" + kName);
  }
  auto f = disk.Open(dir + "/" + kName, 0);
  if (!f) return f.error();
  return std::unique_ptr<Index>(new Index(std::move(*f), data, g, (*h)->name, disk, dir));
}

Index::Index(std::unique_ptr<File> header, File* data, const Geometry& g, uint64_t name, Disk& disk,
             std::string dir)
    : header_(std::move(header)),
      data_(data),
      disk_(disk),
      dir_(std::move(dir)),
      g_(g),
      name_(name),
      record_bytes_(RecordBytes(g.pages())),
      per_page_(PerPage(g)),
      page_(kPage) {
  durable_copy_.assign(groups(), 1);  // until loaded: write copy 0 first
  pending_.assign(groups(), 0);
}

uint64_t Index::MarkOffset() const { return RegionOffset(g_) + 2 * uint64_t{groups()} * kPage; }

uint64_t Index::CopyOffset(uint32_t group, int copy) const {
  // The copies of a group are far apart (one in each half of the region): a
  // device that damages neighbouring pages on power loss hits one only.
  return RegionOffset(g_) + (uint64_t{group} + static_cast<uint64_t>(copy) * groups()) * kPage;
}

Result<PageBits> Index::Mismatches(uint32_t slot, const Record& r) {
  const uint32_t pages = g_.pages();
  PageBits bad{};
  for (uint32_t p = 0; p < pages; ++p) {
    if (!TestBit(r.dirty, p)) continue;
    if (!data_->ReadAt(page_.data(), kPage, uint64_t{slot} * g_.block + uint64_t{p} * kPage)) {
      return Failed("reading the cache data file");
    }
    if (p >= r.crc.size() || Crc(page_.data(), kPage) != r.crc[p]) SetBit(bad, p);
  }
  return bad;
}

bool Index::Whole(const char* page) const {
  return Get<uint32_t>(page, 0) == kPageMagic && Get<uint32_t>(page, kCrcAt) == Crc(page, kCrcAt);
}

bool Index::Ours(const char* page) const {
  return Get<uint16_t>(page, 4) == kFormatVersion && Get<uint16_t>(page, 6) == per_page_ &&
         Get<uint64_t>(page, 16) == name_;
}

bool Index::Sound(const char* page) const { return Whole(page) && Ours(page); }

Result<Index::Choice> Index::Choose(uint32_t group, const char* const copy[2], uint64_t* seen,
                                    bool final, std::vector<Record>* recs) {
  int best = -1;
  uint64_t best_seq = 0;
  bool written = false, ok[2] = {false, false};
  for (int c = 0; c < 2; ++c) {
    const char* page = copy[c];
    const bool whole = Whole(page);  // the CRC once per page: the load's main cost
    // A page of an earlier index (another name) was never written by this one.
    const bool foreign = whole && Get<uint64_t>(page, 16) != name_;
    written = written || (!foreign && std::any_of(page, page + kPage, [](char ch) { return ch != 0; }));
    if (!whole || !Ours(page)) continue;
    ok[c] = true;
    const uint64_t seq = Get<uint64_t>(page, 8);
    *seen = std::max(*seen, Get<uint64_t>(page, 24));
    seq_ = std::max(seq_, seq + 1);
    if (best < 0 || seq > best_seq) {
      best = c;
      best_seq = seq;
    }
  }
  if (best < 0 && written) {
    // Both copies damaged (the placement rules never leave that): the
    // records of these slots are unknown, and may be unflushed writes.
    return Error::Errno(EIO, "cache index page " + std::to_string(group) + " is damaged in both copies");
  }
  if (best < 0) return Choice::kEmpty;  // never written
  auto decode = [&](int c, uint32_t k) {
    auto r = DecodeRecord(std::string_view(copy[c] + kPageHead + size_t{k} * record_bytes_, record_bytes_),
                          g_.pages());
    return r ? std::move(*r) : Record{};
  };
  recs->clear();
  for (uint32_t k = 0; k < per_page_ && group * per_page_ + k < g_.slots; ++k) recs->push_back(decode(best, k));
  const bool check = best_seq > *seen &&
                     std::any_of(recs->begin(), recs->end(), [](const Record& r) { return AnyBit(r.dirty); });
  if (check && !final) return Choice::kLater;
  durable_copy_[group] = static_cast<uint8_t>(best);
  if (!check) return Choice::kTrusted;
  // Written after the last sync this index knows of: the data its records
  // declare may not have reached the disk with it.
  const int other = 1 - best;
  bool fell_back = false;
  for (uint32_t k = 0; k < recs->size(); ++k) {
    Record& r = (*recs)[k];
    if (!AnyBit(r.dirty)) continue;
    auto bad = Mismatches(group * per_page_ + k, r);
    if (!bad) return bad.error();
    if (!AnyBit(*bad)) continue;
    // A page the older copy already declared dirty with the same CRC was
    // synced then (and such a page is not rewritten in place): its
    // mismatch is damage, not a crash before the sync. The record stays,
    // and the damage is found and reported when the page is read.
    Record older = ok[other] ? decode(other, k) : Record{};
    const bool same_block = older.fh == r.fh && older.block == r.block;
    bool unsynced = false;
    for (uint32_t p = 0; p < g_.pages() && !unsynced; ++p) {
      if (!TestBit(*bad, p)) continue;
      unsynced = !same_block || !TestBit(older.dirty, p) || p >= older.crc.size() || older.crc[p] != r.crc[p];
    }
    if (!unsynced) continue;
    // The slot as the last sync left it.
    Log("cache")->warn("cache index: slot {} (block {} of a file) has a record written after the "
                       "last sync known, and pages that do not match it: taken as writes a crash "
                       "kept from the disk before an fsync made them durable, and the slot's "
                       "previous record is used (if the host did not crash, the cache disk damaged "
                       "them, and they are lost)",
                       group * per_page_ + k, r.block);
    r = std::move(older);
    fell_back = true;
    ++fallbacks_;
  }
  if (!fell_back) return Choice::kTrusted;
  // To be written again, before anything trusts it: over the copy that
  // failed, which the other one (the group as the last sync left it)
  // stands in for; over the other one if that one is not sound (then it
  // holds nothing, and the failed copy is the only whole page).
  durable_copy_[group] = static_cast<uint8_t>(ok[other] ? other : best);
  return Choice::kRewrite;
}

Status Index::Load(const std::function<void(uint32_t, Record&&)>& fn) {
  // What is read here may still be only in the page cache (the last mount
  // was killed, the host was not): make it durable before anything is
  // written over the other copies. (The data too: what a record found
  // sound here declares must stay so.)
  if (!data_->Sync()) return Failed("syncing the cache data file");
  fallbacks_ = 0;
  // The newest `synced` on the disk: the mark's, then each page's. One
  // pass: a group is taken at once if it needs no check, or is at or
  // below the `synced` seen so far; the others (written since the last
  // mark, with dirty records) are read again once every page was seen.
  uint64_t synced = 0;
  if (!data_->ReadAt(page_.data(), kPage, MarkOffset())) return Failed("reading the cache index");
  if (Sound(page_.data())) synced = Get<uint64_t>(page_.data(), 24);
  std::vector<uint32_t> later;
  std::vector<std::pair<uint32_t, std::vector<Record>>> rewrite;
  std::vector<Record> recs;
  auto deliver = [&](uint32_t group, Choice choice) {
    if (choice == Choice::kRewrite) rewrite.emplace_back(group, recs);
    for (uint32_t k = 0; k < recs.size(); ++k) {
      if (!recs[k].fh.empty()) fn(group * per_page_ + k, std::move(recs[k]));
    }
  };
  const uint32_t chunk = 256;  // groups per read
  AlignedBuf buf[2];
  for (uint32_t first = 0; first < groups(); first += chunk) {
    const uint32_t n = std::min(chunk, groups() - first);
    for (int c = 0; c < 2; ++c) {
      buf[c].resize(size_t{n} * kPage);
      if (!data_->ReadAt(buf[c].data(), buf[c].size(), CopyOffset(first, c))) {
        return Failed("reading the cache index");
      }
    }
    for (uint32_t i = 0; i < n; ++i) {
      const char* copy[2] = {buf[0].data() + size_t{i} * kPage, buf[1].data() + size_t{i} * kPage};
      auto choice = Choose(first + i, copy, &synced, /*final=*/false, &recs);
      if (!choice) return choice.error();
      if (*choice == Choice::kLater) {
        later.push_back(first + i);
      } else if (*choice != Choice::kEmpty) {
        deliver(first + i, *choice);
      }
    }
  }
  for (uint32_t group : later) {
    for (int c = 0; c < 2; ++c) {
      buf[c].resize(kPage);
      if (!data_->ReadAt(buf[c].data(), kPage, CopyOffset(group, c))) return Failed("reading the cache index");
    }
    const char* copy[2] = {buf[0].data(), buf[1].data()};
    auto choice = Choose(group, copy, &synced, /*final=*/true, &recs);
    if (!choice) return choice.error();
    if (*choice != Choice::kEmpty) deliver(group, *choice);
  }
  synced_ = synced;
  for (const auto& [group, r] : rewrite) {
    if (!WriteGroup(group, r)) return Failed("rewriting the cache index");
  }
  if (!rewrite.empty() && !Sync()) return Failed("syncing the cache data file");
  return Ok{};
}

char* Index::StartPage() {
  char* page = page_.data();
  std::memset(page, 0, kPage);
  Put<uint32_t>(page, 0, kPageMagic);
  Put<uint16_t>(page, 4, static_cast<uint16_t>(kFormatVersion));
  Put<uint16_t>(page, 6, static_cast<uint16_t>(per_page_));
  Put<uint64_t>(page, 8, seq_++);
  Put<uint64_t>(page, 16, name_);
  Put<uint64_t>(page, 24, synced_);
  return page;
}

bool Index::Mark() {
  // Group pages written since the last sync are synced first, so that the
  // mark covers every page written so far.
  if (!pending_list_.empty() && !Sync()) return false;
  if (marked_ >= synced_) return true;
  const uint64_t value = synced_;
  char* page = StartPage();
  Put<uint32_t>(page, kCrcAt, Crc(page, kCrcAt));
  if (!data_->WriteAt(page, kPage, MarkOffset()) || !data_->Sync()) return false;
  marked_ = value;
  return true;
}

bool Index::WriteGroup(uint32_t group, const std::vector<Record>& records) {
  char* page = StartPage();
  for (size_t k = 0; k < records.size() && k < per_page_; ++k) {
    const std::string r = EncodeRecord(records[k], g_.pages());
    std::memcpy(page + kPageHead + k * record_bytes_, r.data(), r.size());
  }
  Put<uint32_t>(page, kCrcAt, Crc(page, kCrcAt));
  last_group_seq_ = seq_ - 1;
  // Never over the copy the last sync left: over the older one, or over
  // this group's unsynced write.
  const int copy = 1 - durable_copy_[group];
  if (!data_->WriteAt(page, kPage, CopyOffset(group, copy))) return false;
  if (!pending_[group]) {
    pending_[group] = 1;
    pending_list_.push_back(group);
  }
  return true;
}

bool Index::Sync() {
  // Every group page written so far, and every data write before this call.
  const uint64_t upto = last_group_seq_;
  if (!data_->Sync()) return false;
  synced_ = std::max(synced_, upto);
  for (uint32_t g : pending_list_) {
    durable_copy_[g] = static_cast<uint8_t>(1 - durable_copy_[g]);
    pending_[g] = 0;
  }
  pending_list_.clear();
  return true;
}

bool Index::Discard() {
  if (header_->Truncate(0) && header_->Sync()) return true;
  return disk_.Remove(dir_ + "/" + kName) && disk_.SyncDir(dir_);
}

}  // namespace mpnfs::cache
