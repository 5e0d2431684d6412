// Engine: the path engine. Sends RpcCalls to one NFS server over a set of
// paths, each path one or more TCP connections.
//
// Design. The number of event-loop threads follows the cores, not the number
// of connections: each connection belongs to one loop (round robin), and a
// loop drives all of its connections with one epoll. A transport is only
// ever touched by one thread at a time: its loop thread, or a submitting
// thread in a direct section of that loop. Submit() may be called from any
// thread: it picks a connection (least outstanding work among the
// connections that are up); if that connection's loop is asleep, the
// submitting thread queues and sends the call itself (a direct section, see
// event_loop.h: no thread hand-off, the loop wakes only for the reply), else
// it hands the request over through a mailbox plus an eventfd wake-up. Loops
// block in epoll_wait until a socket, the mailbox or the nearest deadline is
// due; an idle loop also wakes every min(timeo, path_timeout/2) to find
// nothing to do (the price of direct sends needing no wake-up).
//
// The engine owns, above the transport (which only frames, sends and
// matches replies):
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
// A call goes to the connection whose outstanding work (bytes queued and in
// flight) would drain first: the bytes divided by the link's rate as the
// wire shows it (link_rate.h: how fast one large record crossed, never how
// much the path carried, which follows the load the balancer gives it and
// was measured to starve paths: engine.cc, Scan), or by the paths' weights
// where weight= gives them (SetWeight changes them on a live mount; mpnfsctl
// calibrate --apply sets what it measured), so that each path's queue lasts
// about as long and a slower path's is shorter. Where no rate is known
// (small calls only) every path counts the same: join the shortest queue.
// A small call lands where the least work is queued ahead of it. Calls stay on the connection they
// were sent on; a timeout retransmits there (duplicate request cache). Only
// a connection declared dead moves its calls elsewhere: one that has work
// outstanding, has heard nothing from the server (not even a TCP ACK, nor
// the answer to a NULL probe sent at half time) for path_timeout, while
// another connection has heard from the same server in that time (checked
// when the silence reaches half and all of path_timeout: silence.h; a
// server keeping the TCP window shut is slow, not silent: nfs/tcp_info.h).
// If every path is silent the server, not a path, is the problem: calls
// wait (hard) or time out (soft) as on one path.
// Calls that change the server's state and were on the wire of a lost
// connection are resent only resend_fence after it was lost (the server may
// still execute the first copy: EngineOptions::resend_fence); the others,
// and calls not yet sent, move at once.
//
// Online path maintenance. The set of paths can change while mounted
// (mpnfsctl path ...). A path is disabled (taken out of the balancing),
// enabled again, added or removed:
//  - Disable: the picker sends it no new call from the moment DisablePath()
//    returns. Calls queued on its connections (not yet sent) move to the
//    enabled paths at once, in their order (to a connection that is down if
//    no enabled one is up; they wait there as any queued call would). Calls
//    in flight on it finish there: a timeout retransmits there (same XID),
//    and if the path dies meanwhile (TCP error, path_timeout while another
//    path answers) they are rescued to the enabled paths as for any dead
//    path. No call fails because of a disable. A disabled connection sends
//    no NULL probes once idle, and one that goes down stays down quietly
//    (no reconnect attempts, no warnings) until the path is enabled.
//  - Enable: a connection of it that is up is a candidate again once it has
//    answered a NULL probe (its link may have died unseen while it was
//    disabled and idle); one that is down reconnects now (backoff reset) and
//    is used once it is up.
//  - Add: conns_per_path new connections, on the loops with the fewest
//    connections, connect and join the balancing once up.
//  - Remove: a disable, then each connection closes once nothing is in
//    flight on it any more (answered, or rescued elsewhere); the path is
//    listed as "removing" until then.
// The last usable path can be neither disabled nor removed: not the last
// enabled path, nor an enabled path that is up while every other enabled
// path is not (down, or added and still connecting).
//
// Connection set. Pickers run on any thread without a lock, so connections
// live in a fixed array of kMaxConnections atomic slots; a slot's pointer is
// published (release) after the connection is built, and a removed
// connection's slot is cleared once it has closed. A Connection object is
// never freed before the engine is destroyed (a picker may still hold a
// pointer it loaded just before the slot was cleared; a call delivered to a
// removed connection is passed on to an enabled one). So every remove costs
// the memory of its (closed) connections until unmount.
//
// Statistics. Each connection counts, per NFS procedure (the call's
// Procedure()), in fixed arrays of relaxed atomics written by its loop
// thread only: no lock and no allocation per call. Stats() copies them; the
// totals of a mount are the sum over its connections (OpStats::Merge). Each
// connection also keeps its last kHistory state changes with the reason, in
// a ring under a mutex taken only when the state changes or Stats() runs.
//
// Thread safety: Submit(), Stats(), StatsEver(), Paths() and the path operations are
// thread safe (path operations are serialised by admin_mu_, which is never
// held while waiting for a loop; a loop thread takes it only to retire a
// connection); Start()/Stop() are called by the owner thread only.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "engine/cred.h"
#include "engine/latency.h"
#include "engine/link_rate.h"
#include "engine/request.h"
#include "engine/rpc_call.h"
#include "engine/transport.h"
#include "mpnfs/result.h"

namespace mpnfs::engine {

class Connection;
class Loop;

struct EngineOptions {
  std::vector<Endpoint> paths;       // at least one
  // The paths' weights were given (weight=): the balancer divides by them.
  // Otherwise it divides by each connection's measured link rate
  // (link_rate.h) until weights are set online (SetWeight, SetWeights).
  bool weighed = false;
  int conns_per_path = 1;
  int loops = 0;                     // 0: one per core (at most kMaxPaths x conns_per_path)
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
  std::chrono::milliseconds path_timeout{400};
  // A call that changes the server's state (rpc_call.h ChangesState) and was
  // on the wire of a connection that broke or was declared dead may still
  // be executed by the server later: it is resent elsewhere no sooner than
  // this after the connection was lost, so that what the application does
  // after its answer (write the same bytes again, truncate, remove) comes
  // after such a late execution, as long as the server held the request
  // less than this. Zero resends at once.
  std::chrono::milliseconds resend_fence{2000};
  // After handling events with at most one call in flight, a loop polls
  // for this long before it sleeps (event_loop.h, "Busy polling"). Zero:
  // it sleeps at once.
  std::chrono::microseconds busy_poll{0};
  // The logger the connections log to (common/log.h).
  std::string log_layer = "engine";
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
  int64_t outstanding_bytes = 0;      // queued + in flight (the balancer divides it by the weight)
  int weight = 1;                     // its path's weight now (weight=, path weight)
  uint64_t link_rate_bps = 0;         // what its link carries (link_rate.h); 0 = unknown
  uint64_t rate_bps = 0;              // recent throughput while busy; 0 = not measured yet
  uint64_t sojourn_us = 0;            // recent mean time queued to answered, by bytes; 0 = not yet
  uint64_t latency_mean_us = 0, latency_p99_us = 0;  // send to reply
  uint64_t latency_p50_us = 0;
  std::array<OpStats, kProcCount> ops{};                   // indexed by Proc
  std::array<StabilityStats, kStabilityCount> write_stability{};  // indexed by Stability
  uint64_t transitions = 0;           // state changes since the start (retries included)
  std::vector<StateChange> history;   // the last ones, oldest first
};

// One path as `mpnfsctl path list` shows it.
struct PathInfo {
  Endpoint endpoint;
  // enabled, draining (disabled, calls still queued or in flight on it),
  // disabled, removing (removed, connections not all closed yet).
  std::string admin;
  // up (every connection), degraded (some), connecting (none up, some
  // connecting or probing), down.
  std::string state;
  int connections = 0, connections_up = 0;
  int64_t inflight = 0, queued = 0;
  uint64_t calls = 0, bytes_out = 0, bytes_in = 0;
};

struct SubmitOptions {
  // Give up (kTimedOut) after this long even on a hard mount; used at mount time.
  std::optional<std::chrono::milliseconds> deadline;
  // Pin: only the connections of the path at this endpoint (host and port)
  // may take the call (used by `mpnfsctl calibrate` to measure one path
  // alone, and by the one-call engines of nfs/mount3.h), enabled or not. A
  // pinned call is never moved to another path: while its path's
  // connection is connecting, or has not begun its first connect (an
  // engine just started, a path just added), it waits there (until
  // `deadline`, or soft timeout); if that connection is down, or goes down
  // with the call queued or in flight, the call fails at once (kTimedOut,
  // "pinned path down: " and why it went down), so it never waits for a
  // reconnect that may not come.
  // A path not on the mount fails the call with kShutdown.
  std::optional<Endpoint> path = std::nullopt;
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
  // As Stats(), and also the connections of removed paths, which Stats()
  // no longer lists (their counts are final): what a total over the
  // engine's life sums, so that it never goes down.
  std::vector<ConnectionStats> StatsEver() const;
  const EngineOptions& options() const { return opts_; }
  // Polls made busy polling (EngineOptions::busy_poll), over every loop.
  uint64_t BusyPolls() const;

  // --- online path maintenance (see the top of this file); any thread,
  // REQUIRES: started. `addr` is "HOST" or "HOST:PORT" (numeric); an error
  // says what is wrong (no such path, the last enabled one, ...). On
  // success the message says what was done.
  std::vector<PathInfo> Paths() const;
  Result<std::string> DisablePath(const std::string& addr);
  Result<std::string> EnablePath(const std::string& addr);
  // `weight_given`: ep.weight was given (path add weight=): the mount
  // balances by weights from now on, as after SetWeight().
  Result<std::string> AddPath(const Endpoint& ep, bool weight_given = false);
  Result<std::string> RemovePath(const std::string& addr);
  // The path's weight from now on (clamped to 1..kMaxWeight, as weight=):
  // new calls are balanced by it at once; calls already queued stay where
  // they are.
  Result<std::string> SetWeight(const std::string& addr, int weight);
  // Every path's weight at once: `weights` names each path of the mount
  // (HOST:PORT, in path order) with its weight. Refused, nothing set, unless
  // the mount's paths are exactly those (one added or removed meanwhile
  // would be left on another scale). One answer line per path.
  Result<std::string> SetWeights(const std::vector<std::pair<std::string, int>>& weights);
  // Most connections alive at once (and most paths, at most kMaxPaths).
  static constexpr int kMaxConnections = 256;
  static constexpr int kMaxPaths = 16;

  // Connections that are up and have (almost) nothing outstanding: how many
  // ways a large request can usefully be split now. Splitting costs a copy
  // when the pieces of a read are put together, so it is done only when a
  // path would otherwise stay idle (one O_DIRECT stream, the first read of a
  // readahead burst), not when many requests already keep every path busy.
  int IdleConnections() const;

  // Engine-internal (used by Connection).
  uint32_t NextXid() { return xid_.fetch_add(1, std::memory_order_relaxed); }
  // Bytes of a call answered on any connection (the mount's peak rate, which
  // caps the link rates: link_rate.h).
  void NoteMoved(int64_t bytes) { moved_.Add(bytes); }
  // The up connection (other than `avoid`) with the least outstanding bytes,
  // its call's `cost` included, divided by its path's weight (Scan); null if
  // none is up and `avoid` is set.
  Connection* PickConnection(const Connection* avoid, int64_t cost);
  // Whether a connection other than `self` has heard from the server since `since`.
  bool AnotherHeardSince(const Connection* self, Clock::time_point since) const;
  // Asks every other up connection to send a NULL probe now.
  void ProbeOthers(const Connection* self);
  // Where a call leaving `self` (disabled or removed) goes: the best up
  // enabled connection, else any enabled one (it waits there for the
  // reconnect); null only if no other enabled connection exists. Neither
  // picker is fooled by path operations racing its scan (admin_gen_); with
  // no `avoid`, PickConnection() returns null only if no connection exists.
  Connection* PickElsewhere(const Connection* self, int64_t cost);
  // Loop thread of `c`: a removed connection has closed; its slot is freed.
  void Retire(Connection* c);
  // A call that changes state, held back by resend_fence since its
  // connection was lost (Connection::Fail), now due (any loop thread): ends
  // kShutdown if the engine has stopped (the loops run such timed tasks as
  // they stop), kTimedOut if its deadline passed meanwhile (it is not sent
  // then), else goes to a picked connection.
  void ResendFenced(std::shared_ptr<Request> r);

 private:
  // The least loaded up connection of paths[path] (any of them if none is up).
  Connection* PickOnPath(const Endpoint& path, int64_t cost);

  const EngineOptions opts_;
  TransportFactory factory_;
  std::vector<std::unique_ptr<Loop>> loops_;
  struct PathEntry {
    Endpoint ep;
    std::vector<Connection*> conns;
    bool disabled = false;
    bool removing = false;
  };
  // One scan of the slots: the best up enabled connection other than
  // `avoid`, and in *fallback the first enabled one seen (up or not).
  Connection* Scan(const Connection* avoid, int64_t cost, Connection** fallback);
  // Delivers `r` to a picked connection; with none, retries shortly on a loop.
  void Route(std::shared_ptr<Request> r);

  template <class F>
  void ForEach(F f) const {
    const size_t n = nslots_.load(std::memory_order_acquire);
    for (size_t i = 0; i < n; ++i) {
      if (Connection* c = slots_[i].load(std::memory_order_acquire)) f(c);
    }
  }
  // REQUIRES: admin_mu_ held. The path `addr` names, or an error listing them.
  Result<PathEntry*> Find(const std::string& addr) REQUIRES(admin_mu_);
  // Find, refusing a path that is being removed.
  Result<PathEntry*> FindActive(const std::string& addr) REQUIRES(admin_mu_);
  // Sets `path`'s weight (clamped) on it and its connections; the answer line.
  std::string SetWeightLocked(PathEntry& path, int weight) REQUIRES(admin_mu_);
  int EnabledPaths() const REQUIRES(admin_mu_);
  // Why `path` (enabled) may not be taken out: it is up and no other
  // enabled path is; nullopt if it may.
  std::optional<std::string> LastUpPath(const PathEntry& path) const REQUIRES(admin_mu_);
  std::string Names() const REQUIRES(admin_mu_);
  // Builds, publishes and starts conns_per_path connections for `p`
  // (REQUIRES: started), each on the loop with the fewest connections.
  Status StartConnections(PathEntry& p) REQUIRES(admin_mu_);
  // Sets the disabled flag of every connection of `p` and has their loops
  // move what is queued on them.
  void SetDisabled(PathEntry& p, bool disabled, bool removed) REQUIRES(admin_mu_);

  // The live connection set: slots_[0, nslots_) hold connections or null
  // (a freed slot, reused by a later add).
  std::unique_ptr<std::atomic<Connection*>[]> slots_;
  std::atomic<size_t> nslots_{0};
  mutable Mutex admin_mu_;
  std::vector<std::unique_ptr<Connection>> owned_ GUARDED_BY(admin_mu_);  // all ever made
  std::vector<PathEntry> paths_ GUARDED_BY(admin_mu_);
  int next_index_ GUARDED_BY(admin_mu_) = 0;  // names connections host:port#index
  std::atomic<uint32_t> xid_;
  std::atomic<uint32_t> rr_{0};
  // Balance by weights (given, or set online) rather than link rates.
  std::atomic<bool> weighed_{false};
  MountRate moved_;
  std::atomic<bool> started_{false};
  std::atomic<bool> stopped_{false};  // written under admin_mu_
  // Bumped by every path operation after it changed connection flags.
  std::atomic<uint64_t> admin_gen_{0};
};

}  // namespace mpnfs::engine
