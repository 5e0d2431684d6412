#include "cache/format.h"

#include <zlib.h>

#include <cstring>

namespace mpnfs::cache {
namespace {

constexpr uint32_t kMagic = 0x4d504e43;  // "MPNC"
// magic, version, fh_len | seq | block | fh[64] | valid[32] | dirty[32] |
// size, mtime, ctime | fsize | uid, gid | ngroups, groups[16]
constexpr size_t kHeader =
    4 + 2 + 2 + 8 + 8 + kMaxFh + 2 * sizeof(PageBits) + 8 + 8 + 8 + 8 + 8 + 4 + 4 * kMaxGroups;

template <class T>
void Put(std::string& out, size_t at, T v) {
  std::memcpy(out.data() + at, &v, sizeof(v));
}
template <class T>
T Get(std::string_view in, size_t at) {
  T v;
  std::memcpy(&v, in.data() + at, sizeof(v));
  return v;
}

}  // namespace

uint32_t Crc(const char* data, size_t len) {
  return static_cast<uint32_t>(
      crc32(0L, reinterpret_cast<const Bytef*>(data), static_cast<uInt>(len)));
}

uint32_t RecordBytes(uint32_t pages) {
  const size_t raw = kHeader + 4 * size_t{pages} + 4;  // + the record's own CRC
  return static_cast<uint32_t>((raw + 7) / 8 * 8);
}

std::string EncodeRecord(const Record& r, uint32_t pages) {
  std::string out(RecordBytes(pages), '\0');
  size_t at = 0;
  Put<uint32_t>(out, at, kMagic);
  Put<uint16_t>(out, at + 4, kRecordVersion);
  Put<uint16_t>(out, at + 6, static_cast<uint16_t>(std::min(r.fh.size(), kMaxFh)));
  at += 8;
  Put<uint64_t>(out, at, r.seq);
  Put<uint64_t>(out, at + 8, r.block);
  at += 16;
  std::memcpy(out.data() + at, r.fh.data(), std::min(r.fh.size(), kMaxFh));
  at += kMaxFh;
  std::memcpy(out.data() + at, r.valid.data(), sizeof(PageBits));
  at += sizeof(PageBits);
  std::memcpy(out.data() + at, r.dirty.data(), sizeof(PageBits));
  at += sizeof(PageBits);
  Put<uint64_t>(out, at, r.version.size);
  Put<int64_t>(out, at + 8, r.version.mtime_ns);
  Put<int64_t>(out, at + 16, r.version.ctime_ns);
  at += 24;
  Put<uint64_t>(out, at, r.fsize);
  Put<uint32_t>(out, at + 8, r.uid);
  Put<uint32_t>(out, at + 12, r.gid);
  at += 16;
  const size_t ng = std::min(r.groups.size(), kMaxGroups);
  Put<uint32_t>(out, at, static_cast<uint32_t>(ng));
  for (size_t i = 0; i < ng; ++i) Put<uint32_t>(out, at + 4 + 4 * i, r.groups[i]);
  at += 4 + 4 * kMaxGroups;
  for (uint32_t i = 0; i < pages; ++i) {
    Put<uint32_t>(out, at + 4 * i, i < r.crc.size() ? r.crc[i] : 0);
  }
  const size_t crc_at = out.size() - 4;
  Put<uint32_t>(out, crc_at, Crc(out.data(), crc_at));
  return out;
}

std::optional<Record> DecodeRecord(std::string_view in, uint32_t pages) {
  if (in.size() != RecordBytes(pages)) return std::nullopt;
  const size_t crc_at = in.size() - 4;
  if (Get<uint32_t>(in, 0) != kMagic || Get<uint16_t>(in, 4) != kRecordVersion ||
      Get<uint32_t>(in, crc_at) != Crc(in.data(), crc_at)) {
    return std::nullopt;
  }
  Record r;
  const size_t fh_len = Get<uint16_t>(in, 6);
  if (fh_len > kMaxFh) return std::nullopt;
  size_t at = 8;
  r.seq = Get<uint64_t>(in, at);
  r.block = Get<uint64_t>(in, at + 8);
  at += 16;
  r.fh.assign(in.data() + at, fh_len);
  at += kMaxFh;
  std::memcpy(r.valid.data(), in.data() + at, sizeof(PageBits));
  at += sizeof(PageBits);
  std::memcpy(r.dirty.data(), in.data() + at, sizeof(PageBits));
  at += sizeof(PageBits);
  r.version.size = Get<uint64_t>(in, at);
  r.version.mtime_ns = Get<int64_t>(in, at + 8);
  r.version.ctime_ns = Get<int64_t>(in, at + 16);
  at += 24;
  r.fsize = Get<uint64_t>(in, at);
  r.uid = Get<uint32_t>(in, at + 8);
  r.gid = Get<uint32_t>(in, at + 12);
  at += 16;
  const uint32_t ng = Get<uint32_t>(in, at);
  if (ng > kMaxGroups) return std::nullopt;
  for (uint32_t i = 0; i < ng; ++i) r.groups.push_back(Get<uint32_t>(in, at + 4 + 4 * i));
  at += 4 + 4 * kMaxGroups;
  for (size_t w = 0; w < r.dirty.size(); ++w) r.dirty[w] &= r.valid[w];
  r.crc.resize(pages);
  for (uint32_t i = 0; i < pages; ++i) r.crc[i] = Get<uint32_t>(in, at + 4 * i);
  return r;
}

}  // namespace mpnfs::cache
