#include "fuse/proc_groups.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <string>

namespace mpnfs::fuse {

std::vector<gid_t> ParseStatusGroups(std::string_view status) {
  std::vector<gid_t> out;
  constexpr std::string_view kKey = "\nGroups:";
  const size_t at = status.find(kKey);
  if (at == std::string_view::npos) return out;
  std::string_view rest = status.substr(at + kKey.size());
  rest = rest.substr(0, rest.find('\n'));
  while (!rest.empty()) {
    const size_t start = rest.find_first_not_of(" \t");
    if (start == std::string_view::npos) break;
    rest.remove_prefix(start);
    gid_t g = 0;
    const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), g);
    if (ec != std::errc()) break;
    out.push_back(g);
    rest.remove_prefix(static_cast<size_t>(end - rest.data()));
  }
  return out;
}

bool ReadGroups(pid_t pid, std::vector<gid_t>* groups) {
  const std::string path =
      "/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/status";
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  std::string text;
  char buf[4096];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      close(fd);
      if (n < 0) return false;
      break;
    }
    text.append(buf, static_cast<size_t>(n));
  }
  *groups = ParseStatusGroups(text);
  return true;
}

}  // namespace mpnfs::fuse
