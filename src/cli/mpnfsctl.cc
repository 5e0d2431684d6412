// mpnfsctl: reads the statistics of a mounted mpnfs filesystem.
//   mpnfsctl stats MOUNTPOINT
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "cli/control.h"

int main(int argc, char** argv) {
  if (argc != 3 || std::string(argv[1]) != "stats") {
    fprintf(stderr, "usage: mpnfsctl stats MOUNTPOINT\n");
    return 1;
  }
  auto path = mpnfs::cli::ControlPathFor(argv[2]);
  if (!path) {
    fprintf(stderr, "mpnfsctl: %s\n", path.error().what.c_str());
    return 1;
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path->c_str(), sizeof(addr.sun_path) - 1);
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    fprintf(stderr, "mpnfsctl: %s: %s (is an mpnfs filesystem mounted there?)\n", path->c_str(),
            strerror(errno));
    return 1;
  }
  char buf[65536];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) fwrite(buf, 1, static_cast<size_t>(n), stdout);
  close(fd);
  return n < 0 ? 1 : 0;
}
