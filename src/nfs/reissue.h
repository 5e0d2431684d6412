// What the answer to a reissued non-idempotent call means: the one table
// of these rules, used by the NFS client (nfs3.cc) and by the fake server
// that stands in for it in the unit tests (test/fakes/fake_nfs.cc).
//
// A call sent again after its connection broke (the engine flags it
// `reissued`) may have executed the first time; the second execution then
// fails in a way that is really success. The rules are those of RFC 1813's
// implementation notes and of the Linux client:
//   REMOVE, RMDIR reissued -> ENOENT: our first call removed it: success.
//   RENAME reissued        -> ENOENT: our first RENAME did it: success.
//   LINK reissued          -> EEXIST: success only if the name now holds the
//                             file being linked (LOOKUP, same handle); a name
//                             that holds another file is EEXIST.
//   MKDIR, SYMLINK, MKNOD, GUARDED CREATE reissued -> EEXIST: LOOKUP the name
//                             and return what is there as the new object.
//   EXCLUSIVE CREATE needs no rule: the server matches the verifier.
// The residual risk (another client did the same thing in between) is the
// one every NFSv3 client accepts.
#pragma once

#include <cerrno>

namespace mpnfs::nfs {

enum class Reissued {
  kAsAnswered,  // the error stands
  kDone,        // success: the first execution did it
  kSameObject,  // success if LOOKUP finds the object the call was about
  kWhatIsThere  // success with whatever LOOKUP finds under the name
};

enum class ReissueProc { kRemove, kRmdir, kRename, kLink, kNewObject };

// The meaning of error `err` (an errno) in the answer to a reissued call.
constexpr Reissued OnReissued(ReissueProc p, int err) {
  switch (p) {
    case ReissueProc::kRemove:
    case ReissueProc::kRmdir:
    case ReissueProc::kRename:
      return err == ENOENT ? Reissued::kDone : Reissued::kAsAnswered;
    case ReissueProc::kLink:
      return err == EEXIST ? Reissued::kSameObject : Reissued::kAsAnswered;
    case ReissueProc::kNewObject:
      return err == EEXIST ? Reissued::kWhatIsThere : Reissued::kAsAnswered;
  }
  return Reissued::kAsAnswered;
}

}  // namespace mpnfs::nfs
