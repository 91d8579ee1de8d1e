#!/usr/bin/env bash
# Runs softrdma's benchmarks and the peers a user would pick instead (../shared/anchors),
# interleaved in one invocation, and prints a table of medians with ratios.
#
#   scripts/bench.sh            # REPS=3 by default
#   REPS=1 scripts/bench.sh     # a quick look
#
# Needs root for apt-get (the peers are Debian packages: ucx-utils, libfabric-bin).
# Figures: RC RDMA WRITE bandwidth at 4 KiB, 64 KiB and 1 MiB, 8-byte SEND one-way latency
# (softrdma perf), UCX tcp ucp_put_bw / tag_lat and libfabric fi_pingpong tcp.
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
REPS=${REPS:-3}
ANCHORS=${ANCHORS:-$ROOT/../shared/anchors/run_anchors.sh}
[ -f "$ANCHORS" ] || { echo "error: $ANCHORS not found (shared/ must sit beside the repository)" >&2; exit 1; }

echo "== building softrdma (release)"
cargo build --release -p softrdma-cli >&2 || exit 1
SR=$ROOT/target/release/softrdma

# The anchors script as a library: its install step, CSV recorder and peer runners.
export OUT=${OUT:-/tmp/softrdma-bench/results-$(date +%Y%m%d-%H%M%S)}
ANCHORS_LIB=1 . "$ANCHORS"
if ! command -v ucx_perftest >/dev/null || ! command -v fi_pingpong >/dev/null; then
  [ "${INSTALL:-1}" = 1 ] && do_install >&2
fi
versions

sr_bw(){ # op size rep
  local o; o=$("$SR" perf "$1" -s "$2" --json 2>>"$LOG" | tail -1)
  local v; v=$(echo "$o" | $PY -c 'import json,sys; d=json.load(sys.stdin); print(d["bw_gbps"], d["msg_rate_mps"])' 2>/dev/null || echo "NaN NaN")
  set -- "$1" "$2" "$3" $v
  rec softrdma "softrdma perf" rc "$1"_bw "$2" "$3" bw "$4" GB/s
  rec softrdma "softrdma perf" rc "$1"_bw "$2" "$3" msgrate "$5" Mmsg/s
  log "softrdma $1 bw $2 r$3 $4 GB/s $5 Mmsg/s"
}
sr_lat(){ # op size rep
  local o; o=$("$SR" perf "$1" --lat -s "$2" -n 20000 --json 2>>"$LOG" | tail -1)
  local v; v=$(echo "$o" | $PY -c 'import json,sys; d=json.load(sys.stdin); print(d["lat_us_p50"], d["lat_us_p99"])' 2>/dev/null || echo "NaN NaN")
  set -- "$1" "$2" "$3" $v
  rec softrdma "softrdma perf" rc "$1"_lat "$2" "$3" lat_p50 "$4" us
  rec softrdma "softrdma perf" rc "$1"_lat "$2" "$3" lat_p99 "$5" us
  log "softrdma $1 lat $2 r$3 p50 $4 us p99 $5 us"
}

for r in $(seq 1 "$REPS"); do
  for s in 4096 65536 1048576; do
    sr_bw write $s $r
    ucx_one tcp ucp_put_bw $s $r
  done
  fi_one tcp tcp msg 65536 $r
  fi_one tcp tcp msg 4096 $r
  sr_bw send 8 $r
  sr_bw write 8 $r
  ucx_one tcp ucp_put_bw 8 $r
  sr_lat send 8 $r
  ucx_one tcp tag_lat 8 $r
  fi_one tcp tcp msg 8 $r
done
summary
echo "results: $OUT"
