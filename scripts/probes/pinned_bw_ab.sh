#!/bin/bash
# Two builds of `softrdma` against each other over the wire between two processes pinned to a
# core each (server `taskset -c 0`, client `-c 1`), the order alternating each round: SEND,
# WRITE and READ 1 MiB, `perf -D 2` each (GB/s).
#   scripts/probes/pinned_bw_ab.sh ROUNDS BASE_BINARY HEAD_BINARY [OPS]
# (BENCHMARKS.md, "A poll that finds the receive side taken yields".)
set -u
R=${1:-6}; A=$2; B=$3; OPS=${4:-send write read}
one() { # binary op
  local port=$((28000 + RANDOM % 4000))
  SOFTRDMA_TRANSPORT=wire taskset -c 0 "$1" perf "$2" --server 127.77.13.1 -p $port >/dev/null 2>&1 &
  sleep 0.3
  SOFTRDMA_TRANSPORT=wire taskset -c 1 "$1" perf "$2" -s 1048576 -D 2 --connect 127.77.13.1 \
    --client-addr 127.77.13.2 -p $port 2>&1 | awk '$1 == 1048576 {print $4}'
  wait
}
run() { # name binary
  local line="$1"
  for op in $OPS; do line="$line $op $(one "$2" "$op")"; done
  echo "$line"
}
for r in $(seq "$R"); do
  if [ $((r % 2)) = 1 ]; then run base "$A"; run head "$B"; else run head "$B"; run base "$A"; fi
done
