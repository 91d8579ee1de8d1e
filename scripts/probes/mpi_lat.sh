#!/bin/bash
# Open MPI ping-pong (scripts/probes/mpi_pingpong.c, 2 ranks on this host) over softrdma
# beside the transports Open MPI would use instead, interleaved, ROUNDS rounds:
#   softrdma lanes / wire: pml ucx, UCX_TLS=self,rc_verbs,ud_verbs:aux, both ranks on one
#     device, in the user+mount namespace UCX needs (as crates/capi/tests/frameworks.rs);
#   UCX posix, UCX tcp: pml ucx with UCX_TLS=self,posix / self,tcp;
#   ob1 vader, ob1 tcp: Open MPI's own shared-memory and TCP transports.
# Prints each run's lines prefixed by round and case; CASES (default: all six, named as
# printed) picks some.
#   scripts/probes/mpi_lat.sh [ROUNDS] [LIBDIR]   (LIBDIR: the drop-in libraries,
#   default target/release/capi; root or a user namespace; apt-get install openmpi-bin
#   libopenmpi-dev)
set -u
R=${1:-3}; LIB=$(realpath "${2:-target/release/capi}")
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
mpicc -O2 -o "$W/pp" "$(dirname "$0")/mpi_pingpong.c" || exit 1
cat > "$W/ns.sh" <<'NS'
set -e
old="$1"; shift
mount --rbind /dev "$old"; mount -t tmpfs softrdma-dev /dev
for e in "$old"/* "$old"/.[!.]*; do if [ -e "$e" ] || [ -L "$e" ]; then ln -s "$e" "/dev/${e##*/}"; fi; done
mkdir /dev/infiniband; ln -s "$old/null" /dev/infiniband/uverbs_srdma_ucx
exec "$@"
NS
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 UCX_WARN_UNUSED_ENV_VARS=n
mpi() { mpirun --oversubscribe -np 2 --bind-to core "$@" "$W/pp"; }
soft() { # wire|lanes
  mkdir -p "$W/old"
  env LD_LIBRARY_PATH="$LIB" SOFTRDMA_DEVICES=srdma_ucx=127.61.0.$((RANDOM % 200 + 2)) \
    UCX_TLS=self,rc_verbs,ud_verbs:aux UCX_NET_DEVICES=srdma_ucx:1 UCX_UD_VERBS_ETH_DGID_CHECK=n \
    SOFTRDMA_TRANSPORT=$1 unshare -rm sh "$W/ns.sh" "$W/old" mpirun --oversubscribe -np 2 \
    --bind-to core --mca pml ucx --mca btl self -x LD_LIBRARY_PATH -x SOFTRDMA_DEVICES -x UCX_TLS \
    -x UCX_NET_DEVICES -x UCX_UD_VERBS_ETH_DGID_CHECK -x SOFTRDMA_TRANSPORT "$W/pp"
}
CASES=${CASES:-softrdma-lanes softrdma-wire ucx-posix ucx-tcp ob1-vader ob1-tcp}
ucx() { UCX_TLS=$1 mpi --mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any --mca btl self -x UCX_TLS; }
for r in $(seq "$R"); do
  for c in $CASES; do
    case $c in
      softrdma-lanes) soft lanes ;;
      softrdma-wire) soft wire ;;
      ucx-posix) ucx self,posix ;;
      ucx-tcp) ucx self,tcp ;;
      ob1-vader) mpi --mca pml ob1 --mca btl self,vader ;;
      ob1-tcp) mpi --mca pml ob1 --mca btl self,tcp ;;
    esac 2>&1 | grep " B: " | sed "s/^/r$r $c /"
  done
done
