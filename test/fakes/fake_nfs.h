// FakeNfs: an in-memory NFSv3 server behind the nfs::Client interface, for
// unit tests of the filesystem layer (fs::Filesystem) without a network.
//
// The model
//   Server state: nodes (regular files, directories, symlinks, devices,
//   sockets, fifos) named by opaque handles ("fh:<fileid>"; the root's from
//   root()), with type, mode, uid, gid, nlink, size, fileid and a fake clock
//   for atime/mtime/ctime that advances one microsecond per change. A
//   directory's entries keep the READDIR cookie given at insertion, so a
//   listing resumed at a cookie survives removals; "." and ".." come first
//   (cookies 1 and 2) as real servers send them. A node whose last name goes
//   is deleted: its handle answers ESTALE from then on.
//   Permissions are checked against the call's Cred as a Linux server does
//   (owner/group/other mode bits, uid 0 may do everything except execute a
//   file with no x bit; the owner may READ/WRITE regardless of the bits;
//   a write by someone other than the owner clears setuid/setgid).
//   Errors are Error::Errno(errno, "PROC: NFS3ERR_...") as Nfs3 gives them.
//
//   Stability: each regular file has a current content (what READ sees) and
//   a stable content (what survives a restart). An UNSTABLE WRITE changes
//   the current content only and answers stable=false with the server's
//   write verifier; a FILE_SYNC WRITE changes both and answers stable=true;
//   COMMIT copies current to stable. SETATTR of the size applies to both (a
//   truncate is a metadata operation the server makes durable at once).
//   Restart() is a server reboot: every file's current content becomes its
//   stable content (UNSTABLE data is lost) and the write verifier changes;
//   the namespace and attributes survive.
//
//   Retransmissions: when a reply is dropped (drop_prob) the call has already
//   changed the server state and is executed once more later, as a resend
//   the server's duplicate request cache missed; only the second reply is
//   delivered. The second execution of a non-idempotent call gets Nfs3's
//   "reissued" rules (the one table in nfs/reissue.h), since Nfs3 is what
//   this fake stands in for: REMOVE/RMDIR/RENAME ENOENT are success, LINK
//   EEXIST is success when the name holds the linked file, MKDIR, SYMLINK,
//   MKNOD and GUARDED CREATE EEXIST answer with the existing object.
//
// Threads
//   Nothing executes on the caller's thread. Every call is queued; one
//   dispatcher thread owned by the fake picks queued calls, executes them
//   against the server state and runs their callbacks, one call at a time.
//   Callbacks may issue new calls (they are queued). A call counts as
//   executing until its callback has returned. Every callback runs exactly
//   once. All public methods are thread safe; Quiesce, WaitPending and
//   StepOne wait for the dispatcher and must not be called from a callback.
//
// Knobs (any time, from any thread)
//   Seed(s)            reseeds the PRNG behind every random choice below.
//   set_reorder(b)     pick a random queued call (among those whose delay has
//                      passed) instead of the oldest: replies in any order,
//                      as several connections give them.
//   set_max_delay_us   each call (and each retransmission) waits a random
//                      0..max microseconds after it is queued before it may
//                      execute: network and server latency.
//   set_drop_prob(p)   probability that an executed call's reply is lost and
//                      the call runs again later (see Retransmissions); a
//                      call loses at most one reply, so with p = 1 every
//                      call executes exactly twice.
//   set_wcc_before(b)  pre-operation attributes in WCC data (default on;
//                      NFS-Ganesha sends none: turn off to model it).
//   set_parallelism(n) what Parallelism() answers (idle connections; the
//                      filesystem splits large reads and writes by it).
//   set_write_max(n)   a WRITE stores at most n bytes and answers that count
//                      (a short write, which the client must complete); 0: off.
//   set_dir_page_entries(n)  entries per READDIR(PLUS) page at most (0: as
//                      many as the call's byte count allows).
//   Pause()/Resume()   hold every call in the queue / let them go. While
//                      paused, StepOne() executes one (the one the policy
//                      would pick, or the index-th queued), ignoring delays.
//   FailNext(proc, errno, count)  the next `count` executions of `proc`
//                      answer that errno and change nothing (ENOSPC, EIO...).
//
// Observation
//   Contents(fh), StableContents(fh), Attributes(fh), FhOf("dir/file"),
//   stats() (calls per procedure at arrival, executions, dropped replies,
//   FILE_SYNC and UNSTABLE WRITEs, COMMITs), History() (the last
//   history_limit calls with their Cred, at arrival), Queued(), Pending(),
//   overlap_violations(): WRITEs that arrived while another WRITE to the
//   same file with an overlapping byte range was still unanswered (queued,
//   executing, or dropped and waiting for its retransmission) -- the
//   "never two overlapping WRITEs in flight" rule of fs/write_order.h.
//
// Shutdown
//   The destructor fails every call still queued with EIO without executing
//   it (as Nfs3 does when the engine shuts down), including calls those
//   callbacks issue, then stops the dispatcher; it prints a warning when it
//   had to. Callbacks of the filesystem layer usually reference the
//   Filesystem, so a test must Quiesce() before destroying the Filesystem,
//   which must go before the fake.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "nfs/client.h"

namespace mpnfs::testing {

class FakeNfs : public nfs::Client {
 public:
  enum class Proc {
    kGetattr, kSetattr, kLookup, kAccess, kReadlink, kRead, kWrite, kCommit, kCreate,
    kMkdir, kSymlink, kMknod, kRemove, kRmdir, kRename, kLink, kReaddir, kReaddirplus,
    kFsstat, kCount
  };
  static const char* ProcName(Proc p);

  // One call as it arrived (History) or waits (Queued).
  struct CallRecord {
    uint64_t seq = 0;  // arrival order, from 1
    Proc proc = Proc::kGetattr;
    nfs::Fh fh;        // the object, or the directory for name operations
    std::string name;  // name operations: the name (RENAME: the source name)
    uint64_t off = 0, len = 0;  // READ, WRITE
    bool stable = false;        // WRITE: FILE_SYNC
    nfs::Cred cred;
  };

  struct Stats {
    std::array<uint64_t, static_cast<size_t>(Proc::kCount)> calls{};  // at arrival
    uint64_t executions = 0;      // incl. re-executions of dropped calls
    uint64_t dropped_replies = 0;
    uint64_t writes_file_sync = 0, writes_unstable = 0;  // at arrival
    uint64_t commits = 0;                                 // at arrival
    uint64_t injected_failures = 0;
    uint64_t Calls(Proc p) const { return calls[static_cast<size_t>(p)]; }
  };

  FakeNfs();
  ~FakeNfs() override;
  FakeNfs(const FakeNfs&) = delete;
  FakeNfs& operator=(const FakeNfs&) = delete;

  const nfs::Fh& root() const { return root_; }

  // ---- knobs ----
  void Seed(uint64_t s);
  void set_reorder(bool on);
  void set_max_delay_us(uint64_t us);
  void set_drop_prob(double p);
  void set_wcc_before(bool on);
  void set_parallelism(int n);
  void set_write_max(size_t n);
  void set_dir_page_entries(size_t n);
  void set_history_limit(size_t n);
  // GETATTR answers ESTALE to every user but `uid`, as knfsd does with
  // subtree_check for a user who cannot search the file's directories.
  void set_stale_to_others(std::optional<uint32_t> uid);
  // Every call naming a handle answers ESTALE, the root's too (a server
  // whose exports are not loaded yet, or a failover in progress).
  void set_all_stale(bool on);
  void Pause();
  void Resume();
  // While paused: executes one queued call on the dispatcher and returns
  // after its callback did (or after its reply was dropped). `index` picks
  // the index-th queued call (Queued() order); without it the policy picks.
  // False if nothing is queued (or the index is out of range).
  bool StepOne(std::optional<size_t> index = std::nullopt);
  void FailNext(Proc proc, int err, int count = 1);
  // Server reboot: UNSTABLE data lost, new write verifier.
  void Restart();

  // ---- waiting ----
  size_t Pending() const;  // queued, not executing (paused or delayed)
  // Until at least n calls are queued; false on timeout.
  bool WaitPending(size_t n, std::chrono::milliseconds timeout = std::chrono::seconds(10));
  // Until nothing is queued or executing; false on timeout (e.g. paused with
  // calls queued).
  bool Quiesce(std::chrono::milliseconds timeout = std::chrono::seconds(30));

  // ---- observation ----
  std::string Contents(const nfs::Fh& fh) const;        // "" for an unknown handle
  std::string StableContents(const nfs::Fh& fh) const;  // "" for an unknown handle
  std::optional<nfs::Attr> Attributes(const nfs::Fh& fh) const;
  std::optional<nfs::Fh> FhOf(const std::string& path) const;  // "a/b" from the root
  uint64_t write_verifier() const;
  Stats stats() const;
  std::vector<CallRecord> History() const;
  std::vector<CallRecord> Queued() const;
  uint64_t overlap_violations() const;

  // ---- nfs::Client ----
  int Parallelism() const override;
  void Getattr(const nfs::Fh& fh, const nfs::Cred& c, nfs::Cb<nfs::Attr> cb) override;
  void Setattr(const nfs::Fh& fh, const nfs::SetAttr& sa, const nfs::Cred& c,
               nfs::Cb<nfs::Wcc> cb) override;
  void Lookup(const nfs::Fh& dir, const std::string& name, const nfs::Cred& c,
              nfs::Cb<nfs::LookupReply> cb) override;
  void Access(const nfs::Fh& fh, uint32_t mask, const nfs::Cred& c,
              nfs::Cb<nfs::AccessReply> cb) override;
  void Readlink(const nfs::Fh& fh, const nfs::Cred& c, nfs::Cb<std::string> cb) override;
  void Read(const nfs::Fh& fh, uint64_t off, uint32_t count, const nfs::Cred& c,
            nfs::Cb<nfs::ReadReply> cb) override;
  void Write(const nfs::Fh& fh, uint64_t off, nfs::Buffer buf, size_t buf_off, size_t len,
             bool stable, const nfs::Cred& c, nfs::Cb<nfs::WriteReply> cb) override;
  void Commit(const nfs::Fh& fh, const nfs::Cred& c, nfs::Cb<nfs::CommitReply> cb) override;
  void Create(const nfs::Fh& dir, const std::string& name, nfs::CreateMode mode,
              const nfs::SetAttr& sa, uint64_t verf, const nfs::Cred& c,
              nfs::Cb<nfs::NewObject> cb) override;
  void Mkdir(const nfs::Fh& dir, const std::string& name, const nfs::SetAttr& sa,
             const nfs::Cred& c, nfs::Cb<nfs::NewObject> cb) override;
  void Symlink(const nfs::Fh& dir, const std::string& name, const std::string& target,
               const nfs::SetAttr& sa, const nfs::Cred& c, nfs::Cb<nfs::NewObject> cb) override;
  void Mknod(const nfs::Fh& dir, const std::string& name, nfs::Ftype type, const nfs::SetAttr& sa,
             uint32_t major, uint32_t minor, const nfs::Cred& c,
             nfs::Cb<nfs::NewObject> cb) override;
  void Remove(const nfs::Fh& dir, const std::string& name, const nfs::Cred& c,
              nfs::Cb<nfs::Wcc> cb) override;
  void Rmdir(const nfs::Fh& dir, const std::string& name, const nfs::Cred& c,
             nfs::Cb<nfs::Wcc> cb) override;
  void Rename(const nfs::Fh& from_dir, const std::string& from, const nfs::Fh& to_dir,
              const std::string& to, const nfs::Cred& c, nfs::Cb<nfs::RenameReply> cb) override;
  void Link(const nfs::Fh& fh, const nfs::Fh& dir, const std::string& name, const nfs::Cred& c,
            nfs::Cb<nfs::LinkReply> cb) override;
  void Readdir(const nfs::Fh& dir, uint64_t cookie, uint64_t verf, uint32_t count,
               const nfs::Cred& c, nfs::Cb<nfs::DirPage> cb) override;
  void Readdirplus(const nfs::Fh& dir, uint64_t cookie, uint64_t verf, uint32_t dircount,
                   uint32_t maxcount, const nfs::Cred& c, nfs::Cb<nfs::DirPage> cb) override;
  void Fsstat(const nfs::Fh& fh, const nfs::Cred& c, nfs::Cb<nfs::FsStat> cb) override;

 private:
  struct Entry {
    std::string name;
    nfs::Fh fh;
  };
  struct Node {
    nfs::Fh fh;
    nfs::Attr attr;           // size is kept equal to current.size() for files
    std::string current;      // regular files: what READ sees
    std::string stable;       // regular files: what survives Restart()
    std::string target;       // symlinks
    std::optional<uint64_t> excl_verf;  // EXCLUSIVE CREATE verifier until a SETATTR
    // Directories: entries by cookie, cookie by name, the parent's handle.
    std::map<uint64_t, Entry> entries;
    std::map<std::string, uint64_t> cookie_of;
    uint64_t next_cookie = 3;
    nfs::Fh parent;
  };
  // A queued call. `run` executes it against the server state (under mu_)
  // and returns its reply, which the dispatcher delivers without the lock;
  // `fail` builds an error reply instead of executing.
  using Reply = std::function<void()>;
  struct Call {
    CallRecord rec;
    std::function<Reply(bool reissued)> run;
    std::function<Reply(int err)> fail;
    std::chrono::steady_clock::time_point not_before;
    int executions = 0;
  };
  struct ReadData {  // READ's reply before it becomes a ReadReply (which points into it)
    std::string data;
    bool eof = false;
    std::optional<nfs::Attr> attr;
  };

  template <class T>
  void Submit(CallRecord rec, nfs::Cb<T> cb, std::function<Result<T>(bool reissued)> op);
  void Enqueue(std::shared_ptr<Call> call) REQUIRES(mu_);
  std::chrono::steady_clock::time_point NotBefore() REQUIRES(mu_);
  void Loop();
  void OffDispatcher(const char* what) const REQUIRES(mu_);  // aborts on the dispatcher
  // The queue index to execute now, or -1 (then *wake: when to look again).
  long Pick(std::chrono::steady_clock::time_point now, bool ignore_delay,
            std::chrono::steady_clock::time_point* wake) REQUIRES(mu_);

  // Server operations, all REQUIRES(mu_).
  nfs::Time Tick() REQUIRES(mu_);
  Node* Find(const nfs::Fh& fh) REQUIRES(mu_);
  const Node* Find(const nfs::Fh& fh) const REQUIRES(mu_);
  Result<Node*> Get(Proc p, const nfs::Fh& fh) REQUIRES(mu_);
  Result<Node*> Dir(Proc p, const nfs::Fh& fh) REQUIRES(mu_);
  Node& NewNode(nfs::Ftype type, const nfs::SetAttr& sa, const nfs::Cred& c, const Node& dir)
      REQUIRES(mu_);
  void AddEntry(Node& dir, const std::string& name, const Node& n) REQUIRES(mu_);
  void DropEntry(Node& dir, const std::string& name) REQUIRES(mu_);  // and the node at its last link
  Node* Child(Node& dir, const std::string& name) REQUIRES(mu_);
  uint32_t Allowed(const Node& n, const nfs::Cred& c) const REQUIRES(mu_);  // ACCESS bits
  bool May(const Node& n, const nfs::Cred& c, uint32_t bits) const REQUIRES(mu_);
  nfs::Wcc::Before Pre(const Node& n) const REQUIRES(mu_);
  nfs::Wcc Wcc(const std::optional<nfs::Wcc::Before>& before, const Node& n) const REQUIRES(mu_);
  std::optional<nfs::Wcc::Before> MaybePre(const Node& n) const REQUIRES(mu_);
  void Touch(Node& n, bool data) REQUIRES(mu_);  // ctime (and mtime when `data`) now
  void SetSize(Node& n, uint64_t size) REQUIRES(mu_);
  Error Err(Proc p, int err) const REQUIRES(mu_);
  Result<nfs::NewObject> NewObject(Proc p, const nfs::Fh& dir, const std::string& name,
                                   nfs::Ftype type, const nfs::SetAttr& sa, const nfs::Cred& c,
                                   bool reissued, const std::function<void(Node&)>& init) REQUIRES(mu_);
  Result<nfs::DirPage> ListDir(Proc p, const nfs::Fh& dir, uint64_t cookie, uint32_t bytes,
                               bool plus, const nfs::Cred& c) REQUIRES(mu_);
  Result<nfs::Wcc> Unlink(Proc p, const nfs::Fh& dir, const std::string& name,
                          const nfs::Cred& c, bool reissued) REQUIRES(mu_);

  mutable Mutex mu_;
  CondVar cv_;  // any change of queue, executing, knobs, steps

  // Server state.
  nfs::Fh root_;
  std::unordered_map<nfs::Fh, Node> nodes_ GUARDED_BY(mu_);
  uint64_t next_fileid_ GUARDED_BY(mu_) = 256;
  nfs::Time now_ GUARDED_BY(mu_){1700000000, 0};
  uint64_t verf_ GUARDED_BY(mu_);
  uint64_t boots_ GUARDED_BY(mu_) = 0;

  // Dispatcher.
  std::deque<std::shared_ptr<Call>> queue_ GUARDED_BY(mu_);
  int executing_ GUARDED_BY(mu_) = 0;
  bool paused_ GUARDED_BY(mu_) = false;
  bool stopping_ GUARDED_BY(mu_) = false;
  struct Step {
    std::optional<size_t> index;
    bool done = false, found = false;
  };
  Step* step_ GUARDED_BY(mu_) = nullptr;  // a StepOne() waiting for the dispatcher
  bool exited_ GUARDED_BY(mu_) = false;   // the dispatcher has stopped
  std::thread::id dispatcher_id_ GUARDED_BY(mu_);
  uint64_t failed_at_stop_ GUARDED_BY(mu_) = 0;

  // Knobs.
  std::mt19937_64 rng_ GUARDED_BY(mu_){1};
  bool reorder_ GUARDED_BY(mu_) = false;
  uint64_t max_delay_us_ GUARDED_BY(mu_) = 0;
  double drop_prob_ GUARDED_BY(mu_) = 0;
  bool wcc_before_ GUARDED_BY(mu_) = true;
  int parallelism_ GUARDED_BY(mu_) = 1;
  size_t dir_page_entries_ GUARDED_BY(mu_) = 0;
  size_t write_max_ GUARDED_BY(mu_) = 0;
  size_t history_limit_ GUARDED_BY(mu_) = 1024;
  std::optional<uint32_t> stale_to_others_ GUARDED_BY(mu_);
  bool all_stale_ GUARDED_BY(mu_) = false;
  // errno, count
  std::array<std::pair<int, int>, static_cast<size_t>(Proc::kCount)> fail_next_ GUARDED_BY(mu_){};

  // Observation.
  Stats stats_ GUARDED_BY(mu_);
  uint64_t seq_ GUARDED_BY(mu_) = 0;
  std::deque<CallRecord> history_ GUARDED_BY(mu_);
  uint64_t overlap_violations_ GUARDED_BY(mu_) = 0;

  std::thread thread_;  // last: started once everything above exists
};

}  // namespace mpnfs::testing
