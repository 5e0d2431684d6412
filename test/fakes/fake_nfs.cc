#include "test/fakes/fake_nfs.h"

#include "nfs/reissue.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace mpnfs::testing {

using nfs::Attr;
using nfs::Cred;
using nfs::Fh;
using nfs::Ftype;
using Clock = std::chrono::steady_clock;

namespace {

constexpr uint64_t kFsid = 0x6d706e6673;  // "mpnfs"
constexpr uint64_t kTotalBytes = 1ull << 40;
constexpr uint64_t kTotalFiles = 1u << 20;
constexpr size_t kNameMax = 255;

const char* NfsErrName(int err) {
  switch (err) {
    case EPERM: return "NFS3ERR_PERM";
    case ENOENT: return "NFS3ERR_NOENT";
    case EIO: return "NFS3ERR_IO";
    case ENXIO: return "NFS3ERR_NXIO";
    case EACCES: return "NFS3ERR_ACCES";
    case EEXIST: return "NFS3ERR_EXIST";
    case EXDEV: return "NFS3ERR_XDEV";
    case ENODEV: return "NFS3ERR_NODEV";
    case ENOTDIR: return "NFS3ERR_NOTDIR";
    case EISDIR: return "NFS3ERR_ISDIR";
    case EINVAL: return "NFS3ERR_INVAL";
    case EFBIG: return "NFS3ERR_FBIG";
    case ENOSPC: return "NFS3ERR_NOSPC";
    case EROFS: return "NFS3ERR_ROFS";
    case EMLINK: return "NFS3ERR_MLINK";
    case ENAMETOOLONG: return "NFS3ERR_NAMETOOLONG";
    case ENOTEMPTY: return "NFS3ERR_NOTEMPTY";
    case EDQUOT: return "NFS3ERR_DQUOT";
    case ESTALE: return "NFS3ERR_STALE";
    default: return nullptr;
  }
}

bool Overlap(uint64_t a, uint64_t alen, uint64_t b, uint64_t blen) {
  return alen > 0 && blen > 0 && a < b + blen && b < a + alen;
}

bool InGroups(const Cred& c, uint32_t gid) {
  return c.gid == gid || std::find(c.groups.begin(), c.groups.end(), gid) != c.groups.end();
}

}  // namespace

const char* FakeNfs::ProcName(Proc p) {
  static constexpr const char* kNames[] = {
      "GETATTR", "SETATTR", "LOOKUP", "ACCESS", "READLINK", "READ",   "WRITE",
      "COMMIT",  "CREATE",  "MKDIR",  "SYMLINK", "MKNOD",   "REMOVE", "RMDIR",
      "RENAME",  "LINK",    "READDIR", "READDIRPLUS", "FSSTAT"};
  static_assert(std::size(kNames) == static_cast<size_t>(Proc::kCount));
  return kNames[static_cast<size_t>(p)];
}

// ---------------------------------------------------------------- lifetime

FakeNfs::FakeNfs() : verf_(0x66616b6500000001ull) {
  // The root: a directory owned by root, writable by everyone (like /tmp
  // without the sticky bit) so that tests can run as any user.
  const uint64_t id = next_fileid_++;
  root_ = "fh:" + std::to_string(id);
  Node& r = nodes_[root_];
  r.fh = root_;
  r.parent = root_;
  r.attr.type = Ftype::kDir;
  r.attr.mode = 0777;
  r.attr.nlink = 2;
  r.attr.size = r.attr.used = 4096;
  r.attr.fsid = kFsid;
  r.attr.fileid = id;
  r.attr.atime = r.attr.mtime = r.attr.ctime = Tick();
  thread_ = std::thread([this] { Loop(); });
}

FakeNfs::~FakeNfs() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  cv_.SignalAll();
  thread_.join();
  if (failed_at_stop_ > 0) {
    std::fprintf(stderr,
                 "FakeNfs: destroyed with %llu calls unanswered: failed them with EIO "
                 "(Quiesce() before destroying what issued them)\n",
                 static_cast<unsigned long long>(failed_at_stop_));
  }
}

// ---------------------------------------------------------------- knobs

void FakeNfs::Seed(uint64_t s) {
  MutexLock lock(mu_);
  rng_.seed(s);
}

void FakeNfs::set_reorder(bool on) {
  { MutexLock lock(mu_); reorder_ = on; }
  cv_.SignalAll();
}

void FakeNfs::set_max_delay_us(uint64_t us) {
  { MutexLock lock(mu_); max_delay_us_ = us; }
  cv_.SignalAll();
}

void FakeNfs::set_drop_prob(double p) {
  MutexLock lock(mu_);
  drop_prob_ = std::clamp(p, 0.0, 1.0);
}

void FakeNfs::set_wcc_before(bool on) {
  MutexLock lock(mu_);
  wcc_before_ = on;
}

void FakeNfs::set_parallelism(int n) {
  MutexLock lock(mu_);
  parallelism_ = std::max(1, n);
}

void FakeNfs::set_write_max(size_t n) {
  MutexLock lock(mu_);
  write_max_ = n;
}

void FakeNfs::set_dir_page_entries(size_t n) {
  MutexLock lock(mu_);
  dir_page_entries_ = n;
}

void FakeNfs::set_stale_to_others(std::optional<uint32_t> uid) {
  MutexLock lock(mu_);
  stale_to_others_ = uid;
}

void FakeNfs::set_all_stale(bool on) {
  MutexLock lock(mu_);
  all_stale_ = on;
}

void FakeNfs::set_history_limit(size_t n) {
  MutexLock lock(mu_);
  history_limit_ = n;
  while (history_.size() > history_limit_) history_.pop_front();
}

void FakeNfs::Pause() {
  MutexLock lock(mu_);
  paused_ = true;
}

void FakeNfs::Resume() {
  { MutexLock lock(mu_); paused_ = false; }
  cv_.SignalAll();
}

bool FakeNfs::StepOne(std::optional<size_t> index) {
  MutexLock lock(mu_);
  OffDispatcher("StepOne");
  while (step_ != nullptr) cv_.Wait(mu_);
  Step s;
  s.index = index;
  step_ = &s;
  cv_.SignalAll();
  while (!s.done) cv_.Wait(mu_);
  step_ = nullptr;
  cv_.SignalAll();
  return s.found;
}

void FakeNfs::FailNext(Proc proc, int err, int count) {
  MutexLock lock(mu_);
  fail_next_[static_cast<size_t>(proc)] = {err, count};
}

void FakeNfs::Restart() {
  MutexLock lock(mu_);
  for (auto& [fh, n] : nodes_) {
    if (n.attr.type != Ftype::kReg) continue;
    n.current = n.stable;
    n.attr.size = n.current.size();
    n.attr.used = (n.attr.size + 4095) & ~uint64_t{4095};
  }
  ++boots_;
  verf_ = 0x66616b6500000001ull + boots_ * 0x10001;
}

// ---------------------------------------------------------------- waiting

size_t FakeNfs::Pending() const {
  MutexLock lock(mu_);
  return queue_.size();
}

void FakeNfs::OffDispatcher(const char* what) const {
  if (std::this_thread::get_id() != dispatcher_id_) return;
  std::fprintf(stderr, "FakeNfs::%s called from a callback: it would never return\n", what);
  std::abort();
}

bool FakeNfs::WaitPending(size_t n, std::chrono::milliseconds timeout) {
  MutexLock lock(mu_);
  OffDispatcher("WaitPending");
  const auto until = Clock::now() + timeout;
  while (!(queue_.size() >= n)) {
    if (!cv_.WaitUntil(mu_, until)) return queue_.size() >= n;
  }
  return true;
}

bool FakeNfs::Quiesce(std::chrono::milliseconds timeout) {
  MutexLock lock(mu_);
  OffDispatcher("Quiesce");
  const auto until = Clock::now() + timeout;
  while (!(queue_.empty() && executing_ == 0)) {
    if (!cv_.WaitUntil(mu_, until)) return queue_.empty() && executing_ == 0;
  }
  return true;
}

// ---------------------------------------------------------------- observation

std::string FakeNfs::Contents(const Fh& fh) const {
  MutexLock lock(mu_);
  const Node* n = Find(fh);
  return n ? n->current : std::string();
}

std::string FakeNfs::StableContents(const Fh& fh) const {
  MutexLock lock(mu_);
  const Node* n = Find(fh);
  return n ? n->stable : std::string();
}

std::optional<Attr> FakeNfs::Attributes(const Fh& fh) const {
  MutexLock lock(mu_);
  const Node* n = Find(fh);
  if (!n) return std::nullopt;
  return n->attr;
}

std::optional<Fh> FakeNfs::FhOf(const std::string& path) const {
  MutexLock lock(mu_);
  const Node* n = Find(root_);
  size_t pos = 0;
  while (n && pos < path.size()) {
    size_t end = path.find('/', pos);
    if (end == std::string::npos) end = path.size();
    const std::string name = path.substr(pos, end - pos);
    pos = end + 1;
    if (name.empty() || name == ".") continue;
    if (name == "..") {
      n = Find(n->parent);
      continue;
    }
    auto it = n->cookie_of.find(name);
    if (it == n->cookie_of.end()) return std::nullopt;
    n = Find(n->entries.at(it->second).fh);
  }
  if (!n) return std::nullopt;
  return n->fh;
}

uint64_t FakeNfs::write_verifier() const {
  MutexLock lock(mu_);
  return verf_;
}

FakeNfs::Stats FakeNfs::stats() const {
  MutexLock lock(mu_);
  return stats_;
}

std::vector<FakeNfs::CallRecord> FakeNfs::History() const {
  MutexLock lock(mu_);
  return {history_.begin(), history_.end()};
}

std::vector<FakeNfs::CallRecord> FakeNfs::Queued() const {
  MutexLock lock(mu_);
  std::vector<CallRecord> out;
  for (const auto& c : queue_) out.push_back(c->rec);
  return out;
}

uint64_t FakeNfs::overlap_violations() const {
  MutexLock lock(mu_);
  return overlap_violations_;
}

int FakeNfs::Parallelism() const {
  MutexLock lock(mu_);
  return parallelism_;
}

// ---------------------------------------------------------------- dispatcher

template <class T>
void FakeNfs::Submit(CallRecord rec, nfs::Cb<T> cb, std::function<Result<T>(bool)> op) {
  auto shared_cb = std::make_shared<nfs::Cb<T>>(std::move(cb));
  auto call = std::make_shared<Call>();
  const Proc p = rec.proc;
  call->rec = std::move(rec);
  call->run = [op = std::move(op), shared_cb](bool reissued) -> Reply {
    auto r = std::make_shared<Result<T>>(op(reissued));
    return [shared_cb, r] { (*shared_cb)(std::move(*r)); };
  };
  call->fail = [this, p, shared_cb](int err) REQUIRES(mu_) -> Reply {
    auto e = std::make_shared<Error>(Err(p, err));
    return [shared_cb, e] { (*shared_cb)(*e); };
  };
  Reply late;
  {
    MutexLock lock(mu_);
    if (exited_) {
      late = call->fail(EIO);  // a call racing with the destructor: nowhere else to run it
    } else {
      Enqueue(std::move(call));
    }
  }
  if (late) late();
}

Clock::time_point FakeNfs::NotBefore() {
  auto t = Clock::now();
  if (max_delay_us_ > 0) {
    t += std::chrono::microseconds(
        std::uniform_int_distribution<uint64_t>(0, max_delay_us_)(rng_));
  }
  return t;
}

void FakeNfs::Enqueue(std::shared_ptr<Call> call) {
  CallRecord& rec = call->rec;
  rec.seq = ++seq_;
  stats_.calls[static_cast<size_t>(rec.proc)]++;
  if (rec.proc == Proc::kWrite) {
    (rec.stable ? stats_.writes_file_sync : stats_.writes_unstable)++;
    // Every WRITE not yet answered is in the queue: the one executing is
    // answered (or requeued) before the lock is let go.
    for (const auto& q : queue_) {
      if (q->rec.proc == Proc::kWrite && q->rec.fh == rec.fh &&
          Overlap(q->rec.off, q->rec.len, rec.off, rec.len)) {
        overlap_violations_++;
        break;
      }
    }
  }
  if (rec.proc == Proc::kCommit) stats_.commits++;
  if (history_limit_ > 0) {
    history_.push_back(rec);
    while (history_.size() > history_limit_) history_.pop_front();
  }
  call->not_before = NotBefore();
  queue_.push_back(std::move(call));
  cv_.SignalAll();
}

long FakeNfs::Pick(Clock::time_point now, bool ignore_delay, Clock::time_point* wake) {
  if (queue_.empty()) return -1;
  if (!reorder_) {
    if (ignore_delay || queue_.front()->not_before <= now) return 0;
    if (wake) *wake = queue_.front()->not_before;
    return -1;
  }
  std::vector<size_t> ready;
  Clock::time_point earliest = Clock::time_point::max();
  for (size_t i = 0; i < queue_.size(); ++i) {
    if (ignore_delay || queue_[i]->not_before <= now) {
      ready.push_back(i);
    } else {
      earliest = std::min(earliest, queue_[i]->not_before);
    }
  }
  if (ready.empty()) {
    if (wake) *wake = earliest;
    return -1;
  }
  return static_cast<long>(
      ready[std::uniform_int_distribution<size_t>(0, ready.size() - 1)(rng_)]);
}

void FakeNfs::Loop() {
  MutexLock lock(mu_);
  dispatcher_id_ = std::this_thread::get_id();
  for (;;) {
    std::shared_ptr<Call> call;
    Step* step = nullptr;
    if (stopping_) {
      if (queue_.empty()) break;
      call = queue_.front();
      queue_.pop_front();
    } else if (step_ != nullptr && !step_->done) {
      step = step_;
      long i = -1;
      if (step->index) {
        if (*step->index < queue_.size()) i = static_cast<long>(*step->index);
      } else {
        i = Pick(Clock::now(), /*ignore_delay=*/true, nullptr);
      }
      if (i < 0) {
        step->done = true;
        cv_.SignalAll();
        continue;
      }
      step->found = true;
      call = queue_[static_cast<size_t>(i)];
      queue_.erase(queue_.begin() + i);
    } else if (paused_ || queue_.empty()) {
      cv_.Wait(mu_);
      continue;
    } else {
      Clock::time_point wake;
      const long i = Pick(Clock::now(), /*ignore_delay=*/false, &wake);
      if (i < 0) {
        cv_.WaitUntil(mu_, wake);
        continue;
      }
      call = queue_[static_cast<size_t>(i)];
      queue_.erase(queue_.begin() + i);
    }

    ++executing_;
    Reply reply;
    auto& fail = fail_next_[static_cast<size_t>(call->rec.proc)];
    if (stopping_) {
      failed_at_stop_++;
      reply = call->fail(EIO);
    } else if (fail.second > 0) {
      fail.second--;
      stats_.injected_failures++;
      reply = call->fail(fail.first);
    } else {
      stats_.executions++;
      reply = call->run(call->executions++ > 0);
      if (call->executions == 1 && drop_prob_ > 0 &&
          std::bernoulli_distribution(drop_prob_)(rng_)) {
        // The reply is lost; the client sends the call again.
        stats_.dropped_replies++;
        reply = nullptr;
        call->not_before = NotBefore();
        queue_.push_back(call);
      }
    }
    if (reply) {
      lock.Unlock();
      reply();
      reply = nullptr;  // what the callback captured dies outside the lock
      call.reset();
      lock.Lock();
    }
    --executing_;
    if (step) step->done = true;
    cv_.SignalAll();
  }
  exited_ = true;
}

// ---------------------------------------------------------------- server model

nfs::Time FakeNfs::Tick() {
  now_.nsec += 1000;
  if (now_.nsec >= 1000000000) {
    now_.sec++;
    now_.nsec -= 1000000000;
  }
  return now_;
}

FakeNfs::Node* FakeNfs::Find(const Fh& fh) {
  auto it = nodes_.find(fh);
  return it == nodes_.end() ? nullptr : &it->second;
}

const FakeNfs::Node* FakeNfs::Find(const Fh& fh) const {
  auto it = nodes_.find(fh);
  return it == nodes_.end() ? nullptr : &it->second;
}

Error FakeNfs::Err(Proc p, int err) const {
  const char* name = NfsErrName(err);
  return Error::Errno(err, std::string(ProcName(p)) + ": " +
                               (name ? name : std::strerror(err)));
}

Result<FakeNfs::Node*> FakeNfs::Get(Proc p, const Fh& fh) {
  if (all_stale_) return Err(p, ESTALE);
  Node* n = Find(fh);
  if (!n) return Err(p, ESTALE);
  return n;
}

Result<FakeNfs::Node*> FakeNfs::Dir(Proc p, const Fh& fh) {
  auto n = Get(p, fh);
  if (n && (*n)->attr.type != Ftype::kDir) return Err(p, ENOTDIR);
  return n;
}

FakeNfs::Node* FakeNfs::Child(Node& dir, const std::string& name) {
  auto it = dir.cookie_of.find(name);
  if (it == dir.cookie_of.end()) return nullptr;
  return Find(dir.entries.at(it->second).fh);
}

// Mode bits as Linux checks them; then the NFSv3 ACCESS bits they give.
uint32_t FakeNfs::Allowed(const Node& n, const Cred& c) const {
  const bool dir = n.attr.type == Ftype::kDir;
  bool r, w, x;
  if (c.uid == 0) {
    r = w = true;
    x = dir || (n.attr.mode & 0111) != 0;
  } else {
    int shift = 0;
    if (c.uid == n.attr.uid) {
      shift = 6;
    } else if (InGroups(c, n.attr.gid)) {
      shift = 3;
    }
    const uint32_t bits = (n.attr.mode >> shift) & 7;
    r = bits & 4;
    w = bits & 2;
    x = bits & 1;
  }
  uint32_t a = 0;
  if (r) a |= nfs::kAccessRead;
  if (dir) {
    if (x) a |= nfs::kAccessLookup;
    if (w) a |= nfs::kAccessModify | nfs::kAccessExtend | nfs::kAccessDelete;
  } else {
    if (w) a |= nfs::kAccessModify | nfs::kAccessExtend;
    if (x) a |= nfs::kAccessExecute;
  }
  return a;
}

bool FakeNfs::May(const Node& n, const Cred& c, uint32_t bits) const {
  return (Allowed(n, c) & bits) == bits;
}

nfs::Wcc::Before FakeNfs::Pre(const Node& n) const {
  return nfs::Wcc::Before{n.attr.size, n.attr.mtime, n.attr.ctime};
}

std::optional<nfs::Wcc::Before> FakeNfs::MaybePre(const Node& n) const {
  if (!wcc_before_) return std::nullopt;
  return Pre(n);
}

nfs::Wcc FakeNfs::Wcc(const std::optional<nfs::Wcc::Before>& before, const Node& n) const {
  nfs::Wcc w;
  w.before = before;
  w.after = n.attr;
  return w;
}

void FakeNfs::Touch(Node& n, bool data) {
  const nfs::Time t = Tick();
  n.attr.ctime = t;
  if (data) n.attr.mtime = t;
}

void FakeNfs::SetSize(Node& n, uint64_t size) {
  n.current.resize(size, '\0');
  n.attr.size = size;
  n.attr.used = (size + 4095) & ~uint64_t{4095};
}

FakeNfs::Node& FakeNfs::NewNode(Ftype type, const nfs::SetAttr& sa, const Cred& c,
                                const Node& dir) {
  const uint64_t id = next_fileid_++;
  const Fh fh = "fh:" + std::to_string(id);
  Node& n = nodes_[fh];
  n.fh = fh;
  Attr& a = n.attr;
  a.type = type;
  a.mode = sa.mode.value_or(type == Ftype::kDir ? 0755 : 0644) & 07777;
  a.uid = c.uid;
  a.gid = c.gid;
  if (dir.attr.mode & S_ISGID) {  // BSD group semantics of a setgid directory
    a.gid = dir.attr.gid;
    if (type == Ftype::kDir) a.mode |= S_ISGID;
  }
  if (c.uid == 0) {
    if (sa.uid) a.uid = *sa.uid;
    if (sa.gid) a.gid = *sa.gid;
  }
  a.nlink = type == Ftype::kDir ? 2 : 1;
  if (type == Ftype::kDir) {
    a.size = a.used = 4096;
    n.parent = dir.fh;
  }
  a.fsid = kFsid;
  a.fileid = id;
  a.atime = a.mtime = a.ctime = Tick();
  return n;
}

void FakeNfs::AddEntry(Node& dir, const std::string& name, const Node& n) {
  const uint64_t cookie = dir.next_cookie++;
  dir.entries[cookie] = Entry{name, n.fh};
  dir.cookie_of[name] = cookie;
  if (n.attr.type == Ftype::kDir) dir.attr.nlink++;
}

void FakeNfs::DropEntry(Node& dir, const std::string& name) {
  auto it = dir.cookie_of.find(name);
  if (it == dir.cookie_of.end()) return;
  const Fh fh = dir.entries.at(it->second).fh;
  dir.entries.erase(it->second);
  dir.cookie_of.erase(it);
  Node* n = Find(fh);
  if (!n) return;
  if (n->attr.type == Ftype::kDir) {
    dir.attr.nlink--;
    nodes_.erase(fh);  // (RMDIR or RENAME checked that it is empty)
    return;
  }
  n->attr.nlink--;
  Touch(*n, false);
  if (n->attr.nlink == 0) nodes_.erase(fh);  // its handle is stale from now on
}

namespace {
// A name a directory operation may create or remove.
int BadName(const std::string& name) {
  if (name.size() > kNameMax) return ENAMETOOLONG;
  if (name.empty() || name.find('/') != std::string::npos) return EINVAL;
  return 0;
}
}  // namespace

Result<nfs::NewObject> FakeNfs::NewObject(Proc p, const Fh& dirfh, const std::string& name,
                                          Ftype type, const nfs::SetAttr& sa, const Cred& c,
                                          bool reissued, const std::function<void(Node&)>& init) {
  auto d = Dir(p, dirfh);
  if (!d) return d.error();
  Node& dir = **d;
  if (name == "." || name == "..") return Err(p, EEXIST);
  if (int e = BadName(name)) return Err(p, e);
  if (!May(dir, c, nfs::kAccessModify | nfs::kAccessLookup)) return Err(p, EACCES);
  const auto before = MaybePre(dir);
  if (Node* ex = Child(dir, name)) {
    // Nfs3 answers a resent call's EEXIST with what the name now holds.
    if (!reissued || nfs::OnReissued(nfs::ReissueProc::kNewObject, EEXIST) != nfs::Reissued::kWhatIsThere) {
      return Err(p, EEXIST);
    }
    return nfs::NewObject{ex->fh, ex->attr, Wcc(before, dir), /*looked_up=*/true};
  }
  Node& n = NewNode(type, sa, c, dir);
  if (init) init(n);
  AddEntry(dir, name, n);
  Touch(dir, true);
  return nfs::NewObject{n.fh, n.attr, Wcc(before, dir)};
}

Result<nfs::Wcc> FakeNfs::Unlink(Proc p, const Fh& dirfh, const std::string& name,
                                 const Cred& c, bool reissued) {
  auto d = Dir(p, dirfh);
  if (!d) return d.error();
  Node& dir = **d;
  if (name == ".") return Err(p, EINVAL);
  if (name == "..") return Err(p, p == Proc::kRmdir ? ENOTEMPTY : EISDIR);
  if (int e = BadName(name)) return Err(p, e);
  if (!May(dir, c, nfs::kAccessModify | nfs::kAccessLookup)) return Err(p, EACCES);
  const auto before = MaybePre(dir);
  Node* n = Child(dir, name);
  if (!n) {
    // Nfs3: a resent REMOVE/RMDIR that finds nothing did it the first time.
    const auto rp = p == Proc::kRmdir ? nfs::ReissueProc::kRmdir : nfs::ReissueProc::kRemove;
    if (reissued && nfs::OnReissued(rp, ENOENT) == nfs::Reissued::kDone) return Wcc(before, dir);
    return Err(p, ENOENT);
  }
  const bool is_dir = n->attr.type == Ftype::kDir;
  if (p == Proc::kRemove && is_dir) return Err(p, EISDIR);
  if (p == Proc::kRmdir && !is_dir) return Err(p, ENOTDIR);
  if (p == Proc::kRmdir && !n->entries.empty()) return Err(p, ENOTEMPTY);
  if ((dir.attr.mode & S_ISVTX) && c.uid != 0 && c.uid != dir.attr.uid && c.uid != n->attr.uid) {
    return Err(p, EPERM);
  }
  DropEntry(dir, name);
  Touch(dir, true);
  return Wcc(before, dir);
}

Result<nfs::DirPage> FakeNfs::ListDir(Proc p, const Fh& dirfh, uint64_t cookie, uint32_t bytes,
                                      bool plus, const Cred& c) {
  auto d = Dir(p, dirfh);
  if (!d) return d.error();
  Node& dir = **d;
  if (!May(dir, c, nfs::kAccessRead)) return Err(p, EACCES);
  nfs::DirPage page;
  page.verf = dir.attr.fileid;
  page.dir = dir.attr;
  // What an entry costs in the reply, roughly as XDR encodes it.
  const size_t per_entry = plus ? 24 + 96 + 72 : 24;
  size_t used = 0;
  auto add = [&](uint64_t ck, const std::string& name, const Fh& fh) REQUIRES(mu_) {
    const size_t cost = per_entry + ((name.size() + 3) & ~size_t{3});
    const bool full = (dir_page_entries_ > 0 && page.entries.size() >= dir_page_entries_) ||
                      (!page.entries.empty() && used + cost > bytes);
    if (full) return false;
    used += cost;
    const Node* n = Find(fh);
    nfs::DirEntry e;
    e.fileid = n ? n->attr.fileid : 0;
    e.name = name;
    e.cookie = ck;
    if (plus && n) {
      e.attr = n->attr;
      e.fh = fh;
    }
    page.entries.push_back(std::move(e));
    return true;
  };
  // "." and ".." first (cookies 1 and 2), then the entries in cookie order.
  if (cookie < 1 && !add(1, ".", dir.fh)) return page;
  if (cookie < 2 && !add(2, "..", dir.parent)) return page;
  for (auto it = dir.entries.upper_bound(cookie); it != dir.entries.end(); ++it) {
    if (!add(it->first, it->second.name, it->second.fh)) return page;
  }
  page.eof = true;
  return page;
}

// ---------------------------------------------------------------- procedures

void FakeNfs::Getattr(const Fh& fh, const Cred& c, nfs::Cb<Attr> cb) {
  CallRecord rec{0, Proc::kGetattr, fh, {}, 0, 0, false, c};
  Submit<Attr>(std::move(rec), std::move(cb), [this, fh, uid = c.uid](bool) REQUIRES(mu_) -> Result<Attr> {
    if (stale_to_others_ && *stale_to_others_ != uid) return Err(Proc::kGetattr, ESTALE);
    auto n = Get(Proc::kGetattr, fh);
    if (!n) return n.error();
    return (*n)->attr;
  });
}

void FakeNfs::Setattr(const Fh& fh, const nfs::SetAttr& sa, const Cred& c, nfs::Cb<nfs::Wcc> cb) {
  CallRecord rec{0, Proc::kSetattr, fh, {}, 0, 0, false, c};
  Submit<nfs::Wcc>(std::move(rec), std::move(cb), [this, fh, sa, c](bool) REQUIRES(mu_) -> Result<nfs::Wcc> {
    constexpr Proc p = Proc::kSetattr;
    auto got = Get(p, fh);
    if (!got) return got.error();
    Node& n = **got;
    const bool owner = c.uid == 0 || c.uid == n.attr.uid;
    using How = nfs::SetAttr::TimeHow;
    // Check everything before changing anything.
    if (sa.mode && !owner) return Err(p, EPERM);
    if (sa.uid && *sa.uid != n.attr.uid && c.uid != 0) return Err(p, EPERM);
    if (sa.gid && *sa.gid != n.attr.gid && !(c.uid == 0 || (owner && InGroups(c, *sa.gid)))) {
      return Err(p, EPERM);
    }
    if (sa.size) {
      if (n.attr.type == Ftype::kDir) return Err(p, EISDIR);
      if (n.attr.type != Ftype::kReg) return Err(p, EINVAL);
      if (!owner && !May(n, c, nfs::kAccessModify)) return Err(p, EACCES);
    }
    for (How h : {sa.atime_how, sa.mtime_how}) {
      if (h == How::kServer && !owner && !May(n, c, nfs::kAccessModify)) return Err(p, EACCES);
      if (h == How::kClient && !owner) return Err(p, EPERM);
    }
    const auto before = MaybePre(n);
    const nfs::Time t = Tick();
    if (sa.mode) n.attr.mode = *sa.mode & 07777;
    if (sa.uid) n.attr.uid = *sa.uid;
    if (sa.gid) n.attr.gid = *sa.gid;
    if (sa.size) {
      SetSize(n, *sa.size);
      n.stable.resize(*sa.size, '\0');  // a truncate is durable at once
      n.attr.mtime = t;
    }
    if (sa.atime_how == How::kServer) n.attr.atime = t;
    if (sa.atime_how == How::kClient) n.attr.atime = sa.atime;
    if (sa.mtime_how == How::kServer) n.attr.mtime = t;
    if (sa.mtime_how == How::kClient) n.attr.mtime = sa.mtime;
    if (sa.atime_how != How::kDontChange || sa.mtime_how != How::kDontChange) n.excl_verf.reset();
    n.attr.ctime = t;
    return Wcc(before, n);
  });
}

void FakeNfs::Lookup(const Fh& dirfh, const std::string& name, const Cred& c,
                     nfs::Cb<nfs::LookupReply> cb) {
  CallRecord rec{0, Proc::kLookup, dirfh, name, 0, 0, false, c};
  Submit<nfs::LookupReply>(
      std::move(rec), std::move(cb), [this, dirfh, name, c](bool) REQUIRES(mu_) -> Result<nfs::LookupReply> {
        constexpr Proc p = Proc::kLookup;
        auto d = Dir(p, dirfh);
        if (!d) return d.error();
        Node& dir = **d;
        if (name.size() > kNameMax) return Err(p, ENAMETOOLONG);
        if (!May(dir, c, nfs::kAccessLookup)) return Err(p, EACCES);
        Node* n = nullptr;
        if (name == ".") {
          n = &dir;
        } else if (name == "..") {
          n = Find(dir.parent);
        } else {
          n = Child(dir, name);
        }
        if (!n) return Err(p, ENOENT);
        return nfs::LookupReply{n->fh, n->attr, dir.attr};
      });
}

void FakeNfs::Access(const Fh& fh, uint32_t mask, const Cred& c, nfs::Cb<nfs::AccessReply> cb) {
  CallRecord rec{0, Proc::kAccess, fh, {}, 0, 0, false, c};
  Submit<nfs::AccessReply>(std::move(rec), std::move(cb),
                           [this, fh, mask, c](bool) REQUIRES(mu_) -> Result<nfs::AccessReply> {
                             auto n = Get(Proc::kAccess, fh);
                             if (!n) return n.error();
                             return nfs::AccessReply{mask & Allowed(**n, c), (*n)->attr};
                           });
}

void FakeNfs::Readlink(const Fh& fh, const Cred& c, nfs::Cb<std::string> cb) {
  CallRecord rec{0, Proc::kReadlink, fh, {}, 0, 0, false, c};
  Submit<std::string>(std::move(rec), std::move(cb), [this, fh](bool) REQUIRES(mu_) -> Result<std::string> {
    auto n = Get(Proc::kReadlink, fh);
    if (!n) return n.error();
    if ((*n)->attr.type != Ftype::kLnk) return Err(Proc::kReadlink, EINVAL);
    return (*n)->target;
  });
}

void FakeNfs::Read(const Fh& fh, uint64_t off, uint32_t count, const Cred& c,
                   nfs::Cb<nfs::ReadReply> cb) {
  CallRecord rec{0, Proc::kRead, fh, {}, off, count, false, c};
  // The reply points into a ReadData that lives until the callback returns.
  nfs::Cb<ReadData> deliver = [cb = std::move(cb)](Result<ReadData> r) {
    if (!r) return cb(r.error());
    nfs::ReadReply rr;
    rr.data = r->data.data();
    rr.len = r->data.size();
    rr.eof = r->eof;
    rr.attr = r->attr;
    cb(std::move(rr));
  };
  Submit<ReadData>(std::move(rec), std::move(deliver),
                   [this, fh, off, count, c](bool) REQUIRES(mu_) -> Result<ReadData> {
                     constexpr Proc p = Proc::kRead;
                     auto got = Get(p, fh);
                     if (!got) return got.error();
                     Node& n = **got;
                     if (n.attr.type == Ftype::kDir) return Err(p, EISDIR);
                     if (n.attr.type != Ftype::kReg) return Err(p, EINVAL);
                     if (c.uid != n.attr.uid && !May(n, c, nfs::kAccessRead)) {
                       return Err(p, EACCES);
                     }
                     ReadData d;
                     if (off < n.current.size()) d.data = n.current.substr(off, count);
                     d.eof = off + d.data.size() >= n.current.size();
                     d.attr = n.attr;
                     return d;
                   });
}

void FakeNfs::Write(const Fh& fh, uint64_t off, nfs::Buffer buf, size_t buf_off, size_t len,
                    bool stable, const Cred& c, nfs::Cb<nfs::WriteReply> cb) {
  CallRecord rec{0, Proc::kWrite, fh, {}, off, len, stable, c};
  Submit<nfs::WriteReply>(
      std::move(rec), std::move(cb),
      [this, fh, off, buf, buf_off, len_asked = len, stable, c](bool)
          REQUIRES(mu_) -> Result<nfs::WriteReply> {
        constexpr Proc p = Proc::kWrite;
        const size_t len = write_max_ > 0 ? std::min(len_asked, write_max_) : len_asked;
        auto got = Get(p, fh);
        if (!got) return got.error();
        Node& n = **got;
        if (n.attr.type == Ftype::kDir) return Err(p, EISDIR);
        if (n.attr.type != Ftype::kReg) return Err(p, EINVAL);
        if (c.uid != n.attr.uid && !May(n, c, nfs::kAccessModify)) return Err(p, EACCES);
        const auto before = MaybePre(n);
        const char* src = buf->data() + buf_off;
        if (n.current.size() < off + len) SetSize(n, off + len);
        std::memcpy(n.current.data() + off, src, len);
        if (stable) {
          if (n.stable.size() < off + len) n.stable.resize(off + len, '\0');
          std::memcpy(n.stable.data() + off, src, len);
        }
        if (c.uid != 0) {  // a write drops setuid (and setgid of an executable)
          n.attr.mode &= ~static_cast<uint32_t>(S_ISUID);
          if (n.attr.mode & S_IXGRP) n.attr.mode &= ~static_cast<uint32_t>(S_ISGID);
        }
        Touch(n, true);
        nfs::WriteReply r;
        r.count = static_cast<uint32_t>(len);
        r.stable = stable;
        r.verf = verf_;
        r.wcc = Wcc(before, n);
        return r;
      });
}

void FakeNfs::Commit(const Fh& fh, const Cred& c, nfs::Cb<nfs::CommitReply> cb) {
  CallRecord rec{0, Proc::kCommit, fh, {}, 0, 0, false, c};
  Submit<nfs::CommitReply>(std::move(rec), std::move(cb),
                           [this, fh](bool) REQUIRES(mu_) -> Result<nfs::CommitReply> {
                             constexpr Proc p = Proc::kCommit;
                             auto got = Get(p, fh);
                             if (!got) return got.error();
                             Node& n = **got;
                             if (n.attr.type == Ftype::kDir) return Err(p, EISDIR);
                             if (n.attr.type != Ftype::kReg) return Err(p, EINVAL);
                             const auto before = MaybePre(n);
                             n.stable = n.current;
                             return nfs::CommitReply{verf_, Wcc(before, n)};
                           });
}

void FakeNfs::Create(const Fh& dirfh, const std::string& name, nfs::CreateMode mode,
                     const nfs::SetAttr& sa, uint64_t verf, const Cred& c,
                     nfs::Cb<nfs::NewObject> cb) {
  CallRecord rec{0, Proc::kCreate, dirfh, name, 0, 0, false, c};
  Submit<nfs::NewObject>(
      std::move(rec), std::move(cb),
      [this, dirfh, name, mode, sa, verf, c](bool reissued) REQUIRES(mu_) -> Result<nfs::NewObject> {
        constexpr Proc p = Proc::kCreate;
        using M = nfs::CreateMode;
        auto d = Dir(p, dirfh);
        if (!d) return d.error();
        Node& dir = **d;
        if (Node* ex = Child(dir, name); ex && mode != M::kGuarded) {
          if (!May(dir, c, nfs::kAccessModify | nfs::kAccessLookup)) return Err(p, EACCES);
          const auto before = MaybePre(dir);
          if (mode == M::kExclusive) {
            // The same verifier: our own earlier CREATE, resent.
            if (ex->excl_verf != verf) return Err(p, EEXIST);
          } else {  // UNCHECKED: an existing file is opened; only its size is set
            if (ex->attr.type != Ftype::kReg) return Err(p, EEXIST);
            if (sa.size) {
              SetSize(*ex, *sa.size);
              ex->stable.resize(*sa.size, '\0');
              Touch(*ex, true);
            }
          }
          return nfs::NewObject{ex->fh, ex->attr, Wcc(before, dir), /*looked_up=*/true};
        }
        nfs::SetAttr initial = sa;
        if (mode == M::kExclusive) {  // the verifier takes the times; mode 0 until a SETATTR
          initial = nfs::SetAttr{};
          initial.mode = 0;
        }
        return NewObject(p, dirfh, name, Ftype::kReg, initial, c, reissued,
                         [&](Node& n) REQUIRES(mu_) {
                           if (initial.size) SetSize(n, *initial.size);
                           if (mode != M::kExclusive) return;
                           n.excl_verf = verf;
                           n.attr.atime = {static_cast<uint32_t>(verf >> 32), 0};
                           n.attr.mtime = {static_cast<uint32_t>(verf), 0};
                         });
      });
}

void FakeNfs::Mkdir(const Fh& dirfh, const std::string& name, const nfs::SetAttr& sa,
                    const Cred& c, nfs::Cb<nfs::NewObject> cb) {
  CallRecord rec{0, Proc::kMkdir, dirfh, name, 0, 0, false, c};
  Submit<nfs::NewObject>(std::move(rec), std::move(cb),
                         [this, dirfh, name, sa, c](bool reissued) REQUIRES(mu_) -> Result<nfs::NewObject> {
                           return NewObject(Proc::kMkdir, dirfh, name, Ftype::kDir, sa, c,
                                            reissued, nullptr);
                         });
}

void FakeNfs::Symlink(const Fh& dirfh, const std::string& name, const std::string& target,
                      const nfs::SetAttr& sa, const Cred& c, nfs::Cb<nfs::NewObject> cb) {
  CallRecord rec{0, Proc::kSymlink, dirfh, name, 0, 0, false, c};
  Submit<nfs::NewObject>(
      std::move(rec), std::move(cb),
      [this, dirfh, name, target, sa, c](bool reissued) REQUIRES(mu_) -> Result<nfs::NewObject> {
        nfs::SetAttr s = sa;
        s.mode = 0777;  // a symlink's mode is not used
        return NewObject(Proc::kSymlink, dirfh, name, Ftype::kLnk, s, c, reissued,
                         [&](Node& n) {
                           n.target = target;
                           n.attr.size = target.size();
                         });
      });
}

void FakeNfs::Mknod(const Fh& dirfh, const std::string& name, Ftype type, const nfs::SetAttr& sa,
                    uint32_t major, uint32_t minor, const Cred& c, nfs::Cb<nfs::NewObject> cb) {
  CallRecord rec{0, Proc::kMknod, dirfh, name, 0, 0, false, c};
  Submit<nfs::NewObject>(
      std::move(rec), std::move(cb),
      [this, dirfh, name, type, sa, major, minor, c](bool reissued) REQUIRES(mu_) -> Result<nfs::NewObject> {
        if (type != Ftype::kChr && type != Ftype::kBlk && type != Ftype::kSock &&
            type != Ftype::kFifo) {
          return Err(Proc::kMknod, EINVAL);  // NFS3ERR_BADTYPE
        }
        const bool dev = type == Ftype::kChr || type == Ftype::kBlk;
        if (dev && c.uid != 0) return Err(Proc::kMknod, EPERM);
        return NewObject(Proc::kMknod, dirfh, name, type, sa, c, reissued, [&](Node& n) {
          if (!dev) return;
          n.attr.rdev_major = major;
          n.attr.rdev_minor = minor;
        });
      });
}

void FakeNfs::Remove(const Fh& dirfh, const std::string& name, const Cred& c,
                     nfs::Cb<nfs::Wcc> cb) {
  CallRecord rec{0, Proc::kRemove, dirfh, name, 0, 0, false, c};
  Submit<nfs::Wcc>(std::move(rec), std::move(cb),
                   [this, dirfh, name, c](bool reissued) REQUIRES(mu_) -> Result<nfs::Wcc> {
                     return Unlink(Proc::kRemove, dirfh, name, c, reissued);
                   });
}

void FakeNfs::Rmdir(const Fh& dirfh, const std::string& name, const Cred& c,
                    nfs::Cb<nfs::Wcc> cb) {
  CallRecord rec{0, Proc::kRmdir, dirfh, name, 0, 0, false, c};
  Submit<nfs::Wcc>(std::move(rec), std::move(cb),
                   [this, dirfh, name, c](bool reissued) REQUIRES(mu_) -> Result<nfs::Wcc> {
                     return Unlink(Proc::kRmdir, dirfh, name, c, reissued);
                   });
}

void FakeNfs::Rename(const Fh& from_dir, const std::string& from, const Fh& to_dir,
                     const std::string& to, const Cred& c, nfs::Cb<nfs::RenameReply> cb) {
  CallRecord rec{0, Proc::kRename, from_dir, from, 0, 0, false, c};
  Submit<nfs::RenameReply>(
      std::move(rec), std::move(cb),
      [this, from_dir, from, to_dir, to, c](bool reissued) REQUIRES(mu_) -> Result<nfs::RenameReply> {
        constexpr Proc p = Proc::kRename;
        auto fd = Dir(p, from_dir);
        if (!fd) return fd.error();
        auto td = Dir(p, to_dir);
        if (!td) return td.error();
        Node& fdir = **fd;
        Node& tdir = **td;
        for (const std::string* n : {&from, &to}) {
          if (*n == "." || *n == "..") return Err(p, EINVAL);
          if (int e = BadName(*n)) return Err(p, e);
        }
        const uint32_t wx = nfs::kAccessModify | nfs::kAccessLookup;
        if (!May(fdir, c, wx) || !May(tdir, c, wx)) return Err(p, EACCES);
        const auto before_from = MaybePre(fdir);
        const auto before_to = MaybePre(tdir);
        Node* src = Child(fdir, from);
        if (!src) {
          // Nfs3: a resent RENAME that finds nothing did it the first time.
          if (reissued && nfs::OnReissued(nfs::ReissueProc::kRename, ENOENT) == nfs::Reissued::kDone) {
            return nfs::RenameReply{Wcc(before_from, fdir), Wcc(before_to, tdir)};
          }
          return Err(p, ENOENT);
        }
        const bool src_dir = src->attr.type == Ftype::kDir;
        Node* dst = Child(tdir, to);
        if (dst == src) {  // two names of one file: nothing to do (POSIX)
          return nfs::RenameReply{Wcc(before_from, fdir), Wcc(before_to, tdir)};
        }
        if (dst) {
          const bool dst_dir = dst->attr.type == Ftype::kDir;
          if (src_dir && !dst_dir) return Err(p, ENOTDIR);
          if (!src_dir && dst_dir) return Err(p, EISDIR);
          if (dst_dir && !dst->entries.empty()) return Err(p, ENOTEMPTY);
        }
        if (src_dir) {
          // Not into itself or below itself.
          for (const Node* up = &tdir;; up = Find(up->parent)) {
            if (up == src) return Err(p, EINVAL);
            if (up == nullptr || up->fh == root_) break;
          }
        }
        if (dst) DropEntry(tdir, to);
        const auto it = fdir.cookie_of.find(from);
        fdir.entries.erase(it->second);
        fdir.cookie_of.erase(it);
        if (src_dir) {
          fdir.attr.nlink--;
          src->parent = tdir.fh;
        }
        AddEntry(tdir, to, *src);
        Touch(*src, false);
        Touch(fdir, true);
        Touch(tdir, true);
        return nfs::RenameReply{Wcc(before_from, fdir), Wcc(before_to, tdir)};
      });
}

void FakeNfs::Link(const Fh& fh, const Fh& dirfh, const std::string& name, const Cred& c,
                   nfs::Cb<nfs::LinkReply> cb) {
  CallRecord rec{0, Proc::kLink, fh, name, 0, 0, false, c};
  Submit<nfs::LinkReply>(
      std::move(rec), std::move(cb),
      [this, fh, dirfh, name, c](bool reissued) REQUIRES(mu_) -> Result<nfs::LinkReply> {
        constexpr Proc p = Proc::kLink;
        auto got = Get(p, fh);
        if (!got) return got.error();
        auto d = Dir(p, dirfh);
        if (!d) return d.error();
        Node& n = **got;
        Node& dir = **d;
        if (n.attr.type == Ftype::kDir) return Err(p, EPERM);
        if (name == "." || name == "..") return Err(p, EEXIST);
        if (int e = BadName(name)) return Err(p, e);
        if (!May(dir, c, nfs::kAccessModify | nfs::kAccessLookup)) return Err(p, EACCES);
        const auto before = MaybePre(dir);
        if (Node* ex = Child(dir, name)) {
          // Nfs3: a resent LINK that finds the name there did it the first time.
          if (reissued && nfs::OnReissued(nfs::ReissueProc::kLink, EEXIST) == nfs::Reissued::kSameObject &&
              ex == &n) {
            return nfs::LinkReply{n.attr, Wcc(before, dir)};
          }
          return Err(p, EEXIST);
        }
        AddEntry(dir, name, n);
        n.attr.nlink++;
        Touch(n, false);
        Touch(dir, true);
        return nfs::LinkReply{n.attr, Wcc(before, dir)};
      });
}

void FakeNfs::Readdir(const Fh& dirfh, uint64_t cookie, uint64_t /*verf*/, uint32_t count,
                      const Cred& c, nfs::Cb<nfs::DirPage> cb) {
  CallRecord rec{0, Proc::kReaddir, dirfh, {}, cookie, count, false, c};
  Submit<nfs::DirPage>(std::move(rec), std::move(cb),
                       [this, dirfh, cookie, count, c](bool) REQUIRES(mu_) -> Result<nfs::DirPage> {
                         return ListDir(Proc::kReaddir, dirfh, cookie, count, false, c);
                       });
}

void FakeNfs::Readdirplus(const Fh& dirfh, uint64_t cookie, uint64_t /*verf*/,
                          uint32_t /*dircount*/, uint32_t maxcount, const Cred& c,
                          nfs::Cb<nfs::DirPage> cb) {
  CallRecord rec{0, Proc::kReaddirplus, dirfh, {}, cookie, maxcount, false, c};
  Submit<nfs::DirPage>(std::move(rec), std::move(cb),
                       [this, dirfh, cookie, maxcount, c](bool) REQUIRES(mu_) -> Result<nfs::DirPage> {
                         return ListDir(Proc::kReaddirplus, dirfh, cookie, maxcount, true, c);
                       });
}

void FakeNfs::Fsstat(const Fh& fh, const Cred& c, nfs::Cb<nfs::FsStat> cb) {
  CallRecord rec{0, Proc::kFsstat, fh, {}, 0, 0, false, c};
  Submit<nfs::FsStat>(std::move(rec), std::move(cb), [this, fh](bool) REQUIRES(mu_) -> Result<nfs::FsStat> {
    auto n = Get(Proc::kFsstat, fh);
    if (!n) return n.error();
    uint64_t used = 0;
    for (const auto& [h, node] : nodes_) used += node.attr.used;
    nfs::FsStat s;
    s.tbytes = kTotalBytes;
    s.fbytes = s.abytes = kTotalBytes - std::min(used, kTotalBytes);
    s.tfiles = kTotalFiles;
    s.ffiles = s.afiles = kTotalFiles - std::min<uint64_t>(nodes_.size(), kTotalFiles);
    return s;
  });
}

}  // namespace mpnfs::testing
