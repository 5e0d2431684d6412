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

// The connect or MOUNT call is still pending inside libnfs when the deadline
// passes; destroying the context then calls it back. That callback must not
// write into state that is already gone (under ASan, as the suite runs unit
// tests, a string stored there would leak).
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
