// How FUSE requests reach mpnfs and replies reach the kernel: /dev/fuse
// (libfuse's session loop) or, where the kernel offers it, FUSE over
// io_uring (ring_abi.h), which libfuse 3.14 does not know.
//
// libfuse keeps the mount, INIT, forgets, interrupts and notifications on
// /dev/fuse in either case, as the kernel requires. FuseTransport takes the
// session's device I/O (fuse_session_custom_io), which lets it:
// - see INIT and whether the kernel offers io_uring (flags2), and add the
//   flag to libfuse's INIT reply when the rings are built;
// - after that reply, register every ring entry (one queue per possible
//   CPU, as the kernel requires before it routes a request to a ring);
// - hand each request that arrives on a ring to libfuse's decoder
//   (fuse_session_process_buf) laid out as /dev/fuse would deliver it
//   (ring_codec.h), and route the reply, which libfuse writes through the
//   same hook, back into that entry with COMMIT_AND_FETCH.
// A request that came through /dev/fuse is answered there.
//
// Fallback: with fuse_uring=auto, anything that stops the rings (the kernel
// not offering them, io_uring_setup refused, registration refused) leaves
// the mount on /dev/fuse; the log and stats() say which transport is in use
// and why. With fuse_uring=on, main.cc fails the mount when the kernel does
// not allow the rings or they cannot be built; a kernel that allows them and
// then refuses them at INIT or at registration leaves the mount on
// /dev/fuse, with a warning.
//
// Threads: one ring thread per queue is the only thread that issues the
// ring's commands. The kernel hands an entry's next request to the thread
// that issued the entry's last command, through task work, which does not
// run while that thread sleeps elsewhere in the kernel (a thread waiting
// for a page lock would never receive the READ that holds it) and is lost
// if that thread exits. A reply from another thread (an engine loop thread,
// for a request that waited on the server) is packed into its entry there
// and queued for the ring thread, woken through an eventfd its ring reads;
// a reply made inside a handler the ring thread runs goes on its ring
// directly. Replies are sent in batches, one io_uring_enter a round.
//
// Handlers: the kernel may write an entry's next request into its buffers
// as soon as its reply is committed, so a handler must not touch its
// request's arguments (names, WRITE data) after replying, nor from work it
// leaves running (fuse_ops.cc copies what it keeps first). A reply through
// a ring counts as sent when queued: a commit the kernel refuses (its
// request ended, the connection gone) is not reported to the replier.
//
// Lock order: map_mu_, exit_mu_, start_mu_ and each queue's mu are leaves;
// none is held while another is taken, nor across a handler.
//
// Lifetime: Install() after fuse_session_mount and before the session loop;
// Quiesce() as soon as the session loop has returned, before the session
// closes /dev/fuse (fuse_session_unmount): the rings hold /dev/fuse open,
// and the connection lives while anything does. Requests that arrive after
// it are left to the kernel, which ends them with the connection; replies
// to ring requests after it are dropped (never written to a descriptor the
// unmount may have closed). The transport is destroyed after the session.
#pragma once

#define FUSE_USE_VERSION 314
#include <fuse_lowlevel.h>
#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "fuse/transport_stats.h"
#include "mpnfs/result.h"

namespace mpnfs::fuse {

struct FuseContext;

class FuseTransport {
 public:
  enum class Mode { kAuto, kOn, kOff };
  struct Options {
    Mode mode = Mode::kAuto;
    unsigned depth = 32;          // ring entries per queue
    size_t max_write = 1u << 20;  // the connection's, FrontOptions::max_write
  };
  using Stats = TransportStats;

  // Whether a mount made now can serve requests through io_uring: the fuse
  // module has the interface and its enable_uring parameter is set. The
  // error says why not.
  static Result<Ok> KernelAllows();

  // Takes the session's device I/O and, unless mode is kOff or the kernel
  // does not allow it, builds the rings; stats().why says why there are
  // none. Sets ctx->transport, through which the hooks find it (libfuse
  // hands them the session's userdata).
  static std::unique_ptr<FuseTransport> Install(fuse_session* se, FuseContext* ctx,
                                                const Options& o);

  ~FuseTransport();
  FuseTransport(const FuseTransport&) = delete;
  FuseTransport& operator=(const FuseTransport&) = delete;

  void Quiesce();
  Stats stats() const;

  // The custom-I/O hooks (fuse_custom_io), public for the trampolines.
  ssize_t Read(int fd, void* buf, size_t len);
  ssize_t Writev(int fd, iovec* iov, int count);
  ssize_t SpliceReceive(int fdin, off_t* offin, int fdout, off_t* offout, size_t len,
                        unsigned int flags);

 private:
  struct Entry;
  struct Queue;

  explicit FuseTransport(fuse_session* se, const Options& o);
  Result<Ok> Build();
  void ExitRings();
  void RunQueue(Queue& q);
  void Prepare(Queue& q, Entry& e, uint32_t cmd);
  void ArmWake(Queue& q);
  void Commit(Entry& e);
  void OnCompletion(Queue& q, Entry& e, int res);
  ssize_t WriteInit(int fd, iovec* iov, int count);
  void Start(bool rings);
  void SetWhy(const std::string& why);

  fuse_session* const se_;
  const Options opts_;
  size_t payload_cap_ = 0;
  // Built by Install() before any hook or ring thread runs; not resized after.
  std::vector<std::unique_ptr<Queue>> queues_;
  std::atomic<unsigned> nqueues_{0};  // queues_.size() once all are built

  mutable Mutex map_mu_;
  std::unordered_map<uint64_t, Entry*> pending_ GUARDED_BY(map_mu_);  // unique -> entry
  std::string why_ GUARDED_BY(map_mu_);
  bool stopped_ GUARDED_BY(map_mu_) = false;

  Mutex exit_mu_;  // ExitRings(): from INIT's thread (no rings) or Quiesce()

  Mutex start_mu_;
  CondVar start_cv_;
  int start_ GUARDED_BY(start_mu_) = 0;  // 0 waiting, 1 rings, -1 no rings

  std::atomic<bool> rings_on_{false};
  std::atomic<uint64_t> init_unique_{0};
  std::atomic<bool> kernel_offers_{false};
  std::atomic<uint64_t> ring_requests_{0};
  std::atomic<uint64_t> device_requests_{0};
};

}  // namespace mpnfs::fuse
