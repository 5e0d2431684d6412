// RpcTransport against a server on loopback that this test plays by hand:
// it reads the records the transport writes, parses the call header word by
// word itself, decodes arguments with the protocol codecs (proto/), and
// writes replies cut, batched and fragmented as a test needs. One test runs
// Nfs3 calls through the engine over it, so the calls' own argument
// encoding is checked too.
#include "nfs/rpc_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <future>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "engine/engine.h"
#include "nfs/nfs3.h"
#include "nfs/tcp_info.h"
#include "proto/nfs3.h"
#include "test/fakes/loopback_listener.h"

namespace mpnfs::nfs {
namespace {

using engine::CallToken;
using engine::Cred;
using engine::ReplyStatus;
using namespace std::chrono_literals;

using Listener = test::LoopbackListener;
namespace p3 = proto::nfs3;

// RFC 5531 numbers, spelled out here (not taken from the code under test).
constexpr uint32_t kCall = 0, kReply = 1, kMsgAccepted = 0, kMsgDenied = 1, kAuthNone = 0, kAuthUnix = 1,
                   kSuccess = 0, kProcUnavail = 3, kAuthError = 1, kAuthTooWeak = 5;

void Put32(std::vector<char>* v, uint32_t x) {
  x = htonl(x);
  const char* p = reinterpret_cast<const char*>(&x);
  v->insert(v->end(), p, p + 4);
}

bool ReadFull(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t r = read(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// One call record as the server sees it.
struct Seen {
  uint32_t xid = 0, rpcvers = 0, prog = 0, vers = 0, proc = 0;
  uint32_t flavor = 0, uid = 0, gid = 0;
  std::string machine;
  std::vector<uint32_t> gids;
  std::vector<char> body;  // the whole record
  size_t args = 0;         // where the arguments start in `body`
  int fragments = 0;
};

// Reads one record (all its fragments) and decodes its RPC call header.
bool ReadCall(int fd, Seen* s) {
  *s = Seen{};
  for (bool last = false; !last;) {
    char m[4];
    if (!ReadFull(fd, m, 4)) return false;
    uint32_t mark;
    std::memcpy(&mark, m, 4);
    mark = ntohl(mark);
    last = (mark & 0x80000000u) != 0;
    const size_t len = mark & 0x7fffffffu;
    s->fragments++;
    const size_t at = s->body.size();
    s->body.resize(at + len);
    if (!ReadFull(fd, s->body.data() + at, len)) return false;
  }
  // Word by word, RFC 5531's call layout with AUTH_SYS.
  size_t at = 0;
  auto word = [&](uint32_t* v) {
    if (at + 4 > s->body.size()) return false;
    std::memcpy(v, s->body.data() + at, 4);
    *v = ntohl(*v);
    at += 4;
    return true;
  };
  uint32_t dir = 9, cred_len = 0, stamp = 0, name_len = 0, ngids = 0, verf_flavor = 9, verf_len = 9;
  bool ok = word(&s->xid) && word(&dir) && dir == kCall && word(&s->rpcvers) && word(&s->prog) &&
            word(&s->vers) && word(&s->proc) && word(&s->flavor) && word(&cred_len) && word(&stamp) &&
            word(&name_len) && name_len <= 255 && at + name_len <= s->body.size();
  if (ok) {
    s->machine.assign(s->body.data() + at, name_len);
    at += (name_len + 3) & ~3u;
    ok = word(&s->uid) && word(&s->gid) && word(&ngids) && ngids <= 16;
    for (uint32_t i = 0; ok && i < ngids; ++i) {
      uint32_t g = 0;
      ok = word(&g);
      s->gids.push_back(g);
    }
  }
  ok = ok && word(&verf_flavor) && word(&verf_len) && verf_flavor == kAuthNone && verf_len == 0;
  s->args = at;
  return ok;
}

// `v` with the encoding of `m` appended.
template <class M>
void Append(std::vector<char>* v, M m) {
  const size_t at = v->size();
  v->resize(at + 1024 + 2 * sizeof(M) + (1 << 20));
  proto::XdrOut x(std::span<char>(v->data() + at, v->size() - at));
  EXPECT_TRUE(p3::Xdr(x, m));
  v->resize(at + x.size());
}

// The arguments of the call `s`, decoded.
template <class A>
A ArgsOf(const Seen& s, bool* whole = nullptr) {
  proto::XdrIn x(std::span<const char>(s.body.data() + s.args, s.body.size() - s.args));
  A a{};
  EXPECT_TRUE(p3::Xdr(x, a));
  if (whole) *whole = x.left() == 0;
  return a;
}

// The start of an accepted, successful reply.
std::vector<char> Success(uint32_t xid) {
  std::vector<char> v;
  Put32(&v, xid);
  Put32(&v, kReply);
  Put32(&v, kMsgAccepted);
  Put32(&v, kAuthNone);
  Put32(&v, 0);
  Put32(&v, kSuccess);
  return v;
}

// A successful READ reply carrying `data`.
std::vector<char> ReadReplyBody(uint32_t xid, const std::string& data) {
  std::vector<char> v = Success(xid);
  Append(&v, p3::ReadRes{p3::kOk, std::nullopt, static_cast<uint32_t>(data.size()), true, data});
  return v;
}

// `body` as one record, or cut into fragments at the given lengths.
std::vector<char> Framed(const std::vector<char>& body, std::vector<size_t> cuts = {}) {
  std::vector<char> out;
  size_t at = 0;
  cuts.push_back(body.size());
  for (size_t i = 0; i < cuts.size(); ++i) {
    const size_t end = std::min(cuts[i], body.size());
    const bool last = i + 1 == cuts.size();
    Put32(&out, (last ? 0x80000000u : 0) | static_cast<uint32_t>(end - at));
    out.insert(out.end(), body.begin() + static_cast<ptrdiff_t>(at),
               body.begin() + static_cast<ptrdiff_t>(end));
    at = end;
  }
  return out;
}

void WriteAll(int fd, const std::vector<char>& v) {
  size_t at = 0;
  while (at < v.size()) {
    const ssize_t n = send(fd, v.data() + at, v.size() - at, MSG_NOSIGNAL);
    ASSERT_GT(n, 0);
    at += static_cast<size_t>(n);
  }
}

// A call as the transport sees it: a READ whose reply is decoded as
// a READ result, or (payload set) a WRITE-shaped call with raw arguments.
class TestCall final : public engine::RpcCall {
 public:
  explicit TestCall(engine::Proc p = engine::Proc::kRead) : proc_(p) {}
  const char* Name() const override { return engine::ProcName(proc_); }
  engine::Proc Procedure() const override { return proc_; }
  bool EncodeArgs(proto::XdrOut& x) override {
    for (uint32_t w : words) {
      if (!x.U32(w)) return false;
    }
    return true;
  }
  std::span<const char> Payload() const override { return {payload.data(), payload.size()}; }
  bool DecodeResult(proto::XdrIn& x, void* result) override {
    auto* r = new (result) p3::ReadRes;
    if (p3::Xdr(x, *r)) return true;
    r->~ReadRes();
    return false;
  }
  void DestroyResult(void* result) override { static_cast<p3::ReadRes*>(result)->~ReadRes(); }
  void Complete(const engine::CallOutcome&) override {}

  std::vector<uint32_t> words;  // the arguments: XDR words
  std::string payload;

 private:
  engine::Proc proc_;
};

struct Got {
  CallToken* token;
  ReplyStatus status;
  std::string data;  // the READ result's data, copied while valid
  std::string error;
};

class Sink final : public engine::TransportSink {
 public:
  void OnConnected(bool ok, const std::string& error) override {
    connected = ok ? 1 : -1;
    connect_error = error;
  }
  void OnReply(CallToken* token, ReplyStatus status, void* result, const char* error) override {
    Got g{token, status, {}, error ? error : ""};
    if (status == ReplyStatus::kSuccess) {
      g.data.assign(static_cast<const p3::ReadRes*>(result)->data);
    }
    got.push_back(std::move(g));
  }
  void OnLinkRate(uint64_t bytes_per_s) override { rates.push_back(bytes_per_s); }
  int connected = 0;
  std::vector<uint64_t> rates;
  std::string connect_error;
  std::vector<Got> got;
};

class RpcTransportTest : public ::testing::Test {
 protected:
  // Services the transport until `done()`, the transport reports the
  // connection broken (broken_), or 10 s pass. Whether done().
  bool PumpUntil(const std::function<bool()>& done) {
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (!done() && std::chrono::steady_clock::now() < until) {
      pollfd p{t_.Fd(), static_cast<short>(t_.Events()), 0};
      if (p.fd < 0 || (poll(&p, 1, 10) > 0 && !t_.Service(p.revents))) {
        broken_ = true;
        return done();
      }
    }
    return done();
  }
  // Connects and accepts; the server end in server_.
  void Connect() {
    std::string err;
    engine::Endpoint ep;
    ep.host = "127.0.0.1";
    ep.port = listener_.port();
    ASSERT_TRUE(t_.StartConnect(ep, &err)) << err;
    server_ = listener_.Accept();
    ASSERT_GE(server_, 0);
    ASSERT_TRUE(PumpUntil([&] { return sink_.connected != 0; }));
    ASSERT_EQ(sink_.connected, 1) << sink_.connect_error;
  }
  std::shared_ptr<TestCall> Issue(uint32_t xid, CallToken* token, const Cred& c = {}) {
    auto call = std::make_shared<TestCall>();
    call->words = {xid};
    EXPECT_EQ(t_.Issue(call, xid, c, token), 0);
    return call;
  }
  // Issues a READ-shaped call per (xid, token) and waits until all are sent.
  void SendCalls(std::initializer_list<std::pair<uint32_t, CallToken*>> calls) {
    for (auto [xid, token] : calls) Issue(xid, token);
    ASSERT_TRUE(PumpUntil([&] { return t_.Events() == POLLIN; }));
  }
  void TearDown() override {
    t_.Close();
    if (server_ >= 0) close(server_);
  }

  Listener listener_;
  Sink sink_;
  RpcTransport t_{&sink_, 0};
  int server_ = -1;
  bool broken_ = false;
};

TEST_F(RpcTransportTest, AWriteIsOneRecordWithItsPayloadPaddedAndItsCallersCredentials) {
  Connect();
  auto call = std::make_shared<TestCall>(engine::Proc::kWrite);
  call->words = {0xabcdef01u, 1001};  // an argument, then the payload's length
  for (int i = 0; i < 1001; ++i) call->payload.push_back(static_cast<char>(i * 7 + 3));
  Cred c;
  c.uid = 1000;
  c.gid = 100;
  c.groups = {4, 27, 1000};
  CallToken token;
  ASSERT_EQ(t_.Issue(call, 0x1234, c, &token), 0);
  ASSERT_TRUE(PumpUntil([&] { return t_.Events() == POLLIN; }));  // all sent

  Seen s;
  ASSERT_TRUE(ReadCall(server_, &s));
  EXPECT_EQ(s.fragments, 1);
  EXPECT_EQ(s.xid, 0x1234u);
  EXPECT_EQ(s.rpcvers, 2u);
  EXPECT_EQ(s.prog, 100003u);
  EXPECT_EQ(s.vers, 3u);
  EXPECT_EQ(s.proc, 7u);  // WRITE
  EXPECT_EQ(s.flavor, kAuthUnix);
  EXPECT_EQ(s.machine, "mpnfs");
  EXPECT_EQ(s.uid, 1000u);
  EXPECT_EQ(s.gid, 100u);
  EXPECT_EQ(s.gids, (std::vector<uint32_t>{4, 27, 1000}));
  // Arguments, the payload right after its length, then 3 zero bytes.
  ASSERT_EQ(s.body.size(), s.args + 8 + 1001 + 3);
  uint32_t w[2];
  std::memcpy(w, s.body.data() + s.args, 8);
  EXPECT_EQ(ntohl(w[0]), 0xabcdef01u);
  EXPECT_EQ(ntohl(w[1]), 1001u);
  EXPECT_EQ(std::string(s.body.data() + s.args + 8, 1001), call->payload);
  EXPECT_EQ(std::string(s.body.data() + s.args + 8 + 1001, 3), std::string(3, '\0'));

  // A second call with other credentials carries them.
  Cred d;
  d.uid = 7;
  d.gid = 8;
  Issue(5, &token, d);
  ASSERT_TRUE(PumpUntil([&] { return t_.Events() == POLLIN; }));
  ASSERT_TRUE(ReadCall(server_, &s));
  EXPECT_EQ(s.xid, 5u);
  EXPECT_EQ(s.proc, 6u);  // READ
  EXPECT_EQ(s.uid, 7u);
  EXPECT_EQ(s.gid, 8u);
  EXPECT_TRUE(s.gids.empty());
}

TEST_F(RpcTransportTest, RepliesBatchedCutAnywhereAndFragmentedReachTheirCalls) {
  Connect();
  CallToken a, b, c;
  SendCalls({{1, &a}, {2, &b}, {3, &c}});
  std::string small = "small reply";
  std::string big(300000, 'x');  // larger than the bulk buffer
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>('a' + i % 23);
  std::string mid(20000, 'm');
  // Out of order, all in one stream; the big one in three fragments, the
  // middle one in two.
  std::vector<char> stream = Framed(ReadReplyBody(3, big), {10, 150000});
  auto r1 = Framed(ReadReplyBody(1, small));
  auto r2 = Framed(ReadReplyBody(2, mid), {7});
  stream.insert(stream.end(), r1.begin(), r1.end());
  stream.insert(stream.end(), r2.begin(), r2.end());
  // Written in pieces of random length, the transport serviced in between.
  std::mt19937 rnd(20261203);
  for (size_t at = 0; at < stream.size();) {
    const size_t n = std::min<size_t>(stream.size() - at, 1 + rnd() % 70000);
    WriteAll(server_, std::vector<char>(stream.begin() + static_cast<ptrdiff_t>(at),
                                        stream.begin() + static_cast<ptrdiff_t>(at + n)));
    at += n;
    pollfd p{t_.Fd(), POLLIN, 0};
    if (poll(&p, 1, 5) > 0) {
      ASSERT_TRUE(t_.Service(p.revents)) << t_.LastError();
    }
  }
  ASSERT_TRUE(PumpUntil([&] { return sink_.got.size() == 3; })) << t_.LastError();
  ASSERT_EQ(sink_.got[0].token, &c);
  EXPECT_EQ(sink_.got[0].status, ReplyStatus::kSuccess);
  EXPECT_TRUE(sink_.got[0].data == big);
  EXPECT_EQ(sink_.got[1].token, &a);
  EXPECT_EQ(sink_.got[1].data, small);
  EXPECT_EQ(sink_.got[2].token, &b);
  EXPECT_TRUE(sink_.got[2].data == mid);
}

TEST_F(RpcTransportTest, AnXidOutstandingTwiceIsAnsweredOldestFirstAndAStrayReplyIsDropped) {
  Connect();
  CallToken first, second, other;
  Issue(42, &first);
  Issue(42, &second);  // a retransmission: same XID
  Issue(43, &other);
  ASSERT_TRUE(PumpUntil([&] { return t_.Events() == POLLIN; }));
  auto one = Framed(ReadReplyBody(42, "1"));
  auto stray = Framed(ReadReplyBody(999, "stray"));
  auto two = Framed(ReadReplyBody(42, "2"));
  auto three = Framed(ReadReplyBody(42, "3"));  // nothing waits for it any more
  auto last = Framed(ReadReplyBody(43, "other"));
  for (auto* v : {&one, &stray, &two, &three, &last}) WriteAll(server_, *v);
  ASSERT_TRUE(PumpUntil([&] { return sink_.got.size() == 3; })) << t_.LastError();
  EXPECT_EQ(sink_.got[0].token, &first);
  EXPECT_EQ(sink_.got[0].data, "1");
  EXPECT_EQ(sink_.got[1].token, &second);
  EXPECT_EQ(sink_.got[1].data, "2");
  EXPECT_EQ(sink_.got[2].token, &other);
  EXPECT_EQ(sink_.got[2].data, "other");
}

TEST_F(RpcTransportTest, ARejectedOrUndecodableReplyFailsOnlyItsCall) {
  Connect();
  CallToken denied, unavail, garbled, fine;
  Issue(1, &denied);
  Issue(2, &unavail);
  Issue(3, &garbled);
  Issue(4, &fine);
  ASSERT_TRUE(PumpUntil([&] { return t_.Events() == POLLIN; }));
  std::vector<char> d;
  Put32(&d, 1);
  Put32(&d, kReply);
  Put32(&d, kMsgDenied);
  Put32(&d, kAuthError);
  Put32(&d, kAuthTooWeak);
  std::vector<char> u = Success(2);
  u.resize(u.size() - 4);
  Put32(&u, kProcUnavail);
  std::vector<char> g = ReadReplyBody(3, "truncated reply");
  g.resize(g.size() - 12);  // cut inside the data
  for (auto* v : {&d, &u, &g}) WriteAll(server_, Framed(*v));
  WriteAll(server_, Framed(ReadReplyBody(4, "ok")));
  ASSERT_TRUE(PumpUntil([&] { return sink_.got.size() == 4; })) << t_.LastError();
  EXPECT_EQ(sink_.got[0].status, ReplyStatus::kError);
  EXPECT_NE(sink_.got[0].error.find("authentication too weak"), std::string::npos)
      << sink_.got[0].error;
  EXPECT_EQ(sink_.got[1].status, ReplyStatus::kError);
  EXPECT_NE(sink_.got[1].error.find("procedure unavailable"), std::string::npos);
  EXPECT_EQ(sink_.got[2].status, ReplyStatus::kError);
  EXPECT_NE(sink_.got[2].error.find("does not decode"), std::string::npos);
  EXPECT_EQ(sink_.got[3].token, &fine);
  EXPECT_EQ(sink_.got[3].status, ReplyStatus::kSuccess);
  EXPECT_EQ(sink_.got[3].data, "ok");
}

// A data length of 2^31 in a reply: the call fails, alone, and nothing is
// read past the reply.
TEST_F(RpcTransportTest, AReplyClaimingMoreBytesThanItHoldsFailsOnlyItsCall) {
  Connect();
  CallToken huge, fine;
  SendCalls({{1, &huge}, {2, &fine}});
  std::vector<char> h = ReadReplyBody(1, "0123456789abcdef");
  // The data length word sits just before the data and its padding.
  const size_t at = h.size() - 16 - 4;
  h[at] = '\x80';
  h[at + 1] = h[at + 2] = h[at + 3] = 0;
  WriteAll(server_, Framed(h));
  WriteAll(server_, Framed(ReadReplyBody(2, "ok")));
  ASSERT_TRUE(PumpUntil([&] { return sink_.got.size() == 2; })) << t_.LastError();
  EXPECT_EQ(sink_.got[0].token, &huge);
  EXPECT_EQ(sink_.got[0].status, ReplyStatus::kError);
  EXPECT_EQ(sink_.got[1].status, ReplyStatus::kSuccess);
  EXPECT_EQ(sink_.got[1].data, "ok");
  EXPECT_FALSE(broken_);
}

TEST_F(RpcTransportTest, AStreamThatIsNotRpcRepliesBreaksTheConnection) {
  Connect();
  CallToken a;
  Issue(1, &a);
  ASSERT_TRUE(PumpUntil([&] { return t_.Events() == POLLIN; }));
  std::vector<char> call;
  Put32(&call, 1);
  Put32(&call, kCall);  // a call, not a reply
  Put32(&call, 2);
  WriteAll(server_, Framed(call));
  PumpUntil([] { return false; });
  EXPECT_TRUE(broken_);
  EXPECT_NE(t_.LastError().find("not an RPC reply"), std::string::npos) << t_.LastError();
  EXPECT_TRUE(sink_.got.empty());
}

TEST_F(RpcTransportTest, AnOversizedRecordMarkBreaksTheConnection) {
  Connect();
  std::vector<char> mark;
  Put32(&mark, 0x80000000u | 0x7ffffff0u);
  WriteAll(server_, mark);
  PumpUntil([] { return false; });
  EXPECT_TRUE(broken_);
  EXPECT_NE(t_.LastError().find("reply record of"), std::string::npos) << t_.LastError();
}

TEST_F(RpcTransportTest, TheServerClosingBreaksTheConnection) {
  Connect();
  close(server_);
  server_ = -1;
  PumpUntil([] { return false; });
  EXPECT_TRUE(broken_);
  EXPECT_NE(t_.LastError().find("closed the connection"), std::string::npos) << t_.LastError();
}

// Replies sized around the bulk buffer's thresholds, queued before the
// transport reads, so that (as loopback usually delivers them) the first recv
// ends inside the second record, which waits in the bulk buffer until it is
// compacted; then records of exactly kBulk / 2 (wait in place) and just over
// it (assembled), of the bulk buffer's size and over, and a small one behind
// them. What it checks is that every one arrives whole and in order,
// whichever path the recv boundaries send it down.
TEST_F(RpcTransportTest, RepliesAroundTheBulkBufferSizeAreAllDelivered) {
  Connect();
  const size_t overhead = ReadReplyBody(0, "").size();
  const size_t bodies[] = {40000, 30000, RpcTransport::kBulk / 2 - 4, RpcTransport::kBulk / 2,
                           RpcTransport::kBulk - 4, RpcTransport::kBulk + 8, overhead};
  std::vector<CallToken> tokens(std::size(bodies));
  std::vector<std::string> want;
  std::vector<char> stream;
  for (size_t i = 0; i < std::size(bodies); ++i) {
    Issue(static_cast<uint32_t>(i + 1), &tokens[i]);
    std::string data(bodies[i] - overhead, static_cast<char>('A' + i));
    auto body = ReadReplyBody(static_cast<uint32_t>(i + 1), data);
    ASSERT_EQ(body.size(), bodies[i]);
    auto rec = Framed(body);
    stream.insert(stream.end(), rec.begin(), rec.end());
    want.push_back(data);
  }
  ASSERT_TRUE(PumpUntil([&] { return t_.Events() == POLLIN; }));
  std::thread writer([&] { WriteAll(server_, stream); });
  std::this_thread::sleep_for(50ms);  // let the stream queue up ahead of the first read
  const bool all = PumpUntil([&] { return sink_.got.size() == want.size(); });
  if (!all) t_.Close();  // unblocks the writer (its peer resets)
  writer.join();
  ASSERT_TRUE(all) << t_.LastError();
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(sink_.got[i].token, &tokens[i]) << i;
    EXPECT_TRUE(sink_.got[i].data == want[i]) << i;
  }
}

// A large READ reply whose first half comes at once and whose second half
// is paced at about 4 MiB/s gives one link rate sample, of the pace of the
// second half; a small reply gives none.
TEST_F(RpcTransportTest, ALargeReplysSecondHalfIsTimedAsTheLinkRate) {
  Connect();
  CallToken small, large;
  SendCalls({{1, &small}, {2, &large}});
  WriteAll(server_, Framed(ReadReplyBody(1, std::string(100000, 's'))));
  ASSERT_TRUE(PumpUntil([&] { return sink_.got.size() == 1; }));
  EXPECT_TRUE(sink_.rates.empty()) << "a 100 kB reply was timed";
  const auto rec = Framed(ReadReplyBody(2, std::string(1 << 20, 'L')));
  constexpr size_t kPiece = 32 << 10;
  constexpr auto kGap = 8ms;  // 32 KiB per 8 ms: 4 MiB/s
  std::thread writer([&] {
    size_t at = rec.size() * 55 / 100;
    WriteAll(server_, std::vector<char>(rec.begin(), rec.begin() + static_cast<ptrdiff_t>(at)));
    while (at < rec.size()) {
      std::this_thread::sleep_for(kGap);
      const size_t n = std::min(kPiece, rec.size() - at);
      WriteAll(server_, std::vector<char>(rec.begin() + static_cast<ptrdiff_t>(at),
                                          rec.begin() + static_cast<ptrdiff_t>(at + n)));
      at += n;
    }
  });
  const bool done = PumpUntil([&] { return sink_.got.size() == 2; });
  if (!done) t_.Close();
  writer.join();
  ASSERT_TRUE(done) << t_.LastError();
  ASSERT_EQ(sink_.rates.size(), 1u);
  // Sleeps only ever run long: the pace is at most 4 MiB/s. Timing the
  // whole record (its first half came at once) would say about 8.
  EXPECT_LT(sink_.rates[0], 5u << 20);
  EXPECT_GT(sink_.rates[0], 256u << 10);
}

// A WRITE far larger than the socket buffers goes out over many sendmsg
// calls, resumed in the middle of its payload, and arrives intact; while it
// is still queued the transport asks for POLLOUT.
TEST_F(RpcTransportTest, ALargeWriteIsSentWholeAcrossPartialSends) {
  Connect();
  auto call = std::make_shared<TestCall>(engine::Proc::kWrite);
  const size_t n = 3u << 20;  // under kMaxRecord, over what loopback buffers hold unread
  call->words = {static_cast<uint32_t>(n + 1)};
  call->payload.resize(n + 1);
  for (size_t i = 0; i < call->payload.size(); ++i) call->payload[i] = static_cast<char>(i % 251);
  // Small socket buffers on both ends, so that the record cannot go at once.
  const int small = 64 * 1024;
  setsockopt(t_.Fd(), SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
  setsockopt(server_, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  CallToken token;
  ASSERT_EQ(t_.Issue(call, 9, {}, &token), 0);
  pollfd p{t_.Fd(), POLLOUT, 0};
  ASSERT_EQ(poll(&p, 1, 1000), 1);
  ASSERT_TRUE(t_.Service(POLLOUT));
  EXPECT_EQ(t_.Events(), POLLIN | POLLOUT) << "3 MiB cannot fit the socket buffers";
  Seen s;
  bool read_ok = false;
  std::thread reader([&] { read_ok = ReadCall(server_, &s); });
  const bool sent = PumpUntil([&] { return t_.Events() == POLLIN; });
  if (!sent) t_.Close();  // unblocks the reader
  reader.join();
  ASSERT_TRUE(sent) << t_.LastError();
  ASSERT_TRUE(read_ok);
  ASSERT_EQ(s.body.size(), s.args + 4 + n + 1 + 3);
  EXPECT_TRUE(std::equal(call->payload.begin(), call->payload.end(), s.body.begin() +
                         static_cast<ptrdiff_t>(s.args + 4)));
}

// The engine's direct sections call Service(POLLOUT) on a submitting
// thread to write; a reply must not be read and completed there.
TEST_F(RpcTransportTest, ServiceForPollOutOnlyWrites) {
  Connect();
  CallToken a;
  Issue(1, &a);
  ASSERT_TRUE(t_.Service(POLLOUT));
  Seen s;
  ASSERT_TRUE(ReadCall(server_, &s));
  WriteAll(server_, Framed(ReadReplyBody(1, "reply")));
  pollfd p{t_.Fd(), POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 1000), 1);  // the reply is there to be read
  ASSERT_TRUE(t_.Service(POLLOUT));
  EXPECT_TRUE(sink_.got.empty());
  ASSERT_TRUE(t_.Service(POLLIN));
  ASSERT_EQ(sink_.got.size(), 1u);
  EXPECT_EQ(sink_.got[0].data, "reply");
}

// The reply verifier is skipped by its length, padding included; one
// longer than RFC 5531's 400 bytes, or running past the record, fails the
// call without reading beyond it.
TEST_F(RpcTransportTest, AReplyVerifierIsSkippedByItsLengthAndBounded) {
  Connect();
  CallToken a, b, c;
  SendCalls({{1, &a}, {2, &b}, {3, &c}});
  auto with_verf = [](uint32_t xid, uint32_t len, size_t body, const std::string& data) {
    std::vector<char> v;
    Put32(&v, xid);
    Put32(&v, kReply);
    Put32(&v, kMsgAccepted);
    Put32(&v, 6);  // some flavor
    Put32(&v, len);
    v.insert(v.end(), body, 'v');
    Put32(&v, kSuccess);
    auto res = ReadReplyBody(xid, data);
    v.insert(v.end(), res.begin() + 24, res.end());  // the READ result after the header
    return v;
  };
  WriteAll(server_, Framed(with_verf(1, 5, 8, "padded verifier")));
  WriteAll(server_, Framed(with_verf(2, 404, 404, "too long")));
  WriteAll(server_, Framed(with_verf(3, 300, 0, "past the end")));
  ASSERT_TRUE(PumpUntil([&] { return sink_.got.size() == 3; })) << t_.LastError();
  EXPECT_EQ(sink_.got[0].status, ReplyStatus::kSuccess);
  EXPECT_EQ(sink_.got[0].data, "padded verifier");
  EXPECT_EQ(sink_.got[1].status, ReplyStatus::kError);
  EXPECT_NE(sink_.got[1].error.find("truncated"), std::string::npos) << sink_.got[1].error;
  EXPECT_EQ(sink_.got[2].status, ReplyStatus::kError);
}

TEST_F(RpcTransportTest, CloseCancelsEveryOutstandingCallOnceInIssueOrderAndLetsItGo) {
  Connect();
  CallToken tokens[5];
  const uint32_t xids[5] = {900, 3, 77, 3, 12};
  std::vector<std::weak_ptr<TestCall>> calls;
  for (int i = 0; i < 5; ++i) calls.push_back(Issue(xids[i], &tokens[i]));
  for (auto& w : calls) EXPECT_FALSE(w.expired()) << "the transport keeps what it may send";
  t_.Close();
  ASSERT_EQ(sink_.got.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(sink_.got[i].token, &tokens[i]);
    EXPECT_EQ(sink_.got[i].status, ReplyStatus::kCancel);
  }
  for (auto& w : calls) EXPECT_TRUE(w.expired());
  t_.Close();
  EXPECT_EQ(sink_.got.size(), 5u);
  CallToken late;
  EXPECT_LT(t_.Issue(std::make_shared<TestCall>(), 1, {}, &late), 0);
}

TEST_F(RpcTransportTest, ARefusedConnectIsReported) {
  const int port = listener_.port();
  listener_.Stop();
  std::string err;
  engine::Endpoint ep;
  ep.host = "127.0.0.1";
  ep.port = port;
  if (!t_.StartConnect(ep, &err)) {
    EXPECT_FALSE(err.empty());  // refused at once
    return;
  }
  EXPECT_FALSE(PumpUntil([&] { return sink_.connected != 0; }) && sink_.connected == 1);
  EXPECT_EQ(sink_.connected, -1);
  EXPECT_NE(sink_.connect_error.find("refused"), std::string::npos) << sink_.connect_error;
}

// Nfs3 over the engine over RpcTransport, against a server that decodes the
// calls: WRITE's arguments with the data sent from the caller's buffer, a
// large READ reply, the NULL probe.
TEST(RpcTransportNfs3, WriteAndReadRoundTripThroughTheEngine) {
  Listener l;
  std::mutex mu;  // the server thread's findings
  std::string written;
  uint64_t written_at = 0;
  uint32_t stable = 9;
  std::string file(150001, 'f');
  for (size_t i = 0; i < file.size(); ++i) file[i] = static_cast<char>(i * 31 + 7);
  std::thread server([&] {
    const int fd = l.Accept();
    ASSERT_GE(fd, 0);
    Seen s;
    while (ReadCall(fd, &s)) {
      std::vector<char> reply;
      if (s.proc == 0) {
        reply = Success(s.xid);
      } else if (s.proc == 7) {
        bool whole = false;
        const auto w = ArgsOf<p3::WriteArgs>(s, &whole);
        EXPECT_TRUE(whole) << "something after the padding";
        EXPECT_EQ(w.fh, "handle");
        EXPECT_EQ(w.count, w.data.size());
        {
          std::lock_guard lock(mu);
          written.assign(w.data);
          written_at = w.off;
          stable = static_cast<uint32_t>(w.stable);
        }
        reply = Success(s.xid);
        uint64_t verf;
        std::memcpy(&verf, "verifier", 8);
        Append(&reply, p3::WriteRes{p3::kOk, {}, w.count, p3::Stable::kFileSync, verf});
      } else if (s.proc == 6) {
        const auto a = ArgsOf<p3::ReadArgs>(s);
        reply = ReadReplyBody(s.xid, file.substr(a.off, a.count));
      }
      WriteAll(fd, Framed(reply));
    }
    close(fd);
  });
  // Joined after the engine below is gone (its connection closed, which
  // ends the server's loop), also when an assertion returns early. The
  // server's sends do not raise SIGPIPE (WriteAll).
  struct Join {
    std::thread& t;
    ~Join() {
      if (t.joinable()) t.join();
    }
  } join{server};

  // Declared before the engine: a call it ends as it is destroyed still
  // finds its promise.
  std::promise<Result<WriteReply>> wrote;
  std::promise<std::string> read;
  engine::EngineOptions o;
  o.paths = {engine::Endpoint{"127.0.0.1", l.port(), "", 1}};
  o.loops = 1;
  engine::Engine e(o, [](engine::TransportSink* sink) {
    return std::make_unique<RpcTransport>(sink, 0);
  });
  e.Start();
  Nfs3 nfs(e);
  const Fh fh("handle");
  auto bytes = std::make_shared<Bytes>(file.size());
  std::memcpy(bytes->data(), file.data(), file.size());
  Buffer data = bytes;
  nfs.Write(fh, 4096, data, 3, 70001, true, Cred{},
            [&](Result<WriteReply> r) { wrote.set_value(std::move(r)); });
  auto wf = wrote.get_future();
  ASSERT_EQ(wf.wait_for(5s), std::future_status::ready);
  auto w = wf.get();
  ASSERT_TRUE(w) << w.error().what;
  EXPECT_EQ(w->count, 70001u);
  EXPECT_TRUE(w->stable);
  {
    std::lock_guard lock(mu);
    EXPECT_TRUE(written == file.substr(3, 70001));
    EXPECT_EQ(written_at, 4096u);
    EXPECT_EQ(stable, 2u);  // FILE_SYNC
  }

  nfs.Read(fh, 5, 140000, Cred{}, [&](Result<ReadReply> r) {
    read.set_value(r ? std::string(r->data, r->len) : "error: " + r.error().what);
  });
  auto rf = read.get_future();
  ASSERT_EQ(rf.wait_for(5s), std::future_status::ready);
  EXPECT_TRUE(rf.get() == file.substr(5, 140000));
  e.Stop();
}

// A reissued LINK (its connection broke before the answer) answered EEXIST:
// success only if the name now holds the file being linked (nfs/reissue.h).
// The server drops the first LINK unanswered, answers the reissued one
// NFS3ERR_EXIST, then answers the LOOKUP with `there`.
Result<LinkReply> ReissuedLink(const std::string& there) {
  Listener l;
  std::thread server([&] {
    Seen s;
    bool dropped = false;
    for (int conn = 0; conn < 2; ++conn) {
      const int fd = l.Accept();
      if (fd < 0) return;
      while (ReadCall(fd, &s)) {
        std::vector<char> reply = Success(s.xid);
        if (s.proc == 15 && !dropped) {
          dropped = true;  // no answer: the engine reissues it on a new connection
          break;
        }
        if (s.proc == 15) {
          p3::LinkRes r;
          r.status = 17;  // NFS3ERR_EXIST
          Append(&reply, r);
        } else if (s.proc == 3) {
          p3::LookupRes r;
          r.ok.fh = there;
          Append(&reply, r);
        }
        WriteAll(fd, Framed(reply));
      }
      close(fd);
    }
  });
  struct Join {
    std::thread& t;
    ~Join() {
      if (t.joinable()) t.join();
    }
  } join{server};
  std::promise<Result<LinkReply>> linked;
  engine::EngineOptions o;
  o.paths = {engine::Endpoint{"127.0.0.1", l.port(), "", 1}};
  o.loops = 1;
  o.backoff_initial = std::chrono::milliseconds(10);
  o.resend_fence = std::chrono::milliseconds(10);
  engine::Engine e(o, [](engine::TransportSink* sink) {
    return std::make_unique<RpcTransport>(sink, 0);
  });
  e.Start();
  Nfs3 nfs(e);
  nfs.Link(Fh("file"), Fh("dir"), "name", Cred{}, [&](Result<LinkReply> r) { linked.set_value(std::move(r)); });
  auto f = linked.get_future();
  if (f.wait_for(10s) != std::future_status::ready) {
    e.Stop();
    return Error::Errno(ETIMEDOUT, "no answer");
  }
  auto r = f.get();
  e.Stop();
  return r;
}

TEST(RpcTransportNfs3, AReissuedLinkAnsweredExistIsSuccessOnlyIfTheNameHoldsTheFile) {
  auto same = ReissuedLink("file");
  EXPECT_TRUE(same.ok()) << same.error().what;
  auto other = ReissuedLink("another file");
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.error().err, EEXIST);
}

// A connected pair on loopback: `client` (non-blocking) and the server end.
struct TcpPair {
  test::LoopbackListener listener;
  int client = -1, server = -1;
  TcpPair() {
    client = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(listener.port());
    EXPECT_EQ(connect(client, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    server = listener.Accept();
    fcntl(client, F_SETFL, fcntl(client, F_GETFL) | O_NONBLOCK);
  }
  ~TcpPair() {
    close(client);
    close(server);
  }
};

// A peer that is there but reads nothing: once its receive window is shut,
// TCP hears from it only at window probes, whose intervals double (0.2 s,
// 0.4 s, 0.8 s...). That is a slow server, not a dead path: no silence.
TEST(TcpSilence, APeerWhoseWindowIsShutIsNotSilent) {
  TcpPair p;
  std::vector<char> chunk(64 << 10, 'x');
  size_t sent = 0;
  for (;;) {  // until the peer's receive buffer and then our send buffer are full
    const ssize_t n = send(p.client, chunk.data(), chunk.size(), MSG_NOSIGNAL);
    if (n <= 0) {
      ASSERT_TRUE(errno == EAGAIN || errno == EWOULDBLOCK) << strerror(errno);
      break;
    }
    sent += static_cast<size_t>(n);
  }
  ASSERT_GT(sent, 0u);
  // Past the third window probe's interval, the last ACK is 0.4 s or more old.
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_EQ(TcpSilentMs(p.client), 0);
}

TEST(TcpSilence, APeerThatSendsNothingGrowsSilent) {
  TcpPair p;
  ASSERT_EQ(send(p.client, "ping", 4, MSG_NOSIGNAL), 4);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const int64_t ms = TcpSilentMs(p.client);
  EXPECT_GE(ms, 250);
  EXPECT_LT(ms, 5000);
  EXPECT_EQ(TcpSilentMs(-1), -1);
}

}  // namespace
}  // namespace mpnfs::nfs
