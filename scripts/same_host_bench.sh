#!/usr/bin/env bash
# The same-host fast path, measured beside the shared-memory peers a user would pick instead,
# interleaved run by run on this machine:
#   softrdma perf over same-host lanes with 32 KiB segments (the default) and over the wire at
#   the path MTU as between two hosts (SOFTRDMA_TRANSPORT=wire SOFTRDMA_SAME_HOST_SEGMENT=0),
#   in one process (two devices) and in two processes (--server / --connect); with BASE=an
#   older softrdma binary, that one too (one process, its defaults);
#   UCX ucx_perftest over shared memory (UCX_TLS=posix, and posix,cma for the 1 MiB put);
#   libfabric fi_pingpong over its shm provider.
#
# usage: RUNS=3 [BASE=old/softrdma] scripts/same_host_bench.sh   (SR: default target/release)
# Prints a Markdown table of medians (min-max) per case, and keeps every sample in $OUT.
# The peers come from ../shared/anchors/run_anchors.sh (its install step runs when missing).
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
RUNS=${RUNS:-3}
SR=${SR:-$ROOT/target/release/softrdma}
[ -x "$SR" ] || cargo build --release -p softrdma-cli >&2 || exit 1
ANCHORS=${ANCHORS:-$ROOT/../shared/anchors/run_anchors.sh}
export OUT=${OUT:-$(mktemp -d /tmp/softrdma-same-host.XXXXXX)}
ANCHORS_LIB=1 . "$ANCHORS"
. "$ROOT/scripts/samples.sh"
for t in ucx_perftest fi_pingpong bc; do
  command -v $t >/dev/null || { [ "${INSTALL:-1}" = 1 ] && do_install >&2; break; }
done
SAMPLES=$OUT/same_host.csv
echo "case,run,value" >"$SAMPLES"
sample() { echo "\"$1\",$2,$3" >>"$SAMPLES"; }

# The environment of a mode: lane (the defaults) or wire (as between two hosts).
mode_env() { [ "$1" = wire ] && echo "SOFTRDMA_TRANSPORT=wire SOFTRDMA_SAME_HOST_SEGMENT=0"; }
sr_one() { # mode what key [binary]
  # shellcheck disable=SC2086,SC2046
  env $(mode_env "$1") "${4:-$SR}" perf $2 --client-addr 127.197.0.1 --server-addr 127.197.0.2 --json 2>/dev/null | figure "$3"
}
sr_two() { # mode what key
  # shellcheck disable=SC2086,SC2046
  env $(mode_env "$1") "$SR" perf $2 --server 127.197.1.1 -p 19700 >/dev/null 2>&1 &
  local pid=$!
  sleep 0.3
  # shellcheck disable=SC2086,SC2046
  env $(mode_env "$1") "$SR" perf $2 --connect 127.197.1.1 --client-addr 127.197.1.2 -p 19700 --json 2>/dev/null | figure "$3"
  wait "$pid" 2>/dev/null || true
}

for r in $(seq 1 "$RUNS"); do
  log "== run $r of $RUNS"
  for tr in lane wire ${BASE:+base}; do
    t=$tr bin=$SR
    [ "$tr" = base ] && t=lane bin=$BASE
    sample "softrdma $tr, 1 process: WRITE 64 KiB GB/s" "$r" "$(sr_one "$t" "write -s 65536 -n 20000" bw_gbps "$bin")"
    sample "softrdma $tr, 1 process: WRITE 1 MiB GB/s" "$r" "$(sr_one "$t" "write -s 1048576 -n 2000" bw_gbps "$bin")"
    sample "softrdma $tr, 1 process: READ 1 MiB GB/s" "$r" "$(sr_one "$t" "read -s 1048576 -n 2000" bw_gbps "$bin")"
    sample "softrdma $tr, 1 process: SEND 8 B M msg/s" "$r" "$(sr_one "$t" "send -s 8 -n 200000" msg_rate_mps "$bin")"
    sample "softrdma $tr, 1 process: SEND 8 B latency p50 us" "$r" "$(sr_one "$t" "send --lat -s 8 -n 20000" lat_us_p50 "$bin")"
    [ "$tr" = base ] && continue
    sample "softrdma $tr, 2 processes: WRITE 1 MiB GB/s" "$r" "$(sr_two "$t" "write -s 1048576 -n 2000" bw_gbps)"
    sample "softrdma $tr, 2 processes: SEND 8 B latency p50 us" "$r" "$(sr_two "$t" "send --lat -s 8 -n 20000" lat_us_p50)"
  done
  for s in 65536 1048576; do
    ucx_one posix ucp_put_bw $s "$r"
    sample "UCX posix put_bw $s B GB/s" "$r" "$(last ucx posix ucp_put_bw $s bw)"
    fi_one shm shm rdm $s "$r"
    sample "libfabric shm rdm pingpong $s B GB/s" "$r" "$(last fi shm pingpong $s bw)"
  done
  ucx_one posix,cma ucp_put_bw 1048576 "$r"
  sample "UCX posix,cma put_bw 1048576 B GB/s" "$r" "$(last ucx posix+cma ucp_put_bw 1048576 bw)"
  ucx_one posix ucp_put_bw 8 "$r"
  sample "UCX posix put_bw 8 B M msg/s" "$r" "$(last ucx posix ucp_put_bw 8 msgrate)"
  ucx_one posix tag_lat 8 "$r"
  sample "UCX posix tag_lat 8 B p50 us" "$r" "$(last ucx posix tag_lat 8 lat_p50)"
  fi_one shm shm rdm 8 "$r"
  sample "libfabric shm rdm pingpong 8 B latency us" "$r" "$(last fi shm pingpong 8 lat)"
done
cleanup

median_table "$SAMPLES"
echo "samples: $SAMPLES" >&2
