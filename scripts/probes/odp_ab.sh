#!/bin/bash
# What on-demand paging costs: perftest over the drop-in libraries with and without `--odp`
# (buffers registered with IBV_ACCESS_ON_DEMAND, each access populating its pages first), on
# one shared device (127.0.0.1), the order alternating each round; over a same-host lane (the
# default) and over the wire. Prints "plain|odp TEST VALUE" a run: MB/s for the bandwidth
# tests (64 KiB and 1 MiB WRITEs, 2 s), t_typical µs for 8-byte ib_send_lat (server on CPU
# 0, client on CPU 1).
#   scripts/probes/odp_ab.sh ROUNDS LIBDIR
# (LIBDIR: target/release/capi, made by `cargo run --release -p xtask -- capi`; BENCHMARKS.md,
# "On-demand paging".)
set -u
R=${1:-4}; L=$2
run() { # transport port prog args... -> the client's output
  local tr=$1 port=$2; shift 2
  local prog=$1; shift
  LD_LIBRARY_PATH=$L SOFTRDMA_TRANSPORT=$tr SOFTRDMA_DEVICES=127.0.0.1 timeout 60 \
    taskset -c 0 "$prog" -d srdma_127.0.0.1 -x 0 -p "$port" "$@" >/dev/null 2>&1 &
  sleep 0.5
  LD_LIBRARY_PATH=$L SOFTRDMA_TRANSPORT=$tr SOFTRDMA_DEVICES=127.0.0.1 timeout 60 \
    taskset -c 1 "$prog" -d srdma_127.0.0.1 -x 0 -p "$port" "$@" 127.0.0.1 2>&1
  wait
}
one() { # label extra-flag
  local port=$((24000 + (RANDOM % 8000)))
  for tr in lanes wire; do
    for s in 65536 1048576; do
      echo "$1 $tr-write-$s $(run $tr $port ib_write_bw -s $s -D 2 $2 | awk -v s=$s '$1 == s {print $4}')"
      port=$((port + 1))
    done
    echo "$1 $tr-send_lat-8 $(run $tr $port ib_send_lat -s 8 -n 20000 $2 | awk '$1 == 8 {print $5}')"
    port=$((port + 1))
  done
}
for r in $(seq "$R"); do
  if [ $((r % 2)) = 1 ]; then one plain ""; one odp --odp; else one odp --odp; one plain ""; fi
done
