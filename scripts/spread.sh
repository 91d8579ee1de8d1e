#!/usr/bin/env bash
# The repeated-run check: how much `softrdma perf` varies from run to run on this machine, and
# why the slow runs were slow.
#
#   scripts/spread.sh                          # RUNS=10 of each default case
#   RUNS=20 scripts/spread.sh "send -s 8 -n 100000" "write -s 65536"
#
# Each case (the arguments of `softrdma perf`, client and server in one process on two
# loopback devices of this run's own addresses) runs RUNS times in a row. For each case it
# prints the message rate and bandwidth as min / median / max, the spread (max / min), and
# every run slower than half the median with the counters that say why: the client's waits
# for credits (the receiver's queue was empty), packets resent and tail-loss probes, and the
# process's involuntary context switches during the measurement (preemptions: a busy-polling
# benchmark on a machine with fewer free cores than its threads measures the load).
#
# Environment: RUNS (10), SR (the softrdma binary; built in release when unset), OUT (where
# the samples go as CSV; a temporary directory when unset).
set -u
cd "$(dirname "$0")/.."
RUNS=${RUNS:-10}
if [ -z "${SR:-}" ]; then
  cargo build --release -p softrdma-cli >&2 || exit 1
  SR=target/release/softrdma
fi
OUT=${OUT:-$(mktemp -d /tmp/softrdma-spread.XXXXXX)}
mkdir -p "$OUT"
CSV=$OUT/spread.csv
echo "case,run,msg_rate_mps,bw_gbps,credit_waits,retransmitted,probes,preemptions" >"$CSV"

if [ $# -eq 0 ]; then
  set -- "send -s 8 -n 200000" "send -s 4096 -n 100000" "write -s 65536 -n 20000"
fi

# Two addresses of 127/8 for this run: from the pid, so that concurrent runs differ.
a=$(( ($$ >> 8) % 200 + 20 )); b=$(( $$ % 250 + 1 ))
CLIENT=127.$a.$b.1
SERVER=127.$a.$b.2

for c in "$@"; do
  for r in $(seq 1 "$RUNS"); do
    # shellcheck disable=SC2086
    json=$("$SR" perf $c --client-addr "$CLIENT" --server-addr "$SERVER" --json 2>/dev/null | tail -1)
    if [ -z "$json" ]; then
      echo "error: run $r of '$c' failed" >&2
      continue
    fi
    python3 - "$c" "$r" "$json" >>"$CSV" <<'EOF'
import json, sys
case, run, j = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
p = j["points"][-1]
client = next(x for x in j["counters"] if x["who"] == "client")["qp"]
print(f'"{case}",{run},{p.get("msg_rate_mps", 0)},{p.get("bw_gbps", 0)},'
      f'{client["credit_waits"]},{client["retransmitted_packets"]},{client["probes"]},'
      f'{p.get("preemptions", 0)}')
EOF
  done
done

python3 - "$CSV" "$RUNS" <<'EOF'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
cases = {}
for r in rows:
    cases.setdefault(r["case"], []).append(r)
print(f"{'case':<28} {'runs':>4} {'M msg/s min / median / max':>30} {'GB/s median':>12} {'spread':>7}")
for case, rs in cases.items():
    rate = sorted(float(r["msg_rate_mps"]) for r in rs)
    bw = statistics.median(float(r["bw_gbps"]) for r in rs)
    med = statistics.median(rate)
    spread = rate[-1] / rate[0] if rate[0] > 0 else float("inf")
    print(f"{case:<28} {len(rs):>4} {rate[0]:>9.3f} / {med:>7.3f} / {rate[-1]:>7.3f} {bw:>12.3f} {spread:>6.1f}x")
    for r in rs:
        if float(r["msg_rate_mps"]) < med / 2:
            print(f"    slow run {r['run']}: {float(r['msg_rate_mps']):.3f} M/s, "
                  f"waits for credits {r['credit_waits']}, resent {r['retransmitted']}, "
                  f"probes {r['probes']}, preemptions {r['preemptions']}")
    pre = [int(r["preemptions"]) for r in rs]
    print(f"    preemptions per run: min {min(pre)}, median {statistics.median(pre):.0f}, max {max(pre)}")
print(f"samples: {sys.argv[1]}")
EOF
