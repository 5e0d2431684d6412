// mpnfsctl: talks to a mounted mpnfs filesystem over its control socket.
//   mpnfsctl stats MOUNTPOINT                      statistics (JSON)
//   mpnfsctl cache drop|detach|flush MOUNTPOINT    online cache operations (root)
//   mpnfsctl path list MOUNTPOINT                  the paths and their state
//   mpnfsctl path disable|enable|remove MOUNTPOINT ADDR
//   mpnfsctl path add MOUNTPOINT ADDR[:PORT] [local=L]   online path maintenance (root)
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "cli/control.h"

namespace {

int Usage() {
  fprintf(stderr,
          "usage: mpnfsctl stats MOUNTPOINT\n"
          "       mpnfsctl cache drop|detach|flush MOUNTPOINT\n"
          "       mpnfsctl path list MOUNTPOINT\n"
          "       mpnfsctl path disable|enable|remove MOUNTPOINT ADDR[:PORT]\n"
          "       mpnfsctl path add MOUNTPOINT ADDR[:PORT] [local=IFACE|LOCALADDR]\n");
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string cmd, mountpoint;
  if (argc == 3 && std::string(argv[1]) == "stats") {
    cmd = "stats";
    mountpoint = argv[2];
  } else if (argc == 4 && std::string(argv[1]) == "cache") {
    const std::string op = argv[2];
    if (op != "drop" && op != "detach" && op != "flush") return Usage();
    cmd = "cache " + op;
    mountpoint = argv[3];
  } else if (argc >= 4 && std::string(argv[1]) == "path") {
    const std::string op = argv[2];
    mountpoint = argv[3];
    const bool ok = (op == "list" && argc == 4) ||
                    ((op == "disable" || op == "enable" || op == "remove") && argc == 5) ||
                    (op == "add" && (argc == 5 || argc == 6));
    if (!ok) return Usage();
    cmd = "path " + op;
    for (int i = 4; i < argc; ++i) {
      const std::string arg = argv[i];
      // One line, words split by blanks, on the socket.
      if (arg.empty() || arg.find_first_of(" \t\n") != std::string::npos) return Usage();
      cmd += " " + arg;
    }
  } else {
    return Usage();
  }
  auto path = mpnfs::cli::ControlPathFor(mountpoint);
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
  const std::string line = cmd + "\n";
  if (send(fd, line.data(), line.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(line.size())) {
    fprintf(stderr, "mpnfsctl: %s: %s\n", path->c_str(), strerror(errno));
    return 1;
  }
  shutdown(fd, SHUT_WR);
  std::string answer;
  char buf[65536];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) answer.append(buf, static_cast<size_t>(n));
  close(fd);
  if (n < 0) return 1;
  if (answer.rfind("error:", 0) == 0) {
    fprintf(stderr, "mpnfsctl: %s", answer.c_str() + 7);
    return 1;
  }
  fwrite(answer.data(), 1, answer.size(), stdout);
  return 0;
}
