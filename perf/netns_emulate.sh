#!/usr/bin/env bash
# Multi-node emulation on one machine: N network namespaces ("nodes") joined by veth pairs to a
# bridge that lives in a namespace of its own, each node's link limited with tc (default
# 1 Gbit/s each way, plus 100 us delay where the kernel has sch_netem), then agbench ranks
# placed in the namespaces. Traffic stays on 10.77.0.0/24 inside these namespaces (and
# loopback); nothing is connected to the host's own network namespace. Everything is torn
# down on exit, error or signal.
#
#   perf/netns_emulate.sh [options] -- <agbench arguments>
#
#   -N nodes        number of namespaces (default 2)
#   -L ranks        ranks per node (default 2)
#   -r rate         tc rate per link direction (default 1gbit; "none" for no limit)
#   -b burst        tbf bucket size per link direction (default 128kb); a link accrues up to
#                   this much credit while idle, which no real link does (see perf/README.md)
#   -p peakrate     tbf's second bucket (one GSO packet, 64 KiB or -g): no packet leaves faster
#                   than this, credit or not; it also lowers the bulk rate (perf/README.md)
#   -g bytes        largest GSO/GRO packet on the links' veths (default: the kernel's, 64 KiB);
#                   smaller lets a smaller -b carry the rate
#   -d delay        one-way delay added per link direction with netem (default 100us; "none")
#   -c algorithm    TCP congestion control in the nodes (default cubic, Linux's default; "host"
#                   keeps what a new namespace inherits from the host: bbr on the dev machine)
#   -m mode         hicoll: one agbench per namespace (--node-rank), bootstrapped over TCP
#                   mpi:    agbench under mpirun across the namespaces with --baseline mpi
#                           (hicoll and Open MPI over TCP side by side in one run)
#                   han:    as mpi, with Open MPI's hierarchical coll/han enabled
#   -a path         agbench binary (default: build/perf/agbench of this checkout), or
#                   another program of the launch library (--np --nodes --node-rank --master-*):
#                   build/examples/train_gpt/train_gpt
#   -t seconds      timeout of the run (default 900)
#   -k              keep the namespaces until Enter is pressed (debugging)
#
# Example (the 2x2 64 MiB comparison of perf/measure.sh):
#   perf/netns_emulate.sh -N 2 -L 2 -m mpi -- allgather -b 64M -e 64M -n 5 -w 2 --reps 5
set -euo pipefail

nodes=2 per=2 rate=1gbit burst=128kb peak="" gso="" delay=100us cc=cubic mode=hicoll timeout_s=900 keep=0
here=$(cd "$(dirname "$0")" && pwd)
agbench="$here/../build/perf/agbench"
while getopts "N:L:r:b:p:g:d:c:m:a:t:kh" o; do
  case $o in
    N) nodes=$OPTARG ;; L) per=$OPTARG ;; r) rate=$OPTARG ;; b) burst=$OPTARG ;; p) peak=$OPTARG ;; g) gso=$OPTARG ;; d) delay=$OPTARG ;; c) cc=$OPTARG ;;
    m) mode=$OPTARG ;; a) agbench=$OPTARG ;; t) timeout_s=$OPTARG ;; k) keep=1 ;;
    h) sed -n '2,32p' "$0"; exit 0 ;;
    *) exit 2 ;;
  esac
done
shift $((OPTIND - 1))
[[ ${1:-} == -- ]] && shift
(( $# > 0 )) || { echo "usage: $0 [options] -- <agbench args> (see -h)" >&2; exit 2; }
[[ $mode =~ ^(hicoll|mpi|han)$ ]] || { echo "unknown mode $mode" >&2; exit 2; }
(( nodes >= 1 && nodes <= 200 && per >= 1 )) || { echo "bad -N/-L" >&2; exit 2; }
[[ $(id -u) == 0 ]] || { echo "$0 needs root (ip netns, tc)" >&2; exit 2; }
agbench=$(readlink -f "$agbench")
[[ -x $agbench ]] || { echo "agbench not found at $agbench (-a)" >&2; exit 2; }

pfx="hcemu$$"        # namespace names: unique per run, so concurrent runs do not collide
sw="${pfx}_sw"
ifname=emu0           # the node side of every veth has this name inside its namespace
subnet=10.77.0
port=29411
work=$(mktemp -d /tmp/hcemu.XXXXXX)
pids=()

teardown() {
  local rc=$?
  trap - EXIT INT TERM
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  sleep 0.2
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  # Processes left inside our namespaces (orted, ranks) go with them: kill by pid, ours only.
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^${pfx}_" || true); do
    for p in $(ip netns pids "$ns" 2>/dev/null || true); do kill -KILL "$p" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -rf "$work"
  exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

node_ns() { echo "${pfx}_n$1"; }
node_ip() { echo "$subnet.$(( $1 + 1 ))"; }
# Runs a command on node k: in its network namespace and in a UTS namespace with host name
# hcemu-n<k>, so that host-name based logic (Open MPI's session and shared-memory file names,
# hicoll's default topology) sees distinct nodes as on a real cluster.
in_node() {
  local k=$1
  shift
  ip netns exec "$(node_ns "$k")" unshare --uts /bin/sh -c 'hostname "$0" && exec "$@"' "hcemu-n$k" "$@"
}

# --- topology: a bridge in its own namespace, one veth per node ------------------------------
ip netns add "$sw"
ip -n "$sw" link add br0 type bridge
ip -n "$sw" link set br0 up
ip -n "$sw" link set lo up
have_netem=1
shape=(tbf rate "$rate" burst "$burst")
[[ -z $peak ]] || shape+=(peakrate "$peak" mtu "${gso:-65536}")
shape+=(latency 20ms)
limit_link() {  # namespace, device
  local ns=$1 dev=$2
  if [[ $delay != none && $have_netem == 1 ]]; then
    if tc -n "$ns" qdisc add dev "$dev" root handle 1: netem delay "$delay" limit 100000 2>/dev/null; then
      [[ $rate == none ]] || tc -n "$ns" qdisc add dev "$dev" parent 1:1 handle 10: "${shape[@]}"
      return
    fi
    have_netem=0
    echo "# netns_emulate: this kernel has no sch_netem: links are rate-limited only, no added delay" >&2
  fi
  # burst 128kb: enough for 1 Gbit/s at the kernel's timer granularity (measured: 0.94 Gbit/s)
  [[ $rate == none ]] || tc -n "$ns" qdisc add dev "$dev" root "${shape[@]}"
}
for ((k = 0; k < nodes; k++)); do
  ns=$(node_ns $k)
  ip netns add "$ns"
  ip link add "$ifname" netns "$ns" type veth peer name "p$k" netns "$sw"
  ip -n "$sw" link set "p$k" master br0 up
  ip -n "$ns" addr add "$(node_ip $k)/24" dev "$ifname"
  ip -n "$ns" link set "$ifname" up
  ip -n "$ns" link set lo up
  # Per route: a namespace may only take a default the host lists in tcp_allowed_congestion_control.
  [[ $cc == host ]] || ip -n "$ns" route replace "$subnet.0/24" dev "$ifname" proto kernel scope link \
    src "$(node_ip $k)" congctl "$cc"
  if [[ -n $gso ]]; then
    ip -n "$ns" link set "$ifname" gso_max_size "$gso" gro_max_size "$gso"
    ip -n "$sw" link set "p$k" gso_max_size "$gso" gro_max_size "$gso"
  fi
  limit_link "$ns" "$ifname"  # node -> bridge
  limit_link "$sw" "p$k"      # bridge -> node
done
echo "# netns_emulate: $nodes nodes x $per ranks, links: rate $rate burst $burst${peak:+ peakrate $peak}${gso:+ gso $gso}, delay $([[ $have_netem == 1 ]] && echo "$delay" || echo none)," \
     "tcp congestion control $([[ $cc == host ]] && ip netns exec "$(node_ns 0)" sysctl -n net.ipv4.tcp_congestion_control || echo "$cc")," \
     "namespaces ${pfx}_n0..$((nodes - 1)) on $subnet.0/24"

np=$((nodes * per))
export HICOLL_SOCKET_IFNAME=$ifname HICOLL_OFI_IFACE=$ifname
# One secret for the whole job (each node's launcher forks its own ranks): strangers stay out.
export HICOLL_COMM_SECRET=${HICOLL_COMM_SECRET:-$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')}
status=0
case $mode in
  hicoll)
    # One agbench per namespace; each forks its node's ranks with their global numbers.
    for ((k = nodes - 1; k >= 0; k--)); do
      in_node "$k" timeout --kill-after=10 "$timeout_s" \
        "$agbench" "$@" --np "$np" --nodes "$nodes" --node-rank "$k" \
        --master-addr "$(node_ip 0)" --master-port "$port" &
      pids+=($!)
    done
    for p in "${pids[@]}"; do wait "$p" || status=$?; done
    pids=()
    ;;
  mpi | han)
    # mpirun runs in node 0's namespace; it reaches the other namespaces through this rsh
    # agent, which maps a node address to its namespace (no ssh, no name resolution).
    agent="$work/ns_agent.sh"
    {
      echo '#!/bin/sh'
      echo 'host=$1; shift'
      echo 'case $host in'
      for ((k = 0; k < nodes; k++)); do echo "  $(node_ip $k)) ns=$(node_ns $k) hn=hcemu-n$k ;;"; done
      echo '  *) echo "ns_agent: unknown host $host" >&2; exit 1 ;;'
      echo 'esac'
      echo 'exec ip netns exec "$ns" unshare --uts /bin/sh -c "hostname $hn && $*"'
    } >"$agent"
    chmod +x "$agent"
    hosts=""
    for ((k = 0; k < nodes; k++)); do hosts+="${hosts:+,}$(node_ip $k):$per"; done
    mca=(--mca plm_rsh_agent "$agent" --mca btl self,vader,tcp --mca pml ob1
         --mca btl_tcp_if_include "$subnet.0/24" --mca oob_tcp_if_include "$subnet.0/24")
    [[ $mode == han ]] && mca+=(--mca coll_han_priority 100)
    fwd=(-x HICOLL_SOCKET_IFNAME -x HICOLL_OFI_IFACE)
    for v in $(env | grep -oE '^(HICOLL_[A-Z_]+|SMDDP_[A-Z_]+|FI_[A-Z_]+)=' | tr -d = || true); do
      fwd+=(-x "$v")
    done
    [[ -n ${LD_LIBRARY_PATH:-} ]] && fwd+=(-x LD_LIBRARY_PATH)
    echo "# netns_emulate: mpirun $([[ $mode == han ]] && echo "with coll/han") across $nodes namespaces"
    in_node 0 timeout --kill-after=10 "$timeout_s" \
      mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$np" --host "$hosts" \
      --map-by slot "${mca[@]}" "${fwd[@]}" \
      "$agbench" "$@" --nodes "$nodes" --baseline mpi &
    pids+=($!)
    wait "${pids[0]}" || status=$?
    pids=()
    ;;
esac
# Link counters: drops at the rate limiter mean TCP losses (and retransmission timeouts).
for ((k = 0; k < nodes; k++)); do
  for where in "$(node_ns $k) $ifname node$k->bridge" "$sw p$k bridge->node$k"; do
    set -- $where
    tc -n "$1" -s qdisc show dev "$2" | awk -v w="$3" '/^ Sent/ {
      printf "# netns_emulate: link %-16s sent %s bytes %s pkts, dropped %s overlimits %s\n", w, $2, $4, $7, $9 }' | tr -d ','
  done
  # TCP's view of those losses in the node: retransmitted segments, and retransmission
  # timeouts (each stalls a flow for >= 200 ms).
  ip netns exec "$(node_ns $k)" awk -v w="node$k" '
    /^Tcp: [0-9]/ { retrans = $13 }
    /^TcpExt:/ { if (!h) { for (i = 2; i <= NF; i++) col[$i] = i; h = 1 } else { to = $col["TCPTimeouts"] } }
    END { printf "# netns_emulate: tcp in %-10s retransmitted segments %s, retransmission timeouts %s\n", w, retrans, to }' \
    /proc/net/snmp /proc/net/netstat
done
if (( keep )); then read -r -p "namespaces kept; Enter to tear down " _; fi
exit "$status"
