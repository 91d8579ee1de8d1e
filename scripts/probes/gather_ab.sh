#!/bin/bash
# Payloads sent from registered memory in place against copied into the packet, on one binary
# (SOFTRDMA_TX_GATHER=1 / 0), alternating which goes first each round, over the wire: 1 MiB
# WRITE and SEND with same-host segments, 1 MiB WRITE over 4 KiB packets (the path MTU, as
# between hosts). `perf -D 2` each; prints each pair, then per case the medians, the median
# of the pairs' ratios and how many pairs the in-place run won.
#   scripts/probes/gather_ab.sh ROUNDS [BINARY]
# (BENCHMARKS.md, "Payloads sent from registered memory in place".)
set -u
R=${1:-10}
B=${2:-target/release/softrdma}
LOG=$(mktemp)
one() { # gather env op
  env SOFTRDMA_TRANSPORT=wire SOFTRDMA_TX_GATHER="$1" "$2" "$B" perf "$3" -s 1048576 -D 2 \
    --client-addr 127.198.8.1 --server-addr 127.198.8.2 2>&1 | awk '$1==1048576 {print $4}'
}
for r in $(seq "$R"); do
  for c in "X=1 write" "X=1 send" "SOFTRDMA_SAME_HOST_SEGMENT=0 write"; do
    set -- $c
    if [ $((r % 2)) = 1 ]; then a=$(one 0 "$1" "$2"); b=$(one 1 "$1" "$2")
    else b=$(one 1 "$1" "$2"); a=$(one 0 "$1" "$2"); fi
    echo "$r ${1}_$2 copy $a inplace $b" | tee -a "$LOG"
  done
done
python3 - "$LOG" <<'PY'
import collections, statistics, sys
d = collections.defaultdict(list)
for l in open(sys.argv[1]):
    f = l.split()
    if len(f) == 6 and f[3] and f[5]:
        d[f[1]].append((float(f[3]), float(f[5])))
for k, v in d.items():
    a = [x for x, _ in v]; b = [y for _, y in v]
    print("%s: copy %.2f [%.2f-%.2f], in place %.2f [%.2f-%.2f] GB/s; ratio %.3f; in place ahead %d/%d"
          % (k, statistics.median(a), min(a), max(a), statistics.median(b), min(b), max(b),
             statistics.median([y / x for x, y in v]), sum(y > x for x, y in v), len(v)))
PY
rm -f "$LOG"
