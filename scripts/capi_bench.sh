#!/usr/bin/env bash
# The drop-in C libraries against softrdma's own tool, interleaved, two processes each:
#   ib_write_bw -s SIZE   vs  softrdma perf write -s SIZE   (bandwidth, GB/s)
#   ib_send_lat -s 8      vs  softrdma perf send --lat -s 8 (one-way latency p50 / t_typical)
# Debian's perftest binaries run unmodified on target/release/capi (built here with
# `cargo run --release -p xtask -- capi`). Prints one CSV line per sample and a median
# summary with the ratios. REPS (default 3), SIZE (65536), ITERS (20000).
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${REPS:-3}; SIZE=${SIZE:-65536}; ITERS=${ITERS:-20000}
command -v ib_write_bw >/dev/null || { echo "perftest is not installed (apt-get install perftest)" >&2; exit 1; }
cargo build --release -q -p softrdma-cli
lib=$(cargo run --release -q -p xtask -- capi | tail -1)
sr=target/release/softrdma
A=127.77.0.1; B=127.77.0.2
export SOFTRDMA_DEVICES=$A,$B
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# Waits until something listens on TCP port $1 (perftest's exchange) or 10 s.
wait_tcp() { for _ in $(seq 100); do ss -ltn | grep -q ":$1 " && return 0; sleep 0.1; done; return 1; }
out=$(mktemp -d); trap 'rm -rf "$out"' EXIT
{
echo "tool,test,rep,value,unit"
for rep in $(seq "$REPS"); do
  p=$(port)
  LD_LIBRARY_PATH=$lib ib_write_bw -d srdma_$A -x 0 -p "$p" -s "$SIZE" -n "$ITERS" >"$out/s" 2>&1 &
  wait_tcp "$p"
  LD_LIBRARY_PATH=$lib ib_write_bw -d srdma_$B -x 0 -p "$p" -s "$SIZE" -n "$ITERS" $A >"$out/c" 2>&1; wait
  # perftest: "#bytes #iterations BW peak[MB/sec] BW average[MB/sec] MsgRate[Mpps]" (MB = 2^20 B)
  bw=$(awk -v s="$SIZE" '$1==s && NF>=5 {printf "%.4f", $4*1048576/1e9}' "$out/c")
  echo "ib_write_bw,write_${SIZE},$rep,$bw,GB/s"
  p=$(port)
  $sr perf write --server $A -p "$p" >/dev/null 2>&1 &
  sleep 0.3
  j=$($sr perf write --connect $A --client-addr $B -p "$p" -s "$SIZE" -n "$ITERS" --json 2>/dev/null | tail -1); wait
  echo "softrdma_perf,write_${SIZE},$rep,$(echo "$j" | sed 's/.*"bw_gbps":\([0-9.]*\).*/\1/'),GB/s"
  p=$(port)
  LD_LIBRARY_PATH=$lib ib_send_lat -d srdma_$A -x 0 -p "$p" -s 8 -n "$ITERS" >"$out/s" 2>&1 &
  wait_tcp "$p"
  LD_LIBRARY_PATH=$lib ib_send_lat -d srdma_$B -x 0 -p "$p" -s 8 -n "$ITERS" $A >"$out/c" 2>&1; wait
  # "#bytes #iterations t_min t_max t_typical t_avg t_stdev 99% 99.9%" (usec, one way)
  lat=$(awk '$1==8 && NF>=6 {print $5}' "$out/c")
  echo "ib_send_lat,send_lat_8,$rep,$lat,us"
  p=$(port)
  $sr perf send --lat --server $A -p "$p" >/dev/null 2>&1 &
  sleep 0.3
  j=$($sr perf send --lat --connect $A --client-addr $B -p "$p" -s 8 -n "$ITERS" --json 2>/dev/null | tail -1); wait
  echo "softrdma_perf,send_lat_8,$rep,$(echo "$j" | sed 's/.*"lat_us_p50":\([0-9.]*\).*/\1/'),us"
done
} | tee "$out/csv"
python3 - "$out/csv" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
med = {}
for r in rows:
    med.setdefault((r["tool"], r["test"]), []).append(float(r["value"]))
m = {k: statistics.median(v) for k, v in med.items()}
print()
for (tool, test), v in sorted(m.items()):
    print(f"{tool:14} {test:14} median {v:.3f}  ({', '.join(f'{x:.3f}' for x in med[(tool, test)])})")
w = [k for k in m if k[1].startswith("write")]
if len(w) == 2:
    print(f"ib_write_bw / softrdma perf write: {m[('ib_write_bw', w[0][1])] / m[('softrdma_perf', w[0][1])]:.2f}x")
if ('ib_send_lat', 'send_lat_8') in m:
    print(f"ib_send_lat / softrdma perf send --lat (latency, lower is better): {m[('ib_send_lat','send_lat_8')] / m[('softrdma_perf','send_lat_8')]:.2f}x")
PY
