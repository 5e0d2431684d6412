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
  rec.text = *text;
  rec.host = Field(rec.text, "host");
  rec.cache_dir = Field(rec.text, "cache_dir");
  rec.cache_id = Field(rec.text, "cache_id");
  return std::optional<OwnerRecord>(std::move(rec));
}

Result<Ok> ClaimOwner(nfs::Client& nfs, const nfs::Fh& root, const std::string& cache_dir,
                      const std::string& id) {
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
  nfs::SetAttr sa;
  sa.mode = 0644;
  sa.size = 0;
  auto made = Wait<nfs::NewObject>([&](nfs::Cb<nfs::NewObject> cb) {
    nfs.Create(root, kOwnerName, nfs::CreateMode::kUnchecked, sa, 0, root_cred, std::move(cb));
  });
  if (!made) return Error::Errno(made.error().err, std::string("creating ") + kOwnerName + ": " + made.error().what);
  nfs::Fh fh;
  if (made->fh) {
    fh = *made->fh;
  } else {
    auto l = Wait<nfs::LookupReply>(
        [&](nfs::Cb<nfs::LookupReply> cb) { nfs.Lookup(root, kOwnerName, root_cred, std::move(cb)); });
    if (!l) return l.error();
    fh = l->fh;
  }
  auto bytes = std::make_shared<nfs::Bytes>(text.size());
  std::copy(text.begin(), text.end(), bytes->data());
  auto w = Wait<nfs::WriteReply>([&](nfs::Cb<nfs::WriteReply> cb) {
    nfs.Write(fh, 0, bytes, 0, text.size(), /*stable=*/true, root_cred, std::move(cb));
  });
  if (!w) return Error::Errno(w.error().err, std::string("writing ") + kOwnerName + ": " + w.error().what);
  if (w->count != text.size()) return Error::Errno(EIO, std::string("short write of ") + kOwnerName);
  return Ok{};
}

Result<Ok> ReleaseOwner(nfs::Client& nfs, const nfs::Fh& root) {
  const engine::Cred root_cred;
  auto r = Wait<nfs::Wcc>([&](nfs::Cb<nfs::Wcc> cb) { nfs.Remove(root, kOwnerName, root_cred, std::move(cb)); });
  if (!r && r.error().err != ENOENT) return r.error();
  return Ok{};
}

std::string OwnerRefusal(const OwnerRecord& r, const std::string& export_name) {
  return export_name + " is owned by the write-back cache " + r.cache_dir + " on host " + r.host +
         " (" + kOwnerName + " in the export's root), which may hold data the server does not "
         "have yet. Mount it there with cache_mode=writeback to flush it; remove " + kOwnerName +
         " only if that cache is lost for good.";
}

}  // namespace mpnfs::fs
