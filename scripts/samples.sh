# Helpers of the benchmark scripts (sourced, not run): the figure of a `softrdma perf --json`
# run, the last value the anchors' runners recorded, and the Markdown table of medians of a
# "case,run,value" CSV.

# The figure `key` (bw_gbps, msg_rate_mps, lat_us_p50, ...) of the last point of the perf
# --json output on standard input; "nan" when there is none.
figure() {
  python3 -c '
import json, sys
try:
    p = json.loads(sys.stdin.read().strip().splitlines()[-1])["points"][-1]
    print(p[sys.argv[1]])
except Exception:
    print("nan")' "$1"
}

# The last value that ucx_one / fi_one of ../shared/anchors/run_anchors.sh recorded in $CSV
# for (tool, label, test, size, metric); "nan" when none.
last() { # tool label test size metric
  awk -F, -v t="$1" -v l="$2" -v x="$3" -v s="$4" -v m="$5" \
    '$1 == t && $3 == l && $4 == x && $5 == s && $7 == m { v = $8 } END { print (v == "" ? "nan" : v) }' "$CSV"
}

# Prints the Markdown table (case, median (min-max), runs) of the samples in the CSV file $1
# (columns case,run,value; values that are not numbers are left out).
median_table() {
  python3 - "$1" <<'PY'
import csv, statistics, sys
rows = {}
for row in csv.DictReader(open(sys.argv[1])):
    try:
        v = float(row["value"])
    except ValueError:
        continue
    if v == v:
        rows.setdefault(row["case"], []).append(v)
print("| case | median (min-max) | runs |")
print("|---|---|---|")
for case, vs in rows.items():
    print(f"| {case} | {statistics.median(vs):.3g} ({min(vs):.3g}-{max(vs):.3g}) | {len(vs)} |")
PY
}
