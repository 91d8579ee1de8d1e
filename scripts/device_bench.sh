#!/usr/bin/env bash
# Issue 12's and 15's series on a machine with no Rust toolchain, no package registry and no
# network (the 16-core machine lent by the workplace's `device` tool), in one run:
#   1. the wire (SOFTRDMA_TRANSPORT=wire, path MTU), one RC QP: WRITE 64 KiB / 1 MiB, READ and
#      SEND 1 MiB, SEND 8 B one-way latency; interleaved with UCX tcp (put_bw, tag_bw, tag_lat),
#      iperf3 TCP, sockperf UDP ping-pong, `xtask udp-floor` (the loopback's latency floor)
#      and `xtask udp-bw-floor` (what one UDP stream of RoCE-sized datagrams moves, GSO/GRO);
#   2. several QPs over the wire (`perf -q N`, N = 1 2 4 8): WRITE 64 KiB and 1 MiB;
#   3. the same-host lanes against UCX posix and libfabric shm (scripts/same_host_bench.sh);
#   4. N pairs of processes over lanes, all on one device against each pair on devices of its
#      own (N = 1 2 4 8).
# Every sample is written to $OUT as it is taken (partial runs still return something).
#
# What it needs, prepared on a machine that has them, in one folder ($PEERS, default .peers):
#   bin/softrdma and bin/xtask (release builds), run_anchors.sh (../shared/anchors), and the
#   Debian .deb files of the peers and their libraries (ucx-utils libucx0 libfabric-bin
#   libfabric1 iperf3 libiperf0 sockperf libnuma1 libibverbs1 librdmacm1 libpsm-infinipath1
#   libpsm2-2 libsctp1 libgomp1 libatomic1 libnl-3-200 libnl-route-3-200), unpacked here with
#   dpkg-deb -x (no install, no root needed).
#
# usage: RUNS=3 OUT=/tmp/out PEERS=.peers scripts/device_bench.sh
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PEERS=$(cd "${PEERS:-$ROOT/.peers}" && pwd)
RUNS=${RUNS:-3}
export OUT=${OUT:-/tmp/device-bench}
mkdir -p "$OUT"
SR=$PEERS/bin/softrdma
XT=$PEERS/bin/xtask
. "$ROOT/scripts/device_peers.sh"

{
  echo "date: $(date -Is)"; uname -a; nproc; grep -m1 'model name' /proc/cpuinfo
  grep MemTotal /proc/meminfo; (. /etc/os-release; echo "os: $PRETTY_NAME")
  echo "softrdma: $("$SR" --version 2>&1)"
  for b in ucx_perftest fi_pingpong iperf3 sockperf; do
    echo "$b: $(command -v $b)"; ldd "$(command -v $b)" 2>&1 | grep -i 'not found'
  done
  echo "fi_info -l: $(fi_info -l 2>/dev/null | grep ':$' | tr -d '\n')"
  echo "ucx transports: $(ucx_info -d 2>/dev/null | awk '/Transport:/{print $3}' | sort -u | tr '\n' ' ')"
  echo "2 + 3 = $(echo '2+3' | bc -l)"
} >"$OUT/versions.txt" 2>&1
cat "$OUT/versions.txt"

export ANCHORS=$PEERS/run_anchors.sh
ANCHORS_LIB=1 INSTALL=0 . "$ANCHORS"
. "$ROOT/scripts/samples.sh"
T=2
S=$OUT/device.csv
echo "case,run,value" >"$S"
sample() { echo "\"$1\",$2,$3" >>"$S"; echo "[$(date +%T)] $1 r$2: $3"; }
wire() { # perf arguments... -> JSON figure key is the last argument
  local key=${*: -1}
  SOFTRDMA_TRANSPORT=wire SOFTRDMA_SAME_HOST_SEGMENT=0 timeout 60 "$SR" perf "${@:1:$#-1}" \
    --client-addr 127.151.0.1 --server-addr 127.151.0.2 --json 2>>"$OUT/perf.err" | figure "$key"
}

# ---- 1. the wire, one QP, against TCP peers and the UDP floor
iperf3 -s -p 25201 >/dev/null 2>&1 & BGPIDS+=($!)
sockperf sr -i 127.0.0.1 -p 25202 >/dev/null 2>&1 & BGPIDS+=($!)
sleep 0.5
for r in $(seq 1 "$RUNS"); do
  sample "softrdma wire: WRITE 64 KiB GB/s" "$r" "$(wire write -s 65536 -n 20000 bw_gbps)"
  ucx_one tcp ucp_put_bw 65536 "$r"
  sample "UCX tcp put_bw 64 KiB GB/s" "$r" "$(last ucx tcp ucp_put_bw 65536 bw)"
  sample "softrdma wire: WRITE 1 MiB GB/s" "$r" "$(wire write -s 1048576 -n 2000 bw_gbps)"
  ucx_one tcp ucp_put_bw 1048576 "$r"
  sample "UCX tcp put_bw 1 MiB GB/s" "$r" "$(last ucx tcp ucp_put_bw 1048576 bw)"
  sample "softrdma wire: READ 1 MiB GB/s" "$r" "$(wire read -s 1048576 -n 2000 bw_gbps)"
  sample "softrdma wire: SEND 1 MiB GB/s" "$r" "$(wire send -s 1048576 -n 2000 bw_gbps)"
  ucx_one tcp tag_bw 1048576 "$r"
  sample "UCX tcp tag_bw 1 MiB GB/s" "$r" "$(last ucx tcp tag_bw 1048576 bw)"
  o=$(iperf3 -c 127.0.0.1 -p 25201 -t $T -J 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8e9)' 2>/dev/null)
  sample "iperf3 TCP GB/s" "$r" "${o:-nan}"
  o=$("$XT" udp-bw-floor -s $T 2>&1 | tee -a "$OUT/bwfloor.txt")
  sample "xtask udp-bw-floor, one copy a side GB/s" "$r" "$(echo "$o" | sed -n 's/^udp stream.*one copy a side: \([0-9.]*\) GB.*/\1/p')"
  sample "xtask udp-bw-floor, no copy GB/s" "$r" "$(echo "$o" | sed -n 's/^udp stream.*no user-space copy: \([0-9.]*\) GB.*/\1/p')"
  sample "softrdma wire: SEND 8 B latency p50 us" "$r" "$(wire send --lat -s 8 -n 20000 lat_us_p50)"
  ucx_one tcp tag_lat 8 "$r"
  sample "UCX tcp tag_lat 8 B p50 us" "$r" "$(last ucx tcp tag_lat 8 lat_p50)"
  o=$(sockperf pp -i 127.0.0.1 -p 25202 -m 64 -t $T 2>&1 | sed 's/\x1b\[[0-9;]*m//g' | awk '/percentile 50.000/{print $NF}')
  sample "sockperf UDP ping-pong 64 B p50 us" "$r" "${o:-nan}"
  o=$("$XT" udp-floor -i 20000 2>&1 | tee -a "$OUT/floor.txt" | sed -n 's/.*1 datagram(s) per one-way: one-way p50 \([0-9.]*\) us.*/\1/p' | head -1)
  sample "xtask udp-floor one-way p50 us" "$r" "${o:-nan}"
  sample "softrdma wire: SEND 8 B M msg/s" "$r" "$(wire send -s 8 -n 200000 msg_rate_mps)"
done
cleanup; BGPIDS=()

# ---- 2. several QPs over the wire
for r in $(seq 1 "$RUNS"); do
  for q in 1 2 4 8; do
    sample "softrdma wire -q $q: WRITE 64 KiB GB/s" "$r" "$(wire write -s 65536 -n 10000 -q $q bw_gbps)"
    sample "softrdma wire -q $q: WRITE 1 MiB GB/s" "$r" "$(wire write -s 1048576 -n 1000 -q $q bw_gbps)"
  done
done

# ---- 4. N pairs of processes over lanes: one device, or devices of their own
pair_addrs() { # i shared(1/0) -> "server client" of pair i
  if [ "$2" = 1 ]; then echo 127.152.0.1 127.152.0.1; else echo "127.152.$1.1 127.152.$1.2"; fi
}
pairs() { # n shared(1/0) -> summed GB/s
  local n=$1 one=$2 i pids=() srv cli
  for i in $(seq 1 "$n"); do
    read -r srv cli <<<"$(pair_addrs "$i" "$one")"
    timeout 60 "$SR" perf write -s 65536 -n 40000 --server "$srv" -p $((25300 + i)) >/dev/null 2>&1 &
  done
  sleep 0.5
  for i in $(seq 1 "$n"); do
    read -r srv cli <<<"$(pair_addrs "$i" "$one")"
    timeout 60 "$SR" perf write -s 65536 -n 40000 --connect "$srv" --client-addr "$cli" -p $((25300 + i)) --json \
      2>/dev/null | figure bw_gbps >"$OUT/pair.$i" &
    pids+=($!)
  done
  wait "${pids[@]}"
  wait
  cat "$OUT"/pair.* | awk '{ s += $1 } END { print s }'
  rm -f "$OUT"/pair.*
}
for r in $(seq 1 "$RUNS"); do
  for n in 1 2 4 8; do
    sample "lanes, $n pairs, one device: WRITE 64 KiB GB/s summed" "$r" "$(pairs $n 1)"
    sample "lanes, $n pairs, own devices: WRITE 64 KiB GB/s summed" "$r" "$(pairs $n 0)"
  done
done

median_table "$S" | tee "$OUT/device.md"

# ---- 3. the same-host lanes against UCX posix and libfabric shm
mkdir -p "$OUT/same_host"
OUT=$OUT/same_host SR=$SR INSTALL=0 RUNS=$RUNS scripts/same_host_bench.sh 2>"$OUT/same_host.log" |
  tee "$OUT/same_host.md"
