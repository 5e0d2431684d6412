#include "nfs/libnfs_api.h"
#include "nfs/nfs3.h"

#include "nfs/reissue.h"
#include "nfs/xdr_bounds.h"


#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>
#include <span>
#include <type_traits>

namespace mpnfs::nfs {
namespace {

using engine::CallOutcome;
using engine::CallStatus;

// One NFSv3 call: its XDR routines (libnfs's), its arguments and the storage they
// point into. Created with make_shared and never moved, so pointers into
// `fh1`, `name1`... stay valid for every (re)transmission.
// How long to wait before sending a call again that the server answered
// with NFS3ERR_JUKEBOX ("busy, try again later"), as the Linux client does;
// the application never sees that error.
constexpr std::chrono::milliseconds kJukeboxDelay{1000};

template <class Args, class Res>
class Call final : public engine::RpcCall,
                   public std::enable_shared_from_this<Call<Args, Res>> {
 public:
  // libnfs's XDR routines for the arguments and the result (nullptr: none).
  using ArgsFn = uint32_t (*)(ZDR*, Args*);
  using ResFn = uint32_t (*)(ZDR*, std::conditional_t<std::is_void_v<Res>, char, Res>*);
  using Done = std::function<void(const CallOutcome&, Res*)>;

  Call(engine::Proc proc, ArgsFn args_fn, ResFn res_fn)
      : proc_(proc), args_fn_(args_fn), res_fn_(res_fn) {
    std::memset(&args, 0, sizeof(args));
  }

  const char* Name() const override { return engine::ProcName(proc_); }
  engine::Proc Procedure() const override { return proc_; }
  engine::Stability WriteStability() const override {
    if constexpr (std::is_same_v<Args, WRITE3args>) {
      return static_cast<engine::Stability>(args.stable);
    } else {
      return engine::Stability::kUnstable;
    }
  }
  engine::ReplySummary Summarize(const void* result) const override {
    engine::ReplySummary s;
    if constexpr (!std::is_void_v<Res>) {
      const auto* r = static_cast<const Res*>(result);
      s.nfs_status = r->status;
      if constexpr (std::is_same_v<Res, READ3res>) {
        s.data_bytes = r->status == NFS3_OK ? r->READ3res_u.resok.count : 0;
      }
    }
    return s;
  }
  size_t BytesOut() const override { return bytes_out; }
  size_t BytesIn() const override { return bytes_in; }
  bool EncodeArgs(ZDR* z) override {
    if constexpr (std::is_same_v<Args, WRITE3args>) {
      // Up to the data's length; the data is the Payload(), sent from `data`.
      return zdr_nfs_fh3(z, &args.file) && zdr_offset3(z, &args.offset) &&
             zdr_count3(z, &args.count) && zdr_stable_how(z, &args.stable) &&
             libnfs_zdr_u_int(z, &args.data.data_len);
    } else {
      return args_fn_ == nullptr || args_fn_(z, &args);
    }
  }
  std::span<const char> Payload() const override {
    if constexpr (std::is_same_v<Args, WRITE3args>) {
      return {args.data.data_val, args.data.data_len};
    } else {
      return {};
    }
  }
  bool DecodeResult(ZDR* z, void* result) override {
    if constexpr (std::is_void_v<Res>) {
      return true;  // NULL: nothing to decode
    } else {
      static_assert(sizeof(Res) <= engine::kMaxResultSize &&
                    alignof(Res) <= alignof(std::max_align_t));
      auto* r = new (result) Res;
      std::memset(r, 0, sizeof(Res));
      if (res_fn_(z, r) == 0) return false;
      if constexpr (std::is_same_v<Res, READ3res>) {
        // More data than asked for is a broken reply (and libnfs's decoder
        // lets a length over 2^31 through).
        if (r->status == NFS3_OK && r->READ3res_u.resok.data.data_len > args.count) return false;
      }
      return true;
    }
  }
  void Complete(const CallOutcome& o) override {
    if constexpr (!std::is_void_v<Res>) {
      auto* r = static_cast<Res*>(o.result);
      if (o.status == CallStatus::kOk && r->status == NFS3ERR_JUKEBOX && engine_ != nullptr) {
        engine_->SubmitAfter(kJukeboxDelay, this->shared_from_this(), cred_);
        return;
      }
    }
    done(o, static_cast<Res*>(o.result));
  }
  void Send(engine::Engine& e, const Cred& c, engine::SubmitOptions so = {}) {
    engine_ = &e;
    cred_ = c;
    e.Submit(this->shared_from_this(), c, so);
  }

  Args args;
  Fh fh1, fh2;
  std::string name1, name2;
  Buffer data;
  size_t bytes_out = 0, bytes_in = 0;
  Done done;

 private:
  engine::Proc proc_;
  ArgsFn args_fn_;
  ResFn res_fn_;
  engine::Engine* engine_ = nullptr;
  Cred cred_;
};

void SetFh(nfs_fh3* dst, const Fh& src) {
  dst->data.data_len = static_cast<u_int>(src.size());
  dst->data.data_val = const_cast<char*>(src.data());
}

Fh FromFh(const nfs_fh3& fh) { return Fh(fh.data.data_val, fh.data.data_len); }

Ftype FromType(int t) {
  switch (t) {
    case NF3REG: return Ftype::kReg;
    case NF3DIR: return Ftype::kDir;
    case NF3BLK: return Ftype::kBlk;
    case NF3CHR: return Ftype::kChr;
    case NF3LNK: return Ftype::kLnk;
    case NF3SOCK: return Ftype::kSock;
    case NF3FIFO: return Ftype::kFifo;
    default: return Ftype::kNone;
  }
}

Attr FromFattr(const fattr3& a) {
  Attr r;
  r.type = FromType(a.type);
  r.mode = a.mode & 07777;
  r.nlink = a.nlink;
  r.uid = a.uid;
  r.gid = a.gid;
  r.size = a.size;
  r.used = a.used;
  r.rdev_major = a.rdev.specdata1;
  r.rdev_minor = a.rdev.specdata2;
  r.fsid = a.fsid;
  r.fileid = a.fileid;
  r.atime = {a.atime.seconds, a.atime.nseconds};
  r.mtime = {a.mtime.seconds, a.mtime.nseconds};
  r.ctime = {a.ctime.seconds, a.ctime.nseconds};
  return r;
}

std::optional<Attr> FromPostOp(const post_op_attr& p) {
  if (!p.attributes_follow) return std::nullopt;
  return FromFattr(p.post_op_attr_u.attributes);
}

Wcc FromWcc(const wcc_data& w) {
  Wcc r;
  if (w.before.attributes_follow) {
    const wcc_attr& b = w.before.pre_op_attr_u.attributes;
    r.before = Wcc::Before{b.size, {b.mtime.seconds, b.mtime.nseconds},
                           {b.ctime.seconds, b.ctime.nseconds}};
  }
  r.after = FromPostOp(w.after);
  return r;
}

uint64_t Verf8(const char* v) {
  uint64_t r;
  std::memcpy(&r, v, 8);
  return r;
}

void ToSattr(const SetAttr& s, sattr3* d) {
  std::memset(d, 0, sizeof(*d));
  if (s.mode) { d->mode.set_it = 1; d->mode.set_mode3_u.mode = *s.mode & 07777; }
  if (s.uid) { d->uid.set_it = 1; d->uid.set_uid3_u.uid = *s.uid; }
  if (s.gid) { d->gid.set_it = 1; d->gid.set_gid3_u.gid = *s.gid; }
  if (s.size) { d->size.set_it = 1; d->size.set_size3_u.size = *s.size; }
  auto how = [](SetAttr::TimeHow h) {
    switch (h) {
      case SetAttr::TimeHow::kServer: return SET_TO_SERVER_TIME;
      case SetAttr::TimeHow::kClient: return SET_TO_CLIENT_TIME;
      default: return DONT_CHANGE;
    }
  };
  d->atime.set_it = how(s.atime_how);
  d->atime.set_atime_u.atime = {s.atime.sec, s.atime.nsec};
  d->mtime.set_it = how(s.mtime_how);
  d->mtime.set_mtime_u.mtime = {s.mtime.sec, s.mtime.nsec};
}

// The engine could not get an answer: soft timeout, RPC rejection, shutdown.
Error TransportError(const CallOutcome& o, const char* op) {
  std::string what = std::string(op) + ": " + std::string(o.error);
  switch (o.status) {
    case CallStatus::kTimedOut: return Error::Errno(EIO, what);
    case CallStatus::kShutdown: return Error::Errno(EIO, what);
    default: return Error::Errno(EIO, what);
  }
}

Error StatusError(int nfsstat, const char* op) {
  int e = std::abs(nfsstat3_to_errno(nfsstat));
  if (nfsstat == NFS3ERR_NOTSUPP) e = EOPNOTSUPP;
  if (nfsstat == NFS3ERR_JUKEBOX) e = EAGAIN;
  if (e == 0) e = EIO;
  return Error::Errno(e, std::string(op) + ": " + nfsstat3_to_str(nfsstat));
}

template <class Args, class Res>
std::shared_ptr<Call<Args, Res>> Make(engine::Proc proc, typename Call<Args, Res>::ArgsFn args_fn,
                                      typename Call<Args, Res>::ResFn res_fn) {
  return std::make_shared<Call<Args, Res>>(proc, args_fn, res_fn);
}

// The completion of a call with no special rules: transport failure or NFS
// error status become an Error; a success is converted by `ok(reply)`.
template <class Res, class T, class F>
auto Reply(const char* op, Cb<T> cb, F ok) {
  return [op, cb = std::move(cb), ok](const CallOutcome& o, Res* r) {
    if (o.status != CallStatus::kOk) return cb(TransportError(o, op));
    if (r->status != NFS3_OK) return cb(StatusError(r->status, op));
    cb(ok(*r));
  };
}

}  // namespace

Nfs3::Nfs3(engine::Engine& engine, engine::SubmitOptions defaults)
    : engine_(engine), defaults_(std::move(defaults)) {
  CheckXdrBounds();
}

void Nfs3::Null(const Cred& c, Cb<Ok> cb, engine::SubmitOptions so) {
  // NULL has no arguments and no result.
  struct NoArgs { int unused; };
  auto call = Make<NoArgs, void>(engine::Proc::kNull, nullptr, nullptr);
  call->done = [cb = std::move(cb)](const CallOutcome& o, void*) {
    if (o.status != CallStatus::kOk) return cb(TransportError(o, "NULL"));
    cb(Ok{});
  };
  call->Send(engine_, c, so);
}

void Nfs3::Getattr(const Fh& fh, const Cred& c, Cb<Attr> cb, engine::SubmitOptions so) {
  auto call = Make<GETATTR3args, GETATTR3res>(engine::Proc::kGetattr,
                                              &zdr_GETATTR3args, &zdr_GETATTR3res);
  call->fh1 = fh;
  SetFh(&call->args.object, call->fh1);
  call->done = Reply<GETATTR3res>("GETATTR", std::move(cb), [](const GETATTR3res& r) {
    return FromFattr(r.GETATTR3res_u.resok.obj_attributes);
  });
  call->Send(engine_, c, so);
}

void Nfs3::Setattr(const Fh& fh, const SetAttr& sa, const Cred& c, Cb<Wcc> cb) {
  auto call = Make<SETATTR3args, SETATTR3res>(engine::Proc::kSetattr,
                                              &zdr_SETATTR3args, &zdr_SETATTR3res);
  call->fh1 = fh;
  SetFh(&call->args.object, call->fh1);
  ToSattr(sa, &call->args.new_attributes);
  call->done = Reply<SETATTR3res>("SETATTR", std::move(cb), [](const SETATTR3res& r) {
    return FromWcc(r.SETATTR3res_u.resok.obj_wcc);
  });
  call->Send(engine_, c, defaults_);
}

void Nfs3::Lookup(const Fh& dir, const std::string& name, const Cred& c, Cb<LookupReply> cb) {
  auto call = Make<LOOKUP3args, LOOKUP3res>(engine::Proc::kLookup,
                                            &zdr_LOOKUP3args, &zdr_LOOKUP3res);
  call->fh1 = dir;
  call->name1 = name;
  SetFh(&call->args.what.dir, call->fh1);
  call->args.what.name = call->name1.data();
  call->done = Reply<LOOKUP3res>("LOOKUP", std::move(cb), [](const LOOKUP3res& r) {
    const auto& ok = r.LOOKUP3res_u.resok;
    return LookupReply{FromFh(ok.object), FromPostOp(ok.obj_attributes),
                       FromPostOp(ok.dir_attributes)};
  });
  call->Send(engine_, c, defaults_);
}

void Nfs3::Access(const Fh& fh, uint32_t mask, const Cred& c, Cb<AccessReply> cb) {
  auto call = Make<ACCESS3args, ACCESS3res>(engine::Proc::kAccess,
                                            &zdr_ACCESS3args, &zdr_ACCESS3res);
  call->fh1 = fh;
  SetFh(&call->args.object, call->fh1);
  call->args.access = mask;
  call->done = Reply<ACCESS3res>("ACCESS", std::move(cb), [](const ACCESS3res& r) {
    const auto& ok = r.ACCESS3res_u.resok;
    return AccessReply{ok.access, FromPostOp(ok.obj_attributes)};
  });
  call->Send(engine_, c, defaults_);
}

void Nfs3::Readlink(const Fh& fh, const Cred& c, Cb<std::string> cb) {
  auto call = Make<READLINK3args, READLINK3res>(engine::Proc::kReadlink,
                                                &zdr_READLINK3args, &zdr_READLINK3res);
  call->fh1 = fh;
  SetFh(&call->args.symlink, call->fh1);
  call->done = Reply<READLINK3res>("READLINK", std::move(cb), [](const READLINK3res& r) {
    const char* d = r.READLINK3res_u.resok.data;
    return std::string(d != nullptr ? d : "");
  });
  call->Send(engine_, c, defaults_);
}

void Nfs3::Read(const Fh& fh, uint64_t off, uint32_t count, const Cred& c, Cb<ReadReply> cb) {
  auto call = Make<READ3args, READ3res>(engine::Proc::kRead,
                                        &zdr_READ3args, &zdr_READ3res);
  call->fh1 = fh;
  SetFh(&call->args.file, call->fh1);
  call->args.offset = off;
  call->args.count = count;
  call->bytes_in = count;
  call->done = Reply<READ3res>("READ", std::move(cb), [](const READ3res& r) {
    const auto& ok = r.READ3res_u.resok;
    ReadReply rr;
    rr.data = ok.data.data_val;
    rr.len = std::min<size_t>(ok.data.data_len, ok.count);
    rr.eof = ok.eof != 0;
    rr.attr = FromPostOp(ok.file_attributes);
    return rr;
  });
  call->Send(engine_, c, defaults_);
}

void Nfs3::Write(const Fh& fh, uint64_t off, Buffer buf, size_t buf_off, size_t len, bool stable,
                 const Cred& c, Cb<WriteReply> cb) {
  auto call = Make<WRITE3args, WRITE3res>(engine::Proc::kWrite,
                                          &zdr_WRITE3args, &zdr_WRITE3res);
  call->fh1 = fh;
  call->data = std::move(buf);
  SetFh(&call->args.file, call->fh1);
  call->args.offset = off;
  call->args.count = static_cast<count3>(len);
  call->args.stable = stable ? FILE_SYNC : UNSTABLE;
  call->args.data.data_len = static_cast<u_int>(len);
  call->args.data.data_val = const_cast<char*>(call->data->data() + buf_off);
  call->bytes_out = len;
  call->done = Reply<WRITE3res>("WRITE", std::move(cb), [](const WRITE3res& r) {
    const auto& ok = r.WRITE3res_u.resok;
    return WriteReply{ok.count, ok.committed != UNSTABLE, Verf8(ok.verf), FromWcc(ok.file_wcc)};
  });
  call->Send(engine_, c, defaults_);
}

void Nfs3::Commit(const Fh& fh, const Cred& c, Cb<CommitReply> cb) {
  auto call = Make<COMMIT3args, COMMIT3res>(engine::Proc::kCommit,
                                            &zdr_COMMIT3args, &zdr_COMMIT3res);
  call->fh1 = fh;
  SetFh(&call->args.file, call->fh1);
  call->args.offset = 0;
  call->args.count = 0;  // the whole file
  call->done = Reply<COMMIT3res>("COMMIT", std::move(cb), [](const COMMIT3res& r) {
    const auto& ok = r.COMMIT3res_u.resok;
    return CommitReply{Verf8(ok.verf), FromWcc(ok.file_wcc)};
  });
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

namespace {
// Shared decoding of CREATE/MKDIR/SYMLINK/MKNOD replies.
template <class ResOk>
NewObject FromNewObject(const ResOk& ok) {
  NewObject n;
  if (ok.obj.handle_follows) n.fh = FromFh(ok.obj.post_op_fh3_u.handle);
  n.attr = FromPostOp(ok.obj_attributes);
  n.dir = FromWcc(ok.dir_wcc);
  return n;
}
}  // namespace

// The four object-creating procedures share the reissue rule for EEXIST.
template <class Res, class GetOk>
std::function<void(const CallOutcome&, Res*)> Nfs3::NewObjectDone(
    const char* op, Cb<NewObject> cb, const Fh& dir, const std::string& name, const Cred& c,
    bool lookup_on_reissued_exist, GetOk get_ok) {
  return [this, op, cb = std::move(cb), dir, name, c, lookup_on_reissued_exist, get_ok](
             const CallOutcome& o, Res* r) mutable {
    if (o.status != CallStatus::kOk) return cb(TransportError(o, op));
    if (r->status != NFS3_OK && o.reissued && lookup_on_reissued_exist &&
        OnReissued(ReissueProc::kNewObject, StatusError(r->status, op).err) == Reissued::kWhatIsThere) {
      return NewObjectOrLookup(dir, name, c, std::move(cb));
    }
    if (r->status != NFS3_OK) return cb(StatusError(r->status, op));
    cb(FromNewObject(get_ok(*r)));
  };
}

void Nfs3::Create(const Fh& dir, const std::string& name, CreateMode mode, const SetAttr& sa,
                  uint64_t verf, const Cred& c, Cb<NewObject> cb) {
  auto call = Make<CREATE3args, CREATE3res>(engine::Proc::kCreate,
                                            &zdr_CREATE3args, &zdr_CREATE3res);
  call->fh1 = dir;
  call->name1 = name;
  SetFh(&call->args.where.dir, call->fh1);
  call->args.where.name = call->name1.data();
  switch (mode) {
    case CreateMode::kUnchecked:
      call->args.how.mode = UNCHECKED;
      ToSattr(sa, &call->args.how.createhow3_u.obj_attributes);
      break;
    case CreateMode::kGuarded:
      call->args.how.mode = GUARDED;
      ToSattr(sa, &call->args.how.createhow3_u.g_obj_attributes);
      break;
    case CreateMode::kExclusive:
      call->args.how.mode = EXCLUSIVE;
      std::memcpy(call->args.how.createhow3_u.verf, &verf, 8);
      break;
  }
  call->done = NewObjectDone<CREATE3res>(
      "CREATE", std::move(cb), dir, name, c, mode == CreateMode::kGuarded,
      [](const CREATE3res& r) -> const CREATE3resok& { return r.CREATE3res_u.resok; });
  call->Send(engine_, c, defaults_);
}

void Nfs3::Mkdir(const Fh& dir, const std::string& name, const SetAttr& sa, const Cred& c,
                 Cb<NewObject> cb) {
  auto call = Make<MKDIR3args, MKDIR3res>(engine::Proc::kMkdir,
                                          &zdr_MKDIR3args, &zdr_MKDIR3res);
  call->fh1 = dir;
  call->name1 = name;
  SetFh(&call->args.where.dir, call->fh1);
  call->args.where.name = call->name1.data();
  ToSattr(sa, &call->args.attributes);
  call->done = NewObjectDone<MKDIR3res>(
      "MKDIR", std::move(cb), dir, name, c, true,
      [](const MKDIR3res& r) -> const MKDIR3resok& { return r.MKDIR3res_u.resok; });
  call->Send(engine_, c, defaults_);
}

void Nfs3::Symlink(const Fh& dir, const std::string& name, const std::string& target,
                   const SetAttr& sa, const Cred& c, Cb<NewObject> cb) {
  auto call = Make<SYMLINK3args, SYMLINK3res>(engine::Proc::kSymlink,
                                              &zdr_SYMLINK3args, &zdr_SYMLINK3res);
  call->fh1 = dir;
  call->name1 = name;
  call->name2 = target;
  SetFh(&call->args.where.dir, call->fh1);
  call->args.where.name = call->name1.data();
  ToSattr(sa, &call->args.symlink.symlink_attributes);
  call->args.symlink.symlink_data = call->name2.data();
  call->done = NewObjectDone<SYMLINK3res>(
      "SYMLINK", std::move(cb), dir, name, c, true,
      [](const SYMLINK3res& r) -> const SYMLINK3resok& { return r.SYMLINK3res_u.resok; });
  call->Send(engine_, c, defaults_);
}

void Nfs3::Mknod(const Fh& dir, const std::string& name, Ftype type, const SetAttr& sa,
                 uint32_t major, uint32_t minor, const Cred& c, Cb<NewObject> cb) {
  auto call = Make<MKNOD3args, MKNOD3res>(engine::Proc::kMknod,
                                          &zdr_MKNOD3args, &zdr_MKNOD3res);
  call->fh1 = dir;
  call->name1 = name;
  SetFh(&call->args.where.dir, call->fh1);
  call->args.where.name = call->name1.data();
  auto& what = call->args.what;
  switch (type) {
    case Ftype::kChr:
      what.type = NF3CHR;
      ToSattr(sa, &what.mknoddata3_u.chr_device.dev_attributes);
      what.mknoddata3_u.chr_device.spec = {major, minor};
      break;
    case Ftype::kBlk:
      what.type = NF3BLK;
      ToSattr(sa, &what.mknoddata3_u.blk_device.dev_attributes);
      what.mknoddata3_u.blk_device.spec = {major, minor};
      break;
    case Ftype::kSock:
      what.type = NF3SOCK;
      ToSattr(sa, &what.mknoddata3_u.sock_attributes);
      break;
    default:
      what.type = NF3FIFO;
      ToSattr(sa, &what.mknoddata3_u.pipe_attributes);
      break;
  }
  call->done = NewObjectDone<MKNOD3res>(
      "MKNOD", std::move(cb), dir, name, c, true,
      [](const MKNOD3res& r) -> const MKNOD3resok& { return r.MKNOD3res_u.resok; });
  call->Send(engine_, c, defaults_);
}

void Nfs3::Remove(const Fh& dir, const std::string& name, const Cred& c, Cb<Wcc> cb) {
  auto call = Make<REMOVE3args, REMOVE3res>(engine::Proc::kRemove,
                                            &zdr_REMOVE3args, &zdr_REMOVE3res);
  call->fh1 = dir;
  call->name1 = name;
  SetFh(&call->args.object.dir, call->fh1);
  call->args.object.name = call->name1.data();
  call->done = [cb = std::move(cb)](const CallOutcome& o, REMOVE3res* r) {
    if (o.status != CallStatus::kOk) return cb(TransportError(o, "REMOVE"));
    if (r->status != NFS3_OK && o.reissued &&
        OnReissued(ReissueProc::kRemove, StatusError(r->status, "REMOVE").err) == Reissued::kDone) {
      return cb(Wcc{});
    }
    if (r->status != NFS3_OK) return cb(StatusError(r->status, "REMOVE"));
    cb(FromWcc(r->REMOVE3res_u.resok.dir_wcc));
  };
  call->Send(engine_, c, defaults_);
}

void Nfs3::Rmdir(const Fh& dir, const std::string& name, const Cred& c, Cb<Wcc> cb) {
  auto call = Make<RMDIR3args, RMDIR3res>(engine::Proc::kRmdir,
                                          &zdr_RMDIR3args, &zdr_RMDIR3res);
  call->fh1 = dir;
  call->name1 = name;
  SetFh(&call->args.object.dir, call->fh1);
  call->args.object.name = call->name1.data();
  call->done = [cb = std::move(cb)](const CallOutcome& o, RMDIR3res* r) {
    if (o.status != CallStatus::kOk) return cb(TransportError(o, "RMDIR"));
    if (r->status != NFS3_OK && o.reissued &&
        OnReissued(ReissueProc::kRmdir, StatusError(r->status, "RMDIR").err) == Reissued::kDone) {
      return cb(Wcc{});
    }
    if (r->status != NFS3_OK) return cb(StatusError(r->status, "RMDIR"));
    cb(FromWcc(r->RMDIR3res_u.resok.dir_wcc));
  };
  call->Send(engine_, c, defaults_);
}

void Nfs3::Rename(const Fh& from_dir, const std::string& from, const Fh& to_dir,
                  const std::string& to, const Cred& c, Cb<RenameReply> cb) {
  auto call = Make<RENAME3args, RENAME3res>(engine::Proc::kRename,
                                            &zdr_RENAME3args, &zdr_RENAME3res);
  call->fh1 = from_dir;
  call->fh2 = to_dir;
  call->name1 = from;
  call->name2 = to;
  SetFh(&call->args.from.dir, call->fh1);
  call->args.from.name = call->name1.data();
  SetFh(&call->args.to.dir, call->fh2);
  call->args.to.name = call->name2.data();
  call->done = [cb = std::move(cb)](const CallOutcome& o, RENAME3res* r) {
    if (o.status != CallStatus::kOk) return cb(TransportError(o, "RENAME"));
    if (r->status != NFS3_OK && o.reissued &&
        OnReissued(ReissueProc::kRename, StatusError(r->status, "RENAME").err) == Reissued::kDone) {
      return cb(RenameReply{});
    }
    if (r->status != NFS3_OK) return cb(StatusError(r->status, "RENAME"));
    const auto& ok = r->RENAME3res_u.resok;
    cb(RenameReply{FromWcc(ok.fromdir_wcc), FromWcc(ok.todir_wcc)});
  };
  call->Send(engine_, c, defaults_);
}

void Nfs3::Link(const Fh& fh, const Fh& dir, const std::string& name, const Cred& c,
                Cb<LinkReply> cb) {
  auto call = Make<LINK3args, LINK3res>(engine::Proc::kLink,
                                        &zdr_LINK3args, &zdr_LINK3res);
  call->fh1 = fh;
  call->fh2 = dir;
  call->name1 = name;
  SetFh(&call->args.file, call->fh1);
  SetFh(&call->args.link.dir, call->fh2);
  call->args.link.name = call->name1.data();
  call->done = [this, cb = std::move(cb), fh, dir, name, c](const CallOutcome& o, LINK3res* r) mutable {
    if (o.status != CallStatus::kOk) return cb(TransportError(o, "LINK"));
    if (r->status != NFS3_OK && o.reissued &&
        OnReissued(ReissueProc::kLink, StatusError(r->status, "LINK").err) == Reissued::kSameObject) {
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
    if (r->status != NFS3_OK) return cb(StatusError(r->status, "LINK"));
    const auto& ok = r->LINK3res_u.resok;
    cb(LinkReply{FromPostOp(ok.file_attributes), FromWcc(ok.linkdir_wcc)});
  };
  call->Send(engine_, c, defaults_);
}

void Nfs3::Readdir(const Fh& dir, uint64_t cookie, uint64_t verf, uint32_t count, const Cred& c,
                   Cb<DirPage> cb) {
  auto call = Make<READDIR3args, READDIR3res>(engine::Proc::kReaddir,
                                              &zdr_READDIR3args, &zdr_READDIR3res);
  call->fh1 = dir;
  SetFh(&call->args.dir, call->fh1);
  call->args.cookie = cookie;
  std::memcpy(call->args.cookieverf, &verf, 8);
  call->args.count = count;
  call->done = Reply<READDIR3res>("READDIR", std::move(cb), [](const READDIR3res& r) {
    const auto& ok = r.READDIR3res_u.resok;
    DirPage p;
    p.verf = Verf8(ok.cookieverf);
    p.eof = ok.reply.eof != 0;
    p.dir = FromPostOp(ok.dir_attributes);
    // Entries come from libnfs's zdr_malloc, aligned to 4 bytes only:
    // each is copied out before its 8-byte fields are read.
    for (const void* at = ok.reply.entries; at != nullptr;) {
      entry3 e;
      std::memcpy(&e, at, sizeof e);
      p.entries.push_back(DirEntry{e.fileid, e.name, e.cookie, std::nullopt, std::nullopt});
      at = e.nextentry;
    }
    return p;
  });
  call->Send(engine_, c, defaults_);
}

void Nfs3::Readdirplus(const Fh& dir, uint64_t cookie, uint64_t verf, uint32_t dircount,
                       uint32_t maxcount, const Cred& c, Cb<DirPage> cb) {
  auto call = Make<READDIRPLUS3args, READDIRPLUS3res>(engine::Proc::kReaddirplus,
                                                      &zdr_READDIRPLUS3args, &zdr_READDIRPLUS3res);
  call->fh1 = dir;
  SetFh(&call->args.dir, call->fh1);
  call->args.cookie = cookie;
  std::memcpy(call->args.cookieverf, &verf, 8);
  call->args.dircount = dircount;
  call->args.maxcount = maxcount;
  call->done = Reply<READDIRPLUS3res>("READDIRPLUS", std::move(cb), [](const READDIRPLUS3res& r) {
    const auto& ok = r.READDIRPLUS3res_u.resok;
    DirPage p;
    p.verf = Verf8(ok.cookieverf);
    p.eof = ok.reply.eof != 0;
    p.dir = FromPostOp(ok.dir_attributes);
    for (const void* at = ok.reply.entries; at != nullptr;) {
      entryplus3 e;  // (copied out: see READDIR)
      std::memcpy(&e, at, sizeof e);
      DirEntry d{e.fileid, e.name, e.cookie, FromPostOp(e.name_attributes), std::nullopt};
      if (e.name_handle.handle_follows) d.fh = FromFh(e.name_handle.post_op_fh3_u.handle);
      p.entries.push_back(std::move(d));
      at = e.nextentry;
    }
    return p;
  });
  call->Send(engine_, c, defaults_);
}

void Nfs3::Fsstat(const Fh& fh, const Cred& c, Cb<FsStat> cb, engine::SubmitOptions so) {
  auto call = Make<FSSTAT3args, FSSTAT3res>(engine::Proc::kFsstat,
                                            &zdr_FSSTAT3args, &zdr_FSSTAT3res);
  call->fh1 = fh;
  SetFh(&call->args.fsroot, call->fh1);
  call->done = Reply<FSSTAT3res>("FSSTAT", std::move(cb), [](const FSSTAT3res& r) {
    const auto& ok = r.FSSTAT3res_u.resok;
    return FsStat{ok.tbytes, ok.fbytes, ok.abytes, ok.tfiles, ok.ffiles, ok.afiles};
  });
  call->Send(engine_, c, so);
}

void Nfs3::Fsinfo(const Fh& fh, const Cred& c, Cb<FsInfo> cb, engine::SubmitOptions so) {
  auto call = Make<FSINFO3args, FSINFO3res>(engine::Proc::kFsinfo,
                                            &zdr_FSINFO3args, &zdr_FSINFO3res);
  call->fh1 = fh;
  SetFh(&call->args.fsroot, call->fh1);
  call->done = Reply<FSINFO3res>("FSINFO", std::move(cb), [](const FSINFO3res& r) {
    const auto& ok = r.FSINFO3res_u.resok;
    return FsInfo{ok.rtmax, ok.rtpref, ok.wtmax, ok.wtpref, ok.dtpref, ok.maxfilesize,
                  {ok.time_delta.seconds, ok.time_delta.nseconds}};
  });
  call->Send(engine_, c, so);
}

void Nfs3::Pathconf(const Fh& fh, const Cred& c, Cb<PathConf> cb, engine::SubmitOptions so) {
  auto call = Make<PATHCONF3args, PATHCONF3res>(engine::Proc::kPathconf,
                                                &zdr_PATHCONF3args, &zdr_PATHCONF3res);
  call->fh1 = fh;
  SetFh(&call->args.object, call->fh1);
  call->done = Reply<PATHCONF3res>("PATHCONF", std::move(cb), [](const PATHCONF3res& r) {
    const auto& ok = r.PATHCONF3res_u.resok;
    return PathConf{ok.linkmax, ok.name_max};
  });
  call->Send(engine_, c, so);
}

}  // namespace mpnfs::nfs
