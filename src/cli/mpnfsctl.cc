// mpnfsctl: talks to a mounted mpnfs filesystem over its control socket.
//   mpnfsctl stats [--prometheus] MOUNTPOINT         statistics (JSON, or Prometheus text)
//   mpnfsctl iostat MOUNTPOINT [INTERVAL [COUNT]]    per-second rates, as nfsiostat(8)
//   mpnfsctl cache drop|detach|flush MOUNTPOINT      online cache operations (root)
//   mpnfsctl path list MOUNTPOINT                    the paths and their state
//   mpnfsctl path disable|enable|remove MOUNTPOINT ADDR
//   mpnfsctl path add MOUNTPOINT ADDR[:PORT] [local=L] [weight=W]   online path maintenance (root)
//   mpnfsctl path weight MOUNTPOINT ADDR[:PORT] W
//   mpnfsctl calibrate MOUNTPOINT [--size SIZE] [--time SECONDS] [--json] [--path ADDR] [--apply]
//                                                    measure the paths (root)
// The gateway streams its answer; "progress ..." lines are shown on a
// terminal as one line rewritten in place, and dropped otherwise.
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>

#include "cli/control.h"
#include "cli/iostat.h"

namespace {

int Usage() {
  fprintf(stderr,
          "usage: mpnfsctl stats [--prometheus] MOUNTPOINT\n"
          "       mpnfsctl iostat MOUNTPOINT [INTERVAL [COUNT]]\n"
          "       mpnfsctl cache drop|detach|flush MOUNTPOINT\n"
          "       mpnfsctl path list MOUNTPOINT\n"
          "       mpnfsctl path disable|enable|remove MOUNTPOINT ADDR[:PORT]\n"
          "       mpnfsctl path add MOUNTPOINT ADDR[:PORT] [local=IFACE|LOCALADDR] [weight=W]\n"
          "       mpnfsctl path weight MOUNTPOINT ADDR[:PORT] W\n"
          "       mpnfsctl calibrate MOUNTPOINT [--size SIZE] [--time SECONDS] [--json] [--path ADDR]\n"
          "                 [--apply]\n");
  return 1;
}

// Sends one command to the mount at `mountpoint` and returns the answer;
// prints why and returns nothing if that fails.
std::optional<std::string> Ask(const std::string& mountpoint, const std::string& cmd) {
  auto path = mpnfs::cli::ControlPathFor(mountpoint);
  if (!path) {
    fprintf(stderr, "mpnfsctl: %s\n", path.error().what.c_str());
    return std::nullopt;
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path->c_str(), sizeof(addr.sun_path) - 1);
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    fprintf(stderr, "mpnfsctl: %s: %s (is an mpnfs filesystem mounted there?)\n", path->c_str(),
            strerror(errno));
    if (fd >= 0) close(fd);
    return std::nullopt;
  }
  const std::string line = cmd + "\n";
  if (send(fd, line.data(), line.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(line.size())) {
    fprintf(stderr, "mpnfsctl: %s: %s\n", path->c_str(), strerror(errno));
    close(fd);
    return std::nullopt;
  }
  shutdown(fd, SHUT_WR);
  // Lines as they come: progress rendered in place on a terminal, the rest
  // kept; the first other line says whether it is an error.
  const bool tty = isatty(STDOUT_FILENO) != 0;
  bool progress_shown = false;
  std::string answer, pending;
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
  char buf[65536];
  ssize_t n;
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
  if (progress_shown) fputs("\r\033[K", stdout);
  if (n < 0) return std::nullopt;
  if (answer.rfind("error:", 0) == 0) {
    fprintf(stderr, "mpnfsctl: %s", answer.c_str() + 7);
    return std::nullopt;
  }
  if (answer.empty()) {
    fprintf(stderr, "mpnfsctl: no answer (the mount went away?)\n");
    return std::nullopt;
  }
  return answer;
}

bool ToNumber(const char* s, double lo, double* out) {
  char* end = nullptr;
  errno = 0;
  const double v = strtod(s, &end);
  if (errno != 0 || end == s || *end != '\0' || !std::isfinite(v) || v < lo) return false;
  *out = v;
  return true;
}

// nfsiostat's manner: no INTERVAL, one report since the mount; with one,
// a report every INTERVAL seconds (the first since the mount), COUNT times
// or until interrupted.
int Iostat(const std::string& mountpoint, double interval, long count) {
  std::optional<mpnfs::cli::IostatSample> prev;
  for (long i = 0; count <= 0 || i < count; ++i) {
    if (i > 0) {
      timespec ts{static_cast<time_t>(interval),
                  static_cast<long>((interval - std::floor(interval)) * 1e9)};
      while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
      }
    }
    auto answer = Ask(mountpoint, "stats");
    if (!answer) return 1;
    auto sample = mpnfs::cli::ParseIostatSample(*answer);
    if (!sample) {
      fprintf(stderr, "mpnfsctl: %s\n", sample.error().what.c_str());
      return 1;
    }
    const std::string report = mpnfs::cli::IostatReport(prev ? &*prev : nullptr, *sample);
    printf("%s%s", i > 0 ? "\n" : "", report.c_str());
    fflush(stdout);
    prev = std::move(sample).value();
    if (interval <= 0) break;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string cmd, mountpoint;
  const std::string verb = argc > 1 ? argv[1] : "";
  if (verb == "stats" && argc == 3) {
    cmd = "stats";
    mountpoint = argv[2];
  } else if (verb == "stats" && argc == 4 &&
             (std::string(argv[2]) == "--prometheus" || std::string(argv[3]) == "--prometheus")) {
    cmd = "stats prometheus";
    mountpoint = std::string(argv[2]) == "--prometheus" ? argv[3] : argv[2];
  } else if (verb == "iostat" && argc >= 3 && argc <= 5) {
    double interval = 0, count = 0;
    if (argc >= 4 && (!ToNumber(argv[3], 0, &interval) || interval <= 0)) {
      fprintf(stderr, "mpnfsctl: INTERVAL must be a number of seconds above 0\n");
      return Usage();
    }
    if (argc == 5 && (!ToNumber(argv[4], 1, &count) || count != std::floor(count))) {
      fprintf(stderr, "mpnfsctl: COUNT must be a whole number from 1\n");
      return Usage();
    }
    return Iostat(argv[2], interval, static_cast<long>(count));
  } else if (verb == "cache" && argc == 4) {
    const std::string op = argv[2];
    if (op != "drop" && op != "detach" && op != "flush") return Usage();
    cmd = "cache " + op;
    mountpoint = argv[3];
  } else if (verb == "calibrate" && argc >= 3) {
    cmd = "calibrate";
    mountpoint = argv[2];
    for (int i = 3; i < argc; ++i) {
      const std::string a = argv[i];
      if (a.empty() || a.find_first_of(" \t\n") != std::string::npos) return Usage();
      cmd += " " + a;
    }
  } else if (verb == "path" && argc >= 4) {
    const std::string op = argv[2];
    mountpoint = argv[3];
    const bool ok = (op == "list" && argc == 4) ||
                    ((op == "disable" || op == "enable" || op == "remove") && argc == 5) ||
                    (op == "add" && argc >= 5 && argc <= 7) || (op == "weight" && argc == 6);
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
  auto answer = Ask(mountpoint, cmd);
  if (!answer) return 1;
  fwrite(answer->data(), 1, answer->size(), stdout);
  return 0;
}
