#!/bin/bash
# What the SSD cache costs as it grows: RAM per GiB of cache at
# the default block size, and the time to mount a full cache, each for
# several sizes with the slope of a least-squares line through them. Runs
# build/contrib/bench/cache-cost (cache_cost.cc) once per size, in a fresh
# process each time, on a sparse data file with a real index (no server).
# Prints a markdown report; with -o FILE also writes it there.
#   contrib/bench/cost.sh [-o FILE] [DIR=/var/tmp/mpnfs-cost] [RAM_SIZES="1 2 4 8"] [MOUNT_SIZES="1 2 4 8 16 32 50"]
# Environment: BLOCK_KIB (256), FILE_BLOCKS (blocks per file, 64), FH_BYTES (36), BIN (the
# cache-cost program, default build/contrib/bench/cache-cost).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=
if [ "${1:-}" = "-o" ]; then OUT=$2; shift 2; fi
DIR=${1:-/var/tmp/mpnfs-cost}
RAM_SIZES=${2:-"1 2 4 8"}
MOUNT_SIZES=${3:-"1 2 4 8 16 32 50"}
BLOCK_KIB=${BLOCK_KIB:-256} FILE_BLOCKS=${FILE_BLOCKS:-64} FH_BYTES=${FH_BYTES:-36}
BIN=${BIN:-build/contrib/bench/cache-cost}  # (BIN=... runs another build of cache_cost.cc)
[ -x "$BIN" ] || { echo "build first (ninja -C build contrib/bench/cache-cost)" >&2; exit 1; }
RESULTS=$(mktemp)
trap 'rm -rf "$RESULTS" "$RESULTS.err" "$DIR"' EXIT
for n in $(printf '%s\n' $RAM_SIZES $MOUNT_SIZES | sort -n -u); do
  churn=0  # the RAM sizes also evict half a cache's worth (steady state)
  for r in $RAM_SIZES; do [ "$r" = "$n" ] && churn=1; done
  # (The cache's log is shown only when the run fails.)
  if ! "$BIN" "$DIR" "$n" "$BLOCK_KIB" "$FILE_BLOCKS" "$FH_BYTES" "$churn" 2>"$RESULTS.err" >>"$RESULTS"; then
    cat "$RESULTS.err" >&2
    echo "cost: cache-cost failed at $n GiB" >&2
    exit 1
  fi
done
REPORT=$(python3 - "$RESULTS" "$RAM_SIZES" "$MOUNT_SIZES" <<'PY'
import json, sys
rows = {r["gib"]: r for r in map(json.loads, open(sys.argv[1]))}
ram = [int(x) for x in sys.argv[2].split()]
mnt = [int(x) for x in sys.argv[3].split()]
def fit(xs, ys):  # least squares: slope, intercept
    n = len(xs); mx = sum(xs) / n; my = sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    s = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return s, my - s * mx
MiB = 1 << 20
r0 = rows[ram[0]]
print(f"Block {r0['block_kib']} KiB, files of {r0['slots'] // max(1, r0['files'])} blocks, "
      f"{r0['fh_bytes']}-byte file handles.\n")
print("| cache GiB | slots | heap filled (MiB) | heap after evicting half (MiB) | heap after mount (MiB) | of it, checksums (MiB) | RssAnon after mount (MiB) | heap B/slot after mount | checksum frames read / written (fill, churn) |")
print("|---|---|---|---|---|---|---|---|---|")
for n in ram:
    r = rows[n]
    print(f"| {n} | {r['slots']} | {r['heap_full'] / MiB:.2f} | {r['heap_churned'] / MiB:.2f} | "
          f"{r['heap_mounted'] / MiB:.2f} | {r['crc_ram_mounted'] / MiB:.2f} | {r['anon_mounted_per_gib'] * n / MiB:.2f} | "
          f"{r['heap_mounted'] / r['slots']:.0f} | {r['crc_reads_full']} / {r['crc_writes_full']} |")
s, c = fit(ram, [rows[n]["heap_full"] / MiB for n in ram])
s1, c1 = fit(ram, [rows[n]["heap_churned"] / MiB for n in ram])
s2, c2 = fit(ram, [rows[n]["heap_mounted"] / MiB for n in ram])
s3, c3 = fit(ram, [rows[n]["anon_mounted_per_gib"] * n / MiB for n in ram])
print(f"\nHeap slope: **{s:.3f} MiB per GiB** after a fill (intercept {c:.2f} MiB), "
      f"**{s1:.3f} MiB per GiB** in use (after evicting half a cache's worth: ghost list full; "
      f"intercept {c1:.2f} MiB), **{s2:.3f} MiB per GiB** after mounting a full cache "
      f"(intercept {c2:.2f} MiB); RssAnon after mounting, everything anonymous the process "
      f"holds, page checksums included: **{s3:.3f} MiB per GiB** (intercept {c3:.2f} MiB). "
      f"Goal: at most 0.5. (Heap: mallinfo2 uordblks + hblkhd; checksums beyond the budget are "
      f"frames on the heap, those of a table that fits are an anonymous mapping outside it.)\n")
print("| cache GiB | mount, index cold (s) | mount, warm (s) | blocks kept | heap after mount (MiB) |")
print("|---|---|---|---|---|")
for n in mnt:
    r = rows[n]
    print(f"| {n} | {r['mount_cold_s']:.3f} | {r['mount_warm_s']:.3f} | {r['slots_after_mount']} | "
          f"{r['heap_mounted'] / MiB:.1f} |")
s, c = fit(mnt, [rows[n]["mount_cold_s"] for n in mnt])
sw, cw = fit(mnt, [rows[n]["mount_warm_s"] for n in mnt])
print(f"\nMount slope: **{s * 1000:.1f} ms per GiB** cold (intercept {c * 1000:.0f} ms), "
      f"{sw * 1000:.1f} ms per GiB warm. Goal: a full 50 GiB cache mounts in under 2 s.")
PY
)
echo "$REPORT"
[ -z "$OUT" ] || echo "$REPORT" >"$OUT"
