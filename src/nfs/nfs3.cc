#include "nfs/nfs3.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>
#include <span>

#include "nfs/reissue.h"
#include "proto/nfs3.h"

namespace mpnfs::nfs {
namespace {

using engine::CallOutcome;
using engine::CallStatus;
namespace p3 = proto::nfs3;

// How long to wait before sending a call again that the server answered
// with NFS3ERR_JUKEBOX ("busy, try again later"), as the Linux client does;
// the application never sees that error.
constexpr std::chrono::milliseconds kJukeboxDelay{1000};

// One NFSv3 call: its arguments (owned: the engine may send it again) and
// what to do with its result. Each procedure's wire shape and rules are its
// messages' (proto/nfs3.h); this template only carries them.
template <class Args, class Res>
class Call final : public engine::RpcCall,
                   public std::enable_shared_from_this<Call<Args, Res>> {
 public:
  using Done = std::function<void(const CallOutcome&, Res*)>;

  explicit Call(engine::Proc proc) : proc_(proc) {}

  const char* Name() const override { return engine::ProcName(proc_); }
  engine::Proc Procedure() const override { return proc_; }
  engine::Stability WriteStability() const override {
    if constexpr (std::is_same_v<Args, p3::WriteArgs>) {
      return static_cast<engine::Stability>(args.stable);
    } else {
      return engine::Stability::kUnstable;
    }
  }
  engine::ReplySummary Summarize(const void* result) const override {
    const auto* r = static_cast<const Res*>(result);
    engine::ReplySummary s;
    s.nfs_status = static_cast<int>(r->status);
    if constexpr (std::is_same_v<Res, p3::ReadRes>) s.data_bytes = r->status == p3::kOk ? r->data.size() : 0;
    return s;
  }
  size_t BytesOut() const override { return bytes_out; }
  size_t BytesIn() const override { return bytes_in; }
  bool EncodeArgs(proto::XdrOut& x) override { return p3::EncodeArgs(x, args); }
  std::span<const char> Payload() const override { return p3::PayloadOf(args); }
  bool DecodeResult(proto::XdrIn& x, void* result) override {
    static_assert(sizeof(Res) <= engine::kMaxResultSize && alignof(Res) <= alignof(std::max_align_t));
    auto* r = new (result) Res;
    p3::PrepareResult(args, *r);
    if (p3::Xdr(x, *r) && p3::Answers(args, *r)) return true;
    r->~Res();
    return false;
  }
  void DestroyResult(void* result) override { static_cast<Res*>(result)->~Res(); }
  void Complete(const CallOutcome& o) override {
    auto* r = static_cast<Res*>(o.result);
    if (o.status == CallStatus::kOk && r->status == p3::kErrJukebox && engine_ != nullptr) {
      engine_->SubmitAfter(kJukeboxDelay, this->shared_from_this(), cred_);
      return;
    }
    done(o, r);
  }
  void Send(engine::Engine& e, const Cred& c, engine::SubmitOptions so = {}) {
    engine_ = &e;
    cred_ = c;
    e.Submit(this->shared_from_this(), c, so);
  }

  Args args;
  Buffer data;  // WRITE: holds the bytes args.data views
  size_t bytes_out = 0, bytes_in = 0;
  Done done;

 private:
  engine::Proc proc_;
  engine::Engine* engine_ = nullptr;
  Cred cred_;
};

template <class Args, class Res>
std::shared_ptr<Call<Args, Res>> Make(engine::Proc proc) {
  return std::make_shared<Call<Args, Res>>(proc);
}

// The engine could not get an answer: soft timeout, RPC rejection, shutdown.
Error TransportError(const CallOutcome& o, const char* op) {
  return Error::Errno(EIO, std::string(op) + ": " + std::string(o.error));
}

Error StatusError(uint32_t nfsstat, const char* op) {
  return Error::Errno(p3::ErrnoOf(nfsstat), std::string(op) + ": " + p3::StatusName(nfsstat));
}

// A SETATTR's mode carries permission bits only (sattr3's mode3).
SetAttr Sattr(SetAttr sa) {
  if (sa.mode) *sa.mode &= 07777;
  return sa;
}

// The completion of a call with no special rules: transport failure or NFS
// error status become an Error; a success is converted by `ok(reply)` (the
// result is the call's to take from: it is destroyed after).
template <class Res, class T, class F>
auto Reply(const char* op, Cb<T> cb, F ok) {
  return [op, cb = std::move(cb), ok](const CallOutcome& o, Res* r) {
    if (o.status != CallStatus::kOk) return cb(TransportError(o, op));
    if (r->status != p3::kOk) return cb(StatusError(r->status, op));
    cb(ok(*r));
  };
}

}  // namespace

Nfs3::Nfs3(engine::Engine& engine, engine::SubmitOptions defaults)
    : engine_(engine), defaults_(std::move(defaults)) {}

void Nfs3::Null(const Cred& c, Cb<Ok> cb, engine::SubmitOptions so) {
  auto call = Make<p3::NullArgs, p3::NullRes>(engine::Proc::kNull);
  call->done = [cb = std::move(cb)](const CallOutcome& o, p3::NullRes*) {
    if (o.status != CallStatus::kOk) return cb(TransportError(o, "NULL"));
    cb(Ok{});
  };
  call->Send(engine_, c, so);
}

void Nfs3::Getattr(const Fh& fh, const Cred& c, Cb<Attr> cb, engine::SubmitOptions so) {
  auto call = Make<p3::FhArgs, p3::GetattrRes>(engine::Proc::kGetattr);
  call->args.fh = fh;
  call->done = Reply<p3::GetattrRes>("GETATTR", std::move(cb), [](const p3::GetattrRes& r) { return r.attr; });
  call->Send(engine_, c, so);
}

void Nfs3::Setattr(const Fh& fh, const SetAttr& sa, const Cred& c, Cb<Wcc> cb) {
  auto call = Make<p3::SetattrArgs, p3::WccRes>(engine::Proc::kSetattr);
  call->args.fh = fh;
  call->args.sa = Sattr(sa);
  call->done = Reply<p3::WccRes>("SETATTR", std::move(cb), [](const p3::WccRes& r) { return r.wcc; });
  call->Send(engine_, c, defaults_);
}

void Nfs3::Lookup(const Fh& dir, const std::string& name, const Cred& c, Cb<LookupReply> cb) {
  auto call = Make<p3::DirOpArgs, p3::LookupRes>(engine::Proc::kLookup);
  call->args = {dir, name};
  call->done = Reply<p3::LookupRes>("LOOKUP", std::move(cb), [](const p3::LookupRes& r) { return r.ok; });
  call->Send(engine_, c, defaults_);
}

void Nfs3::Access(const Fh& fh, uint32_t mask, const Cred& c, Cb<AccessReply> cb) {
  auto call = Make<p3::AccessArgs, p3::AccessRes>(engine::Proc::kAccess);
  call->args = {fh, mask};
  call->done = Reply<p3::AccessRes>("ACCESS", std::move(cb), [](const p3::AccessRes& r) { return r.ok; });
  call->Send(engine_, c, defaults_);
}

void Nfs3::Readlink(const Fh& fh, const Cred& c, Cb<std::string> cb) {
  auto call = Make<p3::FhArgs, p3::ReadlinkRes>(engine::Proc::kReadlink);
  call->args.fh = fh;
  call->done = Reply<p3::ReadlinkRes>("READLINK", std::move(cb),
                                      [](const p3::ReadlinkRes& r) { return std::string(r.path); });
  call->Send(engine_, c, defaults_);
}

void Nfs3::Read(const Fh& fh, uint64_t off, uint32_t count, const Cred& c, Cb<ReadReply> cb) {
  auto call = Make<p3::ReadArgs, p3::ReadRes>(engine::Proc::kRead);
  call->args = {fh, off, count};
  call->bytes_in = count;
  call->done = Reply<p3::ReadRes>("READ", std::move(cb), [](const p3::ReadRes& r) {
    ReadReply rr;
    rr.data = r.data.data();
    rr.len = std::min<size_t>(r.data.size(), r.count);
    rr.eof = r.eof;
    rr.attr = r.attr;
    return rr;
  });
  call->Send(engine_, c, defaults_);
}

void Nfs3::Write(const Fh& fh, uint64_t off, Buffer buf, size_t buf_off, size_t len, bool stable,
                 const Cred& c, Cb<WriteReply> cb) {
  auto call = Make<p3::WriteArgs, p3::WriteRes>(engine::Proc::kWrite);
  call->data = std::move(buf);
  call->args.fh = fh;
  call->args.off = off;
  call->args.count = static_cast<uint32_t>(len);
  call->args.stable = stable ? p3::Stable::kFileSync : p3::Stable::kUnstable;
  call->args.data = std::string_view(call->data->data() + buf_off, len);
  call->bytes_out = len;
  call->done = Reply<p3::WriteRes>("WRITE", std::move(cb), [](const p3::WriteRes& r) {
    return WriteReply{r.count, r.committed != p3::Stable::kUnstable, r.verf, r.wcc};
  });
  call->Send(engine_, c, defaults_);
}

void Nfs3::Commit(const Fh& fh, const Cred& c, Cb<CommitReply> cb) {
  auto call = Make<p3::CommitArgs, p3::CommitRes>(engine::Proc::kCommit);
  call->args = {fh, 0, 0};  // the whole file
  call->done = Reply<p3::CommitRes>("COMMIT", std::move(cb),
                                    [](const p3::CommitRes& r) { return CommitReply{r.verf, r.wcc}; });
  call->Send(engine_, c, defaults_);
}

void Nfs3::NewObjectOrLookup(const Fh& dir, const std::string& name, const Cred& c,
                             Cb<NewObject> cb) {
  Lookup(dir, name, c, [cb = std::move(cb)](Result<LookupReply> r) {
    if (!r) return cb(r.error());
    NewObject n;
    n.fh = std::move(r->fh);
    n.attr = std::move(r->attr);
    n.dir.after = std::move(r->dir);
    n.looked_up = true;
    cb(std::move(n));
  });
}

// The four object-creating procedures share the reissue rule for EEXIST.
std::function<void(const CallOutcome&, p3::NewObjectRes*)> Nfs3::NewObjectDone(
    const char* op, Cb<NewObject> cb, const Fh& dir, const std::string& name, const Cred& c,
    bool lookup_on_reissued_exist) {
  return [this, op, cb = std::move(cb), dir, name, c, lookup_on_reissued_exist](
             const CallOutcome& o, p3::NewObjectRes* r) mutable {
    if (o.status != CallStatus::kOk) return cb(TransportError(o, op));
    if (r->status != p3::kOk && o.reissued && lookup_on_reissued_exist &&
        OnReissued(ReissueProc::kNewObject, p3::ErrnoOf(r->status)) == Reissued::kWhatIsThere) {
      return NewObjectOrLookup(dir, name, c, std::move(cb));
    }
    if (r->status != p3::kOk) return cb(StatusError(r->status, op));
    cb(r->ok);
  };
}

void Nfs3::Create(const Fh& dir, const std::string& name, CreateMode mode, const SetAttr& sa,
                  uint64_t verf, const Cred& c, Cb<NewObject> cb) {
  auto call = Make<p3::CreateArgs, p3::NewObjectRes>(engine::Proc::kCreate);
  call->args = {dir, name, mode, Sattr(sa), verf};
  call->done = NewObjectDone("CREATE", std::move(cb), dir, name, c, mode == CreateMode::kGuarded);
  call->Send(engine_, c, defaults_);
}

void Nfs3::Mkdir(const Fh& dir, const std::string& name, const SetAttr& sa, const Cred& c,
                 Cb<NewObject> cb) {
  auto call = Make<p3::MkdirArgs, p3::NewObjectRes>(engine::Proc::kMkdir);
  call->args = {dir, name, Sattr(sa)};
  call->done = NewObjectDone("MKDIR", std::move(cb), dir, name, c, true);
  call->Send(engine_, c, defaults_);
}

void Nfs3::Symlink(const Fh& dir, const std::string& name, const std::string& target,
                   const SetAttr& sa, const Cred& c, Cb<NewObject> cb) {
  auto call = Make<p3::SymlinkArgs, p3::NewObjectRes>(engine::Proc::kSymlink);
  call->args = {dir, name, Sattr(sa), target};
  call->done = NewObjectDone("SYMLINK", std::move(cb), dir, name, c, true);
  call->Send(engine_, c, defaults_);
}

void Nfs3::Mknod(const Fh& dir, const std::string& name, Ftype type, const SetAttr& sa,
                 uint32_t major, uint32_t minor, const Cred& c, Cb<NewObject> cb) {
  auto call = Make<p3::MknodArgs, p3::NewObjectRes>(engine::Proc::kMknod);
  // (Any other type is made a FIFO: the FUSE layer asks only for these.)
  const bool known = type == Ftype::kChr || type == Ftype::kBlk || type == Ftype::kSock;
  call->args = {dir, name, known ? type : Ftype::kFifo, Sattr(sa), major, minor};
  call->done = NewObjectDone("MKNOD", std::move(cb), dir, name, c, true);
  call->Send(engine_, c, defaults_);
}

namespace {
// REMOVE, RMDIR and RENAME answered ENOENT when reissued: the first
// execution did it (nfs/reissue.h).
template <class Res, class T, class F>
auto ReplyReissuedDone(const char* op, ReissueProc proc, Cb<T> cb, F ok) {
  return [op, proc, cb = std::move(cb), ok](const CallOutcome& o, Res* r) {
    if (o.status != CallStatus::kOk) return cb(TransportError(o, op));
    if (r->status != p3::kOk && o.reissued && OnReissued(proc, p3::ErrnoOf(r->status)) == Reissued::kDone) {
      return cb(T{});
    }
    if (r->status != p3::kOk) return cb(StatusError(r->status, op));
    cb(ok(*r));
  };
}
}  // namespace

void Nfs3::Remove(const Fh& dir, const std::string& name, const Cred& c, Cb<Wcc> cb) {
  auto call = Make<p3::DirOpArgs, p3::WccRes>(engine::Proc::kRemove);
  call->args = {dir, name};
  call->done = ReplyReissuedDone<p3::WccRes>("REMOVE", ReissueProc::kRemove, std::move(cb),
                                             [](const p3::WccRes& r) { return r.wcc; });
  call->Send(engine_, c, defaults_);
}

void Nfs3::Rmdir(const Fh& dir, const std::string& name, const Cred& c, Cb<Wcc> cb) {
  auto call = Make<p3::DirOpArgs, p3::WccRes>(engine::Proc::kRmdir);
  call->args = {dir, name};
  call->done = ReplyReissuedDone<p3::WccRes>("RMDIR", ReissueProc::kRmdir, std::move(cb),
                                             [](const p3::WccRes& r) { return r.wcc; });
  call->Send(engine_, c, defaults_);
}

void Nfs3::Rename(const Fh& from_dir, const std::string& from, const Fh& to_dir,
                  const std::string& to, const Cred& c, Cb<RenameReply> cb) {
  auto call = Make<p3::RenameArgs, p3::RenameRes>(engine::Proc::kRename);
  call->args = {from_dir, from, to_dir, to};
  call->done = ReplyReissuedDone<p3::RenameRes>("RENAME", ReissueProc::kRename, std::move(cb),
                                                [](const p3::RenameRes& r) { return r.wcc; });
  call->Send(engine_, c, defaults_);
}

void Nfs3::Link(const Fh& fh, const Fh& dir, const std::string& name, const Cred& c,
                Cb<LinkReply> cb) {
  auto call = Make<p3::LinkArgs, p3::LinkRes>(engine::Proc::kLink);
  call->args = {fh, dir, name};
  call->done = [this, cb = std::move(cb), fh, dir, name, c](const CallOutcome& o, p3::LinkRes* r) mutable {
    if (o.status != CallStatus::kOk) return cb(TransportError(o, "LINK"));
    if (r->status != p3::kOk && o.reissued &&
        OnReissued(ReissueProc::kLink, p3::ErrnoOf(r->status)) == Reissued::kSameObject) {
      // Our first LINK made the name only if it names this file.
      return Lookup(dir, name, c, [this, fh, c, cb = std::move(cb)](Result<LookupReply> l) mutable {
        if (!l) return cb(l.error());
        LinkReply lr;
        lr.attr = std::move(l->attr);
        lr.dir.after = std::move(l->dir);
        if (l->fh == fh) return cb(std::move(lr));
        // A server may give one file other handles in other directories
        // (Linux's subtree_check): the same file has the same fsid and
        // fileid.
        if (!lr.attr) return cb(Error::Errno(EEXIST, "LINK: NFS3ERR_EXIST"));
        Getattr(fh, c, [lr = std::move(lr), cb = std::move(cb)](Result<Attr> a) mutable {
          if (!a) return cb(a.error());
          if (a->fsid != lr.attr->fsid || a->fileid != lr.attr->fileid) {
            return cb(Error::Errno(EEXIST, "LINK: NFS3ERR_EXIST"));
          }
          cb(std::move(lr));
        });
      });
    }
    if (r->status != p3::kOk) return cb(StatusError(r->status, "LINK"));
    cb(r->ok);
  };
  call->Send(engine_, c, defaults_);
}

void Nfs3::Readdir(const Fh& dir, uint64_t cookie, uint64_t verf, uint32_t count, const Cred& c,
                   Cb<DirPage> cb) {
  auto call = Make<p3::ReaddirArgs, p3::ReaddirRes>(engine::Proc::kReaddir);
  call->args = {false, dir, cookie, verf, 0, count};
  call->done = Reply<p3::ReaddirRes>("READDIR", std::move(cb), [](p3::ReaddirRes& r) { return std::move(r.page); });
  call->Send(engine_, c, defaults_);
}

void Nfs3::Readdirplus(const Fh& dir, uint64_t cookie, uint64_t verf, uint32_t dircount,
                       uint32_t maxcount, const Cred& c, Cb<DirPage> cb) {
  auto call = Make<p3::ReaddirArgs, p3::ReaddirRes>(engine::Proc::kReaddirplus);
  call->args = {true, dir, cookie, verf, dircount, maxcount};
  call->done = Reply<p3::ReaddirRes>("READDIRPLUS", std::move(cb), [](p3::ReaddirRes& r) { return std::move(r.page); });
  call->Send(engine_, c, defaults_);
}

void Nfs3::Fsstat(const Fh& fh, const Cred& c, Cb<FsStat> cb, engine::SubmitOptions so) {
  auto call = Make<p3::FhArgs, p3::FsstatRes>(engine::Proc::kFsstat);
  call->args.fh = fh;
  call->done = Reply<p3::FsstatRes>("FSSTAT", std::move(cb), [](const p3::FsstatRes& r) { return r.ok; });
  call->Send(engine_, c, so);
}

void Nfs3::Fsinfo(const Fh& fh, const Cred& c, Cb<FsInfo> cb, engine::SubmitOptions so) {
  auto call = Make<p3::FhArgs, p3::FsinfoRes>(engine::Proc::kFsinfo);
  call->args.fh = fh;
  call->done = Reply<p3::FsinfoRes>("FSINFO", std::move(cb), [](const p3::FsinfoRes& r) { return r.ok; });
  call->Send(engine_, c, so);
}

void Nfs3::Pathconf(const Fh& fh, const Cred& c, Cb<PathConf> cb, engine::SubmitOptions so) {
  auto call = Make<p3::FhArgs, p3::PathconfRes>(engine::Proc::kPathconf);
  call->args.fh = fh;
  call->done = Reply<p3::PathconfRes>("PATHCONF", std::move(cb), [](const p3::PathconfRes& r) { return r.ok; });
  call->Send(engine_, c, so);
}

}  // namespace mpnfs::nfs
