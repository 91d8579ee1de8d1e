#!/usr/bin/env bash
# Links the drop-in C libraries from the softrdma-capi static library:
#   link.sh LIBSOFTRDMA_CAPI.a OUTDIR
# OUTDIR gets libibverbs.so.1 (the whole Rust library, with rdma-core's versioned ibv_*
# symbols, and the librdmacm entry points under softrdma's private names) and
# librdmacm.so.1 (one jump per rdma_* function into libibverbs.so.1, under librdmacm's
# version nodes), plus the unversioned .so links a compiler's -libverbs -lrdmacm look for.
# A single copy of the engine serves both libraries. OUTDIR also gets stand-in libmlx5.so.1
# and libefa.so.1 (stubs/: every mlx5dv_*/efadv_* answers "not supported"), which Debian's
# perftest binaries NEED, because the real providers need libibverbs' private provider ABI.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
lib="$1"; out="$2"
cc="${CC:-cc}"
mkdir -p "$out"
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT

"$cc" -shared -o "$tmp/libibverbs.so.1" -Wl,-soname,libibverbs.so.1 \
  -Wl,--whole-archive "$lib" -Wl,--no-whole-archive \
  -Wl,--version-script="$here/ibverbs.map" -Wl,-Bsymbolic-functions -Wl,-z,now \
  -lpthread -ldl -lm -lgcc_s

# librdmacm.so.1: each exported name of rdmacm.map is a tail jump to softrdma_<name> in
# libibverbs.so.1 (the rsocket calls r* to softrdma_r_<name>); arguments pass untouched.
{
  echo '    .text'
  sed -n 's/^[[:space:]]*\([a-z_][a-z0-9_]*\);$/\1/p' "$here/rdmacm.map" | while read -r f; do
    case "$f" in rdma_*) t="softrdma_$f" ;; *) t="softrdma_r_${f#r}" ;; esac
    printf '    .globl %s\n    .type %s,@function\n%s:\n    jmp %s@PLT\n    .size %s,.-%s\n' \
      "$f" "$f" "$f" "$t" "$f" "$f"
  done
  echo '    .section .note.GNU-stack,"",@progbits'
} > "$tmp/rdmacm_jumps.S"
"$cc" -shared -o "$tmp/librdmacm.so.1" -Wl,-soname,librdmacm.so.1 "$tmp/rdmacm_jumps.S" \
  -Wl,--version-script="$here/rdmacm.map" -Wl,-z,now -L"$tmp" -l:libibverbs.so.1

# The provider stand-ins perftest's binaries are linked against (see stubs/*.c).
for p in mlx5 efa; do
  "$cc" -shared -fPIC -O2 -o "$tmp/lib$p.so.1" -Wl,-soname,"lib$p.so.1" "$here/stubs/$p.c" \
    -Wl,--version-script="$here/stubs/$p.map" -Wl,-z,now
done

mv -f "$tmp/libibverbs.so.1" "$tmp/librdmacm.so.1" "$tmp/libmlx5.so.1" "$tmp/libefa.so.1" "$out/"
ln -sf libibverbs.so.1 "$out/libibverbs.so"
ln -sf librdmacm.so.1 "$out/librdmacm.so"
