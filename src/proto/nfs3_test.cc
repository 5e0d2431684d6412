// The protocol codecs (proto/): every message encodes and decodes back to
// itself, every truncation of a valid message is rejected, lengths past
// their bounds or past the end are rejected, and a long directory list
// decodes without recursion.
#include "proto/nfs3.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <set>
#include <vector>

#include "proto/codec_test_util.h"
#include "proto/mount3.h"
#include "proto/rpc.h"
#include "test/fuzz/fuzz.h"

namespace mpnfs::proto {
namespace {

using namespace nfs3;

nfs::Attr SomeAttr(uint32_t seed) {
  nfs::Attr a;
  a.type = static_cast<nfs::Ftype>(1 + seed % 7);
  a.mode = 0640 + seed % 8;
  a.nlink = 1 + seed;
  a.uid = 1000 + seed;
  a.gid = 2000 + seed;
  a.size = (uint64_t{1} << 40) + seed;
  a.used = 4096 * seed;
  a.rdev_major = seed;
  a.rdev_minor = seed + 1;
  a.fsid = 0x1122334455667788ull ^ seed;
  a.fileid = 0x8877665544332211ull ^ seed;
  a.atime = {1700000000 + seed, 5};
  a.mtime = {1700000001 + seed, 999999999};
  a.ctime = {1700000002 + seed, 0};
  return a;
}

nfs::Wcc SomeWcc(uint32_t seed) {
  nfs::Wcc w;
  w.before = nfs::Wcc::Before{seed * 3ull, {seed, 1}, {seed, 2}};
  w.after = SomeAttr(seed);
  return w;
}

nfs::SetAttr SomeSetAttr(bool all) {
  nfs::SetAttr s;
  if (all) {
    s.mode = 04755;
    s.uid = 7;
    s.gid = 8;
    s.size = uint64_t{1} << 33;
    s.atime_how = nfs::SetAttr::TimeHow::kServer;
    s.mtime_how = nfs::SetAttr::TimeHow::kClient;
    s.mtime = {123, 456};
  }
  return s;
}

const nfs::Fh kFh = std::string("\x01\x02\x00\x7f a handle of 27 bytes\xff\xfe", 27);

TEST(Nfs3Codec, MessagesMatchBytesLaidOutFromTheRfc) {
  // LOOKUP3args: diropargs3 {nfs_fh3 dir; filename3 name}.
  EXPECT_EQ(Encode(DirOpArgs{"ab", "x"}), Words().Str("ab").Str("x").b);
  // WRITE3args up to the data's length: file, offset, count, stable, len.
  {
    std::vector<char> buf(256);
    XdrOut out(buf);
    const std::string data = "xyz";
    ASSERT_TRUE(EncodeWriteHead(out, WriteArgs{"ab", 0x100000002ull, 3, Stable::kFileSync, data}));
    EXPECT_EQ(std::vector<char>(out.bytes().begin(), out.bytes().end()),
              Words().Str("ab").H(0x100000002ull).W(3).W(2).W(3).b);
  }
  // READDIRPLUS3res: status, post_op_attr dir (none), cookieverf, then
  // entryplus3 {fileid, name, cookie, post_op_attr, post_op_fh3} chained by
  // value_follows, then eof.
  Words plus;
  plus.W(0).W(0).W(0x01020304).W(0x05060708).W(1).H(0x11).Str("n").H(5).W(0).W(1).Str("hh").W(0).W(1);
  XdrIn in(plus.b);
  ReaddirRes r;
  r.plus = true;
  ASSERT_TRUE(Xdr(in, r));
  EXPECT_EQ(in.left(), 0u);
  ASSERT_EQ(r.page.entries.size(), 1u);
  EXPECT_EQ(r.page.entries[0].fileid, 0x11u);
  EXPECT_EQ(r.page.entries[0].name, "n");
  EXPECT_EQ(r.page.entries[0].cookie, 5u);
  EXPECT_FALSE(r.page.entries[0].attr);
  EXPECT_EQ(r.page.entries[0].fh, std::optional<nfs::Fh>("hh"));
  EXPECT_TRUE(r.page.eof);
  const char verf[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  EXPECT_EQ(std::memcmp(&r.page.verf, verf, 8), 0);
  // GETATTR3res: status, fattr3 {type, mode, nlink, uid, gid, size, used,
  // rdev {specdata1, specdata2}, fsid, fileid, atime, mtime, ctime}.
  Words ga;
  ga.W(0).W(2).W(0755).W(3).W(1000).W(100).H(4096).H(8192).W(0).W(0).H(7).H(99).W(1).W(2).W(3).W(4).W(5).W(6);
  XdrIn gin(ga.b);
  GetattrRes g;
  ASSERT_TRUE(Xdr(gin, g));
  EXPECT_EQ(g.attr.type, nfs::Ftype::kDir);
  EXPECT_EQ(g.attr.mode, 0755u);
  EXPECT_EQ(g.attr.nlink, 3u);
  EXPECT_EQ(g.attr.uid, 1000u);
  EXPECT_EQ(g.attr.size, 4096u);
  EXPECT_EQ(g.attr.used, 8192u);
  EXPECT_EQ(g.attr.fsid, 7u);
  EXPECT_EQ(g.attr.fileid, 99u);
  EXPECT_EQ(g.attr.mtime, (nfs::Time{3, 4}));
  EXPECT_EQ(g.attr.ctime, (nfs::Time{5, 6}));
  // A directory entry named with a NUL or a '/' is malformed.
  for (const std::string& bad : {std::string("a\0b", 3), std::string("a/b"), std::string()}) {
    Words w;
    w.W(0).W(0).W(0).W(0).W(1).H(1).Str(bad).H(2).W(0).W(1);
    XdrIn bin(w.b);
    ReaddirRes br;
    EXPECT_FALSE(Xdr(bin, br)) << "a name the kernel cannot be given";
  }
}

TEST(Nfs3Codec, EveryArgumentRoundTrips) {
  ExpectRoundTrip(FhArgs{kFh});
  ExpectRoundTrip(SetattrArgs{kFh, SomeSetAttr(true), nfs::Time{5, 6}});
  ExpectRoundTrip(SetattrArgs{kFh, SomeSetAttr(false), std::nullopt});
  ExpectRoundTrip(DirOpArgs{kFh, "a name"});
  ExpectRoundTrip(AccessArgs{kFh, 0x3f});
  ExpectRoundTrip(ReadArgs{kFh, uint64_t{1} << 50, 1 << 20});
  const std::string data(4097, 'd');
  ExpectRoundTrip(WriteArgs{kFh, 12345, 4097, Stable::kFileSync, data});
  ExpectRoundTrip(CommitArgs{kFh, 0, 0});
  ExpectRoundTrip(CreateArgs{kFh, "new", nfs::CreateMode::kGuarded, SomeSetAttr(true), 0});
  ExpectRoundTrip(CreateArgs{kFh, "new", nfs::CreateMode::kExclusive, {}, 0x0102030405060708ull});
  ExpectRoundTrip(MkdirArgs{kFh, "dir", SomeSetAttr(true)});
  ExpectRoundTrip(SymlinkArgs{kFh, "link", SomeSetAttr(false), "../some/target"});
  ExpectRoundTrip(MknodArgs{kFh, "dev", nfs::Ftype::kChr, SomeSetAttr(true), 4, 64});
  ExpectRoundTrip(MknodArgs{kFh, "fifo", nfs::Ftype::kFifo, SomeSetAttr(false), 0, 0});
  ExpectRoundTrip(RenameArgs{kFh, "from", std::string(kFh) + "x", "to"});
  ExpectRoundTrip(LinkArgs{kFh, "dirfh", "name"});
  ExpectRoundTrip(ReaddirArgs{false, kFh, 17, 0x99, 0, 8192});
  ReaddirArgs plus{true, kFh, 17, 0x99, 4096, 32768};
  ReaddirArgs blank;
  blank.plus = true;
  ExpectRoundTrip(plus, blank);
}

TEST(Nfs3Codec, EveryResultRoundTripsOkAndFailed) {
  ExpectRoundTrip(GetattrRes{kOk, SomeAttr(1)});
  ExpectRoundTrip(GetattrRes{2, {}});
  ExpectRoundTrip(WccRes{kOk, SomeWcc(2)});
  ExpectRoundTrip(WccRes{13, nfs::Wcc{}});
  ExpectRoundTrip(LookupRes{kOk, nfs::LookupReply{kFh, SomeAttr(3), std::nullopt}});
  ExpectRoundTrip(LookupRes{2, nfs::LookupReply{"", std::nullopt, SomeAttr(4)}});
  ExpectRoundTrip(AccessRes{kOk, nfs::AccessReply{0x1f, SomeAttr(5)}});
  ExpectRoundTrip(AccessRes{70, nfs::AccessReply{0, std::nullopt}});
  ExpectRoundTrip(ReadlinkRes{kOk, SomeAttr(6), "target/of/link"});
  ExpectRoundTrip(ReadlinkRes{22, std::nullopt, ""});
  const std::string data(5000, 'r');
  ExpectRoundTrip(ReadRes{kOk, SomeAttr(7), 5000, true, data});
  ExpectRoundTrip(ReadRes{5, SomeAttr(7), 0, false, ""});
  ExpectRoundTrip(WriteRes{kOk, SomeWcc(8), 4096, Stable::kFileSync, 0xabcdef0123456789ull});
  ExpectRoundTrip(WriteRes{28, SomeWcc(8), 0, Stable::kUnstable, 0});
  ExpectRoundTrip(CommitRes{kOk, SomeWcc(9), 42});
  nfs::NewObject n;
  n.fh = kFh;
  n.attr = SomeAttr(10);
  n.dir = SomeWcc(11);
  ExpectRoundTrip(NewObjectRes{kOk, n});
  nfs::NewObject failed;
  failed.dir = SomeWcc(12);
  ExpectRoundTrip(NewObjectRes{17, failed});
  ExpectRoundTrip(RenameRes{kOk, nfs::RenameReply{SomeWcc(13), SomeWcc(14)}});
  ExpectRoundTrip(LinkRes{31, nfs::LinkReply{SomeAttr(15), SomeWcc(16)}});
  for (bool plus : {false, true}) {
    ReaddirRes r;
    r.plus = plus;
    r.page.dir = SomeAttr(17);
    r.page.verf = 0x55;
    r.page.eof = true;
    for (uint32_t i = 0; i < 5; ++i) {
      nfs::DirEntry e;
      e.fileid = 100 + i;
      e.name = "entry" + std::to_string(i);
      e.cookie = 1000 + i;
      if (plus && i % 2 == 0) {
        e.attr = SomeAttr(i);
        e.fh = kFh + std::to_string(i);
      }
      r.page.entries.push_back(e);
    }
    ReaddirRes blank;
    blank.plus = plus;
    ExpectRoundTrip(r, blank);
    ReaddirRes f;
    f.plus = plus;
    f.status = 2;
    f.page.dir = SomeAttr(18);
    ExpectRoundTrip(f, blank);
  }
  ExpectRoundTrip(FsstatRes{kOk, SomeAttr(19), nfs::FsStat{1, 2, 3, 4, 5, 6}, 7});
  ExpectRoundTrip(FsinfoRes{kOk, std::nullopt, nfs::FsInfo{1 << 20, 1 << 20, 1 << 20, 1 << 20, 65536,
                                                          UINT64_MAX, {0, 1}}, 4096, 4096, 0x1b});
  ExpectRoundTrip(PathconfRes{kOk, SomeAttr(20), nfs::PathConf{32000, 255}, true, true, false, true});
  ExpectRoundTrip(PathconfRes{10004, SomeAttr(20), {}, true, true, false, true});
}

TEST(RpcCodec, HeadersRoundTrip) {
  CallHeader c;
  c.xid = 0xdeadbeef;
  c.prog = kProgram;
  c.vers = kVersion;
  c.proc = 7;
  c.cred = AuthSys{12, "client-host", 1000, 100, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}};
  ExpectRoundTrip(c);
  CallHeader none;
  none.auth_sys = false;
  ExpectRoundTrip(none);
  ExpectRoundTrip(ReplyHeader{1, true, AcceptStat::kSuccess});
  ExpectRoundTrip(ReplyHeader{2, true, AcceptStat::kProgMismatch, RejectStat::kRpcMismatch, 2, 3});
  ExpectRoundTrip(ReplyHeader{3, false, AcceptStat::kSuccess, RejectStat::kAuthError, 0, 0, 5});
  ExpectRoundTrip(ReplyHeader{4, false, AcceptStat::kSuccess, RejectStat::kRpcMismatch, 2, 2});
  EXPECT_EQ(Describe(ReplyHeader{5, false, AcceptStat::kSuccess, RejectStat::kAuthError, 0, 0, 5}),
            "denied: authentication too weak (AUTH_TOOWEAK)");
  // Seventeen groups is more than AUTH_SYS carries.
  c.cred.groups.push_back(17);
  std::vector<char> buf(1024);
  XdrOut out(buf);
  EXPECT_FALSE(Xdr(out, c));
}

TEST(MountCodec, MountAndPortmapMessagesRoundTrip) {
  ExpectRoundTrip(mount3::MntArgs{"/tmp/export"});
  ExpectRoundTrip(mount3::MntRes{mount3::kOk, kFh, {1, 390003}});
  ExpectRoundTrip(mount3::MntRes{13, "", {}});
  ExpectRoundTrip(portmap::GetportArgs{mount3::kProgram, mount3::kVersion, portmap::kTcp, 0});
  ExpectRoundTrip(portmap::GetportRes{20048});
  EXPECT_EQ(mount3::ErrnoOf(2), ENOENT);
  EXPECT_NE(mount3::Explain(13).find("not exported"), std::string::npos);
  // A handle over FHSIZE3, seventeen flavors: malformed.
  std::vector<char> buf(4096);
  XdrOut out(buf);
  mount3::MntRes big{mount3::kOk, std::string(65, 'h'), {}};
  EXPECT_FALSE(Xdr(out, big));
  XdrOut out2(buf);
  mount3::MntRes many{mount3::kOk, kFh, std::vector<uint32_t>(17, 1)};
  EXPECT_FALSE(Xdr(out2, many));
}

// Each 32-bit word of a valid message set to a length-like value it must
// not be taken for: never a read past the end or an allocation that size.
TEST(Nfs3Codec, LengthsPastTheirBoundsOrTheEndAreRejected) {
  ReaddirRes r;
  r.plus = true;
  r.page.dir = SomeAttr(1);
  for (uint32_t i = 0; i < 3; ++i) {
    nfs::DirEntry e;
    e.fileid = i;
    e.name = "n" + std::to_string(i);
    e.cookie = i;
    e.attr = SomeAttr(i);
    e.fh = kFh;
    r.page.entries.push_back(e);
  }
  const std::string data(300, 'x');
  std::vector<std::vector<char>> messages = {Encode(r), Encode(ReadRes{kOk, SomeAttr(2), 300, false, data}),
                                             Encode(ReadlinkRes{kOk, std::nullopt, "abc"}),
                                             Encode(LookupRes{kOk, nfs::LookupReply{kFh, {}, {}}})};
  for (size_t m = 0; m < messages.size(); ++m) {
    const auto& bytes = messages[m];
    for (size_t w = 0; w + 4 <= bytes.size(); w += 4) {
      for (uint32_t v : {0x80000000u, 0xffffffffu, static_cast<uint32_t>(bytes.size() - w - 3)}) {
        std::vector<char> bad = bytes;
        bad[w] = static_cast<char>(v >> 24);
        bad[w + 1] = static_cast<char>(v >> 16);
        bad[w + 2] = static_cast<char>(v >> 8);
        bad[w + 3] = static_cast<char>(v);
        XdrIn in(bad);
        // Decoding may succeed (the word was a size or an id), but only
        // within the message.
        if (m == 0) {
          ReaddirRes got;
          got.plus = true;
          if (Xdr(in, got)) {
            EXPECT_LE(in.pos(), bad.size());
          }
        } else if (m == 1) {
          ReadRes got;
          if (Xdr(in, got)) {
            EXPECT_LE(got.data.size(), bad.size());
          }
        } else if (m == 2) {
          ReadlinkRes got;
          if (Xdr(in, got)) {
            EXPECT_LE(got.path.size(), kPathMax);
          }
        } else {
          LookupRes got;
          if (Xdr(in, got)) {
            EXPECT_LE(got.ok.fh.size(), kFhMax);
          }
        }
      }
    }
  }
  // The READ reply's data length word (just before its 300 bytes) set to
  // any of them is rejected; so is a directory entry's name length.
  for (uint32_t v : {0x80000000u, 0xffffffffu, 301u}) {
    std::vector<char> bad = messages[1];
    const size_t at = bad.size() - 300 - 4;
    for (int k = 0; k < 4; ++k) bad[at + k] = static_cast<char>(v >> (24 - 8 * k));
    XdrIn in(bad);
    ReadRes got;
    EXPECT_FALSE(Xdr(in, got)) << "a data length of " << v << " decodes";
  }
  // A handle one byte over NFS3_FHSIZE, a name over the bound.
  std::vector<char> buf(4096);
  XdrOut out(buf);
  FhArgs big{std::string(kFhMax + 1, 'h')};
  EXPECT_FALSE(Xdr(out, big));
  XdrOut out2(buf);
  DirOpArgs longname{kFh, std::string(kNameMax + 1, 'n')};
  EXPECT_FALSE(Xdr(out2, longname));
}

TEST(Nfs3Codec, TwoHundredThousandEntriesDecodeWithoutRecursion) {
  ReaddirRes r;
  r.page.eof = true;
  r.page.entries.resize(200000);
  for (size_t i = 0; i < r.page.entries.size(); ++i) {
    r.page.entries[i].fileid = i;
    r.page.entries[i].name = "f" + std::to_string(i);
    r.page.entries[i].cookie = i + 1;
  }
  std::vector<char> buf(16 << 20);
  XdrOut out(buf);
  ASSERT_TRUE(Xdr(out, r));
  XdrIn in(out.bytes());
  ReaddirRes got;
  ASSERT_TRUE(Xdr(in, got));
  EXPECT_EQ(got.page.entries.size(), 200000u);
  EXPECT_TRUE(got == r);
}

// RFC 1813's status numbers are BSD's errno values; Linux's differ for
// several of them.
// Replies NFS-Ganesha sent in the test bed (contrib/fuzz/record-corpus.py:
// one of each procedure, status and length seen under ordinary use):
// each decodes whole, and encodes back to exactly the bytes the server
// sent, so the codecs read every field where the server wrote it.
std::vector<std::vector<char>> Captured(const std::string& target) {
  std::vector<std::vector<char>> out;
  const std::filesystem::path dir = std::filesystem::path(MPNFS_SOURCE_ROOT) / "test/fuzz/captured" / target;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    std::ifstream f(e.path(), std::ios::binary);
    out.emplace_back(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  return out;
}

TEST(Nfs3Codec, CapturedGaneshaRepliesDecodeToWhatTheServerSent) {
  std::set<int> selectors;
  for (const auto& bytes : Captured("fuzz_nfs3_results")) {
    ASSERT_FALSE(bytes.empty());
    selectors.insert(static_cast<uint8_t>(bytes[0]) % 16);
    const std::span<const char> body(bytes.data() + 1, bytes.size() - 1);
    fuzz::WithNfs3Result(static_cast<uint8_t>(bytes[0]), [&](const auto& blank) {
      XdrIn in(body);
      auto got = blank;
      ASSERT_TRUE(Xdr(in, got)) << "selector " << int(bytes[0]) << ", " << body.size() << " bytes";
      EXPECT_EQ(in.left(), 0u) << "selector " << int(bytes[0]);
      std::vector<char> buf(body.size() + 64);
      XdrOut out(buf);
      ASSERT_TRUE(Xdr(out, got));
      EXPECT_TRUE(std::equal(body.begin(), body.end(), out.bytes().begin(), out.bytes().end()))
          << "selector " << int(bytes[0]) << " encodes back to other bytes";
    });
  }
  // GETATTR, SETATTR/REMOVE, LOOKUP, ACCESS, READLINK, READ, WRITE, COMMIT,
  // CREATE/MKDIR/SYMLINK, RENAME, LINK, FSSTAT, FSINFO, PATHCONF, READDIRPLUS.
  for (int s : {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 15}) {
    EXPECT_TRUE(selectors.count(s)) << "no captured reply with selector " << s;
  }
  for (const auto& bytes : Captured("fuzz_rpc_reply")) {
    XdrIn in(bytes);
    ReplyHeader h;
    ASSERT_TRUE(Xdr(in, h));
    EXPECT_TRUE(h.accepted && h.accept == AcceptStat::kSuccess) << Describe(h);
  }
  for (const auto& bytes : Captured("fuzz_mount")) {
    XdrIn in(std::span<const char>(bytes).subspan(1));
    mount3::MntRes r;
    ASSERT_TRUE(Xdr(in, r));
    EXPECT_EQ(r.status, mount3::kOk);
    EXPECT_EQ(in.left(), 0u);
  }
}

TEST(Nfs3Codec, StatusesMapToLinuxErrnos) {
  const std::vector<std::pair<uint32_t, int>> want = {
      {0, 0}, {1, EPERM}, {2, ENOENT}, {5, EIO}, {6, ENXIO}, {13, EACCES}, {17, EEXIST}, {18, EXDEV},
      {19, ENODEV}, {20, ENOTDIR}, {21, EISDIR}, {22, EINVAL}, {27, EFBIG}, {28, ENOSPC}, {30, EROFS},
      {31, EMLINK}, {63, ENAMETOOLONG}, {66, ENOTEMPTY}, {69, EDQUOT}, {70, ESTALE}, {71, EREMOTE},
      {10001, EIO}, {10003, EIO}, {10004, EOPNOTSUPP}, {10006, EIO}, {10007, EINVAL}, {10008, EAGAIN},
      {12345, EIO}};
  for (const auto& [status, err] : want) EXPECT_EQ(ErrnoOf(status), err) << StatusName(status);
  EXPECT_EQ(StatusName(66), "NFS3ERR_NOTEMPTY");
  EXPECT_EQ(StatusName(12345), "NFS3 status 12345");
}

TEST(XdrStream, AnyNonZeroBooleanIsTrueAndAFailedStreamStaysFailed) {
  const char words[8] = {0, 0, 0, 2, 0, 0, 0, 0};
  XdrIn in(words);
  bool b = false;
  EXPECT_TRUE(in.Bool(b));
  EXPECT_TRUE(b);
  EXPECT_TRUE(in.Bool(b));
  EXPECT_FALSE(b);
  EXPECT_FALSE(in.Bool(b)) << "read past the end";
  EXPECT_FALSE(in.ok());
  const char more[4] = {0, 0, 0, 1};
  XdrIn in2(more);
  std::string_view v;
  EXPECT_FALSE(in2.View(v, 0)) << "a length over its bound";
  uint32_t u = 0;
  EXPECT_FALSE(in2.U32(u)) << "a failed stream goes on reading";
}

// Whatever random bytes decode to encodes back to bytes that decode to the
// same (the fuzz targets in test/fuzz/ run this at length, under ASan; here
// a fixed seed, briefly).
template <class T>
int DecodesStably(const std::vector<char>& bytes, T blank) {
  XdrIn in(bytes);
  T got = blank;
  if (!Xdr(in, got)) return 0;
  const std::vector<char> again = Encode(got);
  XdrIn in2(again);
  T got2 = blank;
  EXPECT_TRUE(Xdr(in2, got2));
  EXPECT_TRUE(got2 == got);
  return 1;
}

TEST(Nfs3Codec, RandomBytesThatDecodeEncodeBackToTheSame) {
  std::mt19937 rng(20261205);
  int decoded = 0;
  for (int round = 0; round < 20000; ++round) {
    std::vector<char> bytes(4 * (rng() % 40));
    for (char& c : bytes) c = static_cast<char>(rng() % 4 == 0 ? rng() : rng() % 2);
    ReaddirRes d;
    d.plus = round % 2;
    decoded += DecodesStably(bytes, d);
    decoded += DecodesStably(bytes, ReadRes{});
    decoded += DecodesStably(bytes, WccRes{});
    decoded += DecodesStably(bytes, ReplyHeader{});
  }
  EXPECT_GT(decoded, 100) << "too few inputs decode: the test shows little";
}

}  // namespace
}  // namespace mpnfs::proto
