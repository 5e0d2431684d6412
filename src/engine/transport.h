// Transport: one TCP connection to an NFS server, as the engine drives it.
//
// This is the seam below the engine. The production implementation speaks
// ONC RPC over TCP itself (src/nfs/rpc_transport.h); tests plug in a fake that
// drops, delays, resets or answers calls on command, so timeouts, reconnect
// and retransmission are tested without a network.
//
// Contract: a Transport is used by exactly one loop thread. Replies, errors
// and cancellations are reported to the TransportSink given at creation, from
// inside Service() or Close(), exactly once for every Issue() that returned >= 0.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "engine/cred.h"
#include "engine/rpc_call.h"

namespace mpnfs::engine {

inline constexpr int kMaxWeight = 1000;

struct Endpoint {
  std::string host;  // numeric address
  int port = 2049;
  // Client side of the path: an interface name (the socket is bound to that
  // device) or a local address (bound to it and to the interface holding
  // it); empty: let routing choose.
  std::string local;
  // Relative throughput of the path (weight=, 1 to kMaxWeight; the engine
  // clamps it): the balancer compares outstanding bytes divided by it. Not
  // part of the path's identity; Engine::SetWeight changes it online.
  int weight = 1;
};

enum class ReplyStatus { kSuccess, kError, kCancel };

class TransportSink;

// What the engine passes with each call; the transport hands it back to
// `sink` on completion.
struct CallToken {
  TransportSink* sink = nullptr;
};

class TransportSink {
 public:
  virtual ~TransportSink() = default;
  virtual void OnConnected(bool ok, const std::string& error) = 0;
  virtual void OnReply(CallToken* token, ReplyStatus status, void* result, const char* error) = 0;
  // A measure of how fast the link carried one large record (link_rate.h),
  // from inside Service().
  virtual void OnLinkRate(uint64_t /*bytes_per_s*/) {}
};

class Transport {
 public:
  virtual ~Transport() = default;

  // Starts a non-blocking connect; OnConnected() follows from Service().
  virtual bool StartConnect(const Endpoint& ep, std::string* error) = 0;
  // The socket to watch, or -1.
  virtual int Fd() const = 0;
  // POLLIN / POLLOUT wanted now.
  virtual int Events() const = 0;
  // Processes socket events. false: the connection is broken; the caller
  // must Close() it (in-flight calls may already have been failed with kError).
  virtual bool Service(int revents) = 0;
  // Queues `call` with the given XID and credentials. < 0: not queued, no
  // callback. The transport keeps `call` until that transmission is answered
  // or cancelled (its WRITE payload is sent from the call's buffer).
  virtual int Issue(const std::shared_ptr<RpcCall>& call, uint32_t xid, const Cred& cred,
                    CallToken* token) = 0;
  // Queues an NFS NULL call (a liveness probe) with the given XID.
  virtual int IssueProbe(uint32_t xid, CallToken* token) = 0;
  // Milliseconds since the peer was last heard at the transport level (any
  // segment, including bare ACKs of our data); -1 if unknown; 0 while the
  // peer's receive window is shut and its kernel answers TCP's window
  // probes (nfs/tcp_info.h: a slow server, not a dead path).
  virtual int64_t SilentMs() const { return -1; }
  // Tears the connection down; every call still pending is reported kCancel.
  virtual void Close() = 0;
  virtual std::string LastError() const = 0;
};

using TransportFactory = std::function<std::unique_ptr<Transport>(TransportSink* sink)>;

}  // namespace mpnfs::engine
