#!/bin/bash
# Two builds of `softrdma` against each other at bulk sizes, one process (both devices in it),
# the order alternating each round, with iperf3's one TCP stream in every round: WRITE, SEND
# and READ 1 MiB and WRITE 64 KiB over the wire, WRITE and READ 1 MiB and WRITE 64 KiB over a
# same-host lane; `perf -D 2` each (GB/s, the table's bandwidth column).
#   scripts/probes/bulk_ab.sh ROUNDS BASE_BINARY HEAD_BINARY
# (BENCHMARKS.md, "Same-host segments of nearly 64 KiB".)
set -u
R=${1:-6}; A=$2; B=$3
one() { # binary env op size
  env $2 "$1" perf "$3" -s "$4" -D 2 --client-addr 127.198.8.1 --server-addr 127.198.8.2 2>&1 |
    awk -v s="$4" '$1==s {print $4}'
}
run() { # name binary
  echo "$1 wW1M $(one "$2" SOFTRDMA_TRANSPORT=wire write 1048576)" \
    "wS1M $(one "$2" SOFTRDMA_TRANSPORT=wire send 1048576)" \
    "wR1M $(one "$2" SOFTRDMA_TRANSPORT=wire read 1048576)" \
    "wW64K $(one "$2" SOFTRDMA_TRANSPORT=wire write 65536)" \
    "lW1M $(one "$2" X=1 write 1048576) lR1M $(one "$2" X=1 read 1048576)" \
    "lW64K $(one "$2" X=1 write 65536)"
}
for r in $(seq "$R"); do
  if [ $((r % 2)) = 1 ]; then run base "$A"; run head "$B"; else run head "$B"; run base "$A"; fi
  if command -v iperf3 >/dev/null; then
    iperf3 -s -1 -p 5302 -B 127.0.0.1 >/dev/null 2>&1 &
    sleep 0.3
    echo "iperf3 $(iperf3 -c 127.0.0.1 -p 5302 -t 2 -l 1M -J 2>/dev/null | python3 -c \
      'import json,sys; d=json.load(sys.stdin); print("%.2f" % (d["end"]["sum_received"]["bits_per_second"] / 8e9))')"
    wait
  fi
done
