#!/bin/bash
# softrdma against Linux Soft-RoCE (rdma_rxe + the kernel's IB CM / rdma_cm) in a VM.
#
# Builds softrdma's examples, builds the VM of ../shared/interop if needed (build.sh), starts
# it in serve mode (198.18.0.2 in network namespace rxe-ns; softrdma runs on the host side,
# 198.18.0.1, inside that namespace), runs every case while capturing the bridge, prints
# "PASS name" or "FAIL name" per case and then "N passed, N failed" alone on the last line,
# stops the VM, and exits non-zero if anything failed (or the VM could not start: that is a
# failure, never a skip).
#
# Every case also requires that every RoCEv2 frame captured on the bridge during it has a
# valid ICRC against its IP header as captured, and that solving for the IPv4 identification
# (what softrdma does for the kernel's packets) finds the one in the header.
#
# Needs root, qemu-system-x86_64, tcpdump and tshark. Environment:
#   INTEROP_DIR   the VM kit (default: ../shared/interop from the project root)
#   RXE_VM_DIR    where the kit keeps its files (the kit's default: $TMPDIR/softrdma-rxe-vm)
#   INTEROP_OUT   logs and captures of this run (default: target/interop)
#   SIZES         rping sizes (default: "26 1024 1025 4096 65535"; 65535 is the largest the
#                 kernel's rping takes, although its message says 65536)
#   COUNT         rping iterations (default 20)
#   PP_ITERS      *_pingpong iterations (default 300; 4096-byte messages, 1024 for UD)
#   CASES         an extended regular expression: run only the cases whose name matches it
#                 (default: all)
#   REPEAT        run each case this many times (default 1), to chase an intermittent failure
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
KIT=${INTEROP_DIR:-$ROOT/../shared/interop}
OUT=${INTEROP_OUT:-$ROOT/target/interop}
SIZES=${SIZES:-26 1024 1025 4096 65535}
COUNT=${COUNT:-20}
NS=rxe-ns
HOST=198.18.0.1
VMIP=198.18.0.2
RPING=$ROOT/target/release/examples/rping
PINGPONG=$ROOT/target/release/examples/rc_pingpong
PP_ITERS=${PP_ITERS:-300}
CASES=${CASES:-.}
REPEAT=${REPEAT:-1}
PCAP_ICRC=$ROOT/target/release/examples/pcap_icrc
# The drop-in libibverbs.so.1/librdmacm.so.1 (xtask capi), under Debian's own rping,
# ibv_rc_pingpong and ib_write_bw on the host side of the c_* cases.
CAPI=$ROOT/target/release/capi
PASSED=0
FAILED=0
T0=$(date +%s)

die() { echo "interop: $*" >&2; echo "FAIL setup"; echo "0 passed, 1 failed"; exit 1; }
NSX="ip netns exec $NS"   # a command prefix, not a function: timeout and & need a program
# vmsh CMD: run CMD in the VM (stderr included), print its output.
vmsh() { T=${T:-60} "$KIT/run.sh" sh "{ $1; } 2>&1"; }
log() { echo "  $*"; }

[ "$(id -u)" = 0 ] || die "needs root (network namespace, tap devices)"
for t in qemu-system-x86_64 tcpdump tshark ip; do
  command -v $t >/dev/null || die "$t is not installed"
done
[ -x "$KIT/run.sh" ] || die "no VM kit at $KIT (set INTEROP_DIR)"
mkdir -p "$OUT"
rm -f "$OUT"/*.pcap "$OUT"/*.log

echo "building softrdma (release)"
(cd "$ROOT" && cargo build --release -q -p softrdma --examples &&
  cargo build --release -q -p softrdma-wire --example pcap_icrc &&
  cargo run --release -q -p xtask -- capi >/dev/null) || die "cargo build failed"
for t in rping ibv_rc_pingpong ib_write_bw; do
  [ -x /usr/bin/$t ] || die "/usr/bin/$t is missing (rdmacm-utils, ibverbs-utils, perftest)"
done
# The test binary whose ignored probe sends garbage connection requests to the kernel.
HOSTILE=$(cd "$ROOT" && cargo test --release -p softrdma --test cm_hostile --no-run 2>&1 |
  grep -o 'target/release/deps/cm_hostile-[0-9a-f]*' | tail -1)
[ -n "$HOSTILE" ] && [ -x "$ROOT/$HOSTILE" ] || die "cannot build the cm_hostile test binary"
HOSTILE=$ROOT/$HOSTILE

W=${RXE_VM_DIR:-${TMPDIR:-/tmp}/softrdma-rxe-vm}
if [ ! -s "$W/vmlinuz" ] || [ ! -s "$W/initrd.img" ]; then
  echo "building the VM ($KIT/build.sh)"
  "$KIT/build.sh" >"$OUT/vm-build.log" 2>&1 || die "VM build failed; see $OUT/vm-build.log"
fi
"$KIT/run.sh" stop >/dev/null 2>&1
echo "starting the VM"
"$KIT/run.sh" serve >"$OUT/vm-start.log" 2>&1 || {
  cat "$OUT/vm-start.log" >&2
  die "the VM did not start; see $OUT/vm-start.log and $W/logs/vm0.log"
}
trap '"$KIT/run.sh" stop >/dev/null 2>&1' EXIT
[ "$(vmsh 'cat /tmp/gidx')" = 1 ] || die "the VM's RoCEv2 GID index is not 1"

CAP_PID=
cap_start() {
  $NSX tcpdump --immediate-mode -i br-rxe -s 0 -U -w "$OUT/$1.pcap" udp port 4791 2>"$OUT/$1.tcpdump.log" &
  CAP_PID=$!   # ip netns exec execs tcpdump: this is tcpdump's pid
  local n=0    # until it captures ("listening on ..."), at most 10 s
  until grep -q 'listening on' "$OUT/$1.tcpdump.log" 2>/dev/null || [ $n -ge 100 ]; do
    sleep 0.1; n=$((n + 1))
  done
}
cap_stop() {
  sleep 1   # (tcpdump also reads what is still in its buffer when it stops)
  [ -n "$CAP_PID" ] && kill "$CAP_PID" 2>/dev/null && wait "$CAP_PID" 2>/dev/null
  CAP_PID=
}
vm_kill_rping() { vmsh 'kill -9 $(pidof rping udaddy ibv_rc_pingpong ibv_uc_pingpong ibv_ud_pingpong ibv_srq_pingpong ib_write_bw rdma_server) 2>/dev/null; true' >/dev/null; }

# Servers are started in the background and the client only once they listen (a fixed sleep
# is a race on a slow machine). wait_line FILE PATTERN PID: until FILE has PATTERN or the
# process PID ends, at most 30 s. wait_tcp_listen PORT: until something in rxe-ns listens on
# TCP PORT. vm_wait_tcp_listen PORT: the same inside the VM (/proc/net/tcp{,6}, state 0A).
wait_line() {
  local n=0
  until grep -q "$2" "$1" 2>/dev/null || ! kill -0 "$3" 2>/dev/null || [ $n -ge 300 ]; do
    sleep 0.1; n=$((n + 1))
  done
}
wait_tcp_listen() {
  local n=0
  until [ -n "$($NSX ss -Hltn "sport = :$1" 2>/dev/null)" ] || [ $n -ge 300 ]; do
    sleep 0.1; n=$((n + 1))
  done
}
vm_wait_tcp_listen() {
  local hex
  hex=$(printf '%04X' "$1")
  vmsh "n=0; until grep -q ':$hex [0-9A-F:]* 0A' /proc/net/tcp /proc/net/tcp6 2>/dev/null || [ \$n -ge 300 ]; do sleep 0.1; n=\$((n + 1)); done" >/dev/null
}

# vm_server_log FILE: FILE in the VM once the server writing it has ended ("rc=" in it), or
# after 30 s (a server in the VM ends a moment after our client: a fixed sleep is a race).
vm_server_log() {
  vmsh "n=0; until grep -q '^rc=' $1 2>/dev/null || [ \$n -ge 300 ]; do sleep 0.1; n=\$((n + 1)); done; cat $1"
}

# run_case NAME FUNCTION ARGS...: capture, run, check the capture's ICRCs (and, when a
# function FUNCTION_capture exists, call it with NAME once the capture is complete), report.
run_case() {
  local name=$1 fn=$2 i
  echo "$name" | grep -qE "$CASES" || return 0
  for ((i = 1; i < REPEAT; i++)); do run_case_once "$@"; done
  run_case_once "$@"
}
run_case_once() {
  local name=$1 fn=$2
  shift
  vm_kill_rping
  cap_start "$name"
  local ok=0
  "$@" || ok=1
  cap_stop
  if declare -F "${fn}_capture" >/dev/null; then
    "${fn}_capture" "$name" || ok=1
  fi
  if ! "$PCAP_ICRC" "$OUT/$name.pcap" >"$OUT/$name.icrc.log" 2>&1; then
    log "bad ICRC on the bridge:"; sed 's/^/    /' "$OUT/$name.icrc.log" | tail -5
    ok=1
  fi
  if [ $ok = 0 ]; then
    echo "PASS $name"; PASSED=$((PASSED + 1))
  else
    FAILED=$((FAILED + 1))
    # CI shows only this output: the last lines of each log but the ping lines say why.
    local f
    for f in "$OUT/$name".*.log; do
      [ -s "$f" ] && log "$(basename "$f"): $(grep -v 'ping data' "$f" | tail -4 | tr '\n' '|')"
    done
    if [ "$REPEAT" -gt 1 ]; then   # keep this failure's files from the next repetition
      mkdir -p "$OUT/failed-$FAILED" && cp "$OUT/$name".* "$OUT/failed-$FAILED/"
      echo "FAIL $name (logs and capture: $OUT/failed-$FAILED/$name.*)"
    else
      echo "FAIL $name (logs and capture: $OUT/$name.*)"
    fi
  fi
}

# rping_ok LOG [RC]: whether rdma-core's rping exited well (RC, or the "rc=N" line LOG has
# from the VM). rping 44 (Debian's, here and in the VM) races at exit: when its CM event
# thread has handled the last event but not yet read again as main destroys the event
# channel, rdma_get_cm_event fails, perror prints "rdma_get_cm_event: ..." and the thread
# exit()s with 255 after a test that succeeded (rdma-core f3ae6534, "rping: terminate CM
# event thread before exiting", fixed it upstream). Only that exit, with that message, counts
# as success besides 0, and it is logged; the callers still count the pings.
rping_ok() {
  local f=$1 rc=${2:-}
  [ -n "$rc" ] || rc=$(sed -n 's/^rc=//p' "$f" | tail -1)
  [ "$rc" = 0 ] && return 0
  if [ "$rc" = 255 ] && grep -q '^rdma_get_cm_event: ' "$f"; then
    log "(rping 44's exit race in $(basename "$f"): $(grep -m1 '^rdma_get_cm_event: ' "$f"))"
    return 0
  fi
  return 1
}

# softrdma's rping client against the kernel's rping server.
rping_to_kernel() {
  local size=$1 name=$2
  vmsh "(setsid sh -c 'rping -s -a $VMIP -v -V -C $COUNT -S $size; echo rc=\$?' </dev/null >/tmp/rs.log 2>&1 &); sleep 1" >/dev/null
  timeout 120 $NSX "$RPING" -c -a $VMIP -I $HOST -v -V -C "$COUNT" -S "$size" >"$OUT/$name.client.log" 2>&1
  local rc=$?
  vm_server_log /tmp/rs.log >"$OUT/$name.server.log"
  local got srv
  got=$(grep -c '^ping data: ' "$OUT/$name.client.log")
  srv=$(grep -c '^server ping data: ' "$OUT/$name.server.log")
  log "softrdma client rc=$rc, $got pings verified; kernel server: $srv pings"
  [ $rc = 0 ] && [ "$got" = "$COUNT" ] && [ "$srv" = "$COUNT" ] &&
    ! grep -qiE 'mismatch|error' "$OUT/$name.server.log" "$OUT/$name.client.log"
}

# The kernel's rping client against softrdma's rping server.
rping_from_kernel() {
  local size=$1 name=$2
  timeout 120 $NSX "$RPING" -s -d -a $HOST -v -V -C "$COUNT" -S "$size" >"$OUT/$name.server.log" 2>&1 &
  local spid=$!
  wait_line "$OUT/$name.server.log" 'rdma_listen successful' $spid
  vmsh "rping -c -a $HOST -v -V -C $COUNT -S $size; echo rc=\$?" >"$OUT/$name.client.log"
  wait $spid
  local rc=$?
  local got srv
  got=$(grep -c '^ping data: ' "$OUT/$name.client.log")
  srv=$(grep -c '^server ping data: ' "$OUT/$name.server.log")
  log "kernel client: $(grep '^rc=' "$OUT/$name.client.log"), $got pings verified; softrdma server rc=$rc, $srv pings"
  [ $rc = 0 ] && [ "$got" = "$COUNT" ] && [ "$srv" = "$COUNT" ] &&
    rping_ok "$OUT/$name.client.log" &&
    ! grep -qiE 'mismatch|error' "$OUT/$name.server.log" "$OUT/$name.client.log"
}

# Nobody listens in the VM: the kernel's CM rejects our REQ (reason 8, invalid service ID)
# and our client gets RDMA_CM_EVENT_REJECTED with status 8.
rejected_by_kernel() {
  local name=$1
  timeout 60 $NSX "$RPING" -c -a $VMIP -I $HOST -C 1 -S 100 >"$OUT/$name.client.log" 2>&1
  local rc=$?
  log "softrdma client rc=$rc: $(grep -m1 'cma event' "$OUT/$name.client.log")"
  [ $rc != 0 ] && grep -q 'RDMA_CM_EVENT_REJECTED, error 8' "$OUT/$name.client.log"
}
rejected_by_kernel_capture() {
  local rej
  rej=$(tshark -r "$OUT/$1.pcap" -Y 'infiniband.mad.attributeid == 0x0012' -T fields -e ip.src 2>/dev/null)
  log "REJ on the bridge from: ${rej:-nobody}"
  [ "$rej" = $VMIP ]
}

# softrdma listens on port 7174; the kernel's rping connects to 7175: our CM rejects it
# (reason 8) and the kernel's rping reports RDMA_CM_EVENT_REJECTED, error 8.
rejected_by_softrdma() {
  local name=$1
  timeout 60 $NSX "$RPING" -s -d -a $HOST -p 7174 -C 1 -S 100 >"$OUT/$name.server.log" 2>&1 &
  local spid=$!
  wait_line "$OUT/$name.server.log" 'rdma_listen successful' $spid
  vmsh "rping -c -a $HOST -p 7175 -C 1 -S 100; echo rc=\$?" >"$OUT/$name.client.log"
  kill $spid 2>/dev/null
  wait $spid 2>/dev/null
  log "kernel client: $(grep -m1 'cma event' "$OUT/$name.client.log"), $(grep '^rc=' "$OUT/$name.client.log")"
  grep -q 'RDMA_CM_EVENT_REJECTED, error 8' "$OUT/$name.client.log" &&
    ! grep -q '^rc=0$' "$OUT/$name.client.log"
}
rejected_by_softrdma_capture() {
  local rej
  rej=$(tshark -r "$OUT/$1.pcap" -Y 'infiniband.mad.attributeid == 0x0012' -T fields -e ip.src 2>/dev/null)
  log "REJ on the bridge from: ${rej:-nobody}"
  [ "$rej" = $HOST ]
}

# Path MTU: in the 64 KiB rping captures of both directions, the REQs offer 1024 (wire
# value 3) and every middle packet (SEND, WRITE, READ response) carries exactly 1024 bytes,
# from softrdma and from the kernel.
path_mtu_1024() {
  local name=$1 f ok=0
  for f in "$OUT/rping_to_kernel_65535.pcap" "$OUT/rping_from_kernel_65535.pcap"; do
    [ -s "$f" ] || { log "missing $f"; return 1; }
    local mtus mids
    mtus=$(tshark -r "$f" -Y 'infiniband.cm.req.pppmtu' -T fields -e infiniband.cm.req.pppmtu 2>/dev/null | sort -u | tr '\n' ' ')
    # UDP length of a middle packet: 8 + BTH 12 + 1024 + ICRC 4 = 1048.
    mids=$(tshark -r "$f" -Y 'infiniband.bth.opcode == 1 || infiniband.bth.opcode == 7 || infiniband.bth.opcode == 14' \
      -T fields -e ip.src -e udp.length 2>/dev/null | sort | uniq -c | tr '\t\n' ' ;')
    log "$(basename "$f"): REQ path MTU field: $mtus; middle packets (count, source, UDP length): $mids"
    [ "$mtus" = "0x03 " ] || ok=1
    echo "$mids" | grep -q "$HOST 1048" || ok=1
    echo "$mids" | grep -q "$VMIP 1048" || ok=1
    echo "$mids" | tr ';' '\n' | grep -v '^$' | grep -qv ' 1048$' && ok=1
  done
  return $ok
}

# pp_ok LOG ITERS [SIZE]: a *_pingpong / ibv_*_pingpong log with both summary lines for
# ITERS iterations of SIZE bytes (4096), a remote address line, and rc=0 if the log records
# one.
pp_ok() {
  local bytes=$((${3:-4096} * $2 * 2))
  grep -qE "^$bytes bytes in [0-9.]+ seconds = [0-9.]+ Mbit/sec$" "$1" &&
    grep -qE "^$2 iters in [0-9.]+ seconds = [0-9.]+ usec/iter$" "$1" &&
    grep -q '^  remote address: LID 0x0000, QPN 0x' "$1" &&
    ! grep -q '^rc=[1-9]' "$1"
}
# The kernel's hardware counters of rxe0 as "name value" lines.
vm_hw_counters() { vmsh 'cd /sys/class/infiniband/rxe0/ports/1/hw_counters && for f in *; do echo "$f $(cat $f)"; done'; }
# counter_delta BEFORE AFTER NAME
counter_delta() {
  echo $(( $(awk -v n="$3" '$1 == n {print $2}' "$2") - $(awk -v n="$3" '$1 == n {print $2}' "$1") ))
}

# softrdma's rc_pingpong client against the kernel's ibv_rc_pingpong server (the out-of-band
# exchange over TCP 18515, QPs connected by hand, SENDs of 4096 bytes back and forth). With
# FAULTS, softrdma drops that share of the packets it sends (SOFTRDMA_FAULTS): the run must
# still complete, softrdma's QP counters must show retransmissions, and the kernel's hardware
# counters must show what it saw of them (out-of-sequence requests it NAKed, duplicates).
rc_pingpong_to_kernel() {
  local name=$1 faults=${2:-}
  [ -n "$faults" ] && vm_hw_counters >"$OUT/$name.hw_before"
  vmsh "(setsid sh -c 'ibv_rc_pingpong -g 1 -n $PP_ITERS; echo rc=\$?' </dev/null >/tmp/pp.log 2>&1 &)" >/dev/null
  vm_wait_tcp_listen 18515
  SOFTRDMA_FAULTS=$faults timeout 120 $NSX "$PINGPONG" -d $HOST -g 0 -n "$PP_ITERS" --stats $VMIP \
    >"$OUT/$name.client.log" 2>&1
  local rc=$?
  vm_server_log /tmp/pp.log >"$OUT/$name.server.log"
  log "softrdma client rc=$rc: $(grep 'usec/iter' "$OUT/$name.client.log"); kernel server: $(grep 'usec/iter' "$OUT/$name.server.log"), $(grep '^rc=' "$OUT/$name.server.log")"
  [ $rc = 0 ] && pp_ok "$OUT/$name.client.log" "$PP_ITERS" && pp_ok "$OUT/$name.server.log" "$PP_ITERS" &&
    grep -q '^rc=0$' "$OUT/$name.server.log" || return 1
  [ -z "$faults" ] && return 0
  vm_hw_counters >"$OUT/$name.hw_after"
  local drops retx oos dup
  drops=$(grep -o 'fault_drops [0-9]*' "$OUT/$name.client.log" | cut -d' ' -f2)
  retx=$(grep -o 'retransmitted_packets [0-9]*' "$OUT/$name.client.log" | cut -d' ' -f2)
  oos=$(counter_delta "$OUT/$name.hw_before" "$OUT/$name.hw_after" out_of_seq_request)
  dup=$(counter_delta "$OUT/$name.hw_before" "$OUT/$name.hw_after" duplicate_request)
  log "SOFTRDMA_FAULTS=$faults: softrdma dropped ${drops:-?} of its packets and retransmitted ${retx:-?}; kernel: $oos out-of-sequence requests, $dup duplicate requests"
  log "$(grep '^softrdma QP counters' "$OUT/$name.client.log")"
  [ "${drops:-0}" -gt 0 ] && [ "${retx:-0}" -gt 0 ] && [ "$oos" -gt 0 ]
}

# The kernel's ibv_rc_pingpong client against softrdma's rc_pingpong server.
rc_pingpong_from_kernel() {
  local name=$1
  timeout 120 $NSX "$PINGPONG" -d $HOST -g 0 -n "$PP_ITERS" --stats >"$OUT/$name.server.log" 2>&1 &
  local spid=$!
  wait_tcp_listen 18515
  vmsh "ibv_rc_pingpong -g 1 -n $PP_ITERS $HOST; echo rc=\$?" >"$OUT/$name.client.log"
  wait $spid
  local rc=$?
  log "kernel client: $(grep 'usec/iter' "$OUT/$name.client.log"), $(grep '^rc=' "$OUT/$name.client.log"); softrdma server rc=$rc: $(grep 'usec/iter' "$OUT/$name.server.log")"
  [ $rc = 0 ] && pp_ok "$OUT/$name.client.log" "$PP_ITERS" && pp_ok "$OUT/$name.server.log" "$PP_ITERS" &&
    grep -q '^rc=0$' "$OUT/$name.client.log"
}

# Debian's unmodified programs on the host, on the drop-in C libraries (c_*), against the
# same programs on the kernel's rxe in the VM, both ways. cdrop PROG ARGS: PROG from
# /usr/bin in the namespace with the drop-in libraries and the host's device listed by name
# (srdma_198.18.0.1), line-buffered so that a server's log can be waited on.
cdrop() {
  local prog=$1
  shift
  LD_LIBRARY_PATH=$CAPI SOFTRDMA_DEVICES=$HOST timeout 120 $NSX stdbuf -oL /usr/bin/"$prog" "$@"
}
c_rping_to_kernel() {
  local name=$1
  vmsh "(setsid sh -c 'rping -s -a $VMIP -v -V -C $COUNT -S 1024; echo rc=\$?' </dev/null >/tmp/rs.log 2>&1 &); sleep 1" >/dev/null
  cdrop rping -c -a $VMIP -I $HOST -v -V -C "$COUNT" -S 1024 >"$OUT/$name.client.log" 2>&1
  local rc=$?
  vm_server_log /tmp/rs.log >"$OUT/$name.server.log"
  local got srv
  got=$(grep -c '^ping data: ' "$OUT/$name.client.log")
  srv=$(grep -c '^server ping data: ' "$OUT/$name.server.log")
  log "Debian rping client on softrdma rc=$rc, $got pings; kernel server: $srv pings, $(grep '^rc=' "$OUT/$name.server.log")"
  rping_ok "$OUT/$name.client.log" $rc && [ "$got" = "$COUNT" ] && [ "$srv" = "$COUNT" ] &&
    rping_ok "$OUT/$name.server.log" && ! grep -qiE 'mismatch|error' "$OUT/$name.server.log" "$OUT/$name.client.log"
}
c_rping_from_kernel() {
  local name=$1
  cdrop rping -s -d -a $HOST -v -V -C "$COUNT" -S 1024 >"$OUT/$name.server.log" 2>&1 &
  local spid=$!
  # rping -d says so right after the bind; its rdma_listen follows at once.
  wait_line "$OUT/$name.server.log" 'rdma_bind_addr successful' $spid
  sleep 0.2
  vmsh "rping -c -a $HOST -v -V -C $COUNT -S 1024; echo rc=\$?" >"$OUT/$name.client.log"
  wait $spid
  local rc=$?
  local got srv
  got=$(grep -c '^ping data: ' "$OUT/$name.client.log")
  srv=$(grep -c '^server ping data: ' "$OUT/$name.server.log")
  log "kernel client: $(grep '^rc=' "$OUT/$name.client.log"), $got pings; Debian rping server on softrdma rc=$rc, $srv pings"
  rping_ok "$OUT/$name.server.log" $rc && [ "$got" = "$COUNT" ] && [ "$srv" = "$COUNT" ] &&
    rping_ok "$OUT/$name.client.log" && ! grep -qiE 'mismatch|error' "$OUT/$name.server.log" "$OUT/$name.client.log"
}
c_rc_pingpong_to_kernel() {
  local name=$1
  vmsh "(setsid sh -c 'ibv_rc_pingpong -g 1 -n $PP_ITERS; echo rc=\$?' </dev/null >/tmp/pp.log 2>&1 &)" >/dev/null
  vm_wait_tcp_listen 18515
  cdrop ibv_rc_pingpong -d srdma_$HOST -g 0 -n "$PP_ITERS" $VMIP >"$OUT/$name.client.log" 2>&1
  local rc=$?
  vm_server_log /tmp/pp.log >"$OUT/$name.server.log"
  log "Debian client on softrdma rc=$rc: $(grep 'usec/iter' "$OUT/$name.client.log"); kernel server: $(grep '^rc=' "$OUT/$name.server.log")"
  [ $rc = 0 ] && pp_ok "$OUT/$name.client.log" "$PP_ITERS" && pp_ok "$OUT/$name.server.log" "$PP_ITERS" &&
    grep -q '^rc=0$' "$OUT/$name.server.log"
}
c_rc_pingpong_from_kernel() {
  local name=$1
  cdrop ibv_rc_pingpong -d srdma_$HOST -g 0 -n "$PP_ITERS" >"$OUT/$name.server.log" 2>&1 &
  local spid=$!
  wait_tcp_listen 18515
  vmsh "ibv_rc_pingpong -g 1 -n $PP_ITERS $HOST; echo rc=\$?" >"$OUT/$name.client.log"
  wait $spid
  local rc=$?
  log "kernel client: $(grep '^rc=' "$OUT/$name.client.log"); Debian server on softrdma rc=$rc: $(grep 'usec/iter' "$OUT/$name.server.log")"
  [ $rc = 0 ] && pp_ok "$OUT/$name.client.log" "$PP_ITERS" && pp_ok "$OUT/$name.server.log" "$PP_ITERS" &&
    grep -q '^rc=0$' "$OUT/$name.client.log"
}
# ib_write_bw, 64 KiB RDMA WRITEs (64 packets each at the link's path MTU of 1024): the
# BW line of both sides.
bw_ok() { grep -qE '^ 65536 +[0-9]+ +[0-9.]+ +[0-9.]+ ' "$1"; }
c_ib_write_bw_to_kernel() {
  local name=$1
  vmsh "(setsid sh -c 'ib_write_bw -d rxe0 -x 1 -s 65536 -n 500; echo rc=\$?' </dev/null >/tmp/bw.log 2>&1 &)" >/dev/null
  vm_wait_tcp_listen 18515
  cdrop ib_write_bw -d srdma_$HOST -x 0 -s 65536 -n 500 $VMIP >"$OUT/$name.client.log" 2>&1
  local rc=$?
  vm_server_log /tmp/bw.log >"$OUT/$name.server.log"
  log "Debian ib_write_bw client on softrdma rc=$rc: $(grep -E '^ 65536 ' "$OUT/$name.client.log"); kernel server: $(grep '^rc=' "$OUT/$name.server.log")"
  [ $rc = 0 ] && bw_ok "$OUT/$name.client.log" && grep -q '^rc=0$' "$OUT/$name.server.log"
}
# Our runs of packets went as UDP GSO messages, cut by the kernel into datagrams numbered 0, 1,
# 2, ... and each sealed for its number (the capture's ICRC check covers them; rxe took them).
c_ib_write_bw_to_kernel_capture() {
  local numbered
  numbered=$(tshark -r "$OUT/$1.pcap" -Y "ip.src == $HOST && ip.id > 0 && ip.id < 64" 2>/dev/null | wc -l)
  log "datagrams from softrdma with a GSO number (identification 1-63) on the bridge: $numbered"
  [ "${SOFTRDMA_GSO_NUMBERED:-1}" = 0 ] || [ "$numbered" -gt 0 ]
}
c_ib_write_bw_from_kernel() {
  local name=$1
  cdrop ib_write_bw -d srdma_$HOST -x 0 -s 65536 -n 500 >"$OUT/$name.server.log" 2>&1 &
  local spid=$!
  wait_tcp_listen 18515
  vmsh "ib_write_bw -d rxe0 -x 1 -s 65536 -n 500 $HOST; echo rc=\$?" >"$OUT/$name.client.log"
  wait $spid
  local rc=$?
  log "kernel ib_write_bw client: $(grep -E '^ 65536 ' "$OUT/$name.client.log"), $(grep '^rc=' "$OUT/$name.client.log"); Debian server on softrdma rc=$rc"
  [ $rc = 0 ] && bw_ok "$OUT/$name.client.log" && grep -q '^rc=0$' "$OUT/$name.client.log"
}

# host_server_case NAME READY VMCMD CMD...: CMD (a server) on the host until its log shows
# READY, then VMCMD (the kernel's client) in the VM; both must exit 0, and udaddy's logs must
# say "test complete". vm_server_case NAME VMCMD CMD...: the other way round.
host_server_case() {
  local name=$1 ready=$2 vmcmd=$3
  shift 3
  "$@" >"$OUT/$name.server.log" 2>&1 &
  local spid=$!
  wait_line "$OUT/$name.server.log" "$ready" $spid
  sleep 0.2   # (a program that says so before its rdma_listen: that call follows at once)
  vmsh "$vmcmd; echo rc=\$?" >"$OUT/$name.client.log"
  wait $spid
  local rc=$?
  log "kernel client: $(grep '^rc=' "$OUT/$name.client.log"); host server rc=$rc"
  [ $rc = 0 ] && grep -q '^rc=0$' "$OUT/$name.client.log" && complete_if_udaddy "$name"
}
vm_server_case() {
  local name=$1 vmcmd=$2
  shift 2
  vmsh "(setsid sh -c '$vmcmd; echo rc=\$?' </dev/null >/tmp/srv.log 2>&1 &); sleep 1" >/dev/null
  "$@" >"$OUT/$name.client.log" 2>&1
  local rc=$?
  vm_server_log /tmp/srv.log >"$OUT/$name.server.log"
  log "host client rc=$rc; kernel server: $(grep '^rc=' "$OUT/$name.server.log")"
  [ $rc = 0 ] && grep -q '^rc=0$' "$OUT/$name.server.log" && complete_if_udaddy "$name"
}
complete_if_udaddy() {
  case $1 in *udaddy*) grep -q 'test complete' "$OUT/$1.client.log" && grep -q 'test complete' "$OUT/$1.server.log" ;; esac
}
EX=$ROOT/target/release/examples
# UD through SIDR, 10 messages each way: the client's messages carry its QPN in the
# immediate data, which the kernel's udaddy server replies to.
udaddy_to_kernel() { vm_server_case "$1" "udaddy -C 10" timeout 60 $NSX "$EX/udaddy" -s $VMIP -b $HOST -C 10; }
udaddy_from_kernel() {
  host_server_case "$1" 'listening on' "udaddy -s $HOST -C 10" timeout 60 $NSX "$EX/udaddy" -b $HOST -C 10
}
c_udaddy_to_kernel() { vm_server_case "$1" "udaddy -C 10" cdrop udaddy -s $VMIP -b $HOST -C 10; }
c_udaddy_from_kernel() { host_server_case "$1" 'starting server' "udaddy -s $HOST -C 10" cdrop udaddy -b $HOST -C 10; }
# rdma_server / rdma_client (synchronous ids, rdma_verbs.h helpers, inline SENDs).
rdma_client_to_kernel() { vm_server_case "$1" "rdma_server" timeout 60 $NSX "$EX/rdma_client" -s $VMIP -b $HOST; }
rdma_server_from_kernel() {
  host_server_case "$1" 'listening on' "rdma_client -s $HOST" timeout 60 $NSX "$EX/rdma_server" -a $HOST
}

# The UC, UD and SRQ ping-pongs (PROG uc, ud or srq) both ways, with -c (the server checks
# the client's marks): softrdma's uc_pingpong/ud_pingpong/srq_pingpong against the kernel's
# ibv_uc_pingpong / ibv_ud_pingpong / ibv_srq_pingpong (16 RC QPs on one SRQ per side). UD messages are 1024 bytes, the port MTU of the 1500-byte link (both
# programs refuse more); UD goes through an address handle with the GRH in front of each
# receive. No faults: UC and UD never resend, and a lost message stalls a ping-pong.
# pp_size PROG: the message size of the PROG ping-pong cases (UD: the link's port MTU; SRQ:
# 16 QPs share the 300 messages).
pp_size() { case $1 in ud | srq) echo 1024 ;; *) echo 4096 ;; esac; }
xx_pingpong_to_kernel() {
  local name=$1 prog=$2 size
  size=$(pp_size "$prog")
  vmsh "(setsid sh -c 'ibv_${prog}_pingpong -g 1 -c -s $size -n $PP_ITERS; echo rc=\$?' </dev/null >/tmp/pp.log 2>&1 &)" >/dev/null
  vm_wait_tcp_listen 18515
  timeout 120 $NSX "$ROOT/target/release/examples/${prog}_pingpong" -d $HOST -g 0 -c -s $size -n "$PP_ITERS" $VMIP \
    >"$OUT/$name.client.log" 2>&1
  local rc=$?
  vm_server_log /tmp/pp.log >"$OUT/$name.server.log"
  log "softrdma client rc=$rc: $(grep 'usec/iter' "$OUT/$name.client.log"); kernel server: $(grep 'usec/iter' "$OUT/$name.server.log"), $(grep '^rc=' "$OUT/$name.server.log")"
  [ $rc = 0 ] && pp_ok "$OUT/$name.client.log" "$PP_ITERS" $size && pp_ok "$OUT/$name.server.log" "$PP_ITERS" $size &&
    grep -q '^rc=0$' "$OUT/$name.server.log" && ! grep -q 'invalid data' "$OUT/$name.server.log"
}
xx_pingpong_from_kernel() {
  local name=$1 prog=$2 size
  size=$(pp_size "$prog")
  timeout 120 $NSX "$ROOT/target/release/examples/${prog}_pingpong" -d $HOST -g 0 -c -s $size -n "$PP_ITERS" \
    >"$OUT/$name.server.log" 2>&1 &
  local spid=$!
  wait_tcp_listen 18515
  vmsh "ibv_${prog}_pingpong -g 1 -c -s $size -n $PP_ITERS $HOST; echo rc=\$?" >"$OUT/$name.client.log"
  wait $spid
  local rc=$?
  log "kernel client: $(grep 'usec/iter' "$OUT/$name.client.log"), $(grep '^rc=' "$OUT/$name.client.log"); softrdma server rc=$rc: $(grep 'usec/iter' "$OUT/$name.server.log")"
  [ $rc = 0 ] && pp_ok "$OUT/$name.client.log" "$PP_ITERS" $size && pp_ok "$OUT/$name.server.log" "$PP_ITERS" $size &&
    grep -q '^rc=0$' "$OUT/$name.client.log" && ! grep -q 'invalid data' "$OUT/$name.server.log"
}

# Garbage and misdirected connection requests (REQ, SIDR_REQ) from a plain UDP socket in the
# namespace to the kernel's rping -s and udaddy: the kernel answers REJ 28 / SIDR_REP status 2
# for a listened service and REJ 8 / status 1 for another, as softrdma does (cm_hostile.rs
# checks softrdma's answers; its ignored test checks the kernel's, here).
garbage_requests_to_kernel() {
  local name=$1
  vmsh "(setsid sh -c 'rping -s -a $VMIP -C 1; echo rc=\$?' </dev/null >/tmp/rs.log 2>&1 &);
    (setsid sh -c 'udaddy -b $VMIP; echo rc=\$?' </dev/null >/tmp/ud.log 2>&1 &);
    for i in \$(seq 50); do pidof rping >/dev/null && pidof udaddy >/dev/null && break; sleep 0.2; done; sleep 3" >/dev/null
  PROBE_SELF=$HOST PROBE_PEER=$VMIP PROBE_PORT=7174 timeout 120 $NSX "$HOSTILE" --ignored \
    a_linux_peer_answers_garbage_requests_as_softrdma_does >"$OUT/$name.log" 2>&1
  local rc=$?
  vmsh 'kill $(pidof udaddy) 2>/dev/null; true' >/dev/null
  log "the probe: rc=$rc, $(grep -E '^test result' "$OUT/$name.log")"
  [ $rc = 0 ] && grep -q '^test result: ok. 1 passed' "$OUT/$name.log"
}

# RNR across the stacks: softrdma's rc_pingpong server posts its receives only 500 ms after
# the connection is up (--late-recv), so the kernel's first SENDs meet an empty receive queue:
# softrdma answers RNR NAKs, the kernel waits its RNR timer and retries (ibv_rc_pingpong's
# rnr_retry 7 is "forever"), and the run completes once the receives are there. Both sides'
# counters must show it: softrdma's rnr_naks_sent and the kernel's rcvd_rnr_err.
rnr_from_kernel() {
  local name=$1
  vm_hw_counters >"$OUT/$name.hw_before"
  timeout 120 $NSX "$PINGPONG" -d $HOST -g 0 -n "$PP_ITERS" --stats --late-recv 500 >"$OUT/$name.server.log" 2>&1 &
  local spid=$!
  wait_tcp_listen 18515
  vmsh "ibv_rc_pingpong -g 1 -n $PP_ITERS $HOST; echo rc=\$?" >"$OUT/$name.client.log"
  wait $spid
  local rc=$?
  vm_hw_counters >"$OUT/$name.hw_after"
  local sent rcvd
  sent=$(grep -o 'rnr_naks_sent [0-9]*' "$OUT/$name.server.log" | awk '{print $2}')
  rcvd=$(counter_delta "$OUT/$name.hw_before" "$OUT/$name.hw_after" rcvd_rnr_err)
  log "kernel client: $(grep '^rc=' "$OUT/$name.client.log"); softrdma server rc=$rc; RNR NAKs sent by softrdma: ${sent:-?}, received by the kernel (rcvd_rnr_err): $rcvd"
  [ $rc = 0 ] && pp_ok "$OUT/$name.client.log" "$PP_ITERS" && pp_ok "$OUT/$name.server.log" "$PP_ITERS" &&
    grep -q '^rc=0$' "$OUT/$name.client.log" && [ "${sent:-0}" -gt 0 ] && [ "$rcvd" -gt 0 ]
}

# softrdma's rping client (-V) against the kernel's rping server while softrdma drops 3% of
# the data packets it sends (SOFTRDMA_FAULTS, sparing the CM's MADs): every ping is still
# verified on both sides; the capture shows softrdma's packets sent again (its SENDs
# retransmitted, its READ responses sent again for the kernel's READs re-issued) and the
# kernel's counters its retries. 4096 bytes: the kernel recovers a lost READ response only
# by its retransmission timer (~2.3 s here), not on the PSN gap, so large READs under loss
# take seconds per ping.
rping_lossy_to_kernel() {
  local name=$1
  vm_hw_counters >"$OUT/$name.hw_before"
  vmsh "(setsid sh -c 'rping -s -a $VMIP -v -V -C $COUNT -S 4096; echo rc=\$?' </dev/null >/tmp/rs.log 2>&1 &); sleep 1" >/dev/null
  SOFTRDMA_FAULTS=drop=0.03,seed=9,spare_cm=1 timeout 120 $NSX "$RPING" -c -a $VMIP -I $HOST -v -V -C "$COUNT" -S 4096 \
    >"$OUT/$name.client.log" 2>&1
  local rc=$?
  vm_server_log /tmp/rs.log >"$OUT/$name.server.log"
  vm_hw_counters >"$OUT/$name.hw_after"
  local got srv retry
  got=$(grep -c '^ping data: ' "$OUT/$name.client.log")
  srv=$(grep -c '^server ping data: ' "$OUT/$name.server.log")
  retry=$(counter_delta "$OUT/$name.hw_before" "$OUT/$name.hw_after" completer_retry_err)
  log "softrdma client rc=$rc, $got pings verified; kernel server: $srv pings, $(grep '^rc=' "$OUT/$name.server.log"), $retry retries (completer_retry_err)"
  [ $rc = 0 ] && [ "$got" = "$COUNT" ] && [ "$srv" = "$COUNT" ] && rping_ok "$OUT/$name.server.log" &&
    ! grep -qiE 'mismatch|error' "$OUT/$name.server.log" "$OUT/$name.client.log"
}
rping_lossy_to_kernel_capture() {
  local again
  # Non-ACK packets from softrdma (not to QP 1) whose PSN was already on the wire.
  again=$(tshark -r "$OUT/$1.pcap" -Y "ip.src == $HOST && infiniband.bth.opcode != 17 && infiniband.bth.destqp != 1" \
    -T fields -e infiniband.bth.destqp -e infiniband.bth.psn 2>/dev/null | sort | uniq -d | wc -l)
  log "softrdma packets sent again on the bridge (distinct PSNs): $again"
  [ "$again" -gt 0 ]
}

run_case rc_pingpong_to_kernel rc_pingpong_to_kernel rc_pingpong_to_kernel
run_case rc_pingpong_from_kernel rc_pingpong_from_kernel rc_pingpong_from_kernel
# Faults only in the first 1000 of about 1700 packets: ibv_rc_pingpong has no closing
# handshake, so if the ACK of the peer's last SEND is lost after our QP is destroyed, nothing
# can resend it: the kernel retransmitted that SEND every 67 ms for as long as we watched (2 s,
# 30 times with retry_cnt 7), and its ibv_rc_pingpong never ended.
run_case rc_pingpong_lossy_to_kernel rc_pingpong_to_kernel rc_pingpong_lossy_to_kernel "drop=0.05,seed=5,first=1000"
run_case rping_lossy_to_kernel rping_lossy_to_kernel rping_lossy_to_kernel
for p in uc ud srq; do
  run_case ${p}_pingpong_to_kernel xx_pingpong_to_kernel ${p}_pingpong_to_kernel $p
  run_case ${p}_pingpong_from_kernel xx_pingpong_from_kernel ${p}_pingpong_from_kernel $p
done
run_case rnr_from_kernel rnr_from_kernel rnr_from_kernel
for s in $SIZES; do run_case "rping_to_kernel_$s" rping_to_kernel "$s" "rping_to_kernel_$s"; done
for s in $SIZES; do run_case "rping_from_kernel_$s" rping_from_kernel "$s" "rping_from_kernel_$s"; done
for c in udaddy_to_kernel udaddy_from_kernel rdma_client_to_kernel rdma_server_from_kernel \
  c_rping_to_kernel c_rping_from_kernel c_rc_pingpong_to_kernel c_rc_pingpong_from_kernel \
  c_ib_write_bw_to_kernel c_ib_write_bw_from_kernel c_udaddy_to_kernel c_udaddy_from_kernel; do
  run_case $c $c $c
done
run_case rejected_by_kernel rejected_by_kernel rejected_by_kernel
run_case rejected_by_softrdma rejected_by_softrdma rejected_by_softrdma
run_case garbage_requests_to_kernel garbage_requests_to_kernel garbage_requests_to_kernel
if ! echo path_mtu_1024 | grep -qE "$CASES"; then
  :
elif path_mtu_1024 path_mtu_1024; then
  echo "PASS path_mtu_1024"; PASSED=$((PASSED + 1))
else
  echo "FAIL path_mtu_1024"; FAILED=$((FAILED + 1))
fi

"$KIT/run.sh" stop >/dev/null 2>&1
trap - EXIT
echo "  (interop took $(( $(date +%s) - T0 )) s; logs and captures in $OUT)"
echo "$PASSED passed, $FAILED failed"
[ $FAILED = 0 ]
