// Definitions that replace libnfs's primitives of the same names; see
// xdr_bounds.h. Written from RFC 4506 (XDR) and the ZDR contract in
// <nfsc/libnfs-zdr.h>: a ZDR is a buffer `buf` of `size` bytes with a cursor
// `pos`, encoding or decoding; memory a decode allocates comes from libnfs's
// zdr_malloc and is freed by libnfs_zdr_destroy.
#include "nfs/xdr_bounds.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "common/log.h"
#include "nfs/libnfs_api.h"

// Exported by libnfs 4.0 (and used by its generated decoders), not declared
// in its headers.
extern "C" void* zdr_malloc(ZDR* zdrs, uint32_t size);

namespace {

uint64_t Pad4(uint64_t n) { return (n + 3) & ~uint64_t{3}; }

// Whether `n` bytes fit after the cursor, with their padding when encoding
// (a decode, as libnfs's, accepts an item whose padding the buffer ends
// before: whatever follows it then fails).
bool Fits(const ZDR* z, uint64_t n) {
  if (z->pos < 0 || z->size < z->pos) return false;
  const uint64_t need = z->x_op == ZDR_ENCODE ? Pad4(n) : n;
  return static_cast<uint64_t>(z->pos) + need <= static_cast<uint64_t>(z->size);
}

// Past `n` bytes and their padding, at most to the end of the buffer.
void Skip(ZDR* z, uint64_t n) {
  z->pos = static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(z->pos) + Pad4(n),
                                               static_cast<uint64_t>(z->size)));
}

// Copies `n` bytes at the cursor (zeros for the padding when encoding) and
// moves past them. REQUIRES: Fits(z, n).
void Move(ZDR* z, char* obj, uint32_t n) {
  char* at = z->buf + z->pos;
  if (z->x_op == ZDR_ENCODE) {
    const uint32_t pad = static_cast<uint32_t>(Pad4(n) - n);
    if (n > 0) std::memcpy(at, obj, n);
    if (pad > 0) std::memset(at + n, 0, pad);
  } else if (n > 0) {
    std::memcpy(obj, at, n);
  }
  Skip(z, n);
}

// The pointer fields libnfs's decoders hand over live in memory from its
// zdr_malloc, which is 4-byte aligned only: read and written bytewise.
char* Load(const void* p) {
  char* v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
void Store(void* p, char* v) { std::memcpy(p, &v, sizeof v); }

thread_local int t_depth = 0;

// Directory entry lists, decoded in a loop (see libnfs_zdr_pointer).
thread_local bool t_in_list = false;
thread_local char** t_next = nullptr;

bool IsEntryList(zdrproc_t proc) {
  return proc == reinterpret_cast<zdrproc_t>(zdr_entry3) ||
         proc == reinterpret_cast<zdrproc_t>(zdr_entryplus3);
}

}  // namespace

extern "C" {

bool_t libnfs_zdr_opaque(ZDR* zdrs, char* objp, uint32_t size) {
  if (zdrs->x_op != ZDR_ENCODE && zdrs->x_op != ZDR_DECODE) return FALSE;
  if (!Fits(zdrs, size)) return FALSE;
  Move(zdrs, objp, size);
  return TRUE;
}

bool_t libnfs_zdr_bytes(ZDR* zdrs, char** bufp, uint32_t* size, uint32_t maxsize) {
  if (zdrs->x_op != ZDR_ENCODE && zdrs->x_op != ZDR_DECODE) return FALSE;
  if (!libnfs_zdr_u_int(zdrs, size)) return FALSE;
  if (!Fits(zdrs, *size)) return FALSE;
  // (maxsize 0: libnfs's RPC layer decoding a verifier with a stale maximum.)
  if (zdrs->x_op == ZDR_DECODE && maxsize != 0 && *size > maxsize) return FALSE;
  char* buf = Load(bufp);
  if (zdrs->x_op == ZDR_DECODE && buf == nullptr) {
    Store(bufp, zdrs->buf + zdrs->pos);  // in place, as libnfs does
    Skip(zdrs, *size);
    return TRUE;
  }
  Move(zdrs, buf, *size);
  return TRUE;
}

bool_t libnfs_zdr_string(ZDR* zdrs, char** strp, uint32_t maxsize) {
  char* str = Load(strp);
  uint32_t size = 0;
  if (zdrs->x_op == ZDR_ENCODE) {
    const size_t n = std::strlen(str);
    if (n > UINT32_MAX) return FALSE;
    size = static_cast<uint32_t>(n);
  } else if (zdrs->x_op != ZDR_DECODE) {
    return FALSE;
  }
  if (!libnfs_zdr_u_int(zdrs, &size)) return FALSE;
  if (!Fits(zdrs, size)) return FALSE;
  if (zdrs->x_op == ZDR_ENCODE) {
    Move(zdrs, str, size);
    return TRUE;
  }
  if (maxsize != 0 && size > maxsize) return FALSE;
  const uint64_t end = static_cast<uint64_t>(zdrs->pos) + size;
  if (str == nullptr && end < static_cast<uint64_t>(zdrs->size) && zdrs->buf[end] == 0) {
    // Already terminated in the buffer (by its padding): used in place.
    Store(strp, zdrs->buf + zdrs->pos);
    Skip(zdrs, size);
    return TRUE;
  }
  if (str == nullptr) {
    str = static_cast<char*>(zdr_malloc(zdrs, size + 1));
    if (str == nullptr) return FALSE;
    Store(strp, str);
  }
  str[size] = 0;
  Move(zdrs, str, size);
  return TRUE;
}

bool_t libnfs_zdr_array(ZDR* zdrs, char** arrp, uint32_t* size, uint32_t maxsize, uint32_t elsize,
                        zdrproc_t proc) {
  if (zdrs->x_op != ZDR_ENCODE && zdrs->x_op != ZDR_DECODE) return FALSE;
  if (!libnfs_zdr_u_int(zdrs, size)) return FALSE;
  char* arr = Load(arrp);
  if (zdrs->x_op == ZDR_DECODE) {
    if (*size > maxsize || zdrs->pos < 0 || zdrs->size < zdrs->pos) return FALSE;
    // Every XDR element takes 4 bytes or more of the buffer.
    if (*size > static_cast<uint64_t>(zdrs->size - zdrs->pos) / 4) return FALSE;
    const uint64_t bytes = uint64_t{*size} * elsize;
    if (bytes > UINT32_MAX / 2) return FALSE;
    arr = nullptr;
    if (bytes > 0) {
      arr = static_cast<char*>(zdr_malloc(zdrs, static_cast<uint32_t>(bytes)));
      if (arr == nullptr) return FALSE;
      std::memset(arr, 0, bytes);
    }
    Store(arrp, arr);
  }
  for (uint32_t i = 0; i < *size; ++i) {
    if (!proc(zdrs, arr + uint64_t{i} * elsize)) return FALSE;
  }
  return TRUE;
}

bool_t libnfs_zdr_pointer(ZDR* zdrs, char** objp, uint32_t size, zdrproc_t proc) {
  char* obj = Load(objp);
  bool_t more = obj != nullptr;
  if (!libnfs_zdr_bool(zdrs, &more)) return FALSE;
  if (!more) {
    Store(objp, nullptr);
    return TRUE;
  }
  if (zdrs->x_op == ZDR_DECODE) {
    obj = static_cast<char*>(zdr_malloc(zdrs, size));
    if (obj == nullptr) return FALSE;
    std::memset(obj, 0, size);
    Store(objp, obj);
    // A directory page is a list, one entry pointing to the next, which
    // libnfs decodes by recursion: thousands of levels for a page of short
    // names. An entry's `nextentry` is its last field, so its decoding can
    // wait until the entry's own is done: the entry inside the list leaves
    // it in t_next, and the call that started the list decodes entry after
    // entry in a loop, in stream order.
    if (IsEntryList(proc)) {
      if (t_in_list) {
        t_next = objp;
        return TRUE;
      }
      t_in_list = true;
      bool_t ok;
      for (;;) {
        t_next = nullptr;
        ok = proc(zdrs, obj);
        if (!ok || t_next == nullptr) break;
        obj = Load(t_next);
      }
      t_in_list = false;
      t_next = nullptr;
      return ok;
    }
  }
  if (t_depth >= mpnfs::nfs::kMaxListDepth) return FALSE;
  ++t_depth;
  const bool_t ok = proc(zdrs, obj);
  --t_depth;
  return ok;
}

}  // extern "C"

namespace mpnfs::nfs {

bool CheckXdrBounds() {
  static const bool active = [] {
    const bool a = XdrBoundsActive();
    if (!a) {
      Log("nfs")->error(
          "libnfs's XDR primitives were not replaced by mpnfs's bounds-checked ones "
          "(xdr_bounds.h): a malformed reply from the server can crash the gateway");
    }
    return a;
  }();
  return active;
}

bool XdrBoundsActive() {
  // A file handle claiming 2^31 bytes in a 12-byte buffer.
  char buf[12] = {'\x80', 0, 0, 0, 'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h'};
  ZDR z;
  libnfs_zdrmem_create(&z, buf, sizeof buf, ZDR_DECODE);
  nfs_fh3 fh{};
  const bool refused = !zdr_nfs_fh3(&z, &fh);
  libnfs_zdr_destroy(&z);
  return refused;
}

}  // namespace mpnfs::nfs
