// The lock protocols' codecs (proto/nlm4.h, proto/nsm.h): every message
// round-trips with every truncation rejected, the field order matches the
// specifications word by word, bounds hold, and statuses map as the Linux
// client maps them.
#include "proto/nlm4.h"

#include <gtest/gtest.h>

#include <cerrno>

#include "proto/codec_test_util.h"
#include "proto/nsm.h"

namespace mpnfs::proto {
namespace {

const std::string kFh("\x01\x02\x00\x7f a handle\xff", 14);

nlm4::Lock SomeLock() {
  return nlm4::Lock{"host-a", kFh, std::string("owner\0id", 8), -7, 0xfffffffffffffff0ull, 0};
}

TEST(Nlm4Codec, EveryMessageRoundTrips) {
  using namespace nlm4;
  ExpectRoundTrip(SomeLock());
  ExpectRoundTrip(TestArgs{"ck", true, SomeLock()});
  ExpectRoundTrip(LockArgs{"cookie1", true, false, SomeLock(), true, 3});
  ExpectRoundTrip(CancelArgs{"", true, true, SomeLock()});
  ExpectRoundTrip(UnlockArgs{"c", SomeLock()});
  for (uint32_t s = 0; s <= 10; ++s) ExpectRoundTrip(Res{"c", static_cast<Stat>(s)});
  ExpectRoundTrip(TestRes{"c", Stat::kGranted, {}});
  ExpectRoundTrip(TestRes{"c", Stat::kDenied, Holder{true, 42, "oh", 10, 20}});
  ExpectRoundTrip(TestRes{"c", Stat::kDeniedGracePeriod, {}});
  ExpectRoundTrip(Notify{"host-a", 5});
}

TEST(NsmCodec, EveryMessageRoundTrips) {
  using namespace nsm;
  const MyId me{"gw", 100021, 4, 16};
  ExpectRoundTrip(SmName{"server"});
  ExpectRoundTrip(me);
  ExpectRoundTrip(MonId{"server", me});
  Mon mon{MonId{"server", me}, {}};
  mon.priv[0] = 1;
  mon.priv[15] = static_cast<char>(0xff);
  ExpectRoundTrip(mon);
  ExpectRoundTrip(StatChge{"gw", 7});
  ExpectRoundTrip(StatRes{kStatFail, 0});
  ExpectRoundTrip(State{9});
}

TEST(Nlm4Codec, MessagesMatchBytesLaidOutFromTheSpecification) {
  using namespace nlm4;
  // nlm4_lockargs: cookie, block, exclusive, nlm4_lock {caller_name, fh,
  // oh, svid, l_offset (uint64), l_len (uint64)}, reclaim, state.
  EXPECT_EQ(Encode(LockArgs{"ck", true, false, Lock{"h", "fh", "o", 12, 0x100000002ull, 5}, false, 3}),
            Words().Str("ck").W(1).W(0).Str("h").Str("fh").Str("o").W(12).H(0x100000002ull).H(5).W(0).W(3).b);
  // nlm4_testres: cookie, then the nlm4_testrply union; DENIED carries
  // nlm4_holder {exclusive, svid, oh, l_offset, l_len}, other stats nothing.
  Words denied;
  denied.Str("ck").W(1).W(1).W(0xfffffffe).Str("own").H(100).H(0);
  XdrIn in(denied.b);
  TestRes r;
  ASSERT_TRUE(Xdr(in, r));
  EXPECT_EQ(in.left(), 0u);
  EXPECT_EQ(r.stat, Stat::kDenied);
  EXPECT_EQ(r.holder, (Holder{true, -2, "own", 100, 0}));
  EXPECT_EQ(Encode(TestRes{"ck", Stat::kGranted, {}}), Words().Str("ck").W(0).b);
  // nlm4_res: cookie, stat.
  EXPECT_EQ(Encode(Res{"", Stat::kDeniedGracePeriod}), Words().W(0).W(4).b);
  // nsm: stat_chge {mon_name, state}; mon {mon_id {mon_name, my_id
  // {my_name, my_prog, my_vers, my_proc}}, priv[16]}.
  EXPECT_EQ(Encode(nsm::StatChge{"gw", 3}), Words().Str("gw").W(3).b);
  nsm::Mon mon{nsm::MonId{"srv", nsm::MyId{"gw", 100021, 4, 16}}, {}};
  EXPECT_EQ(Encode(mon), Words().Str("srv").Str("gw").W(100021).W(4).W(16).W(0).W(0).W(0).W(0).b);
}

TEST(Nlm4Codec, LengthsPastTheirBoundsAreRejectedAndUnknownStatusesDecode) {
  using namespace nlm4;
  std::vector<char> buf(8192);
  {
    XdrOut out(buf);
    Lock big = SomeLock();
    big.fh = std::string(kFhMax + 1, 'h');
    EXPECT_FALSE(Xdr(out, big)) << "a handle over NFS3_FHSIZE";
  }
  {
    XdrOut out(buf);
    Lock big = SomeLock();
    big.caller_name = std::string(kStrMax + 1, 'n');
    EXPECT_FALSE(Xdr(out, big)) << "a caller_name over LM_MAXSTRLEN";
  }
  // Each length word of a valid GRANTED call (a call the gateway receives)
  // set to 2^31, 2^32-1 and one past the end: rejected or within bounds.
  const std::vector<char> bytes = Encode(TestArgs{"cookie", true, SomeLock()});
  for (size_t w = 0; w + 4 <= bytes.size(); w += 4) {
    for (uint32_t v : {0x80000000u, 0xffffffffu, static_cast<uint32_t>(bytes.size() - w - 3)}) {
      std::vector<char> bad = bytes;
      for (int k = 0; k < 4; ++k) bad[w + k] = static_cast<char>(v >> (24 - 8 * k));
      XdrIn in(bad);
      TestArgs got;
      if (Xdr(in, got)) {
        EXPECT_LE(in.pos(), bad.size());
        EXPECT_LE(got.lock.fh.size(), kFhMax);
        EXPECT_LE(got.cookie.size(), kObjMax);
      }
    }
  }
  // A status from a newer server decodes, is named, and is ENOLCK.
  const Words future = Words().Str("c").W(77);
  XdrIn in(future.b);
  Res r;
  ASSERT_TRUE(Xdr(in, r));
  EXPECT_EQ(StatName(r.stat), "nlm4_stats 77");
  EXPECT_EQ(ErrnoOf(r.stat), ENOLCK);
}

TEST(Nlm4Codec, StatusesMapAsTheLinuxClientMapsThem) {
  using nlm4::Stat;
  EXPECT_EQ(nlm4::ErrnoOf(Stat::kGranted), 0);
  EXPECT_EQ(nlm4::ErrnoOf(Stat::kDenied), EAGAIN);
  EXPECT_EQ(nlm4::ErrnoOf(Stat::kDeniedNoLocks), ENOLCK);
  EXPECT_EQ(nlm4::ErrnoOf(Stat::kDeniedGracePeriod), ENOLCK);
  EXPECT_EQ(nlm4::ErrnoOf(Stat::kDeadlock), EDEADLK);
  EXPECT_EQ(nlm4::ErrnoOf(Stat::kReadOnlyFs), EROFS);
  EXPECT_EQ(nlm4::ErrnoOf(Stat::kStaleFh), ESTALE);
  EXPECT_EQ(nlm4::ErrnoOf(Stat::kFileTooBig), EOVERFLOW);
  EXPECT_EQ(nlm4::ErrnoOf(Stat::kFailed), ENOLCK);
  EXPECT_EQ(nlm4::ErrnoOf(Stat::kBlocked), ENOLCK);
  EXPECT_EQ(nlm4::StatName(Stat::kDeniedGracePeriod), "NLM4_DENIED_GRACE_PERIOD");
}

}  // namespace
}  // namespace mpnfs::proto
