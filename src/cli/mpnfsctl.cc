// mpnfsctl: talks to a mounted mpnfs filesystem over its control socket.
//   mpnfsctl stats MOUNTPOINT                      statistics (JSON)
//   mpnfsctl cache drop|detach|flush MOUNTPOINT    online cache operations (root)
//   mpnfsctl calibrate MOUNTPOINT [--size SIZE] [--time SECONDS] [--json] [--path ADDR]
//                                                  measure the paths (root)
// The gateway streams its answer; "progress ..." lines are shown on a
// terminal as one line rewritten in place, and dropped otherwise.
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
          "       mpnfsctl calibrate MOUNTPOINT [--size SIZE] [--time SECONDS] [--json] [--path ADDR]\n");
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
  } else if (argc >= 3 && std::string(argv[1]) == "calibrate") {
    cmd = "calibrate";
    mountpoint = argv[2];
    for (int i = 3; i < argc; ++i) {
      const std::string a = argv[i];
      if (a.empty() || a.find_first_of(" \n") != std::string::npos) return Usage();
      cmd += " " + a;
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
  // Lines as they come: progress rendered in place on a terminal, the rest
  // kept; the first other line says whether it is an error.
  const bool tty = isatty(STDOUT_FILENO) != 0;
  bool progress_shown = false;
  auto clear_progress = [&] {
    if (progress_shown) fputs("\r\033[K", stdout);
    progress_shown = false;
  };
  std::string answer, pending;
  char buf[65536];
  ssize_t n;
  auto take_line = [&](const std::string& line) {
    if (answer.empty() && line.rfind("progress ", 0) == 0) {
      if (tty) {
        printf("\r%s\033[K", mpnfs::cli::RenderProgress(line).c_str());
        fflush(stdout);
        progress_shown = true;
      }
      return;
    }
    answer += line;
  };
  while ((n = read(fd, buf, sizeof(buf))) > 0) {
    pending.append(buf, static_cast<size_t>(n));
    size_t nl;
    while ((nl = pending.find('\n')) != std::string::npos) {
      take_line(pending.substr(0, nl + 1));
      pending.erase(0, nl + 1);
    }
  }
  if (!pending.empty()) take_line(pending);
  close(fd);
  clear_progress();
  if (n < 0) return 1;
  if (answer.rfind("error:", 0) == 0) {
    fprintf(stderr, "mpnfsctl: %s", answer.c_str() + 7);
    return 1;
  }
  if (answer.empty()) {
    fprintf(stderr, "mpnfsctl: no answer (the mount went away?)\n");
    return 1;
  }
  fwrite(answer.data(), 1, answer.size(), stdout);
  return 0;
}
