#!/bin/bash
# Two builds of the drop-in libraries against each other with perftest's ib_read_bw over the
# wire: server and client processes on one shared device (127.0.0.1), 1 MiB READs for 2 s,
# the order alternating each round. Prints "base|head bw MB/s drops N" a run (drops: the
# host's UdpRcvbufErrors over the run, from nstat).
#   scripts/probes/perftest_read_ab.sh ROUNDS BASE_LIBDIR HEAD_LIBDIR
# (LIBDIR: target/release/capi of a build, made by `cargo run --release -p xtask -- capi`.)
# (BENCHMARKS.md, "A READ's first tail-loss probe asks for one packet".)
set -u
R=${1:-10}; A=$2; B=$3
one() { # libdir port
  local n0 n1
  n0=$(nstat -az UdpRcvbufErrors | awk '/UdpRcvbufErrors/ {print $2}')
  LD_LIBRARY_PATH=$1 SOFTRDMA_TRANSPORT=wire SOFTRDMA_DEVICES=127.0.0.1 timeout 30 \
    ib_read_bw -d srdma_127.0.0.1 -x 0 -s 1048576 -D 2 -p "$2" >/dev/null 2>&1 &
  sleep 0.5
  local bw
  bw=$(LD_LIBRARY_PATH=$1 SOFTRDMA_TRANSPORT=wire SOFTRDMA_DEVICES=127.0.0.1 timeout 30 \
    ib_read_bw -d srdma_127.0.0.1 -x 0 -s 1048576 -D 2 -p "$2" 127.0.0.1 2>&1 |
    awk '$1 == 1048576 {print $4}')
  wait
  n1=$(nstat -az UdpRcvbufErrors | awk '/UdpRcvbufErrors/ {print $2}')
  echo "bw $bw drops $((n1 - n0))"
}
for r in $(seq "$R"); do
  port=$((24000 + (RANDOM % 8000)))
  if [ $((r % 2)) = 1 ]; then
    echo "base $(one "$A" "$port")"; echo "head $(one "$B" $((port + 1)))"
  else
    echo "head $(one "$B" "$port")"; echo "base $(one "$A" $((port + 1)))"
  fi
done
