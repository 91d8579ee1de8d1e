#!/bin/bash
# Instructions a round trip of an 8-byte SEND ping-pong, on its client: `valgrind
# --tool=callgrind` runs the client of `softrdma perf send --lat -s 8` twice (N and 2N round
# trips; the server native, pinned to CPU 0, the client to CPU 1) and prints the difference of
# the whole program's instructions divided by N (set-up cancels out; the harness's own clock
# reads and final sort are in it, and so are the polls that find nothing, which vary from run
# to run by some 10%), and the same for the two steps that do not spin: `Qp::post_send`
# (the request out) and the QP's receive of what came (`QpPort::receive`, inclusive), and over
# a lane the CQ poll's take of the QP pair ring (`Provider::take_pair`, which a poll calls only
# when a record is there; it includes that receive).
#   scripts/probes/callgrind_rt.sh BINARY [N] [lane|wire]
# (BENCHMARKS.md, "Whole-program LTO": N = 20,000 over a lane, 10,000 over the wire.)
set -eu
BIN=$1; N=${2:-20000}; HOW=${3:-lane}
[ "$HOW" = wire ] && export SOFTRDMA_TRANSPORT=wire
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 1; }
OUT=$(mktemp -d)
total() { # iterations -> instructions of the client
  local port=$((27000 + RANDOM % 2000))
  taskset -c 0 "$BIN" perf send --lat -s 8 -n "$1" --server 127.77.11.1 -p $port >/dev/null 2>&1 &
  sleep 0.3
  taskset -c 1 valgrind --tool=callgrind --callgrind-out-file="$OUT/cg.$1" "$BIN" perf send --lat -s 8 -n "$1" \
    --connect 127.77.11.1 --client-addr 127.77.11.2 -p $port >"$OUT/client.$1" 2>&1
  wait
  # (Run elsewhere than the source tree: from inside it, callgrind_annotate folds the inlined
  # parts of a function differently.)
  (cd "$OUT" && callgrind_annotate --inclusive=yes "cg.$1") 2>/dev/null | awk '
    function n(x) { gsub(",", "", x); return x + 0 }
    /PROGRAM TOTALS/ { t = n($1) }
    /qp\/send.rs:softrdma::verbs::qp::send::<impl softrdma::verbs::qp::Qp>::post_send \[/ && !p { p = n($1) }
    /datapath.rs:softrdma::verbs::datapath::<impl softrdma::provider::port::QpPort for softrdma::verbs::qp::QpInner>::receive \[/ && !r { r = n($1) }
    /devices.rs:softrdma::provider::devices::<impl softrdma::provider::port::Provider for softrdma::provider::engine::Engine>::take_pair \[/ && !k { k = n($1) }
    END { print t, p, r, k }'
}
read -r ta pa ra ka <<<"$(total "$N")"
read -r tb pb rb kb <<<"$(total $((2 * N)))"
echo "(N=$N: $ta $pa $ra ${ka:-0}; 2N: $tb $pb $rb ${kb:-0})"
echo "$HOW, client, instructions a round trip: all $(( (tb - ta) / N )), post_send $(( (pb - pa) / N )), receive $(( (rb - ra) / N )), a poll's take of a QP pair ring's records (with that receive) $(( (${kb:-0} - ${ka:-0}) / N )) ($BIN)"
grep -ho "records [0-9]*, [0-9]* by QP rings" "$OUT"/client.* | sed "s/^/client: /"
rm -rf "$OUT"
