// FakeNet / FakeTransport: an in-memory engine::Transport for unit tests.
//
// The test thread scripts the "network" through FakeNet (answer or drop
// calls, reset connections, refuse connects); every change is applied on the
// engine's loop thread inside Service(), woken through an eventfd, exactly as
// a socket would wake it. Nothing sleeps or polls.
//
// Replies are matched as libnfs 4.0 matches them. Every transmission is a PDU
// of its own, kept by XID: once written it is appended to the hash chain of
// its XID (rpc_write_to_socket, lib/socket.c). The server answers a
// transmission at most once, and a reply resolves the first PDU of its XID in
// that chain, the oldest transmission still waiting, whichever one the server
// was answering (rpc_process_pdu, lib/pdu.c). So when the original of a
// retransmitted call was lost and the retransmission is answered, the
// ORIGINAL's token completes and the retransmission's stays pending. libnfs
// has no per-PDU timeout here (rpc_init_context, lib/init.c, sets the timeout
// to -1; mpnfs leaves it), so that PDU is resolved only by a later reply with
// its XID, an error of the whole context (rpc_error_all_pdus: kError) or its
// destruction (rpc_destroy_context: kCancel).
#pragma once

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "engine/transport.h"

namespace mpnfs::testing {

class FakeTransport;

class FakeNet {
 public:
  // Knobs, read under mu on the loop thread.
  bool refuse_connect = false;
  bool auto_reply = true;
  int drop_first_n = 0;  // calls whose first transmission is never answered
  // Transports created while set stay silent (no answers, no ACKs): a dead
  // path. Set by Blackhole() for the live ones.
  bool silent_new = false;
  int probes = 0;         // NULL probes issued
  std::map<std::string, int> probes_to;  // the same, by host

  Mutex mu;
  CondVar cv;
  std::vector<uint32_t> issued_xids;  // every transmission, in order
  std::vector<std::thread::id> issuing_threads;  // the thread of each, in order
  int connect_attempts = 0;
  int max_pending_seen = 0;

  void Set(const std::function<void(FakeNet&)>& fn) {
    // Poked under mu: a transport closes (and leaves live_) under mu before
    // its eventfd is closed, so none is poked once gone.
    MutexLock lock(mu);
    fn(*this);
    for (auto* t : live_) Poke(t);
  }
  // The server answers, on every live transport, every transmission it has
  // not answered yet.
  void ReplyAll();
  // Break every live connection (as a reset would).
  void ResetAll();
  // Break one live connection.
  void ResetOne();
  // Silence the live transport whose connect was the k-th (0-based) one still
  // live; returns false if there is none. Its calls are never answered and
  // SilentMs() grows from now on, as on a path whose link went down.
  bool Blackhole(size_t k);
  // The same for every live transport to `host`; false if there is none.
  bool BlackholeHost(const std::string& host);
  // Answer again (the link came back).
  void Unblackhole();
  // Waits (with a generous cap) until pred holds; returns whether it did.
  bool WaitFor(const std::function<bool(FakeNet&)>& pred, int ms = 5000) {
    MutexLock lock(mu);
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (!pred(*this)) {
      if (!cv.WaitUntil(mu, until)) return pred(*this);
    }
    return true;
  }

 private:
  friend class FakeTransport;
  void Poke(FakeTransport* t);
  std::set<FakeTransport*> live_ GUARDED_BY(mu);
  std::vector<FakeTransport*> order_ GUARDED_BY(mu);  // live transports in connect order
};

class FakeTransport final : public engine::Transport {
 public:
  FakeTransport(FakeNet* net, engine::TransportSink* sink) : net_(net), sink_(sink) {
    efd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  }
  ~FakeTransport() override {
    Close();
    close(efd_);
  }

  bool StartConnect(const engine::Endpoint& ep, std::string*) override {
    MutexLock lock(net_->mu);
    host_ = ep.host;
    net_->connect_attempts++;
    connect_result_ = !net_->refuse_connect;
    connecting_ = true;
    silent_ = net_->silent_new;
    silent_since_ = std::chrono::steady_clock::now();
    net_->live_.insert(this);
    net_->order_.push_back(this);
    net_->cv.SignalAll();
    Signal();
    return true;
  }
  int Fd() const override { return efd_; }
  int64_t SilentMs() const override {
    MutexLock lock(net_->mu);
    if (!silent_) return 0;
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::steady_clock::now() - silent_since_)
        .count();
  }
  int IssueProbe(uint32_t xid, engine::CallToken* token) override {
    {
      MutexLock lock(net_->mu);
      net_->probes++;
      net_->probes_to[host_]++;
    }
    bool answer;
    {
      MutexLock lock(net_->mu);
      answer = !silent_;
    }
    Queue(token, xid, answer);
    return 0;
  }
  int Events() const override { return 1; /* POLLIN */ }
  bool Service(int) override {
    uint64_t v;
    ssize_t n = read(efd_, &v, sizeof(v));
    (void)n;
    bool reset, reply_all, silent;
    {
      MutexLock lock(net_->mu);
      reset = reset_;
      reply_all = reply_all_;
      reset_ = reply_all_ = false;
      silent = silent_;
    }
    if (silent) return true;  // a connect hangs, calls go unanswered
    if (connecting_) {
      connecting_ = false;
      if (!connect_result_) {
        sink_->OnConnected(false, "connection refused (fake)");
        return false;
      }
      sink_->OnConnected(true, {});
    }
    if (reset) {
      auto p = std::move(pending_);
      pending_.clear();
      server_.clear();
      for (auto& c : p) sink_->OnReply(c.token, engine::ReplyStatus::kError, nullptr, "reset");
      return false;
    }
    // The server answers the transmissions it is to answer now, once each...
    std::vector<uint32_t> replies;
    for (auto it = server_.begin(); it != server_.end();) {
      if (reply_all || it->auto_answer) {
        replies.push_back(it->xid);
        it = server_.erase(it);
      } else {
        ++it;
      }
    }
    // ...and each reply resolves the oldest transmission of its XID still
    // waiting, not necessarily the one it answers (see the top of this file).
    for (uint32_t xid : replies) {
      auto it = std::find_if(pending_.begin(), pending_.end(),
                             [xid](const Pdu& c) { return c.xid == xid; });
      if (it == pending_.end()) continue;  // nobody waits: libnfs drops it
      engine::CallToken* token = it->token;
      pending_.erase(it);
      static int result = 0;
      sink_->OnReply(token, engine::ReplyStatus::kSuccess, &result, nullptr);
    }
    return true;
  }
  int Issue(const std::shared_ptr<engine::RpcCall>&, uint32_t xid, const engine::Cred&,
            engine::CallToken* token) override {
    bool answer;
    {
      MutexLock lock(net_->mu);
      net_->issued_xids.push_back(xid);
      net_->issuing_threads.push_back(std::this_thread::get_id());
      bool first = seen_.insert(xid).second;
      answer = net_->auto_reply && !silent_;
      if (first && net_->drop_first_n > 0) {
        net_->drop_first_n--;
        answer = false;
      }
      net_->max_pending_seen =
          std::max<int>(net_->max_pending_seen, static_cast<int>(pending_.size()) + 1);
      net_->cv.SignalAll();
    }
    Queue(token, xid, answer);
    return 0;
  }
  void Close() override {
    {
      MutexLock lock(net_->mu);
      net_->live_.erase(this);
      std::erase(net_->order_, this);
    }
    auto p = std::move(pending_);
    pending_.clear();
    server_.clear();
    for (auto& c : p) sink_->OnReply(c.token, engine::ReplyStatus::kCancel, nullptr, nullptr);
  }
  std::string LastError() const override { return "fake error"; }

  void Signal() {
    uint64_t one = 1;
    ssize_t n = write(efd_, &one, sizeof(one));
    (void)n;
  }

 private:
  friend class FakeNet;
  // A transmission as the client waits for it (a libnfs PDU)...
  struct Pdu {
    engine::CallToken* token;
    uint32_t xid;
  };
  // ...and as the server has it, until it answers.
  struct Received {
    uint32_t xid;
    bool auto_answer;  // answered by itself (else only by ReplyAll/Unblackhole)
  };
  void Queue(engine::CallToken* token, uint32_t xid, bool answer) {
    pending_.push_back(Pdu{token, xid});
    server_.push_back(Received{xid, answer});
    if (answer) Signal();
  }
  FakeNet* net_;
  engine::TransportSink* sink_;
  int efd_;
  bool connecting_ = false;
  bool connect_result_ = true;
  std::deque<Pdu> pending_;        // in the order sent
  std::deque<Received> server_;    // in the order sent
  std::set<uint32_t> seen_;
  bool reset_ = false;      // guarded by net_->mu
  bool silent_ = false;     // guarded by net_->mu
  std::chrono::steady_clock::time_point silent_since_;  // guarded by net_->mu
  bool reply_all_ = false;  // guarded by net_->mu
  std::string host_;        // guarded by net_->mu
};

inline void FakeNet::Poke(FakeTransport* t) { t->Signal(); }

inline void FakeNet::ReplyAll() {
  MutexLock lock(mu);
  for (auto* t : live_) {
    t->reply_all_ = true;
    t->Signal();
  }
}

inline void FakeNet::ResetOne() {
  MutexLock lock(mu);
  if (live_.empty()) return;
  FakeTransport* t = *live_.begin();
  t->reset_ = true;
  t->Signal();
}

inline bool FakeNet::Blackhole(size_t k) {
  MutexLock lock(mu);
  if (k >= order_.size()) return false;
  order_[k]->silent_ = true;
  order_[k]->silent_since_ = std::chrono::steady_clock::now();
  return true;
}

inline bool FakeNet::BlackholeHost(const std::string& host) {
  MutexLock lock(mu);
  bool any = false;
  for (auto* t : live_) {
    if (t->host_ != host) continue;
    t->silent_ = true;
    t->silent_since_ = std::chrono::steady_clock::now();
    any = true;
  }
  return any;
}

inline void FakeNet::Unblackhole() {
  MutexLock lock(mu);
  silent_new = false;
  for (auto* t : live_) {
    if (t->silent_) {
      t->silent_ = false;
      t->reply_all_ = true;  // what was sent meanwhile is answered now
      t->Signal();
    }
  }
}

inline void FakeNet::ResetAll() {
  MutexLock lock(mu);
  for (auto* t : live_) {
    t->reset_ = true;
    t->Signal();
  }
}

}  // namespace mpnfs::testing
