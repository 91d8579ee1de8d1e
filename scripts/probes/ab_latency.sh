#!/bin/bash
# Two builds of `softrdma` against each other, interleaved (the order alternating per round),
# 8-byte SEND ping-pong over a same-host lane and over the wire, two processes each pinned to
# a core of its own, with UCX posix tag_lat (when ucx_perftest is installed) and the loopback's
# UDP floor (`xtask udp-floor`) in every round. Prints per round t_typical/t_avg/99% (µs) of
# each build, then the medians.
#   scripts/probes/ab_latency.sh ROUNDS BASE_BINARY HEAD_BINARY
# (BENCHMARKS.md, 2026-11-27 21:50 UTC: f9f1286 against e9f3ffd, 10 rounds.)
set -u
R=${1:-8}; BASE=$2; HEAD=$3
cd "$(dirname "$0")/../.."
XT=${XTASK:-target/release/xtask}
[ -x "$XT" ] || cargo build --release -q -p xtask
lat() { # binary env -> t_typical/t_avg/p99
  local port=$((27000 + RANDOM % 2000))
  env $2 taskset -c 0 timeout 120 "$1" perf send --lat -s 8 -n 20000 --server 127.77.1.1 -p $port >/dev/null 2>&1 &
  sleep 0.3
  env $2 taskset -c 1 timeout 120 "$1" perf send --lat -s 8 -n 20000 --connect 127.77.1.1 --client-addr 127.77.1.2 -p $port 2>&1 | awk 'NF==7 && $1==8 {print $5"/"$6"/"$7}'
  wait
}
ucx() {
  command -v ucx_perftest >/dev/null || { echo -; return; }
  local port=$((13000 + RANDOM % 2000))
  UCX_TLS=posix taskset -c 0 timeout 60 ucx_perftest -p $port >/dev/null 2>&1 & sleep 0.5
  UCX_TLS=posix taskset -c 1 timeout 60 ucx_perftest 127.0.0.1 -p $port -t tag_lat -s 8 -n 300000 -w 10000 2>&1 | awk '/Final:/{print $3}'
  wait
}
LOG=$(mktemp)
for r in $(seq "$R"); do
  u=$(ucx)
  f=$("$XT" udp-floor -i 20000 2>&1 | sed -n 's/.*1 datagram(s) per one-way: one-way p50 \([0-9.]*\) us.*/\1/p')
  if [ $((r % 2)) = 1 ]; then A=$BASE; B=$HEAD; an=base; bn=head; else A=$HEAD; B=$BASE; an=head; bn=base; fi
  la=$(lat "$A" X=1); lb=$(lat "$B" X=1)
  wa=$(lat "$A" SOFTRDMA_TRANSPORT=wire); wb=$(lat "$B" SOFTRDMA_TRANSPORT=wire)
  echo "r$r ucx_posix $u floor $f | lanes $an $la $bn $lb | wire $an $wa $bn $wb" | tee -a "$LOG"
done
python3 - "$LOG" <<'PY'
import re, statistics as st, sys
d = {}
for l in open(sys.argv[1]):
    m = re.search(r'lanes (\w+) ([\d./]+) (\w+) ([\d./]+) \| wire (\w+) ([\d./]+) (\w+) ([\d./]+)', l)
    if not m:
        continue
    g = m.groups()
    for mode, (n1, v1, n2, v2) in (('lanes', g[:4]), ('wire', g[4:])):
        for n, v in ((n1, v1), (n2, v2)):
            d.setdefault((mode, n), []).append([float(x) for x in v.split('/')])
    for k in ('ucx_posix', 'floor'):
        x = re.search(k + r' ([\d.]+)', l)
        if x:
            d.setdefault(k, []).append(float(x.group(1)))
for k in [('lanes', 'base'), ('lanes', 'head'), ('wire', 'base'), ('wire', 'head')]:
    v = d.get(k, [])
    if v:
        print(k[0], k[1], 't_typical %.3f t_avg %.3f p99 %.2f' % tuple(st.median(x[i] for x in v) for i in range(3)))
for k in ('ucx_posix', 'floor'):
    if d.get(k):
        print(k, st.median(d[k]))
PY
rm -f "$LOG"
