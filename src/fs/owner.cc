#include "fs/owner.h"

#include <unistd.h>

#include <ctime>
#include <sstream>

#include "nfs/wait.h"

namespace mpnfs::fs {
namespace {

using nfs::Wait;

std::string Field(const std::string& text, const std::string& key) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key + ": ", 0) == 0) return line.substr(key.size() + 2);
  }
  return "";
}

}  // namespace

Result<std::optional<OwnerRecord>> ReadOwner(nfs::Client& nfs, const nfs::Fh& root) {
  const engine::Cred root_cred;
  auto l = Wait<nfs::LookupReply>(
      [&](nfs::Cb<nfs::LookupReply> cb) { nfs.Lookup(root, kOwnerName, root_cred, std::move(cb)); });
  if (!l) {
    if (l.error().err == ENOENT) return std::optional<OwnerRecord>();
    return Error::Errno(l.error().err, std::string("looking up ") + kOwnerName + ": " + l.error().what);
  }
  auto text = Wait<std::string>([&](nfs::Cb<std::string> cb) {
    nfs.Read(l->fh, 0, 4096, root_cred, [cb = std::move(cb)](Result<nfs::ReadReply> r) {
      if (!r) return cb(r.error());
      cb(std::string(r->data, r->len));
    });
  });
  if (!text) return Error::Errno(text.error().err, std::string("reading ") + kOwnerName + ": " + text.error().what);
  OwnerRecord rec;
  rec.fh = l->fh;
  rec.text = *text;
  rec.host = Field(rec.text, "host");
  rec.cache_dir = Field(rec.text, "cache_dir");
  rec.cache_id = Field(rec.text, "cache_id");
  return std::optional<OwnerRecord>(std::move(rec));
}

uint64_t OwnerVerifier(const std::string& id) {
  // The host too: a cache directory copied to another machine (a cloned
  // image, a restored snapshot) has the same id, and its CREATE must not be
  // taken by the server for a retransmission of the original's.
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const std::string key = id + "@" + host;
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char ch : key) {
    h ^= ch;
    h *= 1099511628211ull;
  }
  return h;
}

Result<std::optional<OwnerRecord>> ClaimOwner(nfs::Client& nfs, const nfs::Fh& root,
                                              const std::string& cache_dir, const std::string& id) {
  const engine::Cred root_cred;
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  char when[64] = {};
  const time_t now = time(nullptr);
  struct tm tm {};
  gmtime_r(&now, &tm);
  strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
  const std::string text = std::string("mpnfs write-back cache owner: do not remove while that cache holds "
                                       "unflushed data (mpnfs(8))\n") +
                           "host: " + host + "\ncache_dir: " + cache_dir + "\ncache_id: " + id +
                           "\nsince: " + when + "\n";
  // Made now (or our own earlier attempt, same verifier), or found: ours or
  // another cache's. A record removed between our CREATE and our look at
  // it (its owner unmounted) is claimed again.
  std::optional<nfs::Fh> fh;
  for (int attempt = 0; attempt < 3 && !fh; ++attempt) {
    auto made = Wait<nfs::NewObject>([&](nfs::Cb<nfs::NewObject> cb) {
      nfs.Create(root, kOwnerName, nfs::CreateMode::kExclusive, {}, OwnerVerifier(id), root_cred,
                 std::move(cb));
    });
    if (!made && made.error().err != EEXIST) {
      return Error::Errno(made.error().err, std::string("creating ") + kOwnerName + ": " + made.error().what);
    }
    if (made && made->fh) {
      fh = *made->fh;
      break;
    }
    auto found = ReadOwner(nfs, root);
    if (!found) return found.error();
    if (!*found) continue;
    // Another cache's, or this cache's id on another host (a copy of it).
    if (!made && ((*found)->cache_id != id || (!(*found)->host.empty() && (*found)->host != host))) {
      return found;
    }
    fh = (*found)->fh;
  }
  if (!fh) return Error::Errno(EAGAIN, std::string(kOwnerName) + " keeps appearing and disappearing");
  auto setattr = [&](const nfs::SetAttr& sa) {
    return Wait<nfs::Wcc>([&](nfs::Cb<nfs::Wcc> cb) { nfs.Setattr(*fh, sa, root_cred, std::move(cb)); });
  };
  nfs::SetAttr mode;
  mode.mode = 0644;
  if (auto r = setattr(mode); !r) {
    return Error::Errno(r.error().err, std::string("setting the mode of ") + kOwnerName + ": " + r.error().what);
  }
  auto bytes = std::make_shared<nfs::Bytes>(text.size());
  std::copy(text.begin(), text.end(), bytes->data());
  auto w = Wait<nfs::WriteReply>([&](nfs::Cb<nfs::WriteReply> cb) {
    nfs.Write(*fh, 0, bytes, 0, text.size(), /*stable=*/true, root_cred, std::move(cb));
  });
  if (!w) return Error::Errno(w.error().err, std::string("writing ") + kOwnerName + ": " + w.error().what);
  if (w->count != text.size()) return Error::Errno(EIO, std::string("short write of ") + kOwnerName);
  // The size (an older record of ours may have been longer) and the times,
  // where the server kept the verifier.
  nfs::SetAttr fix;
  fix.size = text.size();
  fix.atime_how = fix.mtime_how = nfs::SetAttr::TimeHow::kServer;
  if (auto r = setattr(fix); !r) {
    return Error::Errno(r.error().err, std::string("finishing ") + kOwnerName + ": " + r.error().what);
  }
  return std::optional<OwnerRecord>();
}

Result<Ok> ReleaseOwner(nfs::Client& nfs, const nfs::Fh& root, const std::string& id) {
  const engine::Cred root_cred;
  auto found = ReadOwner(nfs, root);
  if (!found) return found.error();
  if (!*found) return Ok{};
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  if ((*found)->cache_id != id || (!(*found)->host.empty() && (*found)->host != host)) {
    return Error::Errno(EPERM, std::string(kOwnerName) + " is not this cache's any more (cache " +
                                   (*found)->cache_id + " on host " + (*found)->host +
                                   " holds it): left in place");
  }
  auto r = Wait<nfs::Wcc>([&](nfs::Cb<nfs::Wcc> cb) { nfs.Remove(root, kOwnerName, root_cred, std::move(cb)); });
  if (!r && r.error().err != ENOENT) return r.error();
  return Ok{};
}

std::string OwnerRefusal(const OwnerRecord& r, const std::string& export_name) {
  if (r.cache_id.empty()) {
    return export_name + " is being claimed by another write-back cache (" + kOwnerName +
           " in the export's root is still empty: another gateway is starting, or stopped while "
           "claiming it). Remove " + kOwnerName + " only if no gateway mounts this export in "
           "write-back mode.";
  }
  return export_name + " is owned by the write-back cache " + r.cache_dir + " on host " + r.host +
         " (" + kOwnerName + " in the export's root), which may hold data the server does not "
         "have yet. Mount it there with cache_mode=writeback to flush it; remove " + kOwnerName +
         " only if that cache is lost for good.";
}

}  // namespace mpnfs::fs
