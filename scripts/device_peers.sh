# Sourced (bash) by the scripts that run on a machine with no toolchain, no package registry
# and no network (the 16-core machine lent by the `device` tool): unpacks the Debian .deb
# files of $PEERS (the peers and their libraries; dpkg-deb -x, no install, no root) into $PX
# (default /tmp/device-bench-peers), puts their programs and libraries first on PATH and
# LD_LIBRARY_PATH, points UCX and libfabric at their modules, and adds stand-ins for `ss`
# and `bc`, which the anchors' helpers call and a bare machine may lack. Sets LIBD (the
# unpacked libraries). Needs PEERS (an absolute path).
PX=${PX:-/tmp/device-bench-peers}
mkdir -p "$PX/shim"
for d in "$PEERS"/*.deb; do dpkg-deb -x "$d" "$PX" || echo "unpack failed: $d"; done
LIBD=$PX/usr/lib/x86_64-linux-gnu
export PATH=$PX/shim:$PX/usr/bin:$PATH
export LD_LIBRARY_PATH=$LIBD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export UCX_MODULE_DIR=$LIBD/ucx FI_PROVIDER_PATH=$LIBD/libfabric
if ! command -v ss >/dev/null; then
  cat >"$PX/shim/ss" <<'EOF'
#!/bin/sh
# ss -ltnH "sport = :P" / ss -lunH "sport = :P": print a line when P is bound (listening for TCP).
port=$(echo "$*" | sed -n 's/.*sport = :\([0-9]*\).*/\1/p'); hex=$(printf '%04X' "$port")
case "$1" in *u*) f="/proc/net/udp /proc/net/udp6"; st=07 ;; *) f="/proc/net/tcp /proc/net/tcp6"; st=0A ;; esac
cat $f 2>/dev/null | awk -v h=":$hex" -v st=$st '{ split($2, a, ":"); if (":" a[2] == h && $4 == st) { print; exit } }'
EOF
  chmod +x "$PX/shim/ss"
fi
if ! command -v bc >/dev/null; then
  printf '#!/bin/sh\nread e; awk "BEGIN { printf \\"%%.9f\\\\n\\", $e }"\n' >"$PX/shim/bc"
  chmod +x "$PX/shim/bc"
fi
