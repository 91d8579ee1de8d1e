#!/usr/bin/env bash
# Shared devices, measured: (1) the hot path of one process with the shared-device code
# against a build without it, interleaved run by run; (2) two processes on one device against
# two processes on two devices; (3) two pairs of processes on one device against two pairs on
# four devices, run at the same time.
#
# usage: BASE=path/to/old/softrdma NEW=path/to/new/softrdma RUNS=5 scripts/shared_bench.sh
# (NEW defaults to target/release/softrdma; without BASE part 1 is skipped). Prints medians
# (min-max) per case. Addresses are 127.198.x.y, away from the tests' 127.200-253 range.
set -euo pipefail
NEW=${NEW:-target/release/softrdma}
BASE=${BASE:-}
RUNS=${RUNS:-5}
OUT=$(mktemp -d /tmp/softrdma-shared-bench.XXXXXX)
CSV=$OUT/runs.csv
echo "case,run,value" >"$CSV"

# The figure of a perf --json run: GB/s for bandwidth, M msg/s for 8-byte sends, p50 us
# for latency.
figure() {
  python3 -c '
import json, sys
p = json.loads(sys.stdin.read().strip().splitlines()[-1])["points"][-1]
k = sys.argv[1]
print(p[k])' "$1"
}

one_process() { # bin what key
  local bin=$1 what=$2 key=$3
  # shellcheck disable=SC2086
  "$bin" perf $what --client-addr 127.198.0.1 --server-addr 127.198.0.2 --json 2>/dev/null | figure "$key"
}

two_processes() { # server-addr client-addr port what key
  local s=$1 c=$2 port=$3 what=$4 key=$5
  # shellcheck disable=SC2086
  "$NEW" perf $what --server "$s" -p "$port" >/dev/null 2>&1 &
  local pid=$!
  sleep 0.3
  # shellcheck disable=SC2086
  "$NEW" perf $what --connect "$s" --client-addr "$c" -p "$port" --json 2>/dev/null | figure "$key"
  wait "$pid" || true
}

record() { echo "\"$1\",$2,$3" >>"$CSV"; }

for r in $(seq 1 "$RUNS"); do
  for bin in ${BASE:+"$BASE"} "$NEW"; do
    tag=new
    [ "$bin" = "$BASE" ] && tag=base
    record "$tag write 64 KiB GB/s" "$r" "$(one_process "$bin" "write -s 65536 -n 20000" bw_gbps)"
    record "$tag send 8 B M msg/s" "$r" "$(one_process "$bin" "send -s 8 -n 200000" msg_rate_mps)"
    record "$tag send lat 8 B p50 us" "$r" "$(one_process "$bin" "send --lat -s 8 -n 20000" lat_us_p50)"
  done
  record "2 processes, 2 devices: write 64 KiB GB/s" "$r" \
    "$(two_processes 127.198.1.1 127.198.1.2 19600 "write -s 65536 -n 20000" bw_gbps)"
  record "2 processes, 1 device: write 64 KiB GB/s" "$r" \
    "$(two_processes 127.198.1.3 127.198.1.3 19600 "write -s 65536 -n 20000" bw_gbps)"
  record "2 processes, 2 devices: send 8 B M msg/s" "$r" \
    "$(two_processes 127.198.1.1 127.198.1.2 19600 "send -s 8 -n 200000" msg_rate_mps)"
  record "2 processes, 1 device: send 8 B M msg/s" "$r" \
    "$(two_processes 127.198.1.3 127.198.1.3 19600 "send -s 8 -n 200000" msg_rate_mps)"
  record "2 processes, 2 devices: send lat 8 B p50 us" "$r" \
    "$(two_processes 127.198.1.1 127.198.1.2 19600 "send --lat -s 8 -n 20000" lat_us_p50)"
  record "2 processes, 1 device: send lat 8 B p50 us" "$r" \
    "$(two_processes 127.198.1.3 127.198.1.3 19600 "send --lat -s 8 -n 20000" lat_us_p50)"
  # Two pairs at once: the sum of their bandwidths.
  for layout in "4 devices:127.198.2.1 127.198.2.2 127.198.2.3 127.198.2.4" \
                "1 device:127.198.2.5 127.198.2.5 127.198.2.5 127.198.2.5"; do
    name=${layout%%:*}
    read -r s1 c1 s2 c2 <<<"${layout#*:}"
    two_processes "$s1" "$c1" 19603 "write -s 65536 -n 20000" bw_gbps >"$OUT/p1" &
    p1=$!
    two_processes "$s2" "$c2" 19604 "write -s 65536 -n 20000" bw_gbps >"$OUT/p2"
    wait "$p1"
    record "2 pairs at once, $name: write 64 KiB GB/s (sum)" "$r" \
      "$(python3 -c "print(round($(cat "$OUT/p1") + $(cat "$OUT/p2"), 4))")"
  done
done

python3 - "$CSV" <<'EOF'
import csv, statistics, sys
cases = {}
for row in csv.DictReader(open(sys.argv[1])):
    cases.setdefault(row["case"], []).append(float(row["value"]))
print(f"{'case':<52} {'runs':>4} {'median':>9} {'min':>9} {'max':>9}")
for case, v in cases.items():
    print(f"{case:<52} {len(v):>4} {statistics.median(v):>9.4g} {min(v):>9.4g} {max(v):>9.4g}")
EOF
echo "runs: $CSV"
