#!/bin/bash
# Two builds of `softrdma` against each other on the 16-core machine lent by the `device` tool
# (no toolchain, no network): the 8-byte latency series (`ab_latency.sh`: lanes and wire, UCX
# posix tag_lat and the UDP floor in each round) and the rate/bandwidth series
# (`ab_rate.sh`), with the peers unpacked from the .deb files of $PEERS. Prepare $PEERS as for
# scripts/device_bench.sh (bin/xtask, the peers' .deb files), with the two builds as
# bin/softrdma_base and bin/softrdma, then
#   PEERS=.peers ROUNDS=6 scripts/probes/builds_ab16.sh
# (Issue 12's latency and message rate were last measured there in session 29; session 30's
# instruction cuts and session 31's same-host segments of 65,280 bytes are for it to
# measure: the bulk series of `bulk_ab.sh`, iperf3 in each round where the peers have it.)
set -u
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
PEERS=$(cd "${PEERS:-.peers}" && pwd)
. "$ROOT/scripts/device_peers.sh"
R=${ROUNDS:-6}
echo "== latency, $R rounds (base = $PEERS/bin/softrdma_base, head = $PEERS/bin/softrdma)"
XTASK=$PEERS/bin/xtask bash "$ROOT/scripts/probes/ab_latency.sh" "$R" "$PEERS/bin/softrdma_base" "$PEERS/bin/softrdma"
echo "== message rate and bandwidth, $R rounds"
bash "$ROOT/scripts/probes/ab_rate.sh" "$R" "$PEERS/bin/softrdma_base" "$PEERS/bin/softrdma"
echo "== bulk (1 MiB and 64 KiB over the wire and a lane, iperf3 each round), $R rounds"
bash "$ROOT/scripts/probes/bulk_ab.sh" "$R" "$PEERS/bin/softrdma_base" "$PEERS/bin/softrdma"
