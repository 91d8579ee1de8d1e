#!/usr/bin/env bash
# The copy engines (SOFTRDMA_COPY_THREADS) on and off, interleaved, with one binary:
#   ab     one QP over lanes (WRITE 64 KiB and 1 MiB, READ and SEND 1 MiB, one process and two),
#          the wire at 1 MiB and 8-byte latency, with 0 helpers, 2, and the default;
#   pairs  N pairs of processes on one device (WRITE 64 KiB, summed; N = 1 2 4 8) and one
#          QP at 1 MiB / 64 KiB, with 0 helpers and the default.
# Needs no toolchain (runs on the device machine from a prebuilt binary).
# usage: SR=target/release/softrdma RUNS=3 scripts/copy_engines_bench.sh ab|pairs
set -u
SR=${SR:-target/release/softrdma}
RUNS=${RUNS:-3}
fig() { python3 -c 'import json,sys
try:
  p=json.loads(sys.stdin.read().strip().splitlines()[-1])["points"][-1]; print(p[sys.argv[1]])
except Exception: print("nan")' "$1"; }
A="--client-addr 127.66.0.1 --server-addr 127.66.0.2 --json"
W="SOFTRDMA_TRANSPORT=wire SOFTRDMA_SAME_HOST_SEGMENT=0"
envof() { if [ "$1" = def ]; then echo "X=1"; else echo "SOFTRDMA_COPY_THREADS=$1"; fi; }
two_proc() { # env -> GB/s of WRITE 1 MiB between two processes
  env $1 timeout 30 "$SR" perf write -s 1048576 -D 2 --server 127.66.1.1 -p 19811 >/dev/null 2>&1 &
  sleep 0.3
  env $1 timeout 30 "$SR" perf write -s 1048576 -D 2 --connect 127.66.1.1 --client-addr 127.66.1.2 \
    -p 19811 --json 2>/dev/null | fig bw_gbps
  wait
}
pairs() { # env n -> summed GB/s of n pairs on one device
  local e=$1 n=$2 i pids=()
  for i in $(seq 1 "$n"); do
    env $e timeout 60 "$SR" perf write -s 65536 -n 40000 --server 127.152.0.1 -p $((25300 + i)) >/dev/null 2>&1 &
  done
  sleep 0.5
  for i in $(seq 1 "$n"); do
    env $e timeout 60 "$SR" perf write -s 65536 -n 40000 --connect 127.152.0.1 --client-addr 127.152.0.1 \
      -p $((25300 + i)) --json 2>/dev/null | fig bw_gbps >/tmp/copy-pair.$i &
    pids+=($!)
  done
  wait "${pids[@]}"
  wait
  cat /tmp/copy-pair.* | awk '{ s += $1 } END { print s }'
  rm -f /tmp/copy-pair.*
}
case "${1:-ab}" in
ab)
  for r in $(seq 1 "$RUNS"); do for t in 0 2 def; do
    E=$(envof $t)
    for c in "write -s 65536" "write -s 1048576" "read -s 1048576" "send -s 1048576"; do
      echo "t=$t lanes $c $(env $E timeout 30 "$SR" perf $c -D 2 $A 2>/dev/null | fig bw_gbps)"
    done
    echo "t=$t wire write -s 1048576 $(env $E $W timeout 30 "$SR" perf write -s 1048576 -D 2 $A 2>/dev/null | fig bw_gbps)"
    echo "t=$t lanes lat8 $(env $E timeout 30 "$SR" perf send --lat -s 8 -n 50000 $A 2>/dev/null | fig lat_us_p50)"
    echo "t=$t lanes 2proc write -s 1048576 $(two_proc "$E")"
  done; done
  ;;
pairs)
  for r in $(seq 1 "$RUNS"); do for t in 0 def; do
    E=$(envof $t)
    for n in 1 2 4 8; do echo "t=$t pairs$n $(pairs "$E" $n)"; done
    echo "t=$t 1proc write1M $(env $E timeout 30 "$SR" perf write -s 1048576 -D 2 $A 2>/dev/null | fig bw_gbps)"
    echo "t=$t 1proc write64K $(env $E timeout 30 "$SR" perf write -s 65536 -D 2 $A 2>/dev/null | fig bw_gbps)"
  done; done
  ;;
*) echo "usage: $0 ab|pairs" >&2; exit 2 ;;
esac
