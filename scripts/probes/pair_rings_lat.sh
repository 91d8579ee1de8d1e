#!/bin/bash
# QP pair rings on and off (SOFTRDMA_PAIR_RINGS=1/0, same binary), interleaved, with UCX
# posix tag_lat between: 8-byte one-way latency over a same-host lane, two processes in three
# placements and one process, WRITE latency, and the SEND message rate (which takes no
# records: a control). Written for the 16-core machine lent by the `device` tool (no
# toolchain, no network): prepare $PEERS as for scripts/device_bench.sh (bin/softrdma, the
# peers' .deb files), then
#   PEERS=.peers OUT=/tmp/out scripts/probes/pair_rings_lat.sh
set -u
cd "$(dirname "$0")/../.."
PEERS=$(cd "${PEERS:-.peers}" && pwd)
SR=$PEERS/bin/softrdma
OUT=${OUT:-/tmp/pair-rings}; mkdir -p "$OUT"
PX=/tmp/pair-rings-peers; mkdir -p $PX; for d in "$PEERS"/*.deb; do dpkg-deb -x "$d" $PX; done
export PATH=$PX/usr/bin:$PATH LD_LIBRARY_PATH=$PX/usr/lib/x86_64-linux-gnu UCX_MODULE_DIR=$PX/usr/lib/x86_64-linux-gnu/ucx
lat2() { # rings cpuServer cpuClient -> t_typical
  local port=$((20000 + RANDOM % 5000))
  SOFTRDMA_PAIR_RINGS=$1 taskset -c $2 timeout 60 $SR perf send --lat -s 8 -n 200000 --server 127.198.1.1 -p $port >/dev/null 2>&1 & sleep 0.3
  SOFTRDMA_PAIR_RINGS=$1 taskset -c $3 timeout 60 $SR perf send --lat -s 8 -n 200000 --connect 127.198.1.1 --client-addr 127.198.1.2 -p $port 2>&1 | awk 'NF==7 && $1==8 {print $5}'; wait; }
lat1() { SOFTRDMA_PAIR_RINGS=$1 timeout 60 $SR perf send --lat -s 8 -n 200000 --client-addr 127.198.0.1 --server-addr 127.198.0.2 2>&1 | awk 'NF==7 && $1==8 {print $5}'; }
wlat2() { local port=$((20000 + RANDOM % 5000))
  SOFTRDMA_PAIR_RINGS=$1 taskset -c 2 timeout 60 $SR perf write --lat -s 8 -n 200000 --server 127.198.2.1 -p $port >/dev/null 2>&1 & sleep 0.3
  SOFTRDMA_PAIR_RINGS=$1 taskset -c 4 timeout 60 $SR perf write --lat -s 8 -n 200000 --connect 127.198.2.1 --client-addr 127.198.2.2 -p $port 2>&1 | awk 'NF==7 && $1==8 {print $5}'; wait; }
rate1() { SOFTRDMA_PAIR_RINGS=$1 timeout 60 $SR perf send -s 8 -n 1000000 --client-addr 127.198.0.1 --server-addr 127.198.0.2 2>&1 | awk 'NF==5 && $1==8 {print $5}'; }
ucx() { local port=$((25000 + RANDOM % 5000))
  UCX_TLS=posix taskset -c $1 timeout 60 ucx_perftest -p $port >/dev/null 2>&1 & sleep 0.5
  UCX_TLS=posix taskset -c $2 timeout 60 ucx_perftest 127.0.0.1 -p $port -t tag_lat -s 8 -n 1000000 -w 10000 2>&1 | awk '/Final:/{print $3}'; wait; }
for r in 1 2 3 4; do
  for p in 1 0; do
    echo "r$r rings=$p send lat, two processes, cpus 2/4: $(lat2 $p 2 4)"
    echo "r$r rings=$p send lat, two processes, cpus 2/10: $(lat2 $p 2 10)"
    echo "r$r rings=$p send lat, two processes, unpinned: $(lat2 $p 0-15 0-15)"
    echo "r$r rings=$p send lat, one process: $(lat1 $p)"
    echo "r$r rings=$p write lat, two processes, cpus 2/4: $(wlat2 $p)"
    echo "r$r rings=$p send -s 8 rate, one process: $(rate1 $p)"
  done
  echo "r$r UCX posix tag_lat p50, cpus 2/4: $(ucx 2 4)"
  echo "r$r UCX posix tag_lat p50, cpus 2/10: $(ucx 2 10)"
done 2>&1 | tee "$OUT/pair_rings_lat.txt"
