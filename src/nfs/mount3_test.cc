#include "nfs/mount3.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "test/fakes/loopback_listener.h"

namespace mpnfs::nfs {
namespace {

// A MOUNT "service" that accepts connections and never answers.
using SilentServer = test::LoopbackListener;

// A service that takes the connection and answers nothing (not even the
// engine's NULL probe, so MOUNT waits behind it) until the deadline: a
// timeout that says so, and nothing left behind (the suite runs this under
// ASan).
TEST(MountExportTest, ASilentServiceIsATimeoutThatSaysSo) {
  SilentServer s;
  for (int i = 0; i < 3; ++i) {
    auto r = MountExport("127.0.0.1", s.port(), "/export", std::chrono::milliseconds(150));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().err, ETIMEDOUT) << r.error().what;
    EXPECT_NE(r.error().what.find("did not answer in time"), std::string::npos) << r.error().what;
  }
}

void Put(std::vector<char>* v, uint32_t x) {
  x = htonl(x);
  const char* p = reinterpret_cast<const char*>(&x);
  v->insert(v->end(), p, p + 4);
}

// Reads one call record; returns its XID (0 on failure). The connection's
// NULL calls (the engine probes a new connection with one before using it)
// are answered on the way: the first other call's XID is returned.
uint32_t ReadCallXid(int fd) {
  while (true) {
    std::vector<char> body;
    for (bool last = false; !last;) {
      uint32_t mark;
      if (recv(fd, &mark, 4, MSG_WAITALL) != 4) return 0;
      mark = ntohl(mark);
      last = (mark & 0x80000000u) != 0;
      const size_t at = body.size();
      body.resize(at + (mark & 0x7fffffffu));
      if (recv(fd, body.data() + at, body.size() - at, MSG_WAITALL) != static_cast<ssize_t>(body.size() - at)) {
        return 0;
      }
    }
    if (body.size() < 24) return 0;
    uint32_t xid, proc;
    std::memcpy(&xid, body.data(), 4);
    std::memcpy(&proc, body.data() + 20, 4);
    if (ntohl(proc) != 0) return ntohl(xid);
    std::vector<char> rec;
    Put(&rec, 0x80000000u | 24);
    for (uint32_t w : {ntohl(xid), 1u, 0u, 0u, 0u, 0u}) Put(&rec, w);  // accepted, SUCCESS, void
    if (send(fd, rec.data(), rec.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(rec.size())) return 0;
  }
}

// A MOUNT service that answers MNT with `handle`, the reply cut into two
// record fragments (answering with `xid_delta` added to the call's XID),
// after leaving `ignore` calls unanswered (each must be a retransmission of
// the first: the same XID on the same connection).
// A `status` other than MNT3_OK (0) is answered alone.
void AnswerMount(const test::LoopbackListener& l, const std::string& handle, uint32_t xid_delta = 0,
                 int ignore = 0, uint32_t status = 0) {
  const int fd = l.Accept();
  ASSERT_GE(fd, 0);
  const uint32_t xid = ReadCallXid(fd);
  for (int i = 0; i < ignore; ++i) EXPECT_EQ(ReadCallXid(fd), xid) << "not a retransmission";
  std::vector<char> body;
  for (uint32_t w : {xid + xid_delta, 1u, 0u, 0u, 0u, 0u, status}) Put(&body, w);
  if (status == 0) {
    Put(&body, static_cast<uint32_t>(handle.size()));
    body.insert(body.end(), handle.begin(), handle.end());
    while (body.size() % 4) body.push_back(0);
    Put(&body, 1);  // one flavor
    Put(&body, 1);  // AUTH_SYS
  }
  std::vector<char> rec;
  const size_t half = 12;
  Put(&rec, static_cast<uint32_t>(half));
  rec.insert(rec.end(), body.begin(), body.begin() + half);
  Put(&rec, 0x80000000u | static_cast<uint32_t>(body.size() - half));
  rec.insert(rec.end(), body.begin() + half, body.end());
  EXPECT_EQ(send(fd, rec.data(), rec.size(), MSG_NOSIGNAL), static_cast<ssize_t>(rec.size()));
  char c[512];
  while (recv(fd, c, sizeof c, 0) > 0) {
  }  // until the client closes (retransmissions read and dropped)
  close(fd);
}

TEST(MountExportTest, AnAnswerInFragmentsGivesTheExportsRootHandle) {
  test::LoopbackListener l;
  std::thread server([&] { AnswerMount(l, "root-handle"); });
  auto r = MountExport("127.0.0.1", l.port(), "/export", std::chrono::milliseconds(5000));
  server.join();
  ASSERT_TRUE(r.ok()) << r.error().what;
  EXPECT_EQ(*r, "root-handle");
}

// A reply with another XID answers no call of this client: it is dropped,
// and the call is still unanswered at the deadline.
TEST(MountExportTest, AnAnswerToAnotherCallIsIgnored) {
  test::LoopbackListener l;
  std::thread server([&] { AnswerMount(l, "root-handle", 1); });
  auto r = MountExport("127.0.0.1", l.port(), "/export", std::chrono::milliseconds(600));
  server.join();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().err, ETIMEDOUT) << r.error().what;
}

// MOUNT goes over the engine as any call does: a call whose reply is lost is
// retransmitted (same XID, same connection) before the deadline.
TEST(MountExportTest, ACallLeftUnansweredIsRetransmittedAndItsAnswerTaken) {
  test::LoopbackListener l;
  std::thread server([&] { AnswerMount(l, "root-handle", 0, /*ignore=*/1); });
  auto r = MountExport("127.0.0.1", l.port(), "/export", std::chrono::milliseconds(4000));
  server.join();
  ASSERT_TRUE(r.ok()) << r.error().what;
  EXPECT_EQ(*r, "root-handle");
}

// Each call counts for the statistics under its service: a MOUNT answered
// after a retransmission, then one refused.
TEST(MountExportTest, TheCallsAndHowTheyEndedAreCountedPerService) {
  ServiceCounters counters;
  test::LoopbackListener l;
  std::thread server([&] { AnswerMount(l, "root-handle", 0, /*ignore=*/1); });
  auto r = MountExport("127.0.0.1", l.port(), "/export", std::chrono::milliseconds(4000), "", &counters);
  server.join();
  ASSERT_TRUE(r.ok()) << r.error().what;
  auto s = counters.Snapshot();
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].service, "MOUNT");
  EXPECT_EQ(s[0].endpoint, "127.0.0.1:" + std::to_string(l.port()));
  EXPECT_EQ(s[0].calls.ops, 1u);
  EXPECT_EQ(s[0].calls.transmissions, 2u);
  EXPECT_EQ(s[0].calls.retransmits, 1u);
  EXPECT_EQ(s[0].calls.errors, 0u);
  EXPECT_EQ(s[0].calls.rtt.count, 1u);
  EXPECT_EQ(s[0].last_error, "");
  EXPECT_NE(s[0].last_call, std::chrono::system_clock::time_point{});

  int port;
  {
    SilentServer gone;
    port = gone.port();
  }
  r = MountExport("127.0.0.1", port, "/export", std::chrono::milliseconds(2000), "", &counters);
  ASSERT_FALSE(r.ok());
  s = counters.Snapshot();
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].endpoint, "127.0.0.1:" + std::to_string(port));
  EXPECT_EQ(s[0].calls.ops, 2u);
  EXPECT_EQ(s[0].calls.errors, 1u);
  EXPECT_EQ(s[0].last_error, r.error().what);

  // An answer that refuses: a call answered, and a refusal.
  test::LoopbackListener refusing;
  std::thread server2([&] { AnswerMount(refusing, "", 0, 0, /*MNT3ERR_ACCES*/ 13); });
  r = MountExport("127.0.0.1", refusing.port(), "/export", std::chrono::milliseconds(4000), "", &counters);
  server2.join();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().err, EACCES) << r.error().what;
  s = counters.Snapshot();
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].calls.ops, 3u);
  EXPECT_EQ(s[0].calls.errors, 1u);
  EXPECT_EQ(s[0].calls.nfs_errors, 1u);
  EXPECT_EQ(s[0].last_error, r.error().what);
}

TEST(MountExportTest, AnUnknownLocalInterfaceIsAClearError) {
  auto r = MountExport("127.0.0.1", 1, "/export", std::chrono::milliseconds(1000), "nosuchif0");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().err, ENODEV);
  EXPECT_NE(r.error().what.find("nosuchif0"), std::string::npos) << r.error().what;
}

// A connection closed before the reply is "unreachable" (the next address
// is tried), not an answer.
TEST(MountExportTest, AConnectionClosedBeforeTheReplyIsUnreachable) {
  test::LoopbackListener l;
  std::thread server([&] {
    const int fd = l.Accept();
    if (fd < 0) return;
    ReadCallXid(fd);
    close(fd);
  });
  auto r = MountExport("127.0.0.1", l.port(), "/export", std::chrono::milliseconds(5000));
  server.join();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().err, ECONNREFUSED) << r.error().what;
}

TEST(MountExportTest, RefusedConnectionIsAClearError) {
  int port;
  {
    SilentServer s;  // bound, then closed: nothing listens there any more
    port = s.port();
  }
  auto r = MountExport("127.0.0.1", port, "/export", std::chrono::milliseconds(2000));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().err, ECONNREFUSED) << r.error().what;
}

}  // namespace
}  // namespace mpnfs::nfs
