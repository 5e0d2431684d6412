// RpcTransport: engine::Transport speaking ONC RPC (RFC 5531) over one TCP
// connection, for NFSv3 calls (and those of another program that name it:
// RpcCall::OtherProgram, the lock manager's).
//
// A call is framed (record mark, RPC
// header, AUTH_SYS credentials: proto/rpc.h) and its arguments encoded by
// the call itself (RpcCall::EncodeArgs, proto/nfs3.h), into a small header;
// a WRITE's data follows it straight from the call's buffer, both handed to
// the socket in one sendmsg (scatter-gather: no copy in user space). Replies
// are decoded by the call too (RpcCall::DecodeResult), where they were
// received: a READ's data is not copied again after the socket read, but
// for the first part of a large reply (what a bulk read brought with it, at
// most kBulk).
//
// Framing: several queued records go out per sendmsg. Replies are read in
// bulk (one recv may carry many small ones, decoded in place; an incomplete
// one of at most kBulk / 2 waits there for its rest, moved to the front when
// room runs out). A larger incomplete record, or one in several fragments,
// is assembled in a buffer of its own that is reused, the rest of it read
// straight into that buffer. Records above kMaxRecord break the connection
// (a corrupt record mark must not allocate gigabytes).
//
// Replies are matched by XID; a retransmission on the same connection reuses
// its XID, so one XID may be outstanding several times: a reply completes the
// oldest. A reply for an XID not outstanding is dropped. A reply that does
// not decode, or an RPC-level rejection (MSG_DENIED, PROG_UNAVAIL, ...),
// fails that call only (ReplyStatus::kError); a byte stream that is not RPC
// replies breaks the connection.
//
// Every length in a reply is bounded before use (the codecs: proto/xdr.h),
// record marks included (kMaxRecord).
//
// Connect: a non-blocking socket from ConnectFrom() (local_bind.h: bound to
// the path's interface or address when given, from a reserved port when
// allowed), TCP_NODELAY, and TCP_USER_TIMEOUT plus keepalive when asked.
// Close() resets the connection (SO_LINGER 0), see there.
//
// Service() reads only when told POLLIN (or an error): the engine's direct
// sections (event_loop.h) call Service(POLLOUT) to write, and must not
// complete replies on the submitting thread.
//
// Link rate (engine/link_rate.h): a READ reply of at least
// LinkRate::kMinRecord gives a sample, the bytes of its second half over the
// time they took to arrive (its first half may ride on a shaper's burst
// allowance or on queues that emptied while the path idled; its second half
// comes at the rate the path sustains), if at least a quarter of the
// record and 100 us are left to time. A WRITE of that size gives the
// kernel's delivery rate when its reply arrives (tcp_info.h), unless the
// kernel marked it limited by the application. A call sent after the
// connection idled kIdleRestart gives none (Waiting::after_idle).
//
// Thread safety: used by one loop thread at a time, like every Transport.
// The sink's callbacks run inside Service() and Close(); they may Issue()
// new calls (queued, sent by the next Service()) but must not Close() or
// destroy the transport.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/transport.h"
#include "proto/rpc.h"

namespace mpnfs::nfs {

class RpcTransport final : public engine::Transport {
 public:
  // Bulk receive buffer; records that fit are decoded where they landed.
  static constexpr size_t kBulk = 64 * 1024;
  // The largest reply record accepted: a 1 MiB READ plus headers, with room.
  static constexpr size_t kMaxRecord = 4u << 20;

  // `probe`: the program the engine's NULL probes go to (NFSv3 by default;
  // a transport to the lock manager probes NLM).
  RpcTransport(engine::TransportSink* sink, int tcp_user_timeout_ms,
               engine::RpcCall::Program probe = {100003, 3, 0});
  ~RpcTransport() override;
  RpcTransport(const RpcTransport&) = delete;
  RpcTransport& operator=(const RpcTransport&) = delete;

  bool StartConnect(const engine::Endpoint& ep, std::string* error) override;
  int Fd() const override { return fd_; }
  int Events() const override;
  bool Service(int revents) override;
  int Issue(const std::shared_ptr<engine::RpcCall>& call, uint32_t xid, const engine::Cred& cred,
            engine::CallToken* token) override;
  int IssueProbe(uint32_t xid, engine::CallToken* token) override;
  int64_t SilentMs() const override;
  void Close() override;
  std::string LastError() const override { return last_error_; }

 private:
  // One call record on its way out: `head` (record mark, RPC header,
  // credentials, arguments), then `payload` and `pad` zero bytes.
  struct Out {
    std::unique_ptr<char[]> head;
    uint32_t head_len = 0;
    uint32_t pad = 0;
    std::span<const char> payload;  // in `call`'s buffer, which `call` keeps alive
    std::shared_ptr<engine::RpcCall> call;
    size_t sent = 0;  // bytes of the record written so far
    size_t size() const { return head_len + payload.size() + pad; }
  };
  // A call sent and not answered; call == nullptr: the NULL probe.
  struct Waiting {
    engine::CallToken* token;
    std::shared_ptr<engine::RpcCall> call;
    uint64_t seq;  // issue order: the oldest of one XID is answered first
    // Sent after the connection had nothing outstanding for kIdleRestart:
    // TCP may have shrunk its window meanwhile (slow start after idle), so
    // its reply's timing says how long the connection idled, not what the
    // link carries; no link rate from it.
    bool after_idle = false;
  };
  static constexpr std::chrono::milliseconds kIdleRestart{200};

  int Queue(uint32_t xid, engine::RpcCall::Program p, const std::shared_ptr<engine::RpcCall>& call,
            const engine::Cred& cred, engine::CallToken* token);
  bool Flush();
  bool Receive();
  // recv() without blocking, EINTR retried: > 0 bytes read; 0 nothing to
  // read now; -1 the connection is broken (LastError() says why).
  ssize_t RecvSome(char* p, size_t n);
  // Takes the bytes [p, p + n) of the stream; false: the stream is broken.
  bool Consume(const char* p, size_t n, size_t* used);
  bool Dispatch(char* rec, size_t len);
  // After a read into rec_ of a fragment of at least LinkRate::kMinRecord:
  // marks where its second half began; once it is whole, the sink's sample.
  void TimeFragment();
  bool Broken(std::string why);

  engine::TransportSink* const sink_;
  const engine::RpcCall::Program probe_;
  const int tcp_user_timeout_ms_;
  int fd_ = -1;
  bool connecting_ = false;
  std::string last_error_;

  engine::Cred cred_;  // of the last call (the NULL probe goes with it)
  std::vector<char> scratch_;  // where a header is encoded before it gets its own buffer
  // Where a reply's result is decoded (RpcCall::DecodeResult).
  alignas(std::max_align_t) char result_[engine::kMaxResultSize];

  std::deque<Out> out_;
  std::unordered_multimap<uint32_t, Waiting> waiting_;
  uint64_t seq_ = 0;

  std::unique_ptr<char[]> bulk_;  // kBulk bytes; [bulk_pos_, bulk_end_) not yet taken
  size_t bulk_pos_ = 0, bulk_end_ = 0;
  // The record being assembled outside the bulk buffer.
  std::unique_ptr<char[]> rec_;
  size_t rec_cap_ = 0, rec_len_ = 0;
  bool assembling_ = false;  // rec_ holds the first fragments of a record
  size_t frag_left_ = 0;     // bytes of the current fragment still to read into rec_
  bool frag_last_ = false;   // the current fragment ends its record
  // Timing of a large fragment read into rec_, for the sink's link rate:
  // its length, and when and after how many of its bytes its second half
  // began to arrive (0 bytes: not yet).
  size_t frag_len_ = 0;
  size_t half_got_ = 0;
  std::chrono::steady_clock::time_point half_at_{};
  uint64_t timed_rate_ = 0;  // the rate of the record just read, for Dispatch(); 0: none
  // When the last outstanding call was answered (waiting_ became empty).
  std::chrono::steady_clock::time_point idle_since_{};
};

}  // namespace mpnfs::nfs
