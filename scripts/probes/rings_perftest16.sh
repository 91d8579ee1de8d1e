#!/bin/bash
# QP pair rings on and off (SOFTRDMA_PAIR_RINGS=1/0, same binary) under rdma-core's perftest on
# the drop-in libraries, interleaved: ib_write_lat and ib_send_lat over a same-host lane, each
# process pinned to a core of its own and unpinned; then SOFTRDMA_ACK_HOLD_US=0 on both sides
# (lane and wire). t_typical / t_avg / 99% / 99.9%, µs. Prepare $PEERS as for
# scripts/probes/perftest16.sh (the same helper, `one`), then
#   PEERS=.peers OUT=/tmp/out ROUNDS=3 scripts/probes/rings_perftest16.sh
set -u
cd "$(dirname "$0")/../.."
PEERS=$(cd "${PEERS:-.peers}" && pwd)
OUT=${OUT:-/tmp/rings-perftest16}; mkdir -p "$OUT"
PT=$PEERS/perftest/bin
LIBS=$PEERS/capi:$PEERS/perftest/lib${EXTRA_LIBS:+:$EXTRA_LIBS}
DEVS=127.162.0.1,127.162.0.2
A=${SRV_CPU:-2} B=${CLI_CPU:-4} ALL=${ALL_CPUS:-0-15}
. scripts/probes/perftest_pair.sh
{
  echo "date: $(date -Is) cpus: $(nproc)"
  for r in $(seq 1 "${ROUNDS:-3}"); do
    for p in 0 1; do
      R=SOFTRDMA_PAIR_RINGS=$p
      one "r$r rings=$p ib_write_lat, cpus $A/$B" $R $R $A $B ib_write_lat -x 0 -n 20000
      one "r$r rings=$p ib_write_lat, unpinned" $R $R $ALL $ALL ib_write_lat -x 0 -n 20000
      one "r$r rings=$p ib_send_lat, cpus $A/$B" $R $R $A $B ib_send_lat -x 0 -n 20000
      one "r$r rings=$p ib_send_lat, unpinned" $R $R $ALL $ALL ib_send_lat -x 0 -n 20000
    done
  done
  H=SOFTRDMA_ACK_HOLD_US=0
  for r in 1 2; do
    one "r$r ib_write_lat lane, both sides ACK at once, cpus $A/$B" $H $H $A $B ib_write_lat -x 0 -n 5000
    one "r$r ib_write_lat wire, both sides ACK at once, cpus $A/$B" "$H SOFTRDMA_TRANSPORT=wire" "$H SOFTRDMA_TRANSPORT=wire" $A $B ib_write_lat -x 0 -n 5000
    one "r$r ib_write_lat wire, both sides ACK at once, unpinned" "$H SOFTRDMA_TRANSPORT=wire" "$H SOFTRDMA_TRANSPORT=wire" $ALL $ALL ib_write_lat -x 0 -n 5000
  done
} 2>&1 | tee "$OUT/rings_perftest16.txt"
