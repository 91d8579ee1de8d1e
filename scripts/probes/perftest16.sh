#!/bin/bash
# rdma-core's perftest, unmodified, over the drop-in libibverbs/librdmacm on a machine with
# spare cores (the 16-core machine lent by the `device` tool: no toolchain, no network).
# Latency (t_typical / t_avg / 99% / 99.9%, µs) of ib_write_lat, ib_send_lat, ib_read_lat,
# RC and UC, over a same-host lane and over the wire, each process pinned to a core of its own
# (server cpu 2, client cpu 4) and unpinned; then a WRITE-and-spin against a peer that ACKs
# at once (server SOFTRDMA_ACK_HOLD_US=0, like a NIC or rxe); then 8-byte and 64 KiB
# ib_write_bw / ib_send_bw. Rounds interleave the cases.
# Prepare $PEERS on a machine that has them:
#   $PEERS/capi        the drop-in libraries (`cargo run --release -p xtask -- capi`, *.so.1)
#   $PEERS/perftest/bin ib_write_lat ib_send_lat ib_read_lat ib_write_bw ib_send_bw
#   $PEERS/perftest/lib what those need beyond the C library (libpci.so.3, libnl-*.so.200)
# SRV_CPU, CLI_CPU, ALL_CPUS, CLI_CPUS2 move the pinning (defaults 2, 4, 0-15, 2,3).
# usage: PEERS=.peers OUT=/tmp/out ROUNDS=3 scripts/probes/perftest16.sh
set -u
cd "$(dirname "$0")/../.."
PEERS=$(cd "${PEERS:-.peers}" && pwd)
OUT=${OUT:-/tmp/perftest16}; mkdir -p "$OUT"
ROUNDS=${ROUNDS:-3}
PT=$PEERS/perftest/bin
LIBS=$PEERS/capi:$PEERS/perftest/lib${EXTRA_LIBS:+:$EXTRA_LIBS}
DEVS=127.161.0.1,127.161.0.2
A=${SRV_CPU:-2} B=${CLI_CPU:-4} ALL=${ALL_CPUS:-0-15} B2=${CLI_CPUS2:-2,3}
. scripts/probes/perftest_pair.sh
W="SOFTRDMA_TRANSPORT=wire"
N="SOFTRDMA_NOTHING=1"
{
  echo "date: $(date -Is) cpus: $(nproc) $(grep -m1 'model name' /proc/cpuinfo)"
  for r in $(seq 1 "$ROUNDS"); do
    for t in ib_write_lat ib_send_lat ib_read_lat; do
      one "r$r $t lanes, cpus 2/4" $N $N $A $B $t -x 0 -n 20000
      one "r$r $t wire, cpus 2/4" $W $W $A $B $t -x 0 -n 20000
    done
    one "r$r ib_write_lat lanes, unpinned" $N $N $ALL $ALL ib_write_lat -x 0 -n 20000
    one "r$r ib_write_lat wire, unpinned" $W $W $ALL $ALL ib_write_lat -x 0 -n 20000
    one "r$r ib_write_lat -c UC lanes, cpus 2/4" $N $N $A $B ib_write_lat -c UC -x 0 -n 20000
    one "r$r ib_write_lat -c UC wire, cpus 2/4" $W $W $A $B ib_write_lat -c UC -x 0 -n 20000
    one "r$r ib_write_lat wire, server ACKs at once, cpus 2/4" "$W SOFTRDMA_ACK_HOLD_US=0" $W $A $B ib_write_lat -x 0 -n 20000
    one "r$r ib_write_lat wire, server ACKs at once, server cpu 4, client cpus 2,3" "$W SOFTRDMA_ACK_HOLD_US=0" $W $B $B2 ib_write_lat -x 0 -n 20000
    one "r$r ib_write_lat wire, both ACK at once, cpus 2/4" "$W SOFTRDMA_ACK_HOLD_US=0" "$W SOFTRDMA_ACK_HOLD_US=0" $A $B ib_write_lat -x 0 -n 5000
    one "r$r ib_write_bw -s 8 wire" $W $W $A $B ib_write_bw -s 8 -x 0 -n 200000
    one "r$r ib_send_bw -s 8 wire" $W $W $A $B ib_send_bw -s 8 -x 0 -n 200000
    one "r$r ib_write_bw -s 8 lanes" $N $N $A $B ib_write_bw -s 8 -x 0 -n 1000000
    one "r$r ib_write_bw -s 65536 lanes" $N $N $A $B ib_write_bw -s 65536 -x 0 -n 50000
    one "r$r ib_write_bw -s 65536 wire" $W $W $A $B ib_write_bw -s 65536 -x 0 -n 20000
  done
} 2>&1 | tee "$OUT/perftest16.txt"
