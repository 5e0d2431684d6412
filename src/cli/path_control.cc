#include "cli/path_control.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>

#include <sstream>
#include <vector>

#include "cli/options.h"
#include "common/log.h"
#include "nfs/local_bind.h"

namespace mpnfs::cli {

namespace {

const char* const kUsage =
    "error: usage: path list | path disable ADDR | path enable ADDR | "
    "path add ADDR[:PORT] [local=IFACE|LOCALADDR] [weight=W] | path remove ADDR | "
    "path weight ADDR W\n";

std::string Refuse(const std::string& why) { return "error: " + why + "\n"; }

// A host name or numeric IPv4 address -> the numeric address.
Result<std::string> Resolve(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr) {
    return Error::Errno(EHOSTUNREACH, "cannot resolve '" + host + "': " + gai_strerror(rc));
  }
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, buf, sizeof(buf));
  freeaddrinfo(res);
  return std::string(buf);
}

// "path add ADDR[:PORT] [local=L] [weight=W]" -> the endpoint, the port
// defaulting to the mount's (port=).
// `*weight_given`: whether weight= was among the words.
Result<engine::Endpoint> ParseAdd(const std::vector<std::string>& words, int default_port, bool* weight_given) {
  if (words.size() < 3 || words.size() > 5) return Error::Errno(EINVAL, "");
  engine::Endpoint ep;
  std::string host = words[2];
  ep.port = default_port;
  if (auto colon = host.rfind(':'); colon != std::string::npos) {
    const std::string port = host.substr(colon + 1);
    host = host.substr(0, colon);
    char* end = nullptr;
    const long v = strtol(port.c_str(), &end, 10);
    if (port.empty() || *end != '\0' || v < 1 || v > 65535) {
      return Error::Errno(EINVAL, "bad port '" + port + "' (1 to 65535)");
    }
    ep.port = static_cast<int>(v);
  }
  if (host.empty()) return Error::Errno(EINVAL, "");
  auto addr = Resolve(host);
  if (!addr) return addr.error();
  ep.host = *addr;
  bool have_local = false, have_weight = false;
  for (size_t i = 3; i < words.size(); ++i) {
    const std::string& w = words[i];
    if (w.rfind("local=", 0) == 0 && w.size() > 6 && !have_local) {
      have_local = true;
      ep.local = w.substr(6);
      // Checked now, as at mount time: a typo is an error, not a path that
      // never comes up.
      if (auto b = nfs::ResolveLocal(ep.local); !b) return b.error();
    } else if (w.rfind("weight=", 0) == 0 && !have_weight) {
      have_weight = true;
      const std::optional<int> v = ParseWeight(w.substr(7));
      if (!v) return Error::Errno(EINVAL, fmt::format("bad weight '{}' (1 to {})", w.substr(7), engine::kMaxWeight));
      ep.weight = *v;
    } else {
      return Error::Errno(EINVAL, "");
    }
  }
  *weight_given = have_weight;
  return ep;
}

// "HOST[:PORT]" of disable/enable/remove: HOST resolved as for add (a
// name that does not resolve is passed on as is: the engine's error then
// lists the paths).
std::string Target(const std::string& word) {
  std::string host = word, port;
  if (auto colon = word.rfind(':'); colon != std::string::npos) {
    host = word.substr(0, colon);
    port = word.substr(colon);
  }
  if (host.empty()) return word;
  auto addr = Resolve(host);
  return addr ? *addr + port : word;
}

}  // namespace

std::string PathTable(const std::vector<engine::PathInfo>& paths) {
  std::string out =
      fmt::format("{:<22} {:<9} {:<10} {:>5} {:>3} {:>8} {:>6} {:>10} {:>14} {:>14} {:>6} {}\n", "PATH",
                  "ADMIN", "STATE", "CONNS", "UP", "INFLIGHT", "QUEUED", "CALLS", "BYTES_OUT",
                  "BYTES_IN", "WEIGHT", "LOCAL");
  for (const auto& p : paths) {
    out += fmt::format("{:<22} {:<9} {:<10} {:>5} {:>3} {:>8} {:>6} {:>10} {:>14} {:>14} {:>6} {}\n",
                       fmt::format("{}:{}", p.endpoint.host, p.endpoint.port), p.admin, p.state,
                       p.connections, p.connections_up, p.inflight, p.queued, p.calls,
                       p.bytes_out, p.bytes_in, p.endpoint.weight,
                       p.endpoint.local.empty() ? "-" : p.endpoint.local);
  }
  return out;
}

std::string PathCommand(const std::string& cmd, bool privileged, engine::Engine& eng) {
  std::vector<std::string> words;
  {
    std::istringstream in(cmd);
    for (std::string w; in >> w;) words.push_back(w);
  }
  if (words.size() < 2) return kUsage;
  const std::string& op = words[1];
  if (op == "list") {
    if (words.size() != 2) return kUsage;
    return PathTable(eng.Paths());
  }
  if (op != "disable" && op != "enable" && op != "add" && op != "remove" && op != "weight") {
    return kUsage;
  }
  if (!privileged) return Refuse("only root may change the paths of a mount");
  Result<std::string> r = std::string();
  if (op == "add") {
    const int port = eng.options().paths.empty() ? 2049 : eng.options().paths.front().port;
    bool weight_given = false;
    auto ep = ParseAdd(words, port, &weight_given);
    if (!ep) return ep.error().what.empty() ? kUsage : Refuse("path add: " + ep.error().what);
    r = eng.AddPath(*ep, weight_given);
  } else if (op == "weight") {
    if (words.size() != 4) return kUsage;
    const std::optional<int> w = ParseWeight(words[3]);
    if (!w) {
      return Refuse(fmt::format("path weight: bad weight '{}' (1 to {})", words[3], engine::kMaxWeight));
    }
    r = eng.SetWeight(Target(words[2]), *w);
  } else {
    if (words.size() != 3) return kUsage;
    const std::string target = Target(words[2]);
    r = op == "disable" ? eng.DisablePath(target)
        : op == "enable" ? eng.EnablePath(target)
                         : eng.RemovePath(target);
  }
  if (!r) return Refuse(r.error().what);
  Log("mount")->info("{} ({})", cmd, r.value().substr(0, r.value().find('\n')));
  return r.value();
}

}  // namespace mpnfs::cli
