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
// Thread safety: Submit() and Stats() are thread safe; Start()/Stop() are
// called by the owner thread only.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/cred.h"
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
};

struct SubmitOptions {
  // Give up (kTimedOut) after this long even on a hard mount; used at mount time.
  std::optional<std::chrono::milliseconds> deadline;
  // Pin: only the connections of paths[*path] may take the call (used by
  // `mpnfsctl calibrate` to measure one path alone). The pin chooses where
  // the call is first sent; while none of that path's connections is up the
  // call waits in the queue of one of them (hard) or times out (soft). A
  // path declared dead still moves its calls elsewhere: failover wins over
  // the pin. A path index out of range fails the call with kShutdown.
  std::optional<size_t> path = std::nullopt;
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
  // The least loaded up connection of paths[path] (any of them if none is up).
  Connection* PickOnPath(size_t path, int64_t cost);

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
