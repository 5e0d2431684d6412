#include "fuse/transport.h"

#include <liburing.h>
#include <linux/fuse.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/sysinfo.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <thread>

#include "common/log.h"
#include "fuse/fuse_ops.h"
#include "fuse/ring_abi.h"
#include "fuse/ring_codec.h"

namespace mpnfs::fuse {

namespace {

// user_data of the ring's read of its wake_fd; entries are addresses, never 1.
constexpr uint64_t kWakeTag = 1;
constexpr const char* kEnableParam = "/sys/module/fuse/parameters/enable_uring";
// The kernel never sizes a ring payload below this (FUSE_MIN_READ_BUFFER).
constexpr size_t kMinPayload = 8192;

FuseTransport* Of(void* userdata) { return static_cast<FuseContext*>(userdata)->transport; }

ssize_t ReadHook(int fd, void* buf, size_t len, void* ud) { return Of(ud)->Read(fd, buf, len); }

ssize_t WritevHook(int fd, iovec* iov, int count, void* ud) {
  return Of(ud)->Writev(fd, iov, count);
}

// Keeps libfuse's splice of WRITE data from /dev/fuse, which it offers only
// when the custom I/O can splice.
ssize_t SpliceReceiveHook(int fdin, off_t* offin, int fdout, off_t* offout, size_t len,
                          unsigned int flags, void* ud) {
  return Of(ud)->SpliceReceive(fdin, offin, fdout, offout, len, flags);
}

// The kernel makes one queue per possible CPU: num_possible_cpus(), the
// number of CPUs in the mask ("0-1", "0-3,6-7", "0"), not its highest + 1.
unsigned PossibleCpus() {
  std::ifstream f("/sys/devices/system/cpu/possible");
  std::string s;
  unsigned n = 0;
  if (f >> s) {
    size_t i = 0;
    while (i < s.size()) {
      size_t comma = s.find(',', i);
      if (comma == std::string::npos) comma = s.size();
      const std::string part = s.substr(i, comma - i);
      const size_t dash = part.find('-');
      if (!part.empty() && isdigit(static_cast<unsigned char>(part[0])) != 0) {
        const unsigned lo = static_cast<unsigned>(std::stoul(part));
        const unsigned hi = dash == std::string::npos ? lo : static_cast<unsigned>(std::stoul(part.substr(dash + 1)));
        if (hi >= lo) n += hi - lo + 1;
      }
      i = comma + 1;
    }
  }
  return n > 0 ? n : static_cast<unsigned>(std::max(1, get_nprocs_conf()));
}

void* MapBytes(size_t n) {
  void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

size_t IovBytes(const iovec* iov, int count) {
  size_t n = 0;
  for (int i = 0; i < count; ++i) n += iov[i].iov_len;
  return n;
}

}  // namespace

struct FuseTransport::Entry {
  Queue* q = nullptr;
  ring_abi::ReqHeader* hdr = nullptr;  // a page of its own
  char* area = nullptr;                // kRingPrefix, then the payload
  char* payload = nullptr;
  iovec iov[2]{};
  // The ring thread's alone: set when a request arrives, quoted when its
  // reply is committed (also by the ring thread).
  uint64_t commit_id = 0;
  uint32_t last_cmd = 0;
};

struct FuseTransport::Queue {
  unsigned qid = 0;
  // Built and torn down by the owner while no ring thread runs; in between
  // the ring thread's alone, submission and completion sides both.
  io_uring ring{};
  bool ring_ok = false;
  std::vector<Entry> entries;
  int wake_fd = -1;        // eventfd: replies to commit, or stop; closed with the transport
  uint64_t wake_buf = 0;   // where the ring's read of wake_fd lands
  Mutex mu;
  std::vector<Entry*> to_commit GUARDED_BY(mu);  // replies packed by other threads
  bool wake_posted GUARDED_BY(mu) = false;
  bool stop GUARDED_BY(mu) = false;
  std::thread thread;
};

namespace {
// The queue whose ring thread this is, if any: its own replies are
// prepared on its ring directly, submitted with the rest of its batch.
thread_local void* tl_queue = nullptr;
}  // namespace

Result<Ok> FuseTransport::KernelAllows() {
  std::ifstream f(kEnableParam);
  if (!f) {
    return Error::Errno(EOPNOTSUPP, std::string("this kernel has no FUSE over io_uring (no ") +
                                        kEnableParam + ")");
  }
  char c = 'N';
  f >> c;
  if (c != 'Y' && c != 'y' && c != '1') {
    return Error::Errno(EOPNOTSUPP, std::string("FUSE over io_uring is off in this kernel (") +
                                        kEnableParam + " is N)");
  }
  return Ok{};
}

FuseTransport::FuseTransport(fuse_session* se, const Options& o) : se_(se), opts_(o) {}

std::unique_ptr<FuseTransport> FuseTransport::Install(fuse_session* se, FuseContext* ctx,
                                                      const Options& o) {
  std::unique_ptr<FuseTransport> t(new FuseTransport(se, o));
  if (o.mode == Mode::kOff) {
    t->SetWhy("fuse_uring=off");
  } else if (auto allowed = KernelAllows(); !allowed) {
    t->SetWhy(allowed.error().what);
  } else if (auto built = t->Build(); !built) {
    t->SetWhy(built.error().what);
    t->ExitRings();
  }
  static const fuse_custom_io kIo = {WritevHook, ReadHook, SpliceReceiveHook, nullptr};
  ctx->transport = t.get();
  if (fuse_session_custom_io(se, &kIo, fuse_session_fd(se)) != 0) {
    // Not reached with these arguments; the session keeps its own I/O.
    ctx->transport = nullptr;
    t->SetWhy("libfuse refused the custom I/O");
    t->Quiesce();
  }
  return t;
}

Result<Ok> FuseTransport::Build() {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  payload_cap_ = std::max(kMinPayload, (opts_.max_write + page - 1) / page * page);
  const unsigned nq = PossibleCpus();
  for (unsigned qid = 0; qid < nq; ++qid) {
    queues_.push_back(std::make_unique<Queue>());
    Queue& q = *queues_.back();
    q.qid = qid;
    q.wake_fd = eventfd(0, EFD_CLOEXEC);
    if (q.wake_fd < 0) return Error::Errno(errno, std::string("eventfd: ") + strerror(errno));
    io_uring_params p{};
    p.flags = IORING_SETUP_SQE128 | IORING_SETUP_CQSIZE;
    // At most one SQE per entry is ever waiting, plus the read of wake_fd.
    p.cq_entries = 2 * (opts_.depth + 1);
    int r = io_uring_queue_init_params(opts_.depth + 1, &q.ring, &p);
    if (r < 0) return Error::Errno(-r, std::string("io_uring_setup: ") + strerror(-r));
    q.ring_ok = true;
    int fds[1] = {fuse_session_fd(se_)};
    r = io_uring_register_files(&q.ring, fds, 1);
    if (r < 0) return Error::Errno(-r, std::string("io_uring_register_files: ") + strerror(-r));
    q.entries.resize(opts_.depth);
    for (Entry& e : q.entries) {
      e.q = &q;
      e.hdr = static_cast<ring_abi::ReqHeader*>(MapBytes(page));
      e.area = static_cast<char*>(MapBytes(kRingPrefix + payload_cap_));
      if (e.hdr == nullptr || e.area == nullptr) {
        return Error::Errno(ENOMEM, "cannot map the ring buffers");
      }
      e.payload = e.area + kRingPrefix;
      e.iov[0] = {e.hdr, sizeof(ring_abi::ReqHeader)};
      e.iov[1] = {e.payload, payload_cap_};
    }
  }
  nqueues_.store(nq, std::memory_order_relaxed);
  for (auto& q : queues_) {
    Queue* qp = q.get();
    qp->thread = std::thread([this, qp] { RunQueue(*qp); });
  }
  return Ok{};
}

void FuseTransport::ExitRings() {
  MutexLock lock(exit_mu_);
  for (auto& q : queues_) {
    if (q->thread.joinable()) q->thread.join();
    // Closing the ring cancels its commands and lets go of its reference
    // to /dev/fuse: with the last of those the kernel ends the connection.
    if (q->ring_ok) io_uring_queue_exit(&q->ring);
    q->ring_ok = false;
  }
}

FuseTransport::~FuseTransport() {
  Quiesce();
  bool registered;
  {
    MutexLock lock(start_mu_);
    registered = start_ > 0;
  }
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  for (auto& q : queues_) {
    if (q->wake_fd >= 0) close(q->wake_fd);
    // Buffers the kernel was given stay mapped: its teardown of the ring
    // runs after the ring is closed, and the process ends soon after.
    if (registered) continue;
    for (Entry& e : q->entries) {
      if (e.hdr != nullptr) munmap(e.hdr, page);
      if (e.area != nullptr) munmap(e.area, kRingPrefix + payload_cap_);
    }
  }
}

void FuseTransport::SetWhy(const std::string& why) {
  MutexLock lock(map_mu_);
  if (why_.empty()) why_ = why;
}

void FuseTransport::Start(bool rings) {
  MutexLock lock(start_mu_);
  if (start_ == 0) start_ = rings ? 1 : -1;
  start_cv_.SignalAll();
}

// Ring thread only.
void FuseTransport::Prepare(Queue& q, Entry& e, uint32_t cmd) {
  io_uring_sqe* sqe = io_uring_get_sqe(&q.ring);
  if (sqe == nullptr) {  // not reached: the ring has an SQE for every entry
    io_uring_submit(&q.ring);
    sqe = io_uring_get_sqe(&q.ring);
    if (sqe == nullptr) {
      Log("fuse")->error("io_uring queue {}: no free submission entry", q.qid);
      return;
    }
  }
  memset(sqe, 0, 2 * sizeof(io_uring_sqe));  // SQE128
  sqe->opcode = IORING_OP_URING_CMD;
  sqe->flags = IOSQE_FIXED_FILE;
  sqe->fd = 0;  // the registered /dev/fuse
  sqe->cmd_op = cmd;
  sqe->user_data = reinterpret_cast<uint64_t>(&e);
  if (cmd == ring_abi::kCmdRegister) {
    sqe->addr = reinterpret_cast<uint64_t>(e.iov);
    sqe->len = 2;
  }
  ring_abi::CmdReq req{};
  req.qid = static_cast<uint16_t>(q.qid);
  req.commit_id = cmd == ring_abi::kCmdCommitAndFetch ? e.commit_id : 0;
  memcpy(sqe->cmd, &req, sizeof(req));
  e.last_cmd = cmd;
}

// Ring thread only.
void FuseTransport::ArmWake(Queue& q) {
  io_uring_sqe* sqe = io_uring_get_sqe(&q.ring);
  if (sqe == nullptr) {
    io_uring_submit(&q.ring);
    sqe = io_uring_get_sqe(&q.ring);
    if (sqe == nullptr) return;
  }
  memset(sqe, 0, 2 * sizeof(io_uring_sqe));
  io_uring_prep_read(sqe, q.wake_fd, &q.wake_buf, sizeof(q.wake_buf), 0);
  io_uring_sqe_set_data64(sqe, kWakeTag);
}

void FuseTransport::Commit(Entry& e) {
  Queue& q = *e.q;
  if (tl_queue == &q) {  // a reply from within a handler this thread runs
    Prepare(q, e, ring_abi::kCmdCommitAndFetch);
    return;
  }
  // The kernel hands an entry's next request to the thread that issued its
  // last command, through task work that runs when that thread is not
  // asleep in the kernel: only the ring thread, which waits in io_uring
  // itself, issues them.
  bool post;
  {
    MutexLock lock(q.mu);
    q.to_commit.push_back(&e);
    post = !q.wake_posted;
    q.wake_posted = true;
  }
  if (post) {
    const uint64_t one = 1;
    if (write(q.wake_fd, &one, sizeof(one)) < 0) {
      Log("fuse")->error("io_uring queue {}: cannot wake its thread: {}", q.qid, strerror(errno));
    }
  }
}

void FuseTransport::RunQueue(Queue& q) {
  {
    MutexLock lock(start_mu_);
    while (start_ == 0) start_cv_.Wait(start_mu_);
    if (start_ < 0) return;
  }
  tl_queue = &q;
  for (Entry& e : q.entries) Prepare(q, e, ring_abi::kCmdRegister);
  ArmWake(q);
  bool stop = false;
  while (!stop) {
    const int r = io_uring_submit_and_wait(&q.ring, 1);
    if (r < 0 && r != -EINTR && r != -EAGAIN && r != -EBUSY) {
      Log("fuse")->error("io_uring queue {}: {}", q.qid, strerror(-r));
      break;
    }
    bool woken = false;
    io_uring_cqe* cqe = nullptr;
    while (io_uring_peek_cqe(&q.ring, &cqe) == 0) {
      const uint64_t tag = cqe->user_data;
      const int res = cqe->res;
      io_uring_cqe_seen(&q.ring, cqe);
      if (tag == kWakeTag) {
        woken = true;
      } else {
        OnCompletion(q, *reinterpret_cast<Entry*>(tag), res);
      }
    }
    if (woken) {
      std::vector<Entry*> batch;
      {
        MutexLock lock(q.mu);
        batch.swap(q.to_commit);
        q.wake_posted = false;
        stop = q.stop;
      }
      for (Entry* e : batch) Prepare(q, *e, ring_abi::kCmdCommitAndFetch);
      if (!stop) ArmWake(q);
    }
  }
  io_uring_submit(&q.ring);  // the last replies
  tl_queue = nullptr;
}

// Ring thread only.
void FuseTransport::OnCompletion(Queue& q, Entry& e, int res) {
  if (res == 0) {
    fuse_in_header in;
    memcpy(&in, e.hdr->in_out, sizeof(in));
    e.commit_id = e.hdr->ent_in_out.commit_id;
    auto req = ComposeRequest(*e.hdr, e.payload, payload_cap_);
    if (!req) {
      Log("fuse")->error("io_uring queue {}: a request with inconsistent lengths (opcode {}, len {}, "
                         "payload {}); answered EIO",
                         q.qid, in.opcode, in.len, e.hdr->ent_in_out.payload_sz);
      fuse_out_header out{};
      out.unique = in.unique;
      out.error = -EIO;
      iovec v{&out, sizeof(out)};
      PackReply(&v, 1, e.hdr, e.payload, payload_cap_);
      Prepare(q, e, ring_abi::kCmdCommitAndFetch);
      return;
    }
    {
      MutexLock lock(map_mu_);
      // Stopping: the request is left to the kernel, which ends it with
      // the connection.
      if (stopped_) return;
      pending_[in.unique] = &e;
    }
    ring_requests_.fetch_add(1, std::memory_order_relaxed);
    fuse_buf buf{};
    buf.size = req->size;
    buf.mem = const_cast<char*>(req->data);
    fuse_session_process_buf(se_, &buf);
    return;
  }
  if (res == -EAGAIN || res == -EINTR) {
    Prepare(q, e, e.last_cmd);
    return;
  }
  {
    MutexLock lock(map_mu_);
    if (stopped_) return;
  }
  if (e.last_cmd == ring_abi::kCmdCommitAndFetch) {
    // The commit was refused (its request already ended, the connection
    // is gone) or the fetch that follows it ended without a request: hand
    // the entry to the kernel again. A registration the kernel refuses
    // too (the connection is gone) is the entry's end.
    Prepare(q, e, ring_abi::kCmdRegister);
    return;
  }
  if (res != -ENOTCONN && res != -ECONNABORTED && res != -ECANCELED) {
    // The kernel has gone back to /dev/fuse for this connection.
    const std::string why = std::string("the kernel refused the ring's registration: ") + strerror(-res);
    Log("fuse")->warn("FUSE requests go through /dev/fuse: {}", why);
    SetWhy(why);
  }
}

ssize_t FuseTransport::Read(int fd, void* buf, size_t len) {
  const ssize_t n = ::read(fd, buf, len);
  if (n >= static_cast<ssize_t>(sizeof(fuse_in_header))) {
    device_requests_.fetch_add(1, std::memory_order_relaxed);
    fuse_in_header in;
    memcpy(&in, buf, sizeof(in));
    if (in.opcode == FUSE_INIT) {
      fuse_init_in a{};
      memcpy(&a, static_cast<char*>(buf) + sizeof(in),
             std::min(sizeof(a), static_cast<size_t>(n) - sizeof(in)));
      uint64_t flags = a.flags;
      if ((a.flags & FUSE_INIT_EXT) != 0) flags |= uint64_t{a.flags2} << 32;
      kernel_offers_.store((flags & ring_abi::kOverIoUring) != 0);
      init_unique_.store(in.unique);
    }
  }
  return n;
}

ssize_t FuseTransport::SpliceReceive(int fdin, off_t* offin, int fdout, off_t* offout, size_t len,
                                     unsigned int flags) {
  const ssize_t n = splice(fdin, offin, fdout, offout, len, flags);
  if (n > 0) device_requests_.fetch_add(1, std::memory_order_relaxed);
  return n;
}

ssize_t FuseTransport::Writev(int fd, iovec* iov, int count) {
  fuse_out_header out;
  memcpy(&out, iov[0].iov_base, sizeof(out));
  if (out.unique != 0 && rings_on_.load(std::memory_order_acquire)) {
    Entry* e = nullptr;
    bool stopped = false;
    {
      MutexLock lock(map_mu_);
      auto it = pending_.find(out.unique);
      if (it != pending_.end()) {
        e = it->second;
        pending_.erase(it);
        stopped = stopped_;
      }
    }
    // A ring's request answered after Quiesce(): its ring is closed, and the
    // kernel ends the request with the connection. Not written to /dev/fuse,
    // which does not know it, through a descriptor the unmount may have
    // closed and the number of which may be in use again.
    if (e != nullptr && stopped) return static_cast<ssize_t>(IovBytes(iov, count));
    if (e != nullptr) {
      if (!PackReply(iov, count, e->hdr, e->payload, payload_cap_)) {
        Log("fuse")->error("a reply of {} bytes does not fit the ring's {}; answered EIO",
                           IovBytes(iov, count), payload_cap_);
      }
      Commit(*e);
      return static_cast<ssize_t>(IovBytes(iov, count));
    }
  }
  if (out.unique != 0 && out.unique == init_unique_.load()) return WriteInit(fd, iov, count);
  return ::writev(fd, iov, count);
}

ssize_t FuseTransport::WriteInit(int fd, iovec* iov, int count) {
  init_unique_.store(0);
  fuse_out_header out;
  memcpy(&out, iov[0].iov_base, sizeof(out));
  std::string why;
  bool rings = nqueues_.load() > 0;
  fuse_init_out arg{};
  if (rings && !kernel_offers_.load()) {
    why = "the kernel did not offer io_uring at INIT";
    rings = false;
  }
  if (rings && (out.error != 0 || count != 2 || iov[1].iov_len != sizeof(arg))) {
    why = "libfuse's INIT reply has an unexpected shape";
    rings = false;
  }
  if (rings) {
    memcpy(&arg, iov[1].iov_base, sizeof(arg));
    if ((arg.flags & FUSE_INIT_EXT) == 0) {
      why = "libfuse's INIT reply has no flags2";
      rings = false;
    }
  }
  iovec patched[2];
  if (rings) {
    arg.flags2 |= static_cast<uint32_t>(ring_abi::kOverIoUring >> 32);
    patched[0] = iov[0];
    patched[1] = {&arg, sizeof(arg)};
    iov = patched;
  }
  // Before the reply: the kernel may route requests to the rings as soon as
  // every queue has registered, which starts only after it (Start below).
  rings_on_.store(rings, std::memory_order_release);
  const ssize_t r = ::writev(fd, iov, count);
  const int saved = errno;
  if (r < 0 && rings) {
    rings = false;
    rings_on_.store(false, std::memory_order_release);
    why = std::string("INIT reply: ") + strerror(saved);
  }
  if (rings) {
    Log("fuse")->info("FUSE requests go through io_uring: {} queues of {} entries", nqueues_.load(),
                      opts_.depth);
  } else {
    if (!why.empty()) SetWhy(why);
    Log("fuse")->info("FUSE requests go through /dev/fuse: {}", stats().why);
  }
  Start(rings);
  // Rings built but not used would keep /dev/fuse open after the session
  // closes it, and with it the connection.
  if (!rings) ExitRings();
  errno = saved;
  return r;
}

void FuseTransport::Quiesce() {
  {
    MutexLock lock(map_mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  Start(false);
  for (auto& q : queues_) {
    {
      MutexLock lock(q->mu);
      q->stop = true;
    }
    const uint64_t one = 1;
    if (q->wake_fd >= 0 && write(q->wake_fd, &one, sizeof(one)) < 0) {
      Log("fuse")->error("io_uring queue {}: cannot wake its thread: {}", q->qid, strerror(errno));
    }
  }
  ExitRings();
}

FuseTransport::Stats FuseTransport::stats() const {
  Stats s;
  {
    MutexLock lock(map_mu_);
    s.why = why_;
  }
  const bool on = rings_on_.load() && s.why.empty();
  s.transport = on ? "io_uring" : "device";
  s.queues = on ? nqueues_.load(std::memory_order_relaxed) : 0;
  s.depth = on ? opts_.depth : 0;
  s.ring_requests = ring_requests_.load(std::memory_order_relaxed);
  s.device_requests = device_requests_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace mpnfs::fuse
