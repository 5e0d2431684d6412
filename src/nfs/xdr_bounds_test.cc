// The bounds-checked XDR primitives (xdr_bounds.h), exercised through
// libnfs's own generated routines (which reach them through its PLT), on
// buffers made by hand. Each malformed case reads outside the buffer,
// overflows an allocation or overflows the stack with libnfs 4.0's primitives.
#include "nfs/xdr_bounds.h"

#include <gtest/gtest.h>
#include <pthread.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "nfs/libnfs_api.h"

namespace mpnfs::nfs {
namespace {

void Put32(std::vector<char>* v, uint32_t x) {
  for (int s = 24; s >= 0; s -= 8) v->push_back(static_cast<char>((x >> s) & 0xff));
}
void Put64(std::vector<char>* v, uint64_t x) {
  Put32(v, static_cast<uint32_t>(x >> 32));
  Put32(v, static_cast<uint32_t>(x));
}
void PutBytes(std::vector<char>* v, const std::string& s) {
  Put32(v, static_cast<uint32_t>(s.size()));
  v->insert(v->end(), s.begin(), s.end());
  while (v->size() % 4 != 0) v->push_back(0);
}

// Decodes `v` with `fn` into a zeroed T; whether it decoded, and the ZDR
// (destroyed by the caller: decoded pointers may point into its memory).
template <typename T, typename Fn>
bool Decode(std::vector<char>& v, Fn fn, T* out, ZDR* z) {
  std::memset(out, 0, sizeof *out);
  libnfs_zdrmem_create(z, v.data(), static_cast<uint32_t>(v.size()), ZDR_DECODE);
  return fn(z, out) != 0;
}

TEST(XdrBounds, TheReplacementsAreTheOnesLibnfsCalls) { EXPECT_TRUE(XdrBoundsActive()); }

TEST(XdrBounds, AHandleOrNameLongerThanTheReplyIsRefused) {
  for (uint32_t len : {0x80000000u, 0xfffffffcu, 0xffffffffu, 17u}) {
    std::vector<char> v;
    Put32(&v, len);
    v.resize(16, 'x');
    ZDR z;
    nfs_fh3 fh;
    EXPECT_FALSE(Decode(v, zdr_nfs_fh3, &fh, &z)) << len;
    libnfs_zdr_destroy(&z);
    filename3 name;
    EXPECT_FALSE(Decode(v, zdr_filename3, &name, &z)) << len;
    libnfs_zdr_destroy(&z);
  }
}

// NFS3_FHSIZE is 64; the cache's records keep 64 bytes of a handle, so a
// longer one would be cut there and could name another file after a remount.
TEST(XdrBounds, AHandleLongerThan64BytesIsRefused) {
  for (size_t len : {64u, 65u}) {
    std::vector<char> v;
    PutBytes(&v, std::string(len, 'h'));
    ZDR z;
    nfs_fh3 fh;
    EXPECT_EQ(Decode(v, zdr_nfs_fh3, &fh, &z), len == 64) << len;
    libnfs_zdr_destroy(&z);
    mountres3 m;
    std::vector<char> w;
    Put32(&w, MNT3_OK);
    PutBytes(&w, std::string(len, 'h'));
    Put32(&w, 0);  // no flavors
    EXPECT_EQ(Decode(w, zdr_mountres3, &m, &z), len == 64) << len;
    libnfs_zdr_destroy(&z);
  }
}

TEST(XdrBounds, HandlesAndNamesWithinTheReplyDecode) {
  std::vector<char> v;
  PutBytes(&v, "handle");
  ZDR z;
  nfs_fh3 fh;
  ASSERT_TRUE(Decode(v, zdr_nfs_fh3, &fh, &z));
  EXPECT_EQ(std::string(fh.data.data_val, fh.data.data_len), "handle");
  EXPECT_EQ(libnfs_zdr_getpos(&z), 12u);
  libnfs_zdr_destroy(&z);
  // A name whose padding terminates it is used in place; one that fills its
  // words exactly is copied and terminated.
  for (const std::string s : {"abc", "abcd", "", "a name of 16 byt"}) {
    std::vector<char> w;
    PutBytes(&w, s);
    Put32(&w, 0xdeadbeef);
    filename3 name;
    ASSERT_TRUE(Decode(w, zdr_filename3, &name, &z)) << s;
    EXPECT_EQ(std::string(name), s);
    libnfs_zdr_destroy(&z);
  }
}

// libnfs accepted a last item whose padding the reply leaves out; so do
// these (whatever would follow it fails).
TEST(XdrBounds, ALastItemWithoutItsPaddingDecodes) {
  std::vector<char> v;
  PutBytes(&v, "abc");
  v.pop_back();  // the pad byte
  ZDR z;
  nfs_fh3 fh;
  ASSERT_TRUE(Decode(v, zdr_nfs_fh3, &fh, &z));
  EXPECT_EQ(std::string(fh.data.data_val, fh.data.data_len), "abc");
  uint32_t more = 0;
  EXPECT_FALSE(libnfs_zdr_u_int(&z, &more));
  libnfs_zdr_destroy(&z);
  filename3 name;
  ASSERT_TRUE(Decode(v, zdr_filename3, &name, &z));
  EXPECT_STREQ(name, "abc");
  libnfs_zdr_destroy(&z);
}

TEST(XdrBounds, AVerifierCutShortIsRefused) {
  std::vector<char> v;
  Put32(&v, 1);  // 4 of the verifier's 8 bytes
  ZDR z;
  char verf[NFS3_WRITEVERFSIZE];
  libnfs_zdrmem_create(&z, v.data(), static_cast<uint32_t>(v.size()), ZDR_DECODE);
  EXPECT_FALSE(zdr_writeverf3(&z, verf));
  libnfs_zdr_destroy(&z);
}

TEST(XdrBounds, AnArrayLongerThanTheReplyIsRefused) {
  // MOUNT's reply: a handle, then the auth flavors. 0x40000001 x 4 bytes
  // wraps to 4 in 32 bits: libnfs allocated 4 bytes and wrote past them.
  for (uint32_t count : {0x40000001u, 5u}) {
    std::vector<char> v;
    Put32(&v, MNT3_OK);
    PutBytes(&v, "fh");
    Put32(&v, count);
    for (int i = 0; i < 4; ++i) Put32(&v, 1);
    ZDR z;
    mountres3 r;
    EXPECT_FALSE(Decode(v, zdr_mountres3, &r, &z)) << count;
    libnfs_zdr_destroy(&z);
  }
  std::vector<char> v;
  Put32(&v, MNT3_OK);
  PutBytes(&v, "fh");
  Put32(&v, 2);
  Put32(&v, 1);
  Put32(&v, 390003);
  ZDR z;
  mountres3 r;
  ASSERT_TRUE(Decode(v, zdr_mountres3, &r, &z));
  ASSERT_EQ(r.mountres3_u.mountinfo.auth_flavors.auth_flavors_len, 2u);
  EXPECT_EQ(r.mountres3_u.mountinfo.auth_flavors.auth_flavors_val[1], 390003);
  libnfs_zdr_destroy(&z);
}

std::vector<char> DirReply(int entries, bool plus = false) {
  std::vector<char> v;
  Put32(&v, NFS3_OK);
  Put32(&v, 0);   // no dir attributes
  Put64(&v, 7);   // cookie verifier
  for (int i = 0; i < entries; ++i) {
    Put32(&v, 1);  // an entry follows
    Put64(&v, static_cast<uint64_t>(i) + 100);
    PutBytes(&v, "e");
    Put64(&v, static_cast<uint64_t>(i) + 1);
    if (plus) {
      Put32(&v, 0);  // no attributes
      Put32(&v, 1);  // a handle
      PutBytes(&v, "fh" + std::to_string(i));
    }
  }
  Put32(&v, 0);  // no more entries
  Put32(&v, 1);  // eof
  return v;
}

// Runs fn on a thread with a 256 KiB stack: libnfs's recursion needs about
// 100 bytes of stack per entry.
void OnSmallStack(const std::function<void()>& fn) {
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 << 10);
  pthread_t t;
  auto* f = new std::function<void()>(fn);
  ASSERT_EQ(pthread_create(&t, &attr, [](void* p) -> void* {
              auto* g = static_cast<std::function<void()>*>(p);
              (*g)();
              delete g;
              return nullptr;
            }, f), 0);
  pthread_join(t, nullptr);
  pthread_attr_destroy(&attr);
}

TEST(XdrBounds, ADirectoryPageOfAnyLengthDecodesInConstantStack) {
  // 28 bytes an entry: 4.5 MB, about a 4 MiB reply record.
  std::vector<char> page = DirReply(160000);
  int n = -1;
  bool eof = false;
  OnSmallStack([&] {
    ZDR z;
    READDIR3res r;
    if (Decode(page, zdr_READDIR3res, &r, &z)) {
      n = 0;
      for (const entry3* at = r.READDIR3res_u.resok.reply.entries; at != nullptr;) {
        entry3 e;  // (zdr_malloc aligns to 4 bytes only)
        std::memcpy(&e, at, sizeof e);
        if (e.cookie != static_cast<uint64_t>(n) + 1 || std::strcmp(e.name, "e") != 0) break;
        ++n;
        at = e.nextentry;
      }
      eof = r.READDIR3res_u.resok.reply.eof;
    }
    libnfs_zdr_destroy(&z);
  });
  EXPECT_EQ(n, 160000);
  EXPECT_TRUE(eof);
  std::vector<char> plus = DirReply(50000, true);
  n = -1;
  OnSmallStack([&] {
    ZDR z;
    READDIRPLUS3res r;
    if (Decode(plus, zdr_READDIRPLUS3res, &r, &z)) {
      n = 0;
      for (const entryplus3* at = r.READDIRPLUS3res_u.resok.reply.entries; at != nullptr;) {
        entryplus3 e;
        std::memcpy(&e, at, sizeof e);
        const nfs_fh3& fh = e.name_handle.post_op_fh3_u.handle;
        if (std::string(fh.data.data_val, fh.data.data_len) != "fh" + std::to_string(n)) break;
        ++n;
        at = e.nextentry;
      }
    }
    libnfs_zdr_destroy(&z);
  });
  EXPECT_EQ(n, 50000);
  // Cut short inside an entry: refused, and the next page decodes again.
  std::vector<char> cut = DirReply(1000);
  cut.resize(cut.size() - 30);
  ZDR z;
  READDIR3res r;
  EXPECT_FALSE(Decode(cut, zdr_READDIR3res, &r, &z));
  libnfs_zdr_destroy(&z);
  std::vector<char> small = DirReply(3);
  ASSERT_TRUE(Decode(small, zdr_READDIR3res, &r, &z));
  entry3 e;
  const entry3* at = r.READDIR3res_u.resok.reply.entries;
  for (int i = 0; i < 3; ++i) {
    ASSERT_NE(at, nullptr);
    std::memcpy(&e, at, sizeof e);
    at = e.nextentry;
  }
  EXPECT_EQ(e.cookie, 3u);
  EXPECT_EQ(at, nullptr);
  libnfs_zdr_destroy(&z);
}

// Other lists still recurse, up to kMaxListDepth levels.
TEST(XdrBounds, OtherListsDeeperThanTheLimitAreRefused) {
  for (int depth : {kMaxListDepth, kMaxListDepth + 1}) {
    std::vector<char> v;
    for (int i = 0; i < depth; ++i) {
      Put32(&v, 1);  // an export follows
      PutBytes(&v, "/x");
      Put32(&v, 0);  // no groups
    }
    Put32(&v, 0);
    ZDR z;
    exports ex;
    EXPECT_EQ(Decode(v, zdr_exports, &ex, &z), depth == kMaxListDepth) << depth;
    libnfs_zdr_destroy(&z);
  }
}

// Encoding keeps libnfs's format: lengths, data, zero padding.
TEST(XdrBounds, ArgumentsEncodeAsXdrAndDecodeBack) {
  std::string target(4095, 't');
  target[0] = '/';
  SYMLINK3args a;
  std::memset(&a, 0, sizeof a);
  char fh[] = "dirfh";
  a.where.dir.data.data_len = 5;
  a.where.dir.data.data_val = fh;
  char name[] = "link";
  a.where.name = name;
  a.symlink.symlink_data = target.data();
  std::vector<char> buf(8192, '\x55');
  ZDR z;
  libnfs_zdrmem_create(&z, buf.data(), static_cast<uint32_t>(buf.size()), ZDR_ENCODE);
  ASSERT_TRUE(zdr_SYMLINK3args(&z, &a));
  const uint32_t len = libnfs_zdr_getpos(&z);
  libnfs_zdr_destroy(&z);
  std::vector<char> want;
  PutBytes(&want, "dirfh");
  PutBytes(&want, "link");
  Put32(&want, 0);  // no attributes set (all "don't set" arms)
  Put32(&want, 0);
  Put32(&want, 0);
  Put32(&want, 0);
  Put32(&want, 0);  // atime: don't change
  Put32(&want, 0);  // mtime: don't change
  PutBytes(&want, target);
  ASSERT_EQ(len, want.size());
  EXPECT_EQ(std::vector<char>(buf.begin(), buf.begin() + len), want);
  // Too small a buffer fails instead of writing past it.
  std::vector<char> small(want.size() - 1);  // room for the target, not its padding
  libnfs_zdrmem_create(&z, small.data(), static_cast<uint32_t>(small.size()), ZDR_ENCODE);
  EXPECT_FALSE(zdr_SYMLINK3args(&z, &a));
  libnfs_zdr_destroy(&z);
}

}  // namespace
}  // namespace mpnfs::nfs
