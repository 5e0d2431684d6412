// Clang thread-safety annotations (-Wthread-safety). They vanish under GCC.
#pragma once

#if defined(__clang__)
#define MPNFS_TA(x) __attribute__((x))
#else
#define MPNFS_TA(x)
#endif

#define CAPABILITY(x) MPNFS_TA(capability(x))
#define GUARDED_BY(x) MPNFS_TA(guarded_by(x))
#define PT_GUARDED_BY(x) MPNFS_TA(pt_guarded_by(x))
#define REQUIRES(...) MPNFS_TA(requires_capability(__VA_ARGS__))
#define EXCLUDES(...) MPNFS_TA(locks_excluded(__VA_ARGS__))
#define ACQUIRE(...) MPNFS_TA(acquire_capability(__VA_ARGS__))
#define RELEASE(...) MPNFS_TA(release_capability(__VA_ARGS__))
#define NO_THREAD_SAFETY_ANALYSIS MPNFS_TA(no_thread_safety_analysis)
