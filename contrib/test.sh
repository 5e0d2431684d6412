#!/bin/bash
# The test suite, as root on Debian 12 (.ci/run calls exactly this):
#
#   contrib/test.sh          everything, about 40 minutes on 2 cores
#   contrib/test.sh --quick  the GCC build, its unit tests, and the quick
#                            part of the integration tests: under 10 minutes
#
# Everything: installs what is missing; builds with GCC and runs the unit
# tests; builds with clang under AddressSanitizer + UndefinedBehaviorSanitizer
# with -Wthread-safety -Werror (the lock annotations are checked there) and
# runs the unit tests again, and the protocol decoders' fuzz targets for 15 s
# each; builds the concurrent parts under clang's
# ThreadSanitizer and runs their tests; then runs the integration tests (a
# real NFS-Ganesha in network namespaces, real FUSE mounts, real programs)
# with the GCC binary; builds the Debian package (contrib/package.sh: lintian
# included), installs it, mounts through an /etc/fstab line and purges it;
# then runs the integration tests again with mpnfs under ThreadSanitizer
# (every mount taking its FUSE requests through io_uring: fuse_uring=on, the
# fuse module's enable_uring set for the run) or under AddressSanitizer
# (through /dev/fuse, as in the first run), each module under one of them.
set -euo pipefail
cd "$(dirname "$0")/.."
quick=false
case "${1:-}" in
  --quick) quick=true ;;
  "") ;;
  *) echo "usage: contrib/test.sh [--quick]" >&2; exit 2 ;;
esac
started=$SECONDS
step() { printf '== %s (%d:%02d)\n' "$1" $(((SECONDS - started) / 60)) $(((SECONDS - started) % 60)); }
pytest() { /usr/bin/python3 -m pytest -p no:cacheprovider "$@"; }

# The crash explorer's long explorations (seconds each, ten times that under
# AddressSanitizer, where they are left out); the targeted cases and the
# disk-fault cases run everywhere.
CRASH_LONG='CrashExplorerTest.EveryCrashState*:CrashExplorerTest.TheSameHolds*:CrashExplorerTest.ASecondCrash*:CrashExplorerTest.ARecoveryKeepsATombstone*:CrashExplorerTest.ATruncateOfACopiedBlock*'
# --quick: a bit of every layer, a minute or two.
IT_QUICK=(test_data.py test_operations.py test_integrity.py test_preserved_attrs.py test_mounting.py test_multihost.py test_locks.py)

step deps
contrib/deps.sh
step "build (GCC)"
contrib/build.sh build

if $quick; then
  step "unit tests"
  meson test -C build --suite unit --print-errorlogs
  step "integration tests, quick part"
  MPNFS_BIN="$PWD/build/src/mpnfs" pytest -q "${IT_QUICK[@]/#/test/integration/}"
  step done
  exit 0
fi

step "unit tests"
meson test -C build --suite unit --print-errorlogs

step "clang build: ASan + UBSan, -Wthread-safety -Werror"
# (-O1: the sanitizers' cost at run time, a short build.)
[ -f build-clang/build.ninja ] || CC=clang CXX=clang++ meson setup build-clang --werror -Db_sanitize=address,undefined \
  -Db_lundef=false -Doptimization=1 >/dev/null
ninja -C build-clang
step "unit tests under ASan + UBSan"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  meson test -C build-clang --suite unit --no-suite crash --print-errorlogs
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  build-clang/src/crash_test --gtest_filter="-$CRASH_LONG" --gtest_brief=1

step "fuzzing the protocol decoders (libFuzzer under ASan + UBSan, 15 s per target)"
# From the committed corpus, the replies captured from Ganesha
# (contrib/fuzz/record-corpus.py) and every regression input; new inputs go
# to a scratch directory, and a failing input is left there and printed.
fuzz_tmp=$(mktemp -d /tmp/mpnfs-fuzz.XXXXXX)
for t in fuzz_rpc_reply fuzz_nfs3_results fuzz_readdir fuzz_mount fuzz_nlm; do
  mkdir -p "$fuzz_tmp/$t"
  dirs=("test/fuzz/corpus/$t")
  [ -d "test/fuzz/captured/$t" ] && dirs+=("test/fuzz/captured/$t")
  [ -d "test/fuzz/regressions/$t" ] && dirs+=("test/fuzz/regressions/$t")
  if ! UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 "build-clang/test/fuzz/$t" -max_total_time=15 -timeout=10 \
      -rss_limit_mb=2048 -artifact_prefix="$fuzz_tmp/" "$fuzz_tmp/$t" "${dirs[@]}" >"$fuzz_tmp/$t.log" 2>&1; then
    tail -40 "$fuzz_tmp/$t.log"
    echo "fuzz target $t failed; its input and log are in $fuzz_tmp" >&2
    exit 1
  fi
  grep -E '^#[0-9]+[[:space:]]+DONE' "$fuzz_tmp/$t.log" | sed "s/^/$t: /" || true
done
rm -rf "$fuzz_tmp"

step "ThreadSanitizer build (clang): engine, balancing, inode table, cache, filesystem, flusher, gone-check, mpnfs"
[ -f build-tsan/build.ninja ] || CC=clang CXX=clang++ meson setup build-tsan -Db_sanitize=thread -Db_lundef=false >/dev/null
ninja -C build-tsan src/engine_test src/engine_stats_test src/balance_test src/inode_table_test src/block_cache_test \
  src/crc_store_test src/filesystem_test src/flusher_test src/gone_check_test src/hidden_names_test src/mpnfs src/mpnfsctl
step "concurrency unit tests under TSan"
TSAN_OPTIONS=halt_on_error=1 meson test -C build-tsan engine engine_stats balance inode_table block_cache \
  block_cache_paged crc_store filesystem flusher gone_check hidden_names --print-errorlogs

step "integration tests (NFS-Ganesha in a network namespace, real FUSE mounts)"
MPNFS_BIN="$PWD/build/src/mpnfs" pytest -v --durations=15 test/integration

step "Debian package: dpkg-buildpackage, lintian, apt install, an fstab mount, purge"
pkg_tmp=$(mktemp -d /tmp/mpnfs-deb.XXXXXX)
trap 'rm -rf "$pkg_tmp"' EXIT
contrib/package.sh "$pkg_tmp"
MPNFS_IT_DEB=$(ls "$pkg_tmp"/mpnfs_*.deb) pytest -q test/integration/test_package.py
rm -rf "$pkg_tmp"
trap - EXIT

# mpnfs itself under the sanitizers: a data race or a memory error (a leak
# at exit included) kills the mount and fails the test. Each module runs
# under one of them (both passes over every module take a quarter hour
# more than this machine's 40 minutes allow): ThreadSanitizer, with every
# mount on FUSE over io_uring, takes the modules about paths, failures,
# locks, write ordering and sharing (where threads meet); AddressSanitizer
# takes those about operations, the cache, data integrity and real programs
# (where buffers and parsed lengths are). PostgreSQL runs in both, one
# case each (MPNFS_IT_PG_MODES). There the 1 GiB failover transfers move
# 256 MiB, mpnfs_fsx runs 1000 operations per mode rather than 3000, and
# git clones twice per mode rather than three times (MPNFS_IT_GIT_CLONES):
# the instrumented binary is slower. Left out of both: the modules whose
# subject is decided by the server or mount(8) (permission decisions on a
# plain mount, mount(8) and fstab plumbing, the package), whose requests go
# through the same code as test_operations.py, and calibrate's table on a
# terminal (the measuring it does is the one the other calibrate tests
# check).
TSAN_IT=(test_data.py test_failures.py test_fuse_transport.py test_kernel_cache.py test_locks.py test_multihost.py
  test_multipath.py test_paths.py test_stats.py test_writeback.py test_calibrate.py test_postgres.py)
ASAN_IT=(test_cache.py test_fsx.py test_integrity.py test_meta.py test_operations.py test_preserved_attrs.py
  test_programs.py test_postgres.py)
SAN_SKIP=(--deselect test/integration/test_calibrate.py::test_calibrate_table_and_one_path)
step "integration tests, mpnfs under ThreadSanitizer, FUSE over io_uring"
MPNFS_IT_FUSE_URING=1 TSAN_OPTIONS="halt_on_error=1 report_signal_unsafe=0" MPNFS_BIN="$PWD/build-tsan/src/mpnfs" \
  MPNFS_IT_BIG_MIB=256 MPNFS_IT_FSX_OPS=1000 MPNFS_IT_GIT_CLONES=2 MPNFS_IT_PG_MODES=writeback-server-restart \
  pytest -q --durations=15 "${SAN_SKIP[@]}" "${TSAN_IT[@]/#/test/integration/}"
step "integration tests, mpnfs under AddressSanitizer"
ASAN_OPTIONS="detect_leaks=1:halt_on_error=1" UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" \
  MPNFS_BIN="$PWD/build-clang/src/mpnfs" MPNFS_IT_BIG_MIB=256 MPNFS_IT_FSX_OPS=1000 MPNFS_IT_GIT_CLONES=2 \
  MPNFS_IT_PG_MODES=writeback-kill9 \
  pytest -q --durations=15 "${SAN_SKIP[@]}" "${ASAN_IT[@]/#/test/integration/}"
step done
