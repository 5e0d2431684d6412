// nfs::LockClient: the NLM v4 lock calls the filesystem's lock layer makes
// (fs/locks.h), as an interface: the seam where a fake lock manager enters
// its tests. Nlm is the production implementation: proto/nlm4.h over an
// engine whose paths lead to the server's lock manager.
//
// Who holds a lock, for the server: the caller_name (this host), and an
// owner: `oh`, an opaque the lock layer makes unique to this mount and the
// process or open file, with `svid`, its number. A lock call sent again
// (a lost reply, a path failing over) asks for the same thing, so the
// server's answer is the same: NLM's calls are idempotent for one owner.
//
// Contract, as nfs::Client's: `cb` runs exactly once, on an engine loop
// thread (must not block), or inline for an error found before sending.
// Statuses come back as they are (denied, grace period, ...); an Error is
// a call that got no answer. Thread safety: all methods are thread safe.
#pragma once

#include <cstdint>
#include <string>

#include "engine/cred.h"
#include "nfs/client.h"
#include "nfs/types.h"
#include "proto/nlm4.h"

namespace mpnfs::engine {
class Engine;
}

namespace mpnfs::nfs {

struct LockOwner {
  std::string oh;
  int32_t svid = 0;
  bool operator==(const LockOwner&) const = default;
};

// Bytes [offset, offset + length); length 0: to the end of the file, and
// beyond.
struct LockRange {
  bool exclusive = false;
  uint64_t offset = 0;
  uint64_t length = 0;
  bool operator==(const LockRange&) const = default;
};

class LockClient {
 public:
  virtual ~LockClient() = default;
  // TEST: the lock that would conflict, if any (TestRes::holder when
  // stat is kDenied).
  virtual void Test(const Fh& fh, const LockOwner& o, const LockRange& r, const Cred& c,
                    Cb<proto::nlm4::TestRes> cb) = 0;
  // LOCK without blocking on the server (a caller that waits asks again).
  virtual void Lock(const Fh& fh, const LockOwner& o, const LockRange& r, bool reclaim, const Cred& c,
                    Cb<proto::nlm4::Stat> cb) = 0;
  virtual void Unlock(const Fh& fh, const LockOwner& o, uint64_t offset, uint64_t length, const Cred& c,
                      Cb<proto::nlm4::Stat> cb) = 0;
};

class Nlm final : public LockClient {
 public:
  // `caller_name`: this host as the server's lock manager sees it;
  // `nsm_state`: this client's NSM state number (odd while it runs).
  Nlm(engine::Engine& engine, std::string caller_name, int32_t nsm_state);

  void Test(const Fh& fh, const LockOwner& o, const LockRange& r, const Cred& c,
            Cb<proto::nlm4::TestRes> cb) override;
  void Lock(const Fh& fh, const LockOwner& o, const LockRange& r, bool reclaim, const Cred& c,
            Cb<proto::nlm4::Stat> cb) override;
  void Unlock(const Fh& fh, const LockOwner& o, uint64_t offset, uint64_t length, const Cred& c,
              Cb<proto::nlm4::Stat> cb) override;

 private:
  proto::nlm4::Lock Wire(const Fh& fh, const LockOwner& o, uint64_t offset, uint64_t length) const;

  engine::Engine& engine_;
  const std::string caller_name_;
  const int32_t nsm_state_;
};

}  // namespace mpnfs::nfs
