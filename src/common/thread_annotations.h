// Clang thread-safety annotations (-Wthread-safety). They vanish under GCC.
// The capability they name is mpnfs::Mutex (common/mutex.h); the program's
// lock order is listed there.
#pragma once

#if defined(__clang__)
#define MPNFS_TA(x) __attribute__((x))
#else
#define MPNFS_TA(x)
#endif

#define CAPABILITY(x) MPNFS_TA(capability(x))
#define SCOPED_CAPABILITY MPNFS_TA(scoped_lockable)
#define GUARDED_BY(x) MPNFS_TA(guarded_by(x))
#define PT_GUARDED_BY(x) MPNFS_TA(pt_guarded_by(x))
#define ACQUIRED_BEFORE(...) MPNFS_TA(acquired_before(__VA_ARGS__))
#define ACQUIRED_AFTER(...) MPNFS_TA(acquired_after(__VA_ARGS__))
#define REQUIRES(...) MPNFS_TA(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) MPNFS_TA(locks_excluded(__VA_ARGS__))
#define ACQUIRE(...) MPNFS_TA(acquire_capability(__VA_ARGS__))
#define RELEASE(...) MPNFS_TA(release_capability(__VA_ARGS__))
#define TRY_ACQUIRE(...) MPNFS_TA(try_acquire_capability(__VA_ARGS__))
#define ASSERT_CAPABILITY(x) MPNFS_TA(assert_capability(x))
#define RETURN_CAPABILITY(x) MPNFS_TA(lock_returned(x))
#define NO_THREAD_SAFETY_ANALYSIS MPNFS_TA(no_thread_safety_analysis)
