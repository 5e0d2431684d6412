#include "cli/iostat.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <vector>

namespace mpnfs::cli {
namespace {

using nlohmann::json;

uint64_t U(const json& o, const char* key) {
  auto it = o.find(key);
  return it != o.end() && it->is_number_unsigned() ? it->get<uint64_t>() : 0;
}

std::map<std::string, IostatOp> Ops(const json& ops) {
  std::map<std::string, IostatOp> out;
  if (!ops.is_object()) return out;
  for (const auto& [name, o] : ops.items()) {
    IostatOp op;
    op.ops = U(o, "ops");
    op.retransmits = U(o, "retransmits");
    op.errors = U(o, "errors");
    op.nfs_errors = U(o, "nfs_errors");
    op.bytes = U(o, "bytes_out") + U(o, "bytes_in");
    op.rtt_count = U(o, "rtt_count");
    op.rtt_total_us = U(o, "rtt_total_us");
    op.exe_total_us = U(o, "exe_total_us");
    out[name] = op;
  }
  return out;
}

// READ and WRITE first, then the others by name.
bool OpOrder(const std::string& a, const std::string& b) {
  auto rank = [](const std::string& s) { return s == "READ" ? 0 : s == "WRITE" ? 1 : 2; };
  return rank(a) != rank(b) ? rank(a) < rank(b) : a < b;
}

// a - b per counter. A counter that went back (a remount between samples,
// a path removed and added again) gives 0 for the interval, never its
// cumulative value.
IostatOp Delta(const IostatOp& a, const IostatOp& b) {
  auto d = [](uint64_t x, uint64_t y) { return x >= y ? x - y : 0; };
  IostatOp r;
  r.ops = d(a.ops, b.ops);
  r.retransmits = d(a.retransmits, b.retransmits);
  r.errors = d(a.errors, b.errors);
  r.nfs_errors = d(a.nfs_errors, b.nfs_errors);
  r.bytes = d(a.bytes, b.bytes);
  r.rtt_count = d(a.rtt_count, b.rtt_count);
  r.rtt_total_us = d(a.rtt_total_us, b.rtt_total_us);
  r.exe_total_us = d(a.exe_total_us, b.exe_total_us);
  return r;
}

void Accumulate(IostatOp& sum, const IostatOp& x) {
  sum.ops += x.ops;
  sum.retransmits += x.retransmits;
  sum.errors += x.errors;
  sum.nfs_errors += x.nfs_errors;
  sum.bytes += x.bytes;
  sum.rtt_count += x.rtt_count;
  sum.rtt_total_us += x.rtt_total_us;
  sum.exe_total_us += x.exe_total_us;
}

}  // namespace

Result<IostatSample> ParseIostatSample(const std::string& text) {
  const json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object()) {
    return Error::Errno(EPROTO, "the statistics are not a JSON document");
  }
  if (!doc.contains("connections") || !doc["connections"].is_array() || !doc.contains("ops")) {
    return Error::Errno(EPROTO, "the statistics have no per-procedure counters (an older mpnfs?)");
  }
  IostatSample s;
  s.source = doc.value("source", "");
  s.mountpoint = doc.value("mountpoint", "");
  s.uptime_s = doc.value("uptime_s", 0.0);
  s.paths["all"] = Ops(doc["ops"]);
  for (const auto& c : doc["connections"]) {
    const std::string ep = c.value("endpoint", "?");
    s.paths[ep] = Ops(c.contains("ops") ? c["ops"] : json::object());
    s.states[ep] = c.value("state", "?");
  }
  return s;
}

std::string IostatReport(const IostatSample* prev, const IostatSample& cur) {
  const double dt = prev != nullptr ? cur.uptime_s - prev->uptime_s : cur.uptime_s;
  std::string out = fmt::format("{} mounted on {} ({} {:.2f} s):\n", cur.source, cur.mountpoint,
                                prev != nullptr ? "over" : "since the mount,", dt);
  // Paths: the totals, then each connection.
  std::vector<std::string> order = {"all"};
  size_t width = 8;
  for (const auto& [p, ops] : cur.paths) {
    if (p != "all") order.push_back(p);
  }
  std::vector<std::string> shown;
  for (const auto& p : order) {
    auto st = cur.states.find(p);
    shown.push_back(st == cur.states.end() ? p : p + " (" + st->second + ")");
    width = std::max(width, shown.back().size() + 2);
  }
  out += fmt::format("{:<{}}{:<13}{:>10}{:>11}{:>9}{:>9}{:>8}{:>9}{:>14}{:>14}\n", "path", width,
                     "op", "ops/s", "kB/s", "kB/op", "retrans", "errors", "nfs_err", "avg RTT (ms)",
                     "avg exe (ms)");
  const double per = dt > 0 ? 1.0 / dt : 0.0;
  for (size_t i = 0; i < order.size(); ++i) {
    // What happened over the interval, per procedure. "all" is the sum of
    // the connections' own deltas (the totals of a document are over the
    // connections that exist then, so they fall when one is removed).
    std::map<std::string, IostatOp> delta;
    if (prev == nullptr) {
      delta = cur.paths.at(order[i]);
    } else if (order[i] == "all") {
      for (const auto& [p, ops] : cur.paths) {
        if (p == "all") continue;
        auto it = prev->paths.find(p);  // a new connection counts from 0
        for (const auto& [name, op] : ops) {
          IostatOp b;
          if (it != prev->paths.end()) {
            if (auto o = it->second.find(name); o != it->second.end()) b = o->second;
          }
          Accumulate(delta[name], Delta(op, b));
        }
      }
    } else {
      auto it = prev->paths.find(order[i]);
      for (const auto& [name, op] : cur.paths.at(order[i])) {
        IostatOp b;
        if (it != prev->paths.end()) {
          if (auto o = it->second.find(name); o != it->second.end()) b = o->second;
        }
        delta[name] = Delta(op, b);
      }
    }
    std::vector<std::string> names = {"READ", "WRITE"};
    for (const auto& [name, op] : delta) {
      if (name != "READ" && name != "WRITE" && op.ops > 0) names.push_back(name);
    }
    std::sort(names.begin(), names.end(), OpOrder);
    for (const auto& name : names) {
      IostatOp a;
      if (auto it = delta.find(name); it != delta.end()) a = it->second;
      out += fmt::format(
          "{:<{}}{:<13}{:>10.2f}{:>11.2f}{:>9.2f}{:>9}{:>8}{:>9}{:>14.3f}{:>14.3f}\n", shown[i],
          width, name, static_cast<double>(a.ops) * per,
          static_cast<double>(a.bytes) / 1024.0 * per,
          a.ops == 0 ? 0.0 : static_cast<double>(a.bytes) / 1024.0 / static_cast<double>(a.ops),
          a.retransmits, a.errors, a.nfs_errors,
          a.rtt_count == 0 ? 0.0
                           : static_cast<double>(a.rtt_total_us) / 1000.0 /
                                 static_cast<double>(a.rtt_count),
          a.ops == 0 ? 0.0
                     : static_cast<double>(a.exe_total_us) / 1000.0 / static_cast<double>(a.ops));
    }
  }
  return out;
}

}  // namespace mpnfs::cli
