#!/bin/bash
# Two builds of `softrdma` against each other, alternating, one process (both devices in it):
# 8-byte SEND message rate over a lane, and WRITE/SEND 1 MiB and WRITE 64 KiB over the wire.
#   scripts/probes/ab_rate.sh ROUNDS BASE_BINARY HEAD_BINARY
# (BENCHMARKS.md, "Whole-program LTO".)
set -u
R=${1:-4}; A=$2; B=$3
one() { # binary env op size iterations column
  env $2 "$1" perf "$3" -s "$4" -n "$5" --client-addr 127.198.4.1 --server-addr 127.198.4.2 2>&1 |
    awk -v s="$4" -v c="$6" '$1==s {print $c}'
}
for r in $(seq "$R"); do
  for pair in "base $A" "head $B"; do
    set -- $pair
    echo "r$r $1 rate8 $(one "$2" X=1 send 8 3000000 5)" \
      "wire_write1M $(one "$2" SOFTRDMA_TRANSPORT=wire write 1048576 3000 4)" \
      "wire_send1M $(one "$2" SOFTRDMA_TRANSPORT=wire send 1048576 3000 4)" \
      "wire_write64K $(one "$2" SOFTRDMA_TRANSPORT=wire write 65536 40000 4)"
  done
done
