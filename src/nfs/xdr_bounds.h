// Bounds-checked replacements for libnfs 4.0's variable-length XDR
// primitives, so that a reply from a buggy or hostile server fails its call
// instead of crashing the gateway.
//
// libnfs decodes NFS and MOUNT results with generated routines (zdr_READ3res,
// zdr_entryplus3, ...) that call a few primitives. In 4.0 those primitives:
//  - compare lengths as signed ints (`pos + (int)size > zdrs->size`), so a
//    length of 2^31 or more in a file handle, name, path or data passes the
//    check and the decoder reads far outside the reply;
//  - check nothing before reading a fixed-size opaque (a verifier at the end
//    of a short reply reads past it);
//  - allocate `count * elsize` for an array with no bound on count, in 32 bits;
//  - follow a linked list (directory entries) by recursion, one level per
//    entry, with no limit: a reply of 4 MiB of tiny entries overflows a
//    thread's stack.
// xdr_bounds.cc defines these primitives again under libnfs's own names
// (libnfs_zdr_bytes, _string, _opaque, _array, _pointer). libnfs calls them
// through its PLT, so the dynamic linker binds its generated routines to
// these definitions in the executable (ELF symbol interposition, as a
// malloc replacement works). Each keeps libnfs's encoding and decoding
// exactly, adding:
//  - every length and position computed in 64 bits and checked against
//    the buffer, padding included;
//  - an array's count at most maxsize and at most the bytes left / 4 (each
//    XDR element takes at least 4 bytes);
//  - directory entry lists (entry3, entryplus3) decoded in a loop, not by
//    recursion: a page of any number of entries decodes in constant stack
//    (the entries themselves take memory, up to what one reply of at most
//    4 MiB holds); any other nesting of optional items is limited to
//    kMaxListDepth levels per thread (MOUNT's export and group lists, not
//    used by mpnfs; 1,000 levels take at most about 200 KiB of stack).
//  - a decoded length above its declared maximum refused (a file handle of
//    more than 64 bytes: mpnfs's cache records keep 64), unless the maximum
//    is 0 (libnfs's RPC layer decodes the reply verifier with the stale
//    maximum of a null verifier, 0). libnfs ignored every maximum.
//
// XdrBoundsActive() tells whether the interposition took effect (a libnfs
// built with -Bsymbolic would keep its own primitives; linking libnfs.a
// statically fails, with multiple definitions): it decodes a handle whose length is 2^31 with libnfs's
// generated zdr_nfs_fh3, which libnfs's own check lets through and these
// refuse.
//
// Thread safety: the primitives keep a per-thread nesting depth only.
#pragma once

namespace mpnfs::nfs {

constexpr int kMaxListDepth = 1000;

bool XdrBoundsActive();

// XdrBoundsActive(), checked once per process, with an error logged if not.
// RpcTransport and Mount3 call it, which also links this file into every
// program that talks NFS (a static library's object is linked only when
// something in it is referenced).
bool CheckXdrBounds();

}  // namespace mpnfs::nfs
