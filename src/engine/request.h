// Request and Attempt: the engine's bookkeeping for one call.
//
// A Request is one RpcCall plus its identity on the wire (XID, credentials)
// and its history. An Attempt is one transmission of it on one connection;
// a request has several attempts when it is retransmitted after a timeout or
// sent again after its connection broke. The first reply wins; the others
// are discarded. A reply need not come back on the Attempt of the
// transmission it answers: the transport completes the oldest transmission of the
// XID still waiting and keeps the others until another reply with that XID
// or the close. So once its request is finished an Attempt may stay with the
// transport for long; it then lets go of the request (`req` null) and no
// longer counts in flight. Both live on the loop thread of the connection
// that holds them; a Request moves between connections (and loops) only
// through a mailbox, and only with no Attempt left (`unanswered` is 0).
#pragma once

#include <chrono>
#include <list>
#include <memory>

#include "engine/cred.h"
#include "engine/rpc_call.h"
#include "engine/transport.h"

namespace mpnfs::engine {

using Clock = std::chrono::steady_clock;

class Connection;

struct Request {
  std::shared_ptr<RpcCall> call;
  Cred cred;
  uint32_t xid = 0;
  int transmissions = 0;      // on the current connection
  int unanswered = 0;         // Attempts on the current connection still holding it
  bool reissued = false;      // was in flight on a connection that broke
  bool done = false;          // Complete() has been called
  bool rescued = false;       // already collected from a closing connection
  // SubmitOptions::path: never moved to another path; fails (kTimedOut) when
  // its connection is or goes down instead.
  bool pinned = false;
  Clock::time_point give_up = Clock::time_point::max();  // soft limit / SubmitOptions
  Clock::time_point submitted{};  // for the statistics' execution time
  Proc proc = Proc::kOther;       // call->Procedure(), asked once
  // Load-balancing cost: payload bytes plus a fixed per-call overhead, and
  // the connection whose outstanding-bytes counter it is charged to.
  int64_t cost = 0;
  Connection* charged = nullptr;
  Clock::time_point charged_at{};  // when it was charged there (its sojourn starts)
};

struct Attempt : CallToken {
  // Null for a NULL probe, and once the request is finished (the transport
  // has yet to report this transmission). Counts in flight while set.
  std::shared_ptr<Request> req;
  bool probe = false;
  Clock::time_point deadline;
  Clock::time_point sent;
  bool superseded = false;    // a retransmission replaced it; it still may answer
  std::list<Attempt>::iterator self;
};

}  // namespace mpnfs::engine
