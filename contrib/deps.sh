#!/bin/bash
# Installs (apt, Debian 12) what building, testing and the demo need, and
# only what is missing. Safe to run repeatedly. contrib/deps.sh --bench adds
# what contrib/bench/ needs.
set -euo pipefail
PKGS=(meson ninja-build gcc g++ clang libclang-rt-14-dev pkg-config libfuse3-dev liburing-dev fuse3 libnfs-dev libnfs-utils libspdlog-dev
      libgtest-dev nfs-ganesha nfs-ganesha-vfs rpcbind nfs-common sqlite3 fio python3 python3-pytest iproute2 attr
      acl psmisc rsync util-linux procps zlib1g-dev postgresql-15 postgresql-client-15
      prometheus-cpp-dev nlohmann-json3-dev prometheus debhelper lintian build-essential)
# --bench: what the benchmark scripts need besides (the charts' plotting library,
# perf for write_cpu.sh).
[ "${1:-}" = "--bench" ] && PKGS+=(python3-matplotlib linux-perf)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Ganesha's Debian package may start its own daemon; the test bed runs its own.
if command -v systemctl >/dev/null && systemctl is-active --quiet nfs-ganesha 2>/dev/null; then
  systemctl stop nfs-ganesha || true
fi
# So may PostgreSQL's (its cluster 15/main); the PostgreSQL test starts its own servers.
# (postgresql-15 has initdb, pgbench and the amcheck extension; postgresql-client-15
# has psql and pg_amcheck.)
if command -v systemctl >/dev/null && systemctl is-active --quiet postgresql 2>/dev/null; then
  systemctl stop postgresql || true
  systemctl disable --quiet postgresql 2>/dev/null || true
elif command -v pg_lsclusters >/dev/null && pg_lsclusters -h 2>/dev/null | grep -q '^15 main .* online '; then
  pg_ctlcluster 15 main stop || true
fi
# The prometheus package is here for promtool (the statistics tests check the
# metrics with it); its server is not wanted.
if command -v systemctl >/dev/null && systemctl is-active --quiet prometheus 2>/dev/null; then
  systemctl stop prometheus || true
  systemctl disable --quiet prometheus 2>/dev/null || true
elif [ -x /etc/init.d/prometheus ] && /etc/init.d/prometheus status >/dev/null 2>&1; then
  /etc/init.d/prometheus stop || true
fi
[ -e /dev/fuse ] || modprobe fuse 2>/dev/null || true
[ -e /dev/fuse ] || { echo "deps: /dev/fuse is missing (FUSE not available)" >&2; exit 1; }
