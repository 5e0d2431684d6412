#include "fs/whole_write.h"

#include <algorithm>

#include "fs/cache_version.h"

namespace mpnfs::fs {

void SendWholeWrite(nfs::Client& nfs, WholeWrite w,
                    std::function<void(const nfs::WriteReply&, uint64_t off, size_t n)> answered,
                    std::function<void(Result<Ok>)> done) {
  const uint64_t token = w.cache ? w.cache->WriteStart(w.fh, w.off, w.len, w.invalidate) : 0;
  const nfs::Fh fh = w.fh;
  const uint64_t off = w.off;
  const nfs::Buffer data = w.data;
  const size_t buf_off = w.buf_off, len = w.len;
  const bool stable = w.stable;
  const engine::Cred cred = w.cred;
  nfs.Write(fh, off, data, buf_off, len, stable, cred,
            [&nfs, w = std::move(w), token, answered = std::move(answered),
             done = std::move(done)](Result<nfs::WriteReply> r) mutable {
              // (The cache is let go here unless a rest follows: the
              // callback may outlive the call on the event loop.)
              std::shared_ptr<cache::BlockCache> cache = std::move(w.cache);
              if (cache) {
                const bool whole = r && r->count >= w.len;
                std::optional<cache::FileVersion> before, after;
                if (r && r->wcc.before) before = Version(*r->wcc.before);
                if (r && r->wcc.after) after = Version(*r->wcc.after);
                cache->WriteDone(w.fh, token, w.off, w.data->data() + w.buf_off, w.len, whole, w.admit,
                                 before, after);
              }
              if (!r) return done(r.error());
              if (r->count == 0) return done(Error::Errno(EIO, "server wrote nothing"));
              const size_t n = std::min<size_t>(r->count, w.len);
              answered(*r, w.off, n);
              if (n == w.len) return done(Ok{});
              // Short: the rest, from where the server stopped.
              w.cache = std::move(cache);
              w.off += n;
              w.buf_off += n;
              w.len -= n;
              SendWholeWrite(nfs, std::move(w), std::move(answered), std::move(done));
            });
}

}  // namespace mpnfs::fs
