#!/bin/bash
# PostgreSQL 15 pgbench on mpnfs. Prints a markdown report; with -o FILE also
# writes it there.
#
# (a) TPS: pgbench scale 10, 4 clients (-j 2), RUN_A seconds (default 30), on
#     the unshaped bed: a default mount, one with kernel_cache, a
#     cache_mode=writeback mount (cache of 1 GiB), and the same on local disk
#     (the ceiling).
# (b) The OLTP table (after SanDisk's DAS Cache paper): the same database
#     (scale 10, ~160 MB) with shared_buffers=16MB, against a server that is
#     slow per operation: contrib/bench/slowdisk.c in Ganesha delays each
#     disk read, write and fsync by SLOWDISK_US (default 5000) with at most
#     SLOWDISK_SPINDLES (default 4) in service at once. The mounts use
#     direct_io, so PostgreSQL's reads and writes reach mpnfs instead of the
#     client's kernel page cache (which would otherwise hold the whole
#     database: the host has far more RAM than the 16 MB PostgreSQL is
#     given). Configurations: no cache; write-back caches of 30% of the
#     database (default seq_cutoff, under which PostgreSQL's WAL, a
#     sequential stream, bypasses the cache; then seq_cutoff=0 with
#     fill=page and fill=block) and of 120% (seq_cutoff=0, both fills; first
#     one read pass over the database files). cache_block=64, admit=first.
#     Each cached run is warmed with WARM_B seconds of the same workload and
#     then measured for RUN_B seconds; TPS, speedup, and read and write hit
#     ratios from `mpnfsctl stats` over the measured run, beside the paper's.
#     Workload WORKLOAD: "zipf" (default; TPC-B-like with the account chosen
#     by random_zipfian(1, naccounts, 1.1): a skewed OLTP working set, as the
#     paper's hit ratios imply) or "tpcb" (pgbench's built-in, uniform).
#
# Environment: RUN_A, RUN_B, WARM_B (seconds), SLOWDISK_US, SLOWDISK_SPINDLES,
# WB_EXTRA (more options for (a)'s write-back mount, e.g. cache_block=64),
# CONFIGS (which of (a)'s "default kernelcache writeback local" to run;
# kernelcache: a default mount with kernel_cache),
# WORKLOAD, PEERS (other systems for (a), built by hand outside the
# repository, measured after mpnfs in the same run: "NAME=COMMAND" entries
# separated by ';', COMMAND as in compare.sh; it must let other users in,
# allow_other, and keep owners: PostgreSQL runs as its own user), PARTS ("a b" by default), MAX_WAL (max_wal_size, 256MB), PG_CONF
# (lines added to every cluster's postgresql.conf, e.g. wal_sync_method = open_datasync),
# B_ROWS (an extended regex: only (b)'s cached configurations whose label
# matches run; the no-cache row always does), B_EXTRA (options added to
# each of (b)'s cache mounts, e.g. dirty_high=10), B_SAMPLE (seconds: print
# the cache's dirty bytes and slots in use that often during each measured
# run, to stderr), B_SYNCS=1 (count, over each measured run, PostgreSQL's
# WAL writes and syncs (pg_stat_wal), the transactions, and mpnfs's
# fdatasync/fsync calls (perf stat on its syscalls), to stderr). After the
# configurations, (b) runs the same cluster on the local disk, warmed and
# measured the same way: the ceiling (with B_ROWS, only if it matches
# "local disk"). Time: (a) ~3 x (init + RUN_A), about
# 3 minutes; (b) one init, then 6 x (WARM_B + RUN_B) plus mount, warm pass
# and start-up: with the defaults (45 + 45 s) about 12 minutes.
#   contrib/bench/pgbench.sh [-o contrib/bench/OLTP.md]
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=
if [ "${1:-}" = "-o" ]; then OUT=$2; shift 2; fi
RUN_A=${RUN_A:-30}
RUN_B=${RUN_B:-45}
WARM_B=${WARM_B:-45}
SCALE=10
CLIENTS=4
WORKLOAD=${WORKLOAD:-zipf}
PARTS=${PARTS:-a b}
MAX_WAL=${MAX_WAL:-256MB}     # PostgreSQL's max_wal_size: fewer checkpoints, fewer full-page writes
SLOWDISK_US=${SLOWDISK_US:-5000}
SLOWDISK_SPINDLES=${SLOWDISK_SPINDLES:-4}
export MPNFS_TB=/tmp/mpnfs-pgbench MPNFS_TB_NS=mpnfspg MPNFS_TB_NET=${MPNFS_TB_NET:-89} MPNFS_TB_LINK=mpg
SERVER=10.$MPNFS_TB_NET.1.2
EXPORT=$MPNFS_TB/export
MNT=/tmp/mpnfs-pgbench-mnt
SRC=/tmp/mpnfs-pgbench-cache     # cache directories and the local-disk cluster
PGBIN=/usr/lib/postgresql/15/bin
PORT=25990
SOCK=
. contrib/bench/lib.sh  # cleanup on exit, deps, build, helpers
flock /tmp/mpnfs-build.lock ninja -C build contrib/bench/libslowdisk.so >/dev/null
SLOWLIB=$PWD/build/contrib/bench/libslowdisk.so

SOCK=$(mktemp -d /tmp/mpnfs-pgbench-sock.XXXXXX)
chown postgres: "$SOCK"
PGENV=(env -i "PATH=$PGBIN:/usr/bin:/bin" "HOME=$SOCK" LANG=C "PGHOST=$SOCK" "PGPORT=$PORT"
       PGUSER=postgres PGDATABASE=postgres)
as_pg() { (cd "$SOCK" && "${PGENV[@]}" setpriv --reuid=postgres --regid=postgres --clear-groups "$@"); }
pg_stop() {  # DATA: a fast stop, else an immediate one
  as_pg pg_ctl stop -m fast -w -t 120 -D "$1" >/dev/null 2>&1 ||
    as_pg pg_ctl stop -m immediate -w -D "$1" >/dev/null 2>&1 || true
}
CUR_DATA=
on_exit() {
  local rc=$?
  if [ "$rc" != 0 ] && [ -f "$SOCK/server.log" ]; then
    echo "--- failed ($rc); PostgreSQL's log:" >&2; tail -20 "$SOCK/server.log" >&2
    ! grep -q " $MNT fuse" /proc/mounts || fuser -vm "$MNT" >&2 2>&1 || true
  fi
  [ -z "$CUR_DATA" ] || pg_stop "$CUR_DATA"; cleanup; rm -rf "$SOCK"
}
trap on_exit EXIT

new_cluster() {  # TOP: initdb and settings in TOP/data
  mkdir -p "$1"; chown postgres: "$1"; chmod 700 "$1"
  as_pg initdb -D "$1/data" -U postgres -A trust -E UTF8 --locale=C >/dev/null
  cat >> "$1/data/postgresql.conf" <<EOF
listen_addresses = ''
port = $PORT
unix_socket_directories = '$SOCK'
max_connections = 20
shared_buffers = 16MB
max_wal_size = $MAX_WAL
${PG_CONF:-}
EOF
}
pg_start() { as_pg pg_ctl start -w -t 300 -D "$1" -l "$SOCK/server.log" >/dev/null; CUR_DATA=$1; }
pg_down() {  # DATA; then waits (up to 60 s) until nothing uses the mount
  pg_stop "$1"; CUR_DATA=
  grep -q " $MNT fuse" /proc/mounts || return 0
  for _ in $(seq 600); do fuser -m "$MNT" >/dev/null 2>&1 || return 0; sleep 0.1; done
}

# The skewed TPC-B-like transaction (pgbench's tpcb-like with a zipfian aid).
cat > "$SOCK/zipf.sql" <<'EOF'
\set aid random_zipfian(1, 100000 * :scale, 1.1)
\set bid random(1, 1 * :scale)
\set tid random(1, 10 * :scale)
\set delta random(-5000, 5000)
BEGIN;
UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :aid;
SELECT abalance FROM pgbench_accounts WHERE aid = :aid;
UPDATE pgbench_tellers SET tbalance = tbalance + :delta WHERE tid = :tid;
UPDATE pgbench_branches SET bbalance = bbalance + :delta WHERE bid = :bid;
INSERT INTO pgbench_history (tid, bid, aid, delta, mtime) VALUES (:tid, :bid, :aid, :delta, CURRENT_TIMESTAMP);
END;
EOF
chmod 644 "$SOCK/zipf.sql"

bench() {  # SECONDS [WORKLOAD] -> TPS
  local w=()
  [ "${2:-tpcb}" = zipf ] && w=(-f "$SOCK/zipf.sql")
  as_pg pgbench -n -c "$CLIENTS" -j 2 -T "$1" "${w[@]}" 2>&1 |
    awk '/^tps = / { printf "%.0f", $3 }'
}
stat_of() { build/src/mpnfsctl stats "$MNT" | python3 -c "import json,sys; print(json.load(sys.stdin)['cache']['$1'])"; }
nfs_reads() { build/src/mpnfsctl stats "$MNT" | python3 -c "import json,sys; print(json.load(sys.stdin)['ops'].get('READ', {}).get('ops', 0))"; }
ratio() { awk -v h="$1" -v n="$2" 'BEGIN { if (n == 0) print "-"; else printf "%.1f%%", 100 * h / n }'; }

# B_SYNCS: counts over one measured run (start_syncs [MPNFS_PID]; end_syncs TPS).
start_syncs() {
  perf_out= perf_pid=
  [ -n "${B_SYNCS:-}" ] || return 0
  wal0=$(as_pg psql -X -At -c "select wal_write, wal_sync from pg_stat_wal")
  [ -n "${1:-}" ] || return 0
  perf_out=$(mktemp)
  perf stat -x, -o "$perf_out" -e syscalls:sys_enter_fdatasync,syscalls:sys_enter_fsync -p "$1" &
  perf_pid=$!
}
end_syncs() {  # TPS
  [ -n "${B_SYNCS:-}" ] || return 0
  local n=-
  if [ -n "$perf_pid" ]; then
    kill -INT "$perf_pid"; wait "$perf_pid" 2>/dev/null || true
    n=$(awk -F, '/fdatasync|fsync/ { n += $1 } END { print n + 0 }' "$perf_out"); rm -f "$perf_out"
  fi
  wal1=$(as_pg psql -X -At -c "select wal_write, wal_sync from pg_stat_wal")
  awk -v w0="$wal0" -v w1="$wal1" -v tps="$1" -v secs="$RUN_B" -v n="$n" 'BEGIN {
    split(w0, a, "|"); split(w1, b, "|"); tx = tps * secs; syncs = b[2] - a[2]
    printf "  %d transactions (TPS x run); PostgreSQL: %d WAL writes, %d WAL syncs (%.2f per transaction)", tx, b[1] - a[1], syncs, syncs / (tx > 0 ? tx : 1)
    if (n != "-") printf "; mpnfs: %d fdatasync+fsync (%.2f per WAL sync)", n, n / (syncs > 0 ? syncs : 1)
    print "" }' >&2
}

bed_up() {  # [GANESHA_ENV]
  contrib/testbed.sh down >/dev/null 2>&1 || true
  rm -rf "$MPNFS_TB"
  MPNFS_TB_GANESHA_ENV=${1:-} bed_start 1
}

{
  echo "# PostgreSQL pgbench on mpnfs"
  echo
  echo "Recorded $(date -u '+%Y-%m-%d %H:%M UTC') on $(nproc) cores, kernel $(uname -r), NFS-Ganesha"
  echo "$(dpkg-query -W -f='${Version}' nfs-ganesha), PostgreSQL $(dpkg-query -W -f='${Version}' postgresql-15),"
  echo "mpnfs $(git describe --always --dirty 2>/dev/null || echo '?'). Command: \`contrib/bench/pgbench.sh\`"
  echo "(RUN_A=$RUN_A RUN_B=$RUN_B WARM_B=$WARM_B WORKLOAD=$WORKLOAD SLOWDISK_US=$SLOWDISK_US"
  echo "SLOWDISK_SPINDLES=$SLOWDISK_SPINDLES MAX_WAL=$MAX_WAL PARTS=\"$PARTS\"${PG_CONF:+ PG_CONF=\"$PG_CONF\"}${CONFIGS:+ CONFIGS=\"$CONFIGS\"}). Server and client share the machine's cores."
  if [[ " $PARTS " == *" a "* ]]; then
    for x in "${PEER_NAMES[@]}"; do echo "Peer $x (built by hand outside the repository): \`${PEER_CMD[$x]}\`."; done
  fi
} > "$REPORT"
cat "$REPORT"

# --- (a) TPS on the unshaped bed, and the local disk -------------------------
if [[ " $PARTS " == *" a "* ]]; then
  {
    echo
    echo "## (a) pgbench scale $SCALE, $CLIENTS clients, $RUN_A s, unshaped bed"
    echo
    echo "| where | TPS | vs default mount | NFS READ calls per transaction |"
    echo "|---|---|---|---|"
  } | tee -a "$REPORT"
  bed_up
  base=
  wbnote=
  # PEERS (parsed by lib.sh), measured after mpnfs in the same run on the
  # same bed. PostgreSQL runs as its own user: a peer's command must let
  # other users in (allow_other) and keep owners and modes.
  peer_cfgs=
  for x in "${PEER_NAMES[@]}"; do peer_cfgs+=" peer:$x"; done
  for cfg in ${CONFIGS:-default kernelcache writeback local}$peer_cfgs; do
    top=$MNT/pg
    case $cfg in
      peer:*) mount_peer "${PEER_CMD[${cfg#peer:}]}"
              # What PostgreSQL needs of the mount before it is run there:
              # its user may create files, and owners are kept.
              if ! { mkdir "$MNT/pgcheck" && chown postgres: "$MNT/pgcheck" &&
                     as_pg touch "$MNT/pgcheck/f" &&
                     [ "$(stat -c %U "$MNT/pgcheck/f")" = postgres ]; } 2>>"$MPNFS_TB/peer.log"; then
                echo "${cfg#peer:}: PostgreSQL's user cannot create its own files on the mount" >&2
                row "${cfg#peer:} (peer, same run)" "failed: PostgreSQL's user cannot create its own files there" "" ""
                rm -rf "$MNT/pgcheck"; umount_mpnfs; continue
              fi
              rm -rf "$MNT/pgcheck" ;;
      default) mount_mpnfs allow_other ;;
      kernelcache) mount_mpnfs allow_other,kernel_cache ;;
      writeback) rm -rf "$SRC/c"; mkdir -p "$SRC/c"
                 mount_mpnfs "allow_other,cache_dir=$SRC/c,cache_size=1G,cache_mode=writeback${WB_EXTRA:+,$WB_EXTRA}" ;;
      local) top=$SRC/local; rm -rf "$top" ;;
    esac
    new_cluster "$top"
    pg_start "$top/data"
    as_pg pgbench -i -q -s "$SCALE" >/dev/null 2>&1
    ours=1; [ "$cfg" = local ] || [[ $cfg == peer:* ]] && ours=0
    r0=0; [ "$ours" = 0 ] || r0=$(nfs_reads)
    tps=$(bench "$RUN_A")
    rpt=-; [ "$ours" = 0 ] || rpt=$(awk -v r="$(( $(nfs_reads) - r0 ))" -v t="$tps" -v s="$RUN_A" 'BEGIN { printf "%.2f", t ? r / (t * s) : 0 }')
    [ "$cfg" != writeback ] || wbnote="write-back run: $(stat_of writes) writes taken by the cache, $(stat_of copies) copy-on-write copies ($(stat_of copies_to_partner) back to a partner, $(stat_of copied_pages) pages copied, $(stat_of rewrites_in_place) rewrites in place), $(stat_of write_bypasses) bypassed (sequential), $(stat_of writes_around) around it"
    pg_down "$top/data"
    rm -rf "$top"
    [ "$cfg" = local ] || umount_mpnfs
    [ -n "$base" ] || base=$tps
    label=$cfg; [ "$cfg" = default ] && label="mpnfs, default mount"
    [ "$cfg" = kernelcache ] && label="mpnfs, kernel_cache"
    [ "$cfg" = writeback ] && label="mpnfs, cache_mode=writeback (1 GiB cache${WB_EXTRA:+, $WB_EXTRA})"
    [ "$cfg" = local ] && label="local disk (ceiling)"
    [[ $cfg != peer:* ]] || label="${cfg#peer:} (peer, same run)"
    row "$label" "$tps" "$(awk -v a="$tps" -v b="$base" 'BEGIN { printf "%.2fx", a / b }')" "$rpt"
  done
  [ -z "$wbnote" ] || printf '\n%s.\n' "$wbnote" | tee -a "$REPORT"
fi

# --- (b) the OLTP table on a slow-per-operation server ----------------------
if [[ " $PARTS " == *" b "* ]]; then
  # Loaded on a fast server, then the server restarts slow.
  bed_up
  mount_mpnfs allow_other
  new_cluster "$MNT/pg"
  pg_start "$MNT/pg/data"
  as_pg pgbench -i -q -s "$SCALE" >/dev/null 2>&1
  as_pg psql -X -q -c checkpoint >/dev/null
  db_mib=$(du -sm "$MNT/pg/data/base" | awk '{ print $1 }')
  pg_down "$MNT/pg/data"
  umount_mpnfs
  MPNFS_TB_GANESHA_ENV="LD_PRELOAD=$SLOWLIB SLOWDISK_US=$SLOWDISK_US SLOWDISK_SPINDLES=$SLOWDISK_SPINDLES SLOWDISK_ROOT=$EXPORT" \
    contrib/testbed.sh restart-server >/dev/null
  {
    echo
    echo "## (b) OLTP on a server slow per operation ($SLOWDISK_US us per disk operation, $SLOWDISK_SPINDLES at once)"
    echo
    echo "pgbench scale $SCALE ($WORKLOAD, $CLIENTS clients, $db_mib MiB in base/), shared_buffers=16MB, direct_io mounts;"
    echo "cached runs warmed ${WARM_B} s, then measured ${RUN_B} s. Paper: SanDisk DAS Cache, OLTP on disk-bound storage."
    echo
    echo "| configuration (write-back, cache_block=64) | TPS | speedup | read hits | write hits | paper: hits, speedup |"
    echo "|---|---|---|---|---|---|"
  } | tee -a "$REPORT"
  base=
  # LABEL|CACHE_PERCENT(0: none)|MORE_OPTIONS|PAPER
  while IFS="|" read -r -u 3 label pct more paper; do
    if [ "$pct" -gt 0 ] && [ -n "${B_ROWS:-}" ] && ! [[ "$label" =~ $B_ROWS ]]; then continue; fi
    opts=allow_other,direct_io
    if [ "$pct" -gt 0 ]; then
      rm -rf "$SRC/c"; mkdir -p "$SRC/c"
      more="$more${B_EXTRA:+,$B_EXTRA}"; more=${more#,}
      label="$label${B_EXTRA:+, $B_EXTRA}"
      opts="$opts,cache_dir=$SRC/c,cache_size=$((db_mib * pct / 100))M,cache_mode=writeback,cache_block=64${more:+,$more}"
    fi
    mount_mpnfs "$opts"
    if [ "$pct" -gt 100 ]; then
      # A cache larger than the data: one pass over all of it first (as cache.sh).
      find "$MNT/pg/data/base" -type f -exec cat {} + > /dev/null
    fi
    pg_start "$MNT/pg/data"
    [ "$pct" -eq 0 ] || bench "$WARM_B" "$WORKLOAD" >/dev/null
    rh=0 rm_=0 wh=0 w=0 wb=0
    if [ "$pct" -gt 0 ]; then
      rh=$(stat_of read_hits); rm_=$(stat_of read_misses); wh=$(stat_of write_hits); w=$(stat_of writes)
      wb=$(stat_of write_bypasses)
    fi
    sampler=
    if [ "$pct" -gt 0 ] && [ -n "${B_SAMPLE:-}" ]; then
      (while sleep "$B_SAMPLE"; do
         build/src/mpnfsctl stats "$MNT" 2>/dev/null | python3 -c "import json,sys; c=json.load(sys.stdin)['cache']; print('  dirty blocks', c['dirty_blocks'], 'MiB', c['dirty_bytes'] >> 20, '; slots used', c['slots_used'], 'of', c['slots'])" >&2 || break
       done) &
      sampler=$!
    fi
    start_syncs "$PID"
    tps=$(bench "$RUN_B" "$WORKLOAD")
    [ -z "$sampler" ] || kill "$sampler" 2>/dev/null || true
    end_syncs "$tps"
    rhits=- whits=-
    if [ "$pct" -gt 0 ]; then
      rh=$(($(stat_of read_hits) - rh)); rm_=$(($(stat_of read_misses) - rm_))
      wh=$(($(stat_of write_hits) - wh)); w=$(($(stat_of writes) - w)); wb=$(($(stat_of write_bypasses) - wb))
      rhits=$(ratio "$rh" $((rh + rm_))); whits="$(ratio "$wh" "$w") ($wb bypassed)"
    fi
    pg_down "$MNT/pg/data"
    umount_mpnfs   # (a write-back mount flushes first)
    [ -n "$base" ] || base=$tps
    row "$label" "$tps" "$(awk -v a="$tps" -v b="$base" 'BEGIN { printf "%.1fx", a / b }')" \
        "$rhits" "$whits" "$paper"
  done 3<<EOF
no cache|0||-
cache 30%, seq_cutoff=4 (default: the WAL bypasses the cache)|30||85.7% read, 86.7% write; 11x
cache 30%, seq_cutoff=0, fill=page|30|seq_cutoff=0,fill=page|85.7% read, 86.7% write; 11x
cache 30%, seq_cutoff=0, fill=block|30|seq_cutoff=0,fill=block|85.7% read, 86.7% write; 11x
cache 120%, seq_cutoff=0, fill=page|120|seq_cutoff=0,fill=page|97%; 37.6x
cache 120%, seq_cutoff=0, fill=block|120|seq_cutoff=0,fill=block|97%; 37.6x
EOF
  if [ -z "${B_ROWS:-}" ] || [[ "local disk" =~ $B_ROWS ]]; then
    # The ceiling: the same cluster on this machine's own disk (the disk the
    # cache directories use), warmed and measured as long.
    rm -rf "$SRC/local"; mkdir -p "$SRC/local"
    cp -a "$EXPORT/pg" "$SRC/local/"
    pg_start "$SRC/local/pg/data"
    bench "$WARM_B" "$WORKLOAD" >/dev/null
    start_syncs
    tps=$(bench "$RUN_B" "$WORKLOAD")
    end_syncs "$tps"
    pg_stop "$SRC/local/pg/data"; CUR_DATA=
    rm -rf "$SRC/local"
    row "local disk, same settings (the ceiling)" "$tps" \
        "$(awk -v a="$tps" -v b="$base" 'BEGIN { printf "%.1fx", a / b }')" "-" "-" "-"
  fi
fi

if [ -n "$OUT" ]; then cp "$REPORT" "$OUT"; echo "written to $OUT"; fi
