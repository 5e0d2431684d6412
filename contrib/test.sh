#!/bin/bash
# The whole test suite: installs what is missing, builds, runs the unit tests
# (plain, under ASan+UBSan, and the engine's concurrency tests under TSan),
# then the integration tests against a real NFS-Ganesha through real FUSE
# mounts. Run as root on Debian 12. .ci/run calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
contrib/deps.sh
echo "== build"
contrib/build.sh build
echo "== unit tests"
meson test -C build --suite unit --print-errorlogs
echo "== unit tests under AddressSanitizer + UndefinedBehaviorSanitizer"
# At -O1: GCC takes twice as long to compile with UBSan at -O2, and this build
# was the longest step of the suite (about 29 min on 2 cores at -O2, 16 at -O1).
contrib/build.sh build-asan -Db_sanitize=address,undefined -Db_lundef=false -Doptimization=1
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  meson test -C build-asan --suite unit --print-errorlogs
echo "== engine (balancing included), inode table, cache, filesystem, flusher and gone-check concurrency tests under ThreadSanitizer"
[ -f build-tsan/build.ninja ] || meson setup build-tsan -Db_sanitize=thread -Db_lundef=false >/dev/null
ninja -C build-tsan src/engine_test src/engine_stats_test src/balance_test src/inode_table_test src/block_cache_test src/crc_store_test src/filesystem_test src/flusher_test src/gone_check_test src/mpnfs src/mpnfsctl
TSAN_OPTIONS=halt_on_error=1 meson test -C build-tsan engine engine_stats balance inode_table block_cache block_cache_paged crc_store filesystem flusher gone_check --print-errorlogs
pytest() { /usr/bin/python3 -m pytest -p no:cacheprovider "$@"; }
echo "== integration tests (NFS-Ganesha in a network namespace, real FUSE mounts)"
MPNFS_BIN="$PWD/build/src/mpnfs" pytest -v test/integration
# The same suite with mpnfs itself under the sanitizers: a data race or a
# memory error (a leak at exit included) kills the mount and fails the test.
# UBSan only reports: libnfs 4.0 decodes directory entries into misaligned
# memory, which x86 tolerates. PostgreSQL runs there on the default mount, and
# in one write-back crash case each (MPNFS_IT_PG_MODES; the plain run has every
# case): the server restart with the flusher busy under TSan, the gateway
# killed and its cache flushed by the next mount under ASan.
echo "== integration tests, mpnfs under ThreadSanitizer"
# The 1 GiB failover transfers move 256 MiB there, and mpnfs_fsx runs 1000
# operations per mode rather than 3000 (the instrumented binary is slower).
TSAN_OPTIONS="halt_on_error=1 report_signal_unsafe=0" MPNFS_BIN="$PWD/build-tsan/src/mpnfs" \
  MPNFS_IT_BIG_MIB=256 MPNFS_IT_FSX_OPS=1000 MPNFS_IT_PG_MODES=default-1path,writeback-server-restart \
  pytest -q test/integration
echo "== integration tests, mpnfs under AddressSanitizer"
ASAN_OPTIONS="detect_leaks=1:halt_on_error=1" UBSAN_OPTIONS="halt_on_error=0" \
  MPNFS_BIN="$PWD/build-asan/src/mpnfs" MPNFS_IT_BIG_MIB=256 MPNFS_IT_FSX_OPS=1000 \
  MPNFS_IT_PG_MODES=default-1path,writeback-kill9 pytest -q test/integration
