#!/usr/bin/env bash
# One RC QP over the wire at 1 MiB against the TCP peers of issue 15, interleaved, RUNS times:
# softrdma perf write and send (SOFTRDMA_TRANSPORT=wire, path MTU), iperf3 (-l 1M, one
# stream) and UCX over tcp (ucx_perftest ucp_put_bw and tag_bw, 1 MiB). Prints one line per
# run, GB/s (10^9 B/s). Needs a release build (cargo build --release -p softrdma-cli),
# iperf3 and ucx-utils; a peer that is missing prints "-".
#
#     RUNS=3 scripts/probes/wire_one_qp.sh
set -u
cd "$(dirname "$0")/../.."
SR=${SR:-target/release/softrdma}
RUNS=${RUNS:-3}
wire() {
  SOFTRDMA_TRANSPORT=wire SOFTRDMA_SAME_HOST_SEGMENT=0 timeout 60 "$SR" perf "$@" 2>/dev/null |
    awk '/^ *[0-9]+ / {print $4}'
}
iperf() {
  command -v iperf3 >/dev/null || { echo -; return; }
  local port=$((30000 + RANDOM % 5000))
  iperf3 -s -1 -p $port >/dev/null 2>&1 &
  sleep 0.5
  iperf3 -c 127.0.0.1 -p $port -l 1M -t 4 -J 2>/dev/null |
    python3 -c "import json,sys; print(round(json.load(sys.stdin)['end']['sum_received']['bits_per_second']/8e9, 3))"
  wait
}
ucx() { # test
  command -v ucx_perftest >/dev/null || { echo -; return; }
  local port=$((35000 + RANDOM % 5000))
  UCX_TLS=tcp ucx_perftest -p $port -t "$1" -s 1048576 -n 2000 >/dev/null 2>&1 &
  sleep 0.7
  # "Final:" row: iterations, latency (3), then average bandwidth in MiB/s.
  UCX_TLS=tcp timeout 60 ucx_perftest 127.0.0.1 -p $port -t "$1" -s 1048576 -n 2000 2>/dev/null |
    awk '/Final:/ {printf "%.3f\n", $6 * 1.048576 / 1000}'
  wait
}
for r in $(seq 1 "$RUNS"); do
  echo "run $r: softrdma write $(wire write -s 1048576 -n 2000) send $(wire send -s 1048576 -n 2000)" \
    "iperf3 $(iperf) ucx-tcp put_bw $(ucx ucp_put_bw) tag_bw $(ucx tag_bw)"
done
