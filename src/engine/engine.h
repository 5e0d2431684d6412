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
  std::chrono::milliseconds backoff_max{5000};
  // Abort a connection whose sent data stays unacknowledged this long
  // (TCP_USER_TIMEOUT); detects a dead path while a slow server still ACKs.
  std::chrono::milliseconds tcp_user_timeout{15000};
};

struct ConnectionStats {
  std::string endpoint;
  std::string state;
  uint64_t calls = 0, replies = 0, errors = 0, retransmits = 0, reissues = 0, reconnects = 0;
  uint64_t bytes_out = 0, bytes_in = 0;
  int64_t inflight = 0, queued = 0;
  uint64_t latency_mean_us = 0, latency_p99_us = 0;  // send to reply
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
  // Stops the loops; calls not yet complete end with kShutdown. Idempotent.
  void Stop();

  // Sends `call` with `cred`. Complete() is called exactly once, on a loop thread.
  void Submit(std::shared_ptr<RpcCall> call, const Cred& cred, SubmitOptions so = {});

  // Submit() once `delay` has passed (a server that asked to be retried later).
  void SubmitAfter(std::chrono::milliseconds delay, std::shared_ptr<RpcCall> call,
                   const Cred& cred);

  std::vector<ConnectionStats> Stats() const;
  const EngineOptions& options() const { return opts_; }

  // Engine-internal (used by Connection).
  uint32_t NextXid() { return xid_.fetch_add(1, std::memory_order_relaxed); }
  Connection* PickConnection(const Connection* avoid);

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
