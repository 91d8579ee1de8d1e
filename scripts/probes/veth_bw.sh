#!/bin/bash
# The between-hosts shape on one machine: two network namespaces joined by a veth pair whose
# UDP segmentation offload is off (the kernel cuts UDP GSO messages into datagrams in software,
# numbering their IPv4 identifications 0, 1, 2, ..., as it does for a NIC without USO), GRO on,
# MTU 4200 (a 4096-byte path MTU). `softrdma perf --server` in one, the client in the other;
# builds alternate each round, iperf3's one TCP stream (same veth) in every round. Needs root
# (namespaces) and ethtool.
#   BINARIES="A B" [ENVS="K=V ..."] scripts/probes/veth_bw.sh ROUNDS "OP SIZE ..."
# Prints one line per run: binary op size GB/s (the table's bandwidth column).
set -u
R=$1; CASES=$2; shift 2
ip netns del sr_a 2>/dev/null; ip netns del sr_b 2>/dev/null
ip netns add sr_a && ip netns add sr_b || exit 1
ip link add sr_va netns sr_a type veth peer name sr_vb netns sr_b
ip -n sr_a addr add 10.231.0.1/24 dev sr_va; ip -n sr_b addr add 10.231.0.2/24 dev sr_vb
for n in a b; do
  ip -n sr_$n link set lo up; ip -n sr_$n link set sr_v$n mtu 4200 up
  ip netns exec sr_$n ethtool -K sr_v$n tx-udp-segmentation off gro on >/dev/null 2>&1
done
trap 'ip netns del sr_a; ip netns del sr_b' EXIT
set -- $CASES
ops=("$@")
for r in $(seq "$R"); do
  for bin in $BINARIES; do
    for ((i = 0; i < ${#ops[@]}; i += 2)); do
      op=${ops[i]}; size=${ops[i+1]}
      ip netns exec sr_b env ${ENVS:-X=1} "$bin" perf "$op" --server 10.231.0.2 >/dev/null 2>&1 &
      sp=$!; sleep 0.4
      bw=$(ip netns exec sr_a env ${ENVS:-X=1} "$bin" perf "$op" -s "$size" -D 2 --client-addr 10.231.0.1 \
        --connect 10.231.0.2 2>&1 | awk -v s="$size" '$1==s {print $4}')
      kill $sp 2>/dev/null; wait $sp 2>/dev/null
      echo "$(basename "$bin") $op $size ${bw:-fail}"
    done
  done
  if command -v iperf3 >/dev/null; then
    ip netns exec sr_b iperf3 -s -1 -p 5302 -B 10.231.0.2 >/dev/null 2>&1 &
    sleep 0.3
    echo "iperf3 $(ip netns exec sr_a iperf3 -c 10.231.0.2 -p 5302 -t 2 -l 1M -J 2>/dev/null | python3 -c \
      'import json,sys; d=json.load(sys.stdin); print("%.3f" % (d["end"]["sum_received"]["bits_per_second"] / 8e9))')"
    wait
  fi
  BINARIES=$(echo $BINARIES | awk '{for (i=NF;i>0;i--) printf "%s ", $i}')
done
