#include "nfs/rpc_transport.h"

#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "engine/link_rate.h"
#include "nfs/local_bind.h"
#include "nfs/tcp_info.h"
#include "proto/nfs3.h"
#include "proto/rpc.h"

namespace mpnfs::nfs {
namespace {

constexpr uint32_t kLastFragment = 0x80000000u;
// The RPC header with AUTH_SYS (at most 16 groups and a short machine name)
// plus any NFSv3 arguments other than WRITE data (a SYMLINK's target path
// is the largest) fit in this.
constexpr size_t kScratch = 16 * 1024;
// Iovecs per sendmsg: 3 per record.
constexpr int kMaxIov = 48;
constexpr char kZeros[4] = {0, 0, 0, 0};

uint32_t Load32(const char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return ntohl(v);
}

void Store32(char* p, uint32_t v) {
  v = htonl(v);
  std::memcpy(p, &v, 4);
}

}  // namespace

RpcTransport::RpcTransport(engine::TransportSink* sink, int tcp_user_timeout_ms, engine::RpcCall::Program probe)
    : sink_(sink),
      probe_(probe),
      tcp_user_timeout_ms_(tcp_user_timeout_ms),
      scratch_(kScratch),
      bulk_(new char[kBulk]) {}

RpcTransport::~RpcTransport() { Close(); }

bool RpcTransport::StartConnect(const engine::Endpoint& ep, std::string* error) {
  LocalBinding b;
  if (!ep.local.empty()) {
    auto r = ResolveLocal(ep.local);
    if (!r) {
      *error = last_error_ = r.error().what;
      return false;
    }
    b = *r;
  }
  Result<int> fd = ConnectFrom(b, ep.host, ep.port);
  if (!fd) {
    *error = last_error_ = fd.error().what;
    return false;
  }
  fd_ = *fd;
  connecting_ = true;
  int one = 1;
  setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (tcp_user_timeout_ms_ > 0) {
    unsigned int t = static_cast<unsigned int>(tcp_user_timeout_ms_);
    setsockopt(fd_, IPPROTO_TCP, TCP_USER_TIMEOUT, &t, sizeof(t));
    setsockopt(fd_, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    int idle = std::max(1, tcp_user_timeout_ms_ / 3000);
    setsockopt(fd_, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    setsockopt(fd_, IPPROTO_TCP, TCP_KEEPINTVL, &idle, sizeof(idle));
  }
  return true;
}

int RpcTransport::Events() const {
  if (fd_ < 0) return 0;
  if (connecting_) return POLLOUT;
  return POLLIN | (out_.empty() ? 0 : POLLOUT);
}

int RpcTransport::Issue(const std::shared_ptr<engine::RpcCall>& call, uint32_t xid,
                        const engine::Cred& cred, engine::CallToken* token) {
  if (auto p = call->OtherProgram()) return Queue(xid, *p, call, cred, token);
  const int proc = static_cast<int>(call->Procedure());
  if (call->Procedure() == engine::Proc::kOther || proc < 0) {
    last_error_ = std::string("not an NFSv3 procedure: ") + call->Name();
    return -1;
  }
  return Queue(xid, {proto::nfs3::kProgram, proto::nfs3::kVersion, static_cast<uint32_t>(proc)}, call, cred,
               token);
}

int RpcTransport::IssueProbe(uint32_t xid, engine::CallToken* token) {
  // The credentials of the last call (root's before any): NULL takes any.
  return Queue(xid, {probe_.prog, probe_.vers, 0}, nullptr, cred_, token);
}

int RpcTransport::Queue(uint32_t xid, engine::RpcCall::Program p, const std::shared_ptr<engine::RpcCall>& call,
                        const engine::Cred& cred, engine::CallToken* token) {
  if (fd_ < 0) {
    last_error_ = "not connected";
    return -1;
  }
  cred_ = cred;
  proto::CallHeader h;
  h.xid = xid;
  h.prog = p.prog;
  h.vers = p.vers;
  h.proc = p.proc;
  h.cred.machine = "mpnfs";
  h.cred.uid = cred.uid;
  h.cred.gid = cred.gid;
  h.cred.groups.assign(cred.groups.begin(),
                       cred.groups.begin() + static_cast<ptrdiff_t>(std::min(cred.groups.size(), engine::Cred::kMaxGroups)));
  proto::XdrOut x(std::span<char>(scratch_.data() + 4, scratch_.size() - 4));  // (after the record mark)
  bool ok = proto::Xdr(x, h);
  if (ok && call != nullptr) ok = call->EncodeArgs(x);
  const std::span<const char> payload = call != nullptr ? call->Payload() : std::span<const char>();
  if (!ok) {
    last_error_ = fmt::format("cannot encode the arguments of {}", call ? call->Name() : "NULL");
    return -1;
  }
  Out o;
  o.head_len = static_cast<uint32_t>(4 + x.size());
  o.payload = payload;
  o.call = call;
  o.pad = static_cast<uint32_t>((4 - payload.size() % 4) % 4);
  const size_t body = o.size() - 4;
  if (body > kMaxRecord) {
    last_error_ = fmt::format("{} of {} bytes is too large", call->Name(), body);
    return -1;
  }
  Store32(scratch_.data(), kLastFragment | static_cast<uint32_t>(body));
  o.head.reset(new char[o.head_len]);
  std::memcpy(o.head.get(), scratch_.data(), o.head_len);
  out_.push_back(std::move(o));
  const bool after_idle = waiting_.empty() && (idle_since_ == std::chrono::steady_clock::time_point{} ||
                                               std::chrono::steady_clock::now() - idle_since_ >= kIdleRestart);
  waiting_.emplace(xid, Waiting{token, call, seq_++, after_idle});
  return 0;
}

bool RpcTransport::Service(int revents) {
  if (fd_ < 0) return false;
  if (connecting_) {
    if ((revents & (POLLOUT | POLLERR | POLLHUP)) == 0) return true;
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err == EINPROGRESS || err == EALREADY) return true;
    if (err == 0 && (revents & (POLLERR | POLLHUP)) != 0) err = ECONNRESET;
    connecting_ = false;
    if (err != 0) {
      last_error_ = std::string("connect: ") + strerror(err);
      sink_->OnConnected(false, last_error_);
      return false;
    }
    sink_->OnConnected(true, {});
    return Flush();
  }
  if ((revents & (POLLIN | POLLERR | POLLHUP)) != 0 && !Receive()) return false;
  // Also without POLLOUT: a call queued since the last poll goes out now
  // (the queue-depth-1 path calls Service(POLLOUT) right after Issue()).
  return Flush();
}

bool RpcTransport::Flush() {
  while (!out_.empty()) {
    iovec iov[kMaxIov];
    int n = 0;
    for (auto it = out_.begin(); it != out_.end() && n + 3 <= kMaxIov; ++it) {
      size_t skip = it->sent;
      auto add = [&](const char* p, size_t len) {
        if (skip >= len) {
          skip -= len;
          return;
        }
        iov[n].iov_base = const_cast<char*>(p + skip);
        iov[n].iov_len = len - skip;
        ++n;
        skip = 0;
      };
      add(it->head.get(), it->head_len);
      add(it->payload.data(), it->payload.size());
      add(kZeros, it->pad);
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n);
    const ssize_t sent = sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return true;
      return Broken(std::string("send: ") + strerror(errno));
    }
    if (sent == 0) return Broken("send: nothing sent");
    size_t left = static_cast<size_t>(sent);
    while (left > 0) {
      Out& o = out_.front();
      const size_t take = std::min(left, o.size() - o.sent);
      o.sent += take;
      left -= take;
      if (o.sent == o.size()) out_.pop_front();
    }
  }
  return true;
}

ssize_t RpcTransport::RecvSome(char* p, size_t n) {
  for (;;) {
    const ssize_t got = recv(fd_, p, n, MSG_DONTWAIT);
    if (got > 0) return got;
    if (got == 0) return Broken("the server closed the connection") ? 0 : -1;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    return Broken(std::string("recv: ") + strerror(errno)) ? 0 : -1;
  }
}

bool RpcTransport::Receive() {
  // Bounded, so that one busy connection cannot hold a loop shared with
  // others; polling is level-triggered, what is left is read next round.
  for (int round = 0; round < 64; ++round) {
    if (frag_left_ > 0) {
      // The rest of a large fragment, read where it belongs.
      const ssize_t n = RecvSome(rec_.get() + rec_len_, frag_left_);
      if (n <= 0) return n == 0;
      rec_len_ += static_cast<size_t>(n);
      frag_left_ -= static_cast<size_t>(n);
      if (frag_len_ >= engine::LinkRate::kMinRecord) TimeFragment();
      if (frag_left_ > 0) continue;
      size_t unused = 0;
      if (!Consume(nullptr, 0, &unused)) return false;
      continue;
    }
    if (bulk_pos_ == bulk_end_) {
      bulk_pos_ = bulk_end_ = 0;
    } else if (kBulk - bulk_end_ < kBulk / 4) {
      std::memmove(bulk_.get(), bulk_.get() + bulk_pos_, bulk_end_ - bulk_pos_);
      bulk_end_ -= bulk_pos_;
      bulk_pos_ = 0;
    }
    const size_t room = kBulk - bulk_end_;
    const ssize_t n = RecvSome(bulk_.get() + bulk_end_, room);
    if (n <= 0) return n == 0;
    bulk_end_ += static_cast<size_t>(n);
    size_t used = 0;
    const bool ok = Consume(bulk_.get() + bulk_pos_, bulk_end_ - bulk_pos_, &used);
    bulk_pos_ += used;
    if (!ok || fd_ < 0) return false;
    // A short read drained the socket.
    if (static_cast<size_t>(n) < room && frag_left_ == 0) return true;
  }
  return true;
}

// Called with new bytes from the bulk buffer, or (p == nullptr) when the
// fragment being read into rec_ is complete. Dispatches every complete
// record; starts reading a fragment into rec_ when one is too large for the
// bulk buffer or belongs to a record of several fragments.
bool RpcTransport::Consume(const char* p, size_t n, size_t* used) {
  *used = 0;
  if (p == nullptr) {
    // rec_ now holds the whole fragment.
    if (!frag_last_) {
      assembling_ = true;
      return true;
    }
    assembling_ = false;
    const size_t len = rec_len_;
    rec_len_ = 0;
    return Dispatch(rec_.get(), len);
  }
  while (n - *used >= 4) {
    const char* at = p + *used;
    const uint32_t mark = Load32(at);
    const bool last = (mark & kLastFragment) != 0;
    const size_t len = mark & ~kLastFragment;
    if (len > kMaxRecord || rec_len_ + len > kMaxRecord) {
      return Broken(
          fmt::format("a reply record of {} bytes (more than {})", rec_len_ + len, kMaxRecord));
    }
    const size_t avail = n - *used - 4;
    if (!assembling_ && last) {
      if (avail >= len) {
        // Decoded where it landed.
        *used += 4 + len;
        if (!Dispatch(const_cast<char*>(at + 4), len)) return false;
        if (fd_ < 0) return false;
        continue;
      }
      if (4 + len <= kBulk / 2) return true;  // small: wait for the rest in the bulk buffer
    }
    // Into rec_: what is here now, the rest by Receive() reading into rec_.
    if (rec_cap_ < rec_len_ + len) {
      const size_t cap = std::max(rec_len_ + len, std::min(2 * rec_cap_, kMaxRecord));
      std::unique_ptr<char[]> bigger(new char[cap]);
      if (rec_len_ > 0) std::memcpy(bigger.get(), rec_.get(), rec_len_);
      rec_ = std::move(bigger);
      rec_cap_ = cap;
    }
    const size_t take = std::min(avail, len);
    if (take > 0) std::memcpy(rec_.get() + rec_len_, at + 4, take);
    rec_len_ += take;
    *used += 4 + take;
    frag_last_ = last;
    frag_left_ = len - take;
    frag_len_ = len;
    half_got_ = 0;
    if (frag_left_ > 0) return true;
    size_t unused = 0;
    if (!Consume(nullptr, 0, &unused)) return false;
  }
  return true;
}

void RpcTransport::TimeFragment() {
  const size_t got = frag_len_ - frag_left_;
  const auto now = std::chrono::steady_clock::now();
  if (half_got_ == 0) {
    if (got >= frag_len_ / 2 && frag_left_ > 0) {
      half_got_ = got;
      half_at_ = now;
    }
    return;
  }
  if (frag_left_ > 0) return;
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(now - half_at_).count();
  const size_t bytes = frag_len_ - half_got_;
  // (A short tail can arrive in one burst: no time to measure.)
  if (ns >= 100'000 && bytes >= frag_len_ / 4) {
    timed_rate_ = static_cast<uint64_t>(static_cast<double>(bytes) * 1e9 / static_cast<double>(ns));
  }
}

bool RpcTransport::Dispatch(char* rec, size_t len) {
  const uint64_t timed = std::exchange(timed_rate_, 0);
  proto::XdrIn x(std::span<const char>(rec, len));
  // The XID, message type and reply status first: a record that is not an
  // RPC reply breaks the stream; one that is can fail its call alone.
  uint32_t xid = 0, type = 0, stat = 0;
  if (!x.U32(xid) || !x.U32(type) || type != proto::kMsgReply || !x.U32(stat) ||
      (stat != proto::kMsgAccepted && stat != proto::kMsgDenied)) {
    return Broken("the server sent something that is not an RPC reply");
  }
  auto [lo, hi] = waiting_.equal_range(xid);
  if (lo == hi) return true;  // nothing waits for it (a second answer to a retransmission)
  auto oldest = lo;
  for (auto it = lo; it != hi; ++it) {
    if (it->second.seq < oldest->second.seq) oldest = it;
  }
  const Waiting w = std::move(oldest->second);
  waiting_.erase(oldest);
  if (waiting_.empty()) idle_since_ = std::chrono::steady_clock::now();
  const char* name = w.call != nullptr ? w.call->Name() : "NULL";
  proto::XdrIn hx(std::span<const char>(rec, len));
  proto::ReplyHeader h;
  std::string err;
  void* result = nullptr;
  if (!proto::Xdr(hx, h)) {
    err = fmt::format("RPC: the reply to {} is truncated or malformed", name);
  } else if (!h.accepted || h.accept != proto::AcceptStat::kSuccess) {
    err = fmt::format("RPC: {} ({})", proto::Describe(h), name);
  } else if (w.call != nullptr) {
    if (w.call->DecodeResult(hx, result_)) {
      result = result_;
    } else {
      err = fmt::format("RPC: the reply to {} does not decode", name);
    }
  }
  if (err.empty() && !w.after_idle) {
    if (timed > 0) {
      sink_->OnLinkRate(timed);
    } else if (w.call != nullptr && w.call->BytesOut() >= engine::LinkRate::kMinRecord) {
      if (const uint64_t rate = TcpDeliveryRate(fd_); rate > 0) sink_->OnLinkRate(rate);
    }
  }
  if (err.empty()) {
    sink_->OnReply(w.token, engine::ReplyStatus::kSuccess, result, nullptr);
    if (result != nullptr) w.call->DestroyResult(result);
  } else {
    sink_->OnReply(w.token, engine::ReplyStatus::kError, nullptr, err.c_str());
  }
  return true;
}

bool RpcTransport::Broken(std::string why) {
  last_error_ = std::move(why);
  return false;
}

int64_t RpcTransport::SilentMs() const { return fd_ < 0 ? -1 : TcpSilentMs(fd_); }

void RpcTransport::Close() {
  if (fd_ >= 0) {
    // Aborted, not closed: a graceful close leaves the kernel retransmitting
    // what the socket still holds (for up to tcp_timeout), so a call the
    // engine has given up on and resends elsewhere could still reach the
    // server after the resend, once the link is back. A reset drops it.
    const linger abort_on_close{1, 0};
    setsockopt(fd_, SOL_SOCKET, SO_LINGER, &abort_on_close, sizeof(abort_on_close));
    close(fd_);
    fd_ = -1;
  }
  connecting_ = false;
  out_.clear();
  bulk_pos_ = bulk_end_ = 0;
  rec_len_ = frag_left_ = 0;
  assembling_ = false;
  // Every call still outstanding ends kCancel, in the order it was issued
  // (the engine resends rescued calls in that order).
  std::vector<Waiting> cancelled;
  cancelled.reserve(waiting_.size());
  for (auto& [xid, w] : waiting_) cancelled.push_back(std::move(w));
  waiting_.clear();
  std::sort(cancelled.begin(), cancelled.end(),
            [](const Waiting& a, const Waiting& b) { return a.seq < b.seq; });
  for (const Waiting& w : cancelled) {
    sink_->OnReply(w.token, engine::ReplyStatus::kCancel, nullptr, nullptr);
  }
}

}  // namespace mpnfs::nfs
