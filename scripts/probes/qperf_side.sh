#!/bin/bash
# qperf (Debian's, unmodified) over softrdma beside qperf's own TCP and UDP tests, ROUNDS
# rounds, the cases interleaved: RC tests through rdma_cm (-cm1) on the drop-in libraries,
# over the same-host lanes and over RoCEv2 packets (SOFTRDMA_TRANSPORT=wire), then tcp_lat,
# udp_lat, tcp_bw, udp_bw on loopback. qperf's latency is one way (half the round trip), its
# RC tests wait for completions on a completion channel (events, not busy polling).
#   scripts/probes/qperf_side.sh [ROUNDS] [LIBDIR] [SECONDS]   (apt-get install qperf)
set -u
R=${1:-3}; LIB=$(realpath "${2:-target/release/capi}"); T=${3:-2}
RC="rc_lat rc_rdma_write_lat rc_rdma_read_lat rc_bw rc_rdma_write_bw"
IP="tcp_lat udp_lat tcp_bw udp_bw"
for r in $(seq "$R"); do
  for how in lanes wire tcpudp; do
    port=$((21000 + RANDOM % 4000))
    case $how in
      lanes) E="LD_LIBRARY_PATH=$LIB"; TESTS="-cm1 $RC" ;;
      wire) E="LD_LIBRARY_PATH=$LIB SOFTRDMA_TRANSPORT=wire"; TESTS="-cm1 $RC" ;;
      tcpudp) E="X=1"; TESTS="$IP" ;;
    esac
    env $E SOFTRDMA_DEVICES=127.62.0.1 qperf --listen_port $port >/dev/null 2>&1 &
    srv=$!
    sleep 0.3
    # (qperf's own tests go to 127.0.0.1: a UDP answer to an alias comes from 127.0.0.1,
    # and qperf's udp_lat drops it.)
    dst=127.62.0.1
    [ $how = tcpudp ] && dst=127.0.0.1
    env $E SOFTRDMA_DEVICES=127.62.0.2 qperf $dst --listen_port $port -t "$T" $TESTS 2>&1 |
      awk -v r="$r" -v h="$how" '/:$/ {t=$1} /=/ {print "r" r, h, t, $3, $4}'
    kill $srv 2>/dev/null; wait $srv 2>/dev/null
  done
done
