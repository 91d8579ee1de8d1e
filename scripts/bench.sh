#!/usr/bin/env bash
# The benchmark harness: softrdma beside the peers a user would pick instead, in one
# invocation, interleaved, on this machine's loopback.
#
#   scripts/bench.sh                # REPS=3: the run BENCHMARKS.md records (~10 min)
#   REPS=1 QUICK=1 scripts/bench.sh # a quick look: fewer sizes, BENCHMARKS.md untouched
#
# What it runs, every repetition, one after the other:
#   softrdma perf (over the wire: SOFTRDMA_TRANSPORT=wire, SOFTRDMA_SAME_HOST_SEGMENT=0) write/read/send bandwidth at 8 B … 1 MiB and send/write latency at
#   8 B … 64 KiB (two loopback devices in one process, connected by the connection manager);
#   UCX ucx_perftest over tcp and shared memory (posix): ucp_put_bw, tag_bw, tag_lat,
#   ucp_put_lat; libfabric fi_pingpong over tcp, udp and shm; iperf3 and sockperf over TCP and
#   UDP; single-thread memcpy. The peers come from ../shared/anchors/run_anchors.sh (Debian
#   packages, installed with apt-get when missing: needs root).
#
# Then `xtask bench-report` turns the samples into the tables of medians with ratios to each
# peer and the plot docs/bench.svg, and the tables replace the part of BENCHMARKS.md between
# the markers "<!-- bench:begin -->" and "<!-- bench:end -->" (unless QUICK=1 or
# WRITE_MD=0). Every sample stays in $OUT/results.csv.
#
# Environment: REPS (3), QUICK (0), WRITE_MD (1), INSTALL (1: apt-get the peers if missing),
# OUT (result directory), NICE (-10: priority of the benchmarked programs; 0 to leave as is),
# SPREAD (0: with N, also scripts/spread.sh's N-run spread check of softrdma perf, saved in
# $OUT/spread.txt).
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
# softrdma over the wire, as between two hosts: no same-host lanes, the path MTU (the lanes
# have their own harness, scripts/same_host_bench.sh).
export SOFTRDMA_TRANSPORT=${SOFTRDMA_TRANSPORT:-wire}
export SOFTRDMA_SAME_HOST_SEGMENT=${SOFTRDMA_SAME_HOST_SEGMENT:-0}
REPS=${REPS:-3}
QUICK=${QUICK:-0}
WRITE_MD=${WRITE_MD:-1}
[ "$QUICK" = 1 ] && WRITE_MD=0
NICE=${NICE:--10}
ANCHORS=${ANCHORS:-$ROOT/../shared/anchors/run_anchors.sh}
[ -f "$ANCHORS" ] || { echo "error: $ANCHORS not found (shared/ must sit beside the repository)" >&2; exit 1; }

echo "== building softrdma and the report tool (release)" >&2
cargo build --release -p softrdma-cli -p xtask >&2 || exit 1
SR=$ROOT/target/release/softrdma
XTASK=$ROOT/target/release/xtask

# The anchors script as a library: its install step, CSV recorder and peer runners.
export OUT=${OUT:-/tmp/softrdma-bench/results-$(date +%Y%m%d-%H%M%S)}
ANCHORS_LIB=1 . "$ANCHORS"
missing=0
for t in ucx_perftest fi_pingpong iperf3 sockperf gcc bc; do
  command -v $t >/dev/null || missing=1
done
if [ $missing = 1 ]; then
  [ "${INSTALL:-1}" = 1 ] && do_install >&2
fi
versions
echo "command: $0 (REPS=$REPS QUICK=$QUICK)" >>"$OUT/versions.txt"
echo "softrdma: $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet || echo '+changes')" >>"$OUT/versions.txt"

# The measured programs (softrdma and the peers alike) run at a higher priority when allowed,
# so that a build or another job on this small machine disturbs them less.
if [ "$NICE" != 0 ]; then
  renice "$NICE" -p $$ >/dev/null 2>&1 || echo "note: could not renice to $NICE; running at normal priority" >&2
fi

# Iterations for ucx_perftest by size (the anchors script's choice covers only some sizes).
ucx_iters() { # tls size kind
  local s=$2
  if [ "$1" = tcp ]; then
    if [ "$3" = bw ]; then
      if [ "$s" -le 512 ]; then echo 200000; elif [ "$s" -le 16384 ]; then echo 20000; elif [ "$s" -le 65536 ]; then echo 5000; else echo 1000; fi
    else
      if [ "$s" -le 512 ]; then echo 20000; elif [ "$s" -le 16384 ]; then echo 10000; else echo 2000; fi
    fi
  else
    if [ "$s" -le 512 ]; then echo 1000000; elif [ "$s" -le 16384 ]; then echo 200000; elif [ "$s" -le 65536 ]; then echo 20000; else echo 2000; fi
  fi
}
sr_bw() { # op size rep
  local o v
  o=$("$SR" perf "$1" -s "$2" --json 2>>"$LOG" | tail -1)
  v=$(echo "$o" | $PY -c 'import json,sys; d=json.load(sys.stdin); print(d["bw_gbps"], d["msg_rate_mps"])' 2>/dev/null || echo "NaN NaN")
  set -- "$1" "$2" "$3" $v
  rec softrdma "softrdma perf" rc "$1"_bw "$2" "$3" bw "$4" GB/s
  rec softrdma "softrdma perf" rc "$1"_bw "$2" "$3" msgrate "$5" Mmsg/s
  log "softrdma $1 bw $2 r$3 $4 GB/s $5 Mmsg/s"
}
sr_lat() { # op size rep
  local n=20000 o v
  [ "$2" -ge 16384 ] && n=5000
  o=$("$SR" perf "$1" --lat -s "$2" -n $n --json 2>>"$LOG" | tail -1)
  v=$(echo "$o" | $PY -c 'import json,sys; d=json.load(sys.stdin); print(d["lat_us_p50"], d["lat_us_p99"])' 2>/dev/null || echo "NaN NaN")
  set -- "$1" "$2" "$3" $v
  rec softrdma "softrdma perf" rc "$1"_lat "$2" "$3" lat_p50 "$4" us
  rec softrdma "softrdma perf" rc "$1"_lat "$2" "$3" lat_p99 "$5" us
  log "softrdma $1 lat $2 r$3 p50 $4 us p99 $5 us"
}

if [ "$QUICK" = 1 ]; then
  BW_SIZES="8 4096 65536 1048576"
  LAT_SIZES="8 4096 65536"
else
  BW_SIZES="8 64 512 4096 16384 65536 262144 1048576"
  LAT_SIZES="8 64 512 4096 16384 65536"
fi

# Sockets: the anchors' socket section (iperf3, sockperf, qperf), once per repetition. It numbers
# its samples as repetition 1: this repetition's rows are renumbered.
sock_rep() {
  local r=$1 before
  before=$(wc -l <"$CSV")
  REPS=1 do_sock
  "$XTASK" udp-floor -i 20000 >>"$OUT/floor.txt" 2>&1 && log "$(tail -2 "$OUT/floor.txt" | tr '\n' ' ')"
  awk -F, -v OFS=, -v n="$before" -v r="$r" 'NR > n && $1 == "sock" { $6 = r } { print }' "$CSV" >"$CSV.tmp" &&
    mv "$CSV.tmp" "$CSV"
  cleanup; BGPIDS=()
}

for r in $(seq 1 "$REPS"); do
  log "== repetition $r of $REPS"
  for s in $BW_SIZES; do
    sr_bw write "$s" "$r"
    ucx_one tcp ucp_put_bw "$s" "$r"
    ucx_one posix ucp_put_bw "$s" "$r"
    sr_bw send "$s" "$r"
    ucx_one tcp tag_bw "$s" "$r"
    sr_bw read "$s" "$r"
    fi_one tcp tcp msg "$s" "$r"
    fi_one shm shm rdm "$s" "$r"
  done
  for s in $LAT_SIZES; do
    sr_lat send "$s" "$r"
    ucx_one tcp tag_lat "$s" "$r"
    ucx_one posix tag_lat "$s" "$r"
    sr_lat write "$s" "$r"
    ucx_one tcp ucp_put_lat "$s" "$r"
    [ "$s" -le 1024 ] && fi_one udp udp dgram "$s" "$r"
  done
  sock_rep "$r"
  before=$(wc -l <"$CSV")
  REPS=1 do_memcpy
  awk -F, -v OFS=, -v n="$before" -v r="$r" 'NR > n && $1 == "memcpy" { $6 = r } { print }' "$CSV" >"$CSV.tmp" &&
    mv "$CSV.tmp" "$CSV"
done
summary >/dev/null

FRAG=$OUT/benchmarks.md
SVG=docs/bench.svg
[ "$WRITE_MD" = 1 ] || SVG=$OUT/bench.svg
mkdir -p "$(dirname "$SVG")"
"$XTASK" bench-report --csv "$OUT/results.csv" --versions "$OUT/versions.txt" \
  --out-md "$FRAG" --svg "$SVG" --command "scripts/bench.sh (REPS=$REPS)" || exit 1
# The loopback floor under softrdma, measured in each repetition (xtask udp-floor).
if [ -s "$OUT/floor.txt" ]; then
  $PY - "$OUT/floor.txt" >>"$FRAG" <<'EOF'
import re, statistics, sys
cases = {}
for line in open(sys.argv[1]):
    m = re.search(r"(\d) datagram\(s\) per one-way: one-way p50 ([\d.]+) us", line)
    if m:
        cases.setdefault(int(m.group(1)), []).append(float(m.group(2)))
if cases:
    parts = [f"{n} datagram{'s' if n > 1 else ''} per one-way {statistics.median(v):.2f} µs"
             for n, v in sorted(cases.items())]
    print()
    print("Loopback floor, same run (`xtask udp-floor`: two threads busy-polling non-blocking UDP "
          "sockets, one-way p50, median of the repetitions): " + "; ".join(parts) + ".")
EOF
fi
if [ "$WRITE_MD" = 1 ]; then
  $PY - BENCHMARKS.md "$FRAG" <<'EOF' || exit 1
import sys
md, frag = sys.argv[1], open(sys.argv[2]).read().strip("\n")
text = open(md).read()
b, e = "<!-- bench:begin -->", "<!-- bench:end -->"
if b in text and e in text:
    head, rest = text.split(b, 1)
    _, tail = rest.split(e, 1)
    text = head + b + "\n" + frag + "\n" + e + tail
else:
    text = text.rstrip("\n") + "\n\n" + b + "\n" + frag + "\n" + e + "\n"
open(md, "w").write(text)
EOF
  echo "BENCHMARKS.md and $SVG updated" >&2
fi
cat "$FRAG"
echo "results: $OUT" >&2

# The repeated-run check (SPREAD=N): each softrdma perf case N more times in a row, with the
# spread and the counters of the slow runs (scripts/spread.sh), saved beside the samples.
if [ "${SPREAD:-0}" -gt 0 ]; then
  echo "== run-to-run spread (SPREAD=$SPREAD)" >&2
  RUNS=$SPREAD SR=$SR OUT=$OUT scripts/spread.sh | tee "$OUT/spread.txt"
fi
