#!/bin/bash
# mpnfs test bed: an NFS-Ganesha NFSv3 server (FSAL_VFS) in its own network
# namespace, reachable from the root namespace over N veth "paths", each
# optionally shaped with tc tbf in both directions.
#
#   testbed.sh up N [RATE]       e.g. "up 1" or "up 4 200mbit"
#   testbed.sh down
#   testbed.sh link down|up K    take path K down / up (its far end: the client
#                                keeps its route, so nothing leaks elsewhere)
#   testbed.sh shape K RATE|off  shape path K (tbf, both directions) or unshape it
#   testbed.sh restart-server    stop and start Ganesha (export kept)
#   testbed.sh crash-server      SIGKILL Ganesha (no goodbye to clients), start it again
#   testbed.sh stop-server | start-server
#   testbed.sh host up|down H    another client host: network namespace
#                                ${NS}hH with its own address, 10.NET.(100+H).1,
#                                reaching the server at 10.NET.(100+H).2 (run
#                                a client there with nsenter --net=/run/netns/..)
#   testbed.sh env               print the variables below
#
# Variables: MPNFS_TB (state dir, default /tmp/mpnfs-tb), MPNFS_TB_NS (netns,
# default mpnfstb), MPNFS_TB_NET (second octet, default 77), MPNFS_TB_LINK
# (veth prefix, default mtb), MPNFS_TB_GANESHA_ENV (extra VAR=VALUE words for
# Ganesha's environment, e.g. "LD_PRELOAD=/path/libslowdisk.so SLOWDISK_US=5000"
# as contrib/bench/pgbench.sh sets it; read at every server start).
# Path K: client 10.NET.K.1, server 10.NET.K.2.
# Export: $MPNFS_TB/export, NFS port 2049, MOUNT port 20048, NLM port 32803
# (with rpc.statd; a 5 s lock grace period after each server start).
# Once the server runs, change the export only through NFS: Ganesha caches.
set -euo pipefail
TB=${MPNFS_TB:-/tmp/mpnfs-tb}
NS=${MPNFS_TB_NS:-mpnfstb}
NET=${MPNFS_TB_NET:-77}
LP=${MPNFS_TB_LINK:-mtb}

write_conf() {
  cat > "$TB/ganesha.conf" <<EOC
NFS_CORE_PARAM {
  Protocols = 3; NFS_Port = 2049; MNT_Port = 20048; NLM_Port = 32803; Rquota_Port = 875;
  # NLM (byte-range locks) on NLM_Port; its status monitor, rpc.statd, calls
  # Ganesha back over UDP when a client says it restarted (SM_NOTIFY), so
  # UDP is on (the clients use TCP).
  Enable_NLM = true; Enable_RQUOTA = false; Enable_UDP = true;
}
# The lock grace period after a start (only reclaims are granted in it).
NFSv4 { Grace_Period = 5; Lease_Lifetime = 5; }
NFS_KRB5 { Active_krb5 = false; }
EXPORT {
  Export_Id = 1; Path = $TB/export; Pseudo = $TB/export; Protocols = 3; Transports = TCP;
  Access_Type = RW; Squash = No_Root_Squash; SecType = sys; Manage_Gids = false;
  FSAL { Name = VFS; }
}
EXPORT {
  Export_Id = 2; Path = $TB/squashed; Pseudo = $TB/squashed; Protocols = 3; Transports = TCP;
  Access_Type = RW; Squash = Root_Squash; SecType = sys;
  FSAL { Name = VFS; }
}
LOG { Default_Log_Level = WARN; }
EOC
}

server_listening() { ip netns exec "$NS" ss -ltn 2>/dev/null | grep -q ':2049 '; }

start_server() {
  # rpcbind and Ganesha get a private /run: registrations go over
  # /run/rpcbind.sock, which all network namespaces share otherwise. FUSE
  # mounts copied into the new mount namespace are dropped so that they do
  # not keep a FUSE daemon alive after its unmount.
  ip netns exec "$NS" unshare -m --propagation private sh -c "
    awk '\$3 ~ /^fuse/ {print \$2}' /proc/self/mounts | xargs -r -n1 umount -l 2>/dev/null;
    mount -t tmpfs none /run && mkdir -p /run/rpcbind && rpcbind -w &&
    mkdir -p '$TB/statd/sm' '$TB/statd/sm.bak' && rpc.statd --no-notify -P '$TB/statd' 2>/dev/null &&
    env ${MPNFS_TB_GANESHA_ENV:-} ganesha.nfsd -f '$TB/ganesha.conf' -L '$TB/ganesha.log' -p '$TB/ganesha.pid' -N NIV_WARN"
  for _ in $(seq 100); do server_listening && return 0; sleep 0.1; done
  echo "testbed: ganesha did not start; see $TB/ganesha.log" >&2
  return 1
}

stop_server() {
  # Everything in the namespace was started by us (ganesha, rpcbind, rpc.statd).
  local p sig=${1:-TERM}
  for p in $(ip netns pids "$NS" 2>/dev/null); do kill -"$sig" "$p" 2>/dev/null || true; done
  for _ in $(seq 100); do [ -z "$(ip netns pids "$NS" 2>/dev/null)" ] && break; sleep 0.1; done
  for p in $(ip netns pids "$NS" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
  for _ in $(seq 50); do server_listening || break; sleep 0.1; done
  rm -f "$TB/ganesha.pid"
}

shape() {  # K RATE|off
  local k=$1 rate=$2
  if [ "$rate" = off ]; then
    tc qdisc del dev "${LP}c$k" root 2>/dev/null || true
    ip netns exec "$NS" tc qdisc del dev "${LP}s$k" root 2>/dev/null || true
  else
    tc qdisc replace dev "${LP}c$k" root tbf rate "$rate" burst 256kb latency 50ms
    ip netns exec "$NS" tc qdisc replace dev "${LP}s$k" root tbf rate "$rate" burst 256kb latency 50ms
  fi
}

case "${1:-}" in
up)
  n=${2:-1}; rate=${3:-}
  mkdir -p "$TB/export" "$TB/squashed"
  chmod 1777 "$TB/squashed"
  write_conf
  ip netns add "$NS"
  ip netns exec "$NS" ip link set lo up
  for k in $(seq 1 "$n"); do
    ip link add "${LP}c$k" type veth peer name "${LP}s$k"
    ip link set "${LP}s$k" netns "$NS"
    ip addr add "10.$NET.$k.1/24" dev "${LP}c$k"
    ip link set "${LP}c$k" up
    ip netns exec "$NS" ip addr add "10.$NET.$k.2/24" dev "${LP}s$k"
    ip netns exec "$NS" ip link set "${LP}s$k" up
    [ -z "$rate" ] || shape "$k" "$rate"
  done
  start_server ;;
down)
  stop_server
  for l in $(ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | grep -E "^${LP}c[0-9]+$" || true); do
    ip link del "$l" 2>/dev/null || true
  done
  for h in $(ip netns list | awk '{print $1}' | grep -E "^${NS}h[0-9]+$" || true); do
    ip netns del "$h" 2>/dev/null || true
  done
  ip netns del "$NS" 2>/dev/null || true ;;
link)
  # Only the server's end goes down, as when a switch port dies: the client
  # end loses carrier but keeps its address and route, so packets for the
  # path are dropped on the veth instead of following the default route.
  ip netns exec "$NS" ip link set "${LP}s$3" "$2"
  if [ "$2" = up ]; then
    # Forget neighbour entries learnt (or failed) while the path was down.
    ip neigh flush dev "${LP}c$3" 2>/dev/null || true
    ip netns exec "$NS" ip neigh flush dev "${LP}s$3" 2>/dev/null || true
  fi ;;
shape) shape "$2" "$3" ;;
host)
  h=$3 hn="${NS}h$3"
  if [ "$2" = up ]; then
    ip netns add "$hn"
    ip netns exec "$hn" ip link set lo up
    ip link add "${LP}h$h" netns "$hn" type veth peer name "${LP}g$h" netns "$NS"
    ip netns exec "$hn" ip addr add "10.$NET.$((100 + h)).1/24" dev "${LP}h$h"
    ip netns exec "$hn" ip link set "${LP}h$h" up
    ip netns exec "$NS" ip addr add "10.$NET.$((100 + h)).2/24" dev "${LP}g$h"
    ip netns exec "$NS" ip link set "${LP}g$h" up
  else
    ip netns del "$hn" 2>/dev/null || true
  fi ;;
restart-server) stop_server; start_server ;;
crash-server) stop_server KILL; start_server ;;
stop-server) stop_server ;;
start-server) start_server ;;
env) echo "TB=$TB NS=$NS SERVER=10.$NET.1.2 EXPORT=$TB/export" ;;
*) sed -n 2,28p "$0"; exit 2 ;;
esac
