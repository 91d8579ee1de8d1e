#!/usr/bin/env bash
# Loss recovery on loopback: `softrdma perf` (two devices in one process) under
# SOFTRDMA_FAULTS at 0, 1, 5 and 20% loss, each with duplication, reordering and corruption at
# a quarter of the loss rate (20%: drop=0.2,dup=0.05,reorder=0.05,corrupt=0.05, the mix of
# issue 13), and the chaos soak. Not a test: it measures and verifies, and prints Markdown rows
# for BENCHMARKS.md.
#
#   scripts/loss_bench.sh bench [BASE_BINARY]  # perf write/send 64 KiB × 2000 per loss rate,
#                                             # REPS (3) times, interleaved with BASE_BINARY
#                                             # (an older softrdma) when given; medians
#   scripts/loss_bench.sh soak                 # 10^6 verified 1 KiB RC SENDs per loss rate
#                                             # (1, 5, 20%): exactly once, in order, byte-exact
#
# Environment: REPS (3), N (bench: 2000 messages), SOAK_N (1000000), SIZE (bench 65536, soak
# 1024), LIMIT (seconds one run may take, 300), ADDR_C / ADDR_S (the two devices' addresses,
# 127.77.0.1 / 127.77.0.2), CORRUPT (1; 0: no corruption in the mix).
set -u
cd "$(dirname "$0")/.."
cargo build --release -p softrdma-cli >&2 || exit 1
SR=$(pwd)/target/release/softrdma
MODE=${1:-bench}
BASE=${2:-}
REPS=${REPS:-3}
LIMIT=${LIMIT:-300}
C=${ADDR_C:-127.77.0.1}
S=${ADDR_S:-127.77.0.2}

CORRUPT=${CORRUPT:-1}
faults() { # loss -> SOFTRDMA_FAULTS value ("" for none); CORRUPT=0 leaves corruption out
    awk -v p="$1" -v c="$CORRUPT" 'BEGIN { if (p == 0) print ""; else if (c == 0) printf "drop=%g,dup=%g,reorder=%g\n", p, p/4, p/4; else printf "drop=%g,dup=%g,reorder=%g,corrupt=%g\n", p, p/4, p/4, p/4 }'
}

# run BIN FAULTS ARGS...: prints "GB/s Mmsg/s secs unknown_qp" or "fail secs reason"
run() {
    local bin=$1 f=$2
    shift 2
    local t0 out rc
    t0=$(date +%s.%N)
    out=$(SOFTRDMA_FAULTS=$f timeout "$LIMIT" "$bin" perf "$@" --client-addr "$C" --server-addr "$S" 2>&1)
    rc=$?
    local secs
    secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
    if [ $rc -ne 0 ]; then
        local why
        why=$(echo "$out" | grep -m1 -E 'verify|error|softrdma:.*(fail|err)' | tr '|' '/' | cut -c1-120)
        [ $rc -eq 124 ] && why="not finished in ${LIMIT} s"
        echo "fail $secs ${why:-exit $rc}"
        return
    fi
    local line unk
    line=$(echo "$out" | awk '$1 ~ /^[0-9]+$/ && NF == 5 { l = $0 } END { print l }')
    unk=$(echo "$out" | grep -o 'unknown QP [0-9]*' | awk '{ s += $3 } END { print s + 0 }')
    echo "$(echo "$line" | awk '{ print $4, $5 }') $secs $unk"
}

median() { sort -g | awk '{ a[NR] = $1 } END { if (NR == 0) print "-"; else print a[int((NR + 1) / 2)] }'; }

if [ "$MODE" = bench ]; then
    N=${N:-2000}
    SIZE=${SIZE:-65536}
    echo "| op | loss | binary | GB/s (median of $REPS) | runs: GB/s (wall s, unknown-QP packets) |"
    echo "|---|---|---|---|---|"
    for op in write send; do
        for loss in 0 0.01 0.05 0.2; do
            f=$(faults "$loss")
            declare -A got=()
            declare -A all=()
            for r in $(seq "$REPS"); do
                for bin in ${BASE:+"$BASE"} "$SR"; do
                    res=$(run "$bin" "$f" "$op" -s "$SIZE" -n "$N")
                    set -- $res
                    if [ "$1" = fail ]; then
                        all[$bin]+="fail ($2 s: ${*:3}); "
                    else
                        got[$bin]+="$1 "
                        all[$bin]+="$1 ($3 s, $4); "
                    fi
                done
            done
            for bin in ${BASE:+"$BASE"} "$SR"; do
                name=after
                [ "$bin" = "$BASE" ] && name=before
                m=$(echo "${got[$bin]:-}" | tr ' ' '\n' | grep . | median)
                echo "| $op | $loss | $name | $m | ${all[$bin]} |"
            done
            unset got all
        done
    done
elif [ "$MODE" = soak ]; then
    SOAK_N=${SOAK_N:-1000000}
    SIZE=${SIZE:-1024}
    echo "| loss (SOFTRDMA_FAULTS) | messages | verified | GB/s | M msg/s | wall s | unknown-QP packets |"
    echo "|---|---|---|---|---|---|---|"
    for loss in 0 0.01 0.05 0.2; do
        f=$(faults "$loss")
        res=$(run "$SR" "$f" send --verify -s "$SIZE" -n "$SOAK_N")
        set -- $res
        if [ "$1" = fail ]; then
            echo "| $loss (${f:-none}) | $SOAK_N | FAILED: ${*:3} | - | - | $2 | - |"
        else
            echo "| $loss (${f:-none}) | $SOAK_N | exactly once, in order, byte-exact | $1 | $2 | $3 | $4 |"
        fi
    done
else
    echo "usage: $0 bench [BASE_BINARY] | soak" >&2
    exit 2
fi
