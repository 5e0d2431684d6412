// Engine: the path engine. Sends RpcCalls to one NFS server over a set of
// paths, each path one or more TCP connections.
//
// Design. The number of event-loop threads follows the cores, not the number
// of connections: each connection belongs to one loop (round robin), and a
// loop drives all of its connections with one epoll. A libnfs context is only
// ever touched by its own loop thread. Submit() may be called from any thread:
// it picks a connection (least outstanding work among the connections that
// are up) and hands the request to that connection's loop through a mailbox
// plus an eventfd wake-up. Nothing waits by polling or sleeping: loops block
// in epoll_wait until a socket, the mailbox or the nearest deadline is due.
//
// The engine owns what libnfs 4.0 cannot do safely itself:
//  - the in-flight limit per connection (excess waits in the connection's
//    queue, visible in stats);
//  - timeouts: a call unanswered after timeo is retransmitted on the same
//    connection with the same XID (the server's duplicate request cache can
//    still recognise it); after `retrans` retransmissions a hard mount logs
//    and resets the connection, a soft mount fails the call with kTimedOut;
//  - reconnect with capped exponential backoff; the calls of a broken
//    connection go back to the queue (flagged `reissued`) and are sent again
//    once a connection is up, never lost and never failed on a hard mount.
//
// Multipath. Every connection of every path is a candidate for every call.
// A call goes to the connection where it is expected to finish first: the
// bytes already outstanding there plus its own, divided by the throughput
// that connection has recently delivered (measured over busy time only, so an
// idle path is not mistaken for a slow one). Paths of different speeds are
// so kept full in proportion to their speed, and a small call lands where
// the least work is queued ahead of it. Calls stay on the connection they
// were sent on; a timeout retransmits there (duplicate request cache). Only
// a connection declared dead moves its calls elsewhere: one that has work
// outstanding, has heard nothing from the server (not even a TCP ACK, nor
// the answer to a NULL probe sent at half time) for path_timeout, while
// another connection has heard from the same server in that time. If every
// path is silent the server, not a path, is the problem: calls wait (hard)
// or time out (soft) as on one path.
//
// Statistics. Each connection counts, per NFS procedure (the call's
// Procedure()), in fixed arrays of relaxed atomics written by its loop
// thread only: no lock and no allocation per call. Stats() copies them; the
// totals of a mount are the sum over its connections (OpStats::Merge). Each
// connection also keeps its last kHistory state changes with the reason, in
// a ring under a mutex taken only when the state changes or Stats() runs.
//
// Thread safety: Submit() and Stats() are thread safe; Start()/Stop() are
// called by the owner thread only.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/cred.h"
#include "engine/latency.h"
#include "engine/request.h"
#include "engine/rpc_call.h"
#include "engine/transport.h"

namespace mpnfs::engine {

class Connection;
class Loop;

struct EngineOptions {
  std::vector<Endpoint> paths;       // at least one
  int conns_per_path = 1;
  int loops = 0;                     // 0: one per core, capped by the connection count
  int max_inflight = 128;            // per connection
  std::chrono::milliseconds timeo{60000};   // first retransmission timeout
  int retrans = 2;                   // retransmissions before a major timeout
  bool soft = false;                 // soft: fail calls after a major timeout
  std::chrono::milliseconds connect_timeout{10000};
  std::chrono::milliseconds backoff_initial{100};
  std::chrono::milliseconds backoff_max{2000};
  // Abort a connection whose sent data stays unacknowledged this long
  // (TCP_USER_TIMEOUT); detects a dead path while a slow server still ACKs.
  std::chrono::milliseconds tcp_user_timeout{15000};
  // A connection with work outstanding that hears nothing this long while
  // another path does is declared dead and its calls move (see above).
  // Zero disables this; then only TCP errors and timeo take a path out.
  std::chrono::milliseconds path_timeout{1000};
};

// One NFS procedure on one connection, or summed over several (Merge).
// Counted when: `transmissions`, `bytes_out` at each send (retransmissions
// included); `retransmits` at each timeo expiry; `rtt`, `nfs_errors`,
// `bytes_in` at the reply that completes the call; `ops`, `errors`, `exe_us`
// when the call ends on this connection (a call moved after its connection
// broke counts where it ends). Calls ended by the engine stopping are not
// counted. NULL probes of the engine itself are not calls: see `probes`.
struct OpStats {
  uint64_t ops = 0;            // calls ended: answered, failed or timed out
  uint64_t transmissions = 0;  // sends, retransmissions and resends included
  uint64_t retransmits = 0;    // sends after timeo passed with no answer
  uint64_t errors = 0;         // ended without a reply: RPC-level failure or soft timeout
  uint64_t nfs_errors = 0;     // answered with an NFS status other than NFS3_OK (ENOENT, JUKEBOX...)
  uint64_t bytes_out = 0;      // data sent (WRITE payload), per transmission
  uint64_t bytes_in = 0;       // data received (READ payload of the replies)
  uint64_t exe_us = 0;         // sum over `ops` of submit-to-end time (queueing, resends included)
  LatencySnapshot rtt;         // send to reply of the answered transmission

  void Merge(const OpStats& o) {
    ops += o.ops;
    transmissions += o.transmissions;
    retransmits += o.retransmits;
    errors += o.errors;
    nfs_errors += o.nfs_errors;
    bytes_out += o.bytes_out;
    bytes_in += o.bytes_in;
    exe_us += o.exe_us;
    rtt.Merge(o.rtt);
  }
};

// WRITE calls ended (as `ops`) and their data bytes, by stability.
struct StabilityStats {
  uint64_t ops = 0, bytes = 0;
};

// A change of a connection's state. Repeats of the same change (a path that
// keeps refusing connects) are folded into one entry: `count`, `last`.
struct StateChange {
  std::chrono::system_clock::time_point time, last;
  std::string from, to, reason;
  uint64_t count = 1;
};

struct ConnectionStats {
  std::string endpoint;
  std::string state;
  uint64_t calls = 0, replies = 0, errors = 0, retransmits = 0, reissues = 0, reconnects = 0;
  uint64_t failovers = 0;             // times declared dead while connected
  uint64_t probes = 0;                // NFS NULL probes sent
  uint64_t bytes_out = 0, bytes_in = 0;
  int64_t inflight = 0, queued = 0;
  int64_t outstanding_bytes = 0;      // queued + in flight, as weighed by the balancer
  uint64_t rate_bps = 0;              // recent throughput while busy; 0 = not measured yet
  uint64_t latency_mean_us = 0, latency_p99_us = 0;  // send to reply
  uint64_t latency_p50_us = 0;
  std::array<OpStats, kProcCount> ops{};                   // indexed by Proc
  std::array<StabilityStats, kStabilityCount> write_stability{};  // indexed by Stability
  uint64_t transitions = 0;           // state changes since the start (retries included)
  std::vector<StateChange> history;   // the last ones, oldest first
};

struct SubmitOptions {
  // Give up (kTimedOut) after this long even on a hard mount; used at mount time.
  std::optional<std::chrono::milliseconds> deadline;
};

class Engine {
 public:
  Engine(EngineOptions opts, TransportFactory factory);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Starts the loops and the first connects. REQUIRES: not started.
  void Start();
  // Stops the loops; calls not yet complete end with kShutdown, and so do
  // calls other threads submit meanwhile or later. Idempotent.
  void Stop();

  // Sends `call` with `cred`. Complete() is called exactly once, on a loop thread.
  void Submit(std::shared_ptr<RpcCall> call, const Cred& cred, SubmitOptions so = {});

  // Submit() once `delay` has passed (a server that asked to be retried later).
  void SubmitAfter(std::chrono::milliseconds delay, std::shared_ptr<RpcCall> call,
                   const Cred& cred);

  std::vector<ConnectionStats> Stats() const;
  const EngineOptions& options() const { return opts_; }

  // Connections that are up and have (almost) nothing outstanding: how many
  // ways a large request can usefully be split now. Splitting costs a copy
  // when the pieces of a read are put together, so it is done only when a
  // path would otherwise stay idle (one O_DIRECT stream, the first read of a
  // readahead burst), not when many requests already keep every path busy.
  int IdleConnections() const;

  // Engine-internal (used by Connection).
  uint32_t NextXid() { return xid_.fetch_add(1, std::memory_order_relaxed); }
  // The up connection (other than `avoid`) where a call of `cost` bytes is
  // expected to finish first; null if none is up and `avoid` is set.
  Connection* PickConnection(const Connection* avoid, int64_t cost);
  // Whether a connection other than `self` has heard from the server since `since`.
  bool AnotherHeardSince(const Connection* self, Clock::time_point since) const;
  // Asks every other up connection to send a NULL probe now.
  void ProbeOthers(const Connection* self);

 private:
  const EngineOptions opts_;
  TransportFactory factory_;
  std::vector<std::unique_ptr<Loop>> loops_;
  std::vector<std::unique_ptr<Connection>> conns_;
  std::atomic<uint32_t> xid_;
  std::atomic<uint32_t> rr_{0};
  std::atomic<bool> started_{false};
  std::atomic<bool> stopped_{false};
};

}  // namespace mpnfs::engine
