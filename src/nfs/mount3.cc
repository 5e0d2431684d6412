#include "nfs/mount3.h"

#include <cstring>
#include <exception>
#include <future>
#include <new>
#include <optional>

#include <fmt/format.h>

#include "common/log.h"
#include "engine/engine.h"
#include "engine/rpc_call.h"
#include "nfs/local_bind.h"
#include "nfs/program_call.h"
#include "nfs/rpc_transport.h"
#include "proto/mount3.h"
#include "proto/nlm4.h"
#include "proto/nsm.h"
#include "proto/rpc.h"

namespace mpnfs::nfs {
namespace {

using Clock = std::chrono::steady_clock;
using engine::CallOutcome;
using engine::CallStatus;
using Millis = std::chrono::milliseconds;

// One call to prog/vers/proc at host:port, over an engine of its own with
// one connection, made as the mount's paths make theirs (bound to `local`,
// from a reserved port when allowed; TCP_USER_TIMEOUT at the engine's
// default): retransmitted on
// that connection after a quarter of the time left, given up at the
// deadline. The errors: ECONNREFUSED (refused, or closed before the reply:
// the next address is tried), EHOSTUNREACH (no connection otherwise),
// ETIMEDOUT, EIO (an RPC-level rejection, or a reply that does not decode),
// EAGAIN (no engine could be started).
// The call and its outcome go into `counters` (if given) under `service`.
template <class Args, class Res>
Result<Res> CallOnce(const std::string& host, int port, const std::string& local, engine::RpcCall::Program p,
                     Args args, Clock::time_point deadline, const char* what, const char* service,
                     ServiceCounters* counters) {
  engine::OpStats counted;
  auto record = [&](Result<Res> r) {
    if (counters != nullptr) {
      counters->Record(service, fmt::format("{}:{}", host, port), counted, r ? std::string() : r.error().what);
    }
    return r;
  };
  const auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
  if (left <= Millis(0)) return record(Error::Errno(ETIMEDOUT, std::string("no time left to ask the ") + what));
  const engine::Endpoint ep{host, port, local, 1};
  engine::EngineOptions eo;
  eo.paths = {ep};
  eo.loops = 1;
  eo.soft = true;
  eo.timeo = std::max(Millis(100), left / 4);
  eo.retrans = 3;
  // (The call's deadline, not the connect's, ends a connection that stays
  // silent: ETIMEDOUT, as for a server that does not answer.)
  eo.connect_timeout = left + Millis(1000);
  eo.path_timeout = Millis(0);  // one path: nothing to fail over to
  eo.resend_fence = Millis(0);
  eo.log_layer = "setup";
  const int tcp_to = static_cast<int>(eo.tcp_user_timeout.count());
  struct Outcome {
    CallStatus status;
    std::string error;
    std::optional<Res> res;
  };
  std::promise<Outcome> done;
  auto outcome = done.get_future();
  auto call = std::make_shared<ProgramCall<Args, Res>>(
      what, p, std::move(args), [&done](CallStatus st, std::string_view error, const Res* res) {
        done.set_value(Outcome{st, std::string(error), res != nullptr ? std::optional<Res>(*res) : std::nullopt});
      });
  std::string state;
  std::optional<engine::Engine> eng;
  try {
    eng.emplace(eo, [tcp_to, p](engine::TransportSink* sink) {
      return std::make_unique<RpcTransport>(sink, tcp_to, engine::RpcCall::Program{p.prog, p.vers, 0});
    });
    eng->Start();
  } catch (const std::exception& e) {
    // (A loop that cannot get its epoll or eventfd, a thread that cannot
    // start: out of descriptors or threads.) Nothing was sent.
    return record(Error::Errno(EAGAIN, std::string("cannot ask the ") + what + ": " + e.what()));
  }
  engine::SubmitOptions so;
  so.deadline = left;
  so.path = ep;  // a connection that fails ends the call: the caller tries the next address
  eng->Submit(call, engine::Cred{}, so);
  outcome.wait();
  for (const auto& c : eng->Stats()) {
    state = c.state;
    for (const auto& op : c.ops) counted.Merge(op);
  }
  eng->Stop();
  eng.reset();
  auto o = outcome.get();
  Log("nfs")->debug("{} at {}:{}: {} after {} transmission(s)", what, host, port,
                    o.status == CallStatus::kOk ? "answered" : "failed (" + o.error + ")", counted.transmissions);
  switch (o.status) {
    case CallStatus::kOk:
      return record(std::move(*o.res));
    case CallStatus::kFailed:
    case CallStatus::kShutdown:
      return record(Error::Errno(EIO, std::string("the ") + what + ": " + o.error));
    case CallStatus::kTimedOut:
      break;
  }
  static constexpr std::string_view kDown = "pinned path down: ";
  if (o.error.rfind(kDown, 0) == 0) {
    // The connection failed, and the engine says how: refused, or lost
    // before the reply, is ECONNREFUSED; anything else EHOSTUNREACH.
    const std::string why = o.error.substr(kDown.size());
    const int err = why.find(std::strerror(ECONNREFUSED)) != std::string::npos || why.rfind("connection lost", 0) == 0
                        ? ECONNREFUSED
                        : EHOSTUNREACH;
    return record(Error::Errno(err, std::string("cannot reach the ") + what + ": " + why));
  }
  if (state == "connecting") {
    return record(
        Error::Errno(ETIMEDOUT, std::string("server unreachable: no connection to the ") + what + " in time"));
  }
  return record(Error::Errno(ETIMEDOUT, std::string("the ") + what + " did not answer in time" +
                                            (state == "probing" ? " (connected, but not even a NULL call was answered)"
                                                                : "")));
}

// The port `prog` (version `vers`, TCP) is registered on at `host`'s
// portmapper; ENOENT when it is not registered.
Result<int> PortOf(const std::string& host, const std::string& local, uint32_t prog, uint32_t vers,
                   Clock::time_point deadline, const char* what, ServiceCounters* counters) {
  namespace pm = proto::portmap;
  auto r = CallOnce<pm::GetportArgs, pm::GetportRes>(
      host, static_cast<int>(pm::kPort), local, {pm::kProgram, pm::kVersion, pm::kProcGetport},
      pm::GetportArgs{prog, vers, pm::kTcp, 0}, deadline, "portmapper", "PORTMAP", counters);
  if (!r) return r.error();
  if (r->port == 0 || r->port > 65535) {
    const std::string why = std::string("the server's portmapper knows no ") + what + " over TCP";
    if (counters != nullptr) counters->Refused("PORTMAP", why);
    return Error::Errno(ENOENT, why);
  }
  return static_cast<int>(r->port);
}

// This client's address toward `host` from `local`.
Result<std::string> Me(const std::string& host, const std::string& local) {
  LocalBinding b;
  if (!local.empty()) {
    auto r = ResolveLocal(local);
    if (!r) return r.error();
    b = *r;
  }
  return SourceAddress(b, host);
}

}  // namespace

Result<int> LockManagerPort(const std::string& host, std::chrono::milliseconds timeout, const std::string& local,
                            std::string* local_addr, ServiceCounters* counters) {
  if (local_addr != nullptr) {
    auto me = Me(host, local);
    if (!me) return me.error();
    *local_addr = *me;
  }
  return PortOf(host, local, proto::nlm4::kProgram, proto::nlm4::kVersion, Clock::now() + timeout,
                "lock manager (NLM v4)", counters);
}

Result<std::string> NotifyRestart(const std::string& host, int32_t state, std::chrono::milliseconds timeout,
                                  const std::string& local, ServiceCounters* counters) {
  const auto deadline = Clock::now() + timeout;
  auto me = Me(host, local);
  if (!me) return me.error();
  auto port = PortOf(host, local, proto::nsm::kProgram, proto::nsm::kVersion, deadline, "status monitor (NSM)",
                     counters);
  if (!port) return port.error();
  auto r = CallOnce<proto::nsm::StatChge, proto::nsm::Void>(
      host, *port, local, {proto::nsm::kProgram, proto::nsm::kVersion, proto::nsm::kNotify},
      proto::nsm::StatChge{*me, state}, deadline, "status monitor (NSM)", "NSM", counters);
  if (!r) return r.error();
  return *me;
}

Result<Fh> MountExport(const std::string& host, int mount_port, const std::string& export_path,
                       std::chrono::milliseconds timeout, const std::string& local, ServiceCounters* counters) {
  const auto deadline = Clock::now() + timeout;
  if (!local.empty()) {
    if (auto b = ResolveLocal(local); !b) return b.error();
  }
  if (mount_port <= 0) {
    auto port = PortOf(host, local, proto::mount3::kProgram, proto::mount3::kVersion, deadline, "MOUNT v3 service",
                       counters);
    if (!port) {
      // (Unregistered: as unreachable, so the next address is tried.)
      return port.error().err == ENOENT ? Error::Errno(ECONNREFUSED, port.error().what) : port.error();
    }
    mount_port = *port;
  }
  namespace m3 = proto::mount3;
  auto res = CallOnce<m3::MntArgs, m3::MntRes>(host, mount_port, local, {m3::kProgram, m3::kVersion, m3::kProcMnt},
                                               m3::MntArgs{export_path}, deadline, "MOUNT service", "MOUNT", counters);
  if (!res) return res.error();
  if (res->status != m3::kOk) {
    if (counters != nullptr) counters->Refused("MOUNT", m3::Explain(res->status));
    return Error::Errno(m3::ErrnoOf(res->status), m3::Explain(res->status));
  }
  return Fh(res->fh);
}

}  // namespace mpnfs::nfs
