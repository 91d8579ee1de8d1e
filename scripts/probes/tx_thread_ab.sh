#!/bin/bash
# One QP over the wire with the devices' transmit threads off (SOFTRDMA_TX_THREAD=0) and as by
# default (same binary; on where the process may run on 8 CPUs or more), interleaved, against
# iperf3, UCX tcp and the UDP stream floor in the same rounds; a median table at the end.
# Written for the 16-core machine lent by the `device` tool (no toolchain, no network):
# prepare $PEERS as for scripts/device_bench.sh (bin/softrdma, bin/xtask, run_anchors.sh, the
# peers' .deb files), then
#   PEERS=.peers OUT=/tmp/out RUNS=3 scripts/probes/tx_thread_ab.sh
set -u
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
PEERS=$(cd "${PEERS:-.peers}" && pwd)
. "$ROOT/scripts/device_peers.sh"
export OUT=${OUT:-/tmp/tx-thread-ab}; mkdir -p "$OUT"
export ANCHORS=$PEERS/run_anchors.sh
ANCHORS_LIB=1 INSTALL=0 . "$ANCHORS"
. "$ROOT/scripts/samples.sh"
SR=$PEERS/bin/softrdma; XT=$PEERS/bin/xtask
S=$OUT/tx_thread_ab.csv; echo "case,run,value" >"$S"
sample() { echo "\"$1\",$2,$3" >>"$S"; echo "[$(date +%T)] $1 r$2: $3"; }
txenv() { if [ "$1" = 0 ]; then echo SOFTRDMA_TX_THREAD=0; else echo SOFTRDMA_NOTHING=1; fi; }
wire() { # tx(0|default) perf-args... key
  local tx=$1; shift; local key=${*: -1}
  env "$(txenv "$tx")" SOFTRDMA_TRANSPORT=wire SOFTRDMA_SAME_HOST_SEGMENT=0 timeout 60 "$SR" perf "${@:1:$#-1}" \
    --client-addr 127.151.0.1 --server-addr 127.151.0.2 --json 2>>"$OUT/perf.err" | figure "$key"
}
wire2() { # tx perf-args... key: server and client in processes of their own
  local tx=$1; shift; local key=${*: -1} port=$((26000 + RANDOM % 3000))
  env "$(txenv "$tx")" SOFTRDMA_TRANSPORT=wire SOFTRDMA_SAME_HOST_SEGMENT=0 timeout 60 "$SR" perf "${@:1:$#-1}" \
    --server 127.152.0.1 -p $port >/dev/null 2>&1 &
  sleep 0.4
  env "$(txenv "$tx")" SOFTRDMA_TRANSPORT=wire SOFTRDMA_SAME_HOST_SEGMENT=0 timeout 60 "$SR" perf "${@:1:$#-1}" \
    --connect 127.152.0.1 --client-addr 127.152.0.2 -p $port --json 2>>"$OUT/perf.err" | figure "$key"
  wait
}
iperf3 -s -p 25201 >/dev/null 2>&1 & BGPIDS+=($!)
sleep 0.5
for r in $(seq 1 "${RUNS:-3}"); do
  for tx in 0 default; do
    sample "wire tx=$tx: WRITE 1 MiB GB/s" "$r" "$(wire $tx write -s 1048576 -n 3000 bw_gbps)"
    sample "wire tx=$tx: WRITE 64 KiB GB/s" "$r" "$(wire $tx write -s 65536 -n 30000 bw_gbps)"
    sample "wire tx=$tx: READ 1 MiB GB/s" "$r" "$(wire $tx read -s 1048576 -n 3000 bw_gbps)"
    sample "wire tx=$tx: SEND 1 MiB GB/s" "$r" "$(wire $tx send -s 1048576 -n 3000 bw_gbps)"
    sample "wire tx=$tx, two processes: WRITE 1 MiB GB/s" "$r" "$(wire2 $tx write -s 1048576 -n 3000 bw_gbps)"
    sample "wire tx=$tx, two processes: SEND 1 MiB GB/s" "$r" "$(wire2 $tx send -s 1048576 -n 3000 bw_gbps)"
    sample "wire tx=$tx -q 8: WRITE 1 MiB GB/s" "$r" "$(wire $tx write -s 1048576 -n 1000 -q 8 bw_gbps)"
    sample "wire tx=$tx: SEND 8 B latency p50 us" "$r" "$(wire $tx send --lat -s 8 -n 20000 lat_us_p50)"
    sample "wire tx=$tx: SEND 8 B M msg/s" "$r" "$(wire $tx send -s 8 -n 200000 msg_rate_mps)"
  done
  o=$(iperf3 -c 127.0.0.1 -p 25201 -t 2 -J 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8e9)' 2>/dev/null)
  sample "iperf3 TCP GB/s" "$r" "${o:-nan}"
  ucx_one tcp tag_bw 1048576 "$r"; sample "UCX tcp tag_bw 1 MiB GB/s" "$r" "$(last ucx tcp tag_bw 1048576 bw)"
  ucx_one tcp ucp_put_bw 65536 "$r"; sample "UCX tcp put_bw 64 KiB GB/s" "$r" "$(last ucx tcp ucp_put_bw 65536 bw)"
  o=$("$XT" udp-bw-floor -s 1 2>&1 | tee -a "$OUT/bwfloor.txt")
  sample "udp-bw-floor one copy a side GB/s" "$r" "$(echo "$o" | sed -n 's/^udp stream.*one copy a side: \([0-9.]*\) GB.*/\1/p')"
done
cleanup
median_table "$S" | tee "$OUT/tx_thread_ab.md"
