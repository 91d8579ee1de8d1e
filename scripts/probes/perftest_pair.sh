# Sourced (bash) by the perftest probes: `one LABEL SRV_ENV CLI_ENV SRV_CPUS CLI_CPUS TEST ARGS...`
# runs rdma-core's perftest TEST (from $PT) as a server and a client on the drop-in libraries
# ($LIBS), each on a device of its own: the two addresses of $DEVS ("server,client"), listed
# through SOFTRDMA_DEVICES and named with -d; SRV_ENV / CLI_ENV are environment words
# ("A=1 B=2"). Prints "LABEL: t_typical / t_avg / 99% / 99.9%" (µs) for a latency test,
# "LABEL: MB/s, Mpps" for a bandwidth test, or "LABEL: FAILED"; the server's output goes to
# $OUT/srv.txt.
one() {
  local label=$1 se=$2 ce=$3 sc=$4 cc=$5 port=$((21000 + RANDOM % 4000)) o
  local srv=${DEVS%,*} cli=${DEVS#*,}
  shift 5
  env $se SOFTRDMA_DEVICES=$DEVS LD_LIBRARY_PATH=$LIBS taskset -c "$sc" timeout 60 \
    "$PT/$1" "${@:2}" -d "srdma_$srv" -p $port >"$OUT/srv.txt" 2>&1 &
  sleep 0.4
  o=$(env $ce SOFTRDMA_DEVICES=$DEVS LD_LIBRARY_PATH=$LIBS taskset -c "$cc" timeout 60 \
    "$PT/$1" "${@:2}" -d "srdma_$cli" -p $port "$srv" 2>&1)
  wait
  case $1 in
    *_lat) o=$(echo "$o" | awk 'NF >= 9 && $1 ~ /^[0-9]+$/ {print $5 " / " $6 " / " $8 " / " $9}' | tail -1) ;;
    *) o=$(echo "$o" | awk 'NF >= 5 && $1 ~ /^[0-9]+$/ {print $4 " MB/s, " $5 " Mpps"}' | tail -1) ;;
  esac
  echo "$label: ${o:-FAILED}"
}
