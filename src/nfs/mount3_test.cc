#include "nfs/mount3.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace mpnfs::nfs {
namespace {

// A MOUNT "service" on loopback that accepts connections and never answers.
class SilentServer {
 public:
  SilentServer() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(listen(fd_, 4), 0);
    socklen_t len = sizeof a;
    getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
  }
  ~SilentServer() { close(fd_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// The connect or MOUNT call is still pending inside libnfs when the deadline
// passes; destroying the context then calls it back. That callback must not
// write into state that is already gone (under ASan, as the suite runs unit
// tests, the string it stored there leaked before the fix).
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
