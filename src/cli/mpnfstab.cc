#include "cli/mpnfstab.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

namespace mpnfs::cli {
namespace {

// No more weights than paths (no path=: SERVER's address is the one path).
Status CheckWeights(const MountOptions& m) {
  const size_t paths = std::max<size_t>(1, m.paths.size());
  if (m.weights.size() <= paths) return Ok{};
  return Error::Errno(EINVAL, "more weight= entries (" + std::to_string(m.weights.size()) +
                                  ") than paths (" + std::to_string(paths) + ")");
}

std::string StripSlashes(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

}  // namespace

Result<std::vector<TabEntry>> ParseTab(const std::string& text, const std::string& filename) {
  std::vector<TabEntry> out;
  std::istringstream in(text);
  std::string line;
  int lineno = 0;
  auto bad = [&](const std::string& why) {
    return Error::Errno(EINVAL, filename + ":" + std::to_string(lineno) + ": " + why);
  };
  static const std::set<std::string> kKeys = {"server", "path", "local", "export", "mount",
                                              "options"};
  while (std::getline(in, line)) {
    ++lineno;
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream words(line);
    std::vector<std::pair<std::string, std::string>> kv;  // key -> value, in order
    std::string w;
    while (words >> w) {
      if (w.size() < 2 || w.back() != ':') return bad("expected 'keyword:' but found '" + w + "'");
      std::string key = w.substr(0, w.size() - 1);
      if (!kKeys.count(key)) return bad("unknown keyword '" + w + "'");
      std::string value;
      if (!(words >> value) || value.back() == ':') return bad("'" + w + "' needs a value");
      kv.emplace_back(key, value);
    }
    if (kv.empty()) continue;
    const std::string& first = kv[0].first;
    if (first == "server") {
      if (kv.size() != 1) return bad("'server:' must stand alone on its line");
      TabEntry e;
      e.server = kv[0].second;
      e.where = filename + ":" + std::to_string(lineno);
      out.push_back(std::move(e));
      continue;
    }
    if (out.empty()) return bad("'" + first + ":' before any 'server:' line");
    TabEntry& e = out.back();
    if (first == "path" || first == "local") {
      // "path: A", or "local: L path: A" (the local side of that path).
      std::string local, path;
      for (const auto& [k, v] : kv) {
        if (k == "local" && local.empty() && path.empty()) {
          local = v;
        } else if (k == "path" && path.empty()) {
          path = v;
        } else {
          return bad("expected 'path: ADDR' or 'local: ADDR path: ADDR'");
        }
      }
      if (path.empty()) return bad("'local:' must be followed by 'path:' on the same line");
      if (e.paths.size() == 8) return bad("at most 8 paths per server");
      e.paths.push_back(path);
      e.locals.push_back(local);
    } else if (first == "export") {
      if (kv.size() != 2 || kv[1].first != "mount") {
        return bad("expected 'export: /EXPORT mount: /MOUNTPOINT'");
      }
      if (kv[0].second[0] != '/' || kv[1].second[0] != '/') {
        return bad("export and mount must be absolute paths");
      }
      e.exports.push_back({StripSlashes(kv[0].second), StripSlashes(kv[1].second)});
    } else if (first == "options") {
      if (kv.size() != 1) return bad("'options:' takes one comma-separated list");
      if (!e.options.empty()) e.options += ",";
      e.options += kv[0].second;
    } else {
      return bad("'" + first + ":' cannot start a line");
    }
  }
  return out;
}

const TabEntry* FindTabEntry(const std::vector<TabEntry>& entries, const std::string& server,
                             const std::string& export_path, const std::string& mountpoint) {
  const std::string mp = StripSlashes(mountpoint);
  const std::string ex = StripSlashes(export_path);
  for (const auto& e : entries) {
    for (const auto& em : e.exports) {
      if (em.mount == mp || (em.export_path == ex && e.server == server)) return &e;
    }
  }
  return nullptr;
}

Result<std::optional<std::string>> ReadFileIfExists(const std::string& path) {
  std::ifstream f(path);
  if (!f) {
    if (errno == ENOENT) return std::optional<std::string>();
    return Error::Errno(errno, path + ": " + strerror(errno));
  }
  std::stringstream ss;
  ss << f.rdbuf();
  return std::optional<std::string>(ss.str());
}

Result<MountOptions> LoadMountOptions(const std::vector<std::string>& args,
                                      const std::string& env_tab, const std::string& etc_tab,
                                      const FileReader& read) {
  auto m = ParseMountArgs(args);
  if (!m || m->help || m->version) return m;
  struct Candidate {
    std::string path;
    const char* origin;
    bool required;
  };
  std::vector<Candidate> files;
  if (!m->tab.empty()) files.push_back({m->tab, "tab=", true});
  if (!env_tab.empty()) files.push_back({env_tab, "$MPNFS_TAB", true});
  files.push_back({etc_tab, "default", false});
  for (const auto& f : files) {
    auto text = read(f.path);
    if (!text) return text.error();
    if (!*text) {
      if (f.required) return Error::Errno(ENOENT, f.path + " (" + f.origin + "): no such file");
      continue;
    }
    auto entries = ParseTab(**text, f.path);
    if (!entries) return entries.error();
    const TabEntry* e = FindTabEntry(*entries, m->server, m->export_path, m->mountpoint);
    if (e == nullptr) continue;
    // Per-server options first, so that the command line overrides them.
    std::vector<std::string> merged;
    if (!e->options.empty()) {
      for (const char* forbidden : {"tab=", "path=", "local="}) {
        if (("," + e->options).find(std::string(",") + forbidden) != std::string::npos) {
          return Error::Errno(EINVAL, e->where + ": '" + forbidden +
                                          "' cannot be set in 'options:' (use path: and local: lines)");
        }
      }
      if (("," + e->options + ",").find(",remount,") != std::string::npos) {
        return Error::Errno(EINVAL, e->where + ": 'remount' is not an option of a server's mounts");
      }
      merged = {"-o", e->options};
    }
    merged.insert(merged.end(), args.begin(), args.end());
    auto m2 = ParseMountArgs(merged);
    if (!m2) return Error::Errno(EINVAL, e->where + ": " + m2.error().what);
    if (m2->paths.empty()) {
      m2->paths = e->paths.empty() ? std::vector<std::string>{e->server} : e->paths;
      // The entry's paths come with their local sides, unless local= was given.
      if (m2->locals.empty() && !e->paths.empty()) m2->locals = e->locals;
    }
    // The block's weight= weighs the block's paths: path= on the command
    // line replaces both, unless weight= is given there too.
    if (!m->paths.empty() && m->weights.empty()) m2->weights.clear();
    m2->tab_entry = e->where;
    if (auto bad = CheckWeights(*m2); !bad) return Error::Errno(EINVAL, e->where + ": " + bad.error().what);
    return m2;
  }
  if (auto bad = CheckWeights(*m); !bad) return bad.error();
  return m;
}

}  // namespace mpnfs::cli
