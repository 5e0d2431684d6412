#include "nfs/mount3.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "test/fakes/loopback_listener.h"

namespace mpnfs::nfs {
namespace {

// A MOUNT "service" that accepts connections and never answers.
using SilentServer = test::LoopbackListener;

// The MOUNT call is still unanswered when the deadline passes: a timeout
// that says so, and nothing left behind (the suite runs this under ASan).
TEST(MountExportTest, TimeoutWithACallPendingIsCleanAndSaysSo) {
  SilentServer s;
  for (int i = 0; i < 3; ++i) {
    auto r = MountExport("127.0.0.1", s.port(), "/export", std::chrono::milliseconds(150));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().err, ETIMEDOUT) << r.error().what;
  }
}

TEST(MountExportTest, RefusedConnectionIsAClearError) {
  int port;
  {
    SilentServer s;  // bound, then closed: nothing listens there any more
    port = s.port();
  }
  auto r = MountExport("127.0.0.1", port, "/export", std::chrono::milliseconds(2000));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().err, 0);
}

}  // namespace
}  // namespace mpnfs::nfs
