#!/bin/bash
# Runs the field's file-system test suites against a mounted mpnfs (or any
# mounted file system), when given where they are:
#
#   contrib/conformance.sh MOUNTDIR [--pjdfstest DIR] [--fsx BINARY] [--ops N]
#                          [--seed N] [--results DIR] [--keep]
#
#   --pjdfstest DIR  a built pjdfstest tree (DIR/pjdfstest and DIR/tests): runs
#                    `prove -rv DIR/tests` as root in a fresh directory on the
#                    mount (mount with -o allow_other: the tests switch users)
#   --fsx BINARY     xfstests' fsx (ltp/fsx.c), built: runs it for --ops
#                    operations (default 100000) in three variants: mapped I/O
#                    on, mapped I/O off (-R -W), and close/reopen (-c 20)
#   --seed N         fsx seed (default 1)
#   --results DIR    where the logs go (default: a new /tmp/mpnfs-conformance.*)
#   --keep           keep the test directories on the mount
#
# This script downloads and builds nothing: the suites are other projects'
# code, fetched and built by whoever runs it, outside this repository.
# Exit status: 0 all that ran passed, 1 something failed, 2 usage error,
# 77 no suite was given (nothing ran).
set -uo pipefail

usage() { sed -n '2,21s/^# \{0,1\}//p' "$0"; exit 2; }

mnt= pjd= fsx= ops=100000 seed=1 results= keep=0
while [ $# -gt 0 ]; do
  case "$1" in
    --pjdfstest) pjd=${2:?}; shift 2 ;;
    --fsx) fsx=${2:?}; shift 2 ;;
    --ops) ops=${2:?}; shift 2 ;;
    --seed) seed=${2:?}; shift 2 ;;
    --results) results=${2:?}; shift 2 ;;
    --keep) keep=1; shift ;;
    -h|--help) usage ;;
    -*) echo "conformance: unknown option $1" >&2; usage ;;
    *) [ -z "$mnt" ] || usage; mnt=$1; shift ;;
  esac
done
[ -n "$mnt" ] || usage
case "$ops$seed" in *[!0-9]*) echo "conformance: --ops and --seed take numbers" >&2; exit 2 ;; esac
mnt=$(realpath "$mnt") || exit 2
if ! mountpoint -q "$mnt"; then
  echo "conformance: $mnt is not a mount point" >&2
  exit 2
fi
fstype=$(findmnt -n -o FSTYPE --target "$mnt")
[ -n "$results" ] || results=$(mktemp -d /tmp/mpnfs-conformance.XXXXXX)
mkdir -p "$results"
results=$(realpath "$results")

summary=()   # one line per suite or variant
failed=0 ran=0
note() { summary+=("$(printf '%-22s %-8s %s' "$1" "$2" "$3")"); }
elapsed() { echo "$(( $(date +%s) - $1 )) s"; }

echo "conformance: $mnt ($fstype), logs in $results"

# ---- pjdfstest ---------------------------------------------------------------
run_pjdfstest() {
  local dir log work t0 rc
  dir=$(realpath "$pjd" 2>/dev/null)
  if [ -z "$dir" ] || [ ! -x "$dir/pjdfstest" ] || [ ! -d "$dir/tests" ]; then
    echo "pjdfstest: $pjd has no built pjdfstest (DIR/pjdfstest and DIR/tests)" >&2
    note pjdfstest ABSENT "no built pjdfstest in $pjd"
    failed=1
    return
  fi
  if [ "$(id -u)" != 0 ]; then
    note pjdfstest SKIPPED "must run as root"
    failed=1
    return
  fi
  if ! command -v prove >/dev/null; then
    note pjdfstest ABSENT "prove (Perl's Test::Harness) is not installed"
    failed=1
    return
  fi
  work=$(mktemp -d "$mnt/conformance-pjdfstest.XXXXXX") || { note pjdfstest ERROR "cannot create a directory on $mnt"; failed=1; return; }
  chmod 0755 "$work"
  log=$results/pjdfstest.log
  echo "== pjdfstest: prove -rv $dir/tests in $work (log: $log)"
  t0=$(date +%s)
  (cd "$work" && prove -rv "$dir/tests") >"$log" 2>&1
  rc=$?
  ran=1
  # prove's closing lines: "Files=N, Tests=M, ..." and "Result: PASS|FAIL";
  # the failing files are listed under "Test Summary Report".
  sed -n '/^Test Summary Report/,$p' "$log"
  local files tests res
  files=$(sed -n 's/^Files=\([0-9]*\), Tests=\([0-9]*\).*/\1/p' "$log" | tail -1)
  tests=$(sed -n 's/^Files=\([0-9]*\), Tests=\([0-9]*\).*/\2/p' "$log" | tail -1)
  res=$(sed -n 's/^Result: //p' "$log" | tail -1)
  local badfiles badtests
  # A file listed with "(Wstat: 0 Tests: N Failed: 0)" only had TODO tests pass.
  badfiles=$(sed -n '/^Test Summary Report/,$p' "$log" | grep '^/.*(Wstat: ' | grep -vc 'Wstat: 0 Tests: [0-9]* Failed: 0)')
  badtests=$(sed -n '/^Test Summary Report/,$s/.* Failed: \([0-9]*\))$/\1/p' "$log" | awk '{s += $1} END {print s + 0}')
  local bail
  bail=$(grep -B1 -A2 '^Bailout called' "$log" | grep -m1 -o '/[^ ]*\.t')
  if [ "$rc" = 0 ] && [ "$res" = PASS ]; then
    note pjdfstest PASS "$files files, $tests tests, $(elapsed "$t0")"
  else
    note pjdfstest FAIL "$badfiles of ${files:-?} files, $badtests of ${tests:-?} tests failed, $(elapsed "$t0")"
    [ -z "$bail" ] || note "" "" "a test bailed out ($bail): prove ran no file after it"
    failed=1
  fi
  [ "$keep" = 1 ] || rm -rf "$work"
}

# ---- fsx -----------------------------------------------------------------------
run_fsx() {
  local bin work
  bin=$(realpath "$fsx" 2>/dev/null)
  if [ -z "$bin" ] || [ ! -x "$bin" ]; then
    note fsx ABSENT "$fsx is not an executable"
    failed=1
    return
  fi
  work=$(mktemp -d "$mnt/conformance-fsx.XXXXXX") || { note fsx ERROR "cannot create a directory on $mnt"; failed=1; return; }
  local variant flags log t0 rc
  for variant in mmap no-mmap reopen; do
    case $variant in
      mmap) flags=() ;;
      no-mmap) flags=(-R -W) ;;
      reopen) flags=(-c 20) ;;
    esac
    log=$results/fsx-$variant.log
    echo "== fsx $variant: $bin -N $ops -S $seed ${flags[*]} (log: $log)"
    t0=$(date +%s)
    # fsx writes its .fsxlog/.fsxgood files beside the test file unless -P says where.
    (cd "$results" && "$bin" -q -N "$ops" -S "$seed" -P "$results" "${flags[@]}" "$work/fsx-$variant") >"$log" 2>&1
    rc=$?
    ran=1
    if [ "$rc" = 0 ]; then
      note "fsx $variant" PASS "$ops ops, $(elapsed "$t0")"
    else
      note "fsx $variant" FAIL "exit $rc, $(elapsed "$t0"); $(grep -m1 -E 'ERROR|FAIL|failed|error' "$log" | cut -c1-100)"
      failed=1
      tail -40 "$log"
    fi
  done
  [ "$keep" = 1 ] || rm -rf "$work"
}

if [ -n "$pjd" ]; then
  run_pjdfstest
else
  note pjdfstest ABSENT "not given: pjd/pjdfstest (GitHub), built outside this repo with"
  note "" "" "  autoreconf -ifs && ./configure && make; then --pjdfstest DIR"
fi
if [ -n "$fsx" ]; then
  run_fsx
else
  note fsx ABSENT "not given: ltp/fsx.c of xfstests (GitHub mirrors: kdave/xfstests),"
  note "" "" "  built outside this repo (its make, or gcc on fsx.c); then --fsx BINARY"
fi

echo
echo "== conformance summary ($mnt, $fstype)"
printf '%s\n' "${summary[@]}"
echo "logs: $results"
if [ "$failed" = 1 ]; then exit 1; fi
if [ "$ran" = 0 ]; then echo "conformance: no suite was run"; exit 77; fi
exit 0
