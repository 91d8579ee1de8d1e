#!/usr/bin/env bash
# Several QPs over one pair of devices, one receive queue per device against the default
# (Context::set_receive_queues: one per two CPUs, at most 8), interleaved run by run:
# `softrdma perf write -q N` at 64 KiB and 1 MiB and `perf send -s 8 -q N` over the wire
# (SOFTRDMA_TRANSPORT=wire, path MTU), and WRITE 64 KiB over same-host lanes.
#
# usage: RUNS=3 [SR=path/to/softrdma] [QPS="1 2 4 8"] scripts/queues_bench.sh
# Prints a Markdown table of medians (min-max); every sample stays in $OUT/queues.csv.
set -u
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
QPS=${QPS:-1 2 4 8}
SR=${SR:-target/release/softrdma}
[ -x "$SR" ] || cargo build --release -p softrdma-cli >&2 || exit 1
OUT=${OUT:-$(mktemp -d /tmp/softrdma-queues.XXXXXX)}
mkdir -p "$OUT"
S=$OUT/queues.csv
echo "case,run,value" >"$S"
. scripts/samples.sh
one() { # label queues(1|default) key env... -- perf args...
  local label=$1 q=$2 key=$3 env=() v
  shift 3
  while [ "$1" != -- ]; do env+=("$1"); shift; done
  shift
  [ "$q" = 1 ] && env+=(SOFTRDMA_QUEUES=1)
  v=$(env "${env[@]}" timeout 120 "$SR" perf "$@" --client-addr 127.153.0.1 --server-addr 127.153.0.2 \
    --json 2>>"$OUT/perf.err" | figure "$key")
  echo "\"$label, queues $q\",$r,$v" >>"$S"
  echo "[$(date +%T)] $label, queues $q r$r: $v"
}
WIRE=(SOFTRDMA_TRANSPORT=wire SOFTRDMA_SAME_HOST_SEGMENT=0)
for r in $(seq 1 "$RUNS"); do
  for n in $QPS; do
    for q in 1 default; do
      one "wire -q $n: WRITE 64 KiB GB/s" $q bw_gbps "${WIRE[@]}" -- write -s 65536 -n 10000 -q "$n"
      one "wire -q $n: WRITE 1 MiB GB/s" $q bw_gbps "${WIRE[@]}" -- write -s 1048576 -n 1000 -q "$n"
      one "wire -q $n: SEND 8 B M msg/s" $q msg_rate_mps "${WIRE[@]}" -- send -s 8 -n 100000 -q "$n"
      one "lanes -q $n: WRITE 64 KiB GB/s" $q bw_gbps -- write -s 65536 -n 20000 -q "$n"
    done
  done
done
median_table "$S" | tee "$OUT/queues.md"
echo "samples: $S" >&2
