#!/usr/bin/env bash
# Shows that the softrdma test suite shares the machine: two `cargo test -p softrdma` runs
# at once, with `softrdma perf` holding 127.0.0.1 and 127.0.0.2 (UDP port 4791 on each) beside
# them for the whole time. Every test takes device addresses, multicast groups and TCP ports
# of its own (softrdma::testing), so both runs must pass. Exit status 0 when both do and perf
# ran throughout.
#
#   scripts/parallel_tests.sh     # THREADS=2 (libtest threads per run), PERF_OP=write,
#                                 # PERF_CLIENT=127.0.0.1, PERF_SERVER=127.0.0.2
#
# It loads the machine (two test runs and a perf run): on a shared host run it rarely.
# Logs stay in the directory it prints.
set -u
cd "$(dirname "$0")/.."
THREADS=${THREADS:-2}
PERF_OP=${PERF_OP:-write}
PERF_CLIENT=${PERF_CLIENT:-127.0.0.1}
PERF_SERVER=${PERF_SERVER:-127.0.0.2}

# Build once, so the two runs only run (they would wait for each other's build otherwise).
cargo build -q -p softrdma --tests --examples || exit 1
cargo build -q -p softrdma-cli || exit 1
out=$(mktemp -d /tmp/softrdma-parallel-XXXXXX)
echo "logs in $out"

# Whether UDP port 4791 on the IPv4 address $1 is bound (/proc/net/udp writes the address
# as a little-endian hex word).
held() {
    local a b c d
    IFS=. read -r a b c d <<<"$1"
    grep -q " $(printf '%02X%02X%02X%02X' "$d" "$c" "$b" "$a"):12B7 " /proc/net/udp
}

# SOFTRDMA_PROGRESS: perf's once-a-second progress line goes to its log, which shows it moved
# data all along.
SOFTRDMA_PROGRESS=1 target/debug/softrdma perf "$PERF_OP" -D 100000 --client-addr "$PERF_CLIENT" \
    --server-addr "$PERF_SERVER" >"$out/perf.log" 2>&1 &
perf=$!
for _ in $(seq 100); do
    { held "$PERF_CLIENT" && held "$PERF_SERVER"; } && break
    kill -0 $perf 2>/dev/null || break
    sleep 0.1
done
if ! kill -0 $perf 2>/dev/null; then
    echo "softrdma perf did not start (does another process hold $PERF_CLIENT or $PERF_SERVER?"
    echo "PERF_CLIENT and PERF_SERVER choose other addresses):"
    cat "$out/perf.log"
    exit 1
fi
if held "$PERF_CLIENT" && held "$PERF_SERVER"; then
    echo "softrdma perf $PERF_OP holds $PERF_CLIENT:4791 and $PERF_SERVER:4791 (pid $perf)"
else
    echo "softrdma perf $PERF_OP (pid $perf) runs but its ports do not show in /proc/net/udp"
fi

start=$(date +%s)
cargo test -p softrdma --no-fail-fast -- --test-threads="$THREADS" >"$out/run1.log" 2>&1 &
r1=$!
cargo test -p softrdma --no-fail-fast -- --test-threads="$THREADS" >"$out/run2.log" 2>&1 &
r2=$!
wait $r1
s1=$?
wait $r2
s2=$?
secs=$(($(date +%s) - start))

alive=yes
kill -0 $perf 2>/dev/null || alive=no
kill $perf 2>/dev/null
wait $perf 2>/dev/null

summary() { # passed/failed counts over every test binary of a run
    awk '/^test result:/ { p += $4; f += $6 } END { printf "%d passed, %d failed", p, f }' "$1"
}
echo "run 1: exit $s1, $(summary "$out/run1.log")"
echo "run 2: exit $s2, $(summary "$out/run2.log")"
echo "perf ran throughout: $alive; both runs took ${secs} s together"
echo "perf's last progress line: $(tr '\r' '\n' <"$out/perf.log" | sed 's/\x1b\[K//g' | grep ' B: ' | tail -1)"
for r in run1 run2; do
    grep -E "^test .* FAILED$|panicked at" "$out/$r.log" | sed "s/^/$r: /" | head -20
done
[ "$s1" = 0 ] && [ "$s2" = 0 ] && [ "$alive" = yes ]
