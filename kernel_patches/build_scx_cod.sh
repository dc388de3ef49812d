#!/bin/bash
# Build scx_cod (kernel_patches/scx_cod) against the sched_ext kernel build_kernel.sh builds or
# finds in the cache: its BTF (vmlinux.h) and its source tree's libbpf.  Prints the kernel's
# cache directory (bzImage there); scx_cod and scx_cod.bpf.o go to kernel_patches/scx_cod/build/.
# Both are cached beside the kernel ($COD_VM_CACHE, else ~/.cache/cod-vm), each made in a
# temporary directory and renamed:
#   libbpf-scx-VERSION/     the kernel tree's libbpf (libbpf.a and its headers): the source's alone
#   scx_cod-KEY/            scx_cod and scx_cod.bpf.o, KEY hashing every input: the scheduler's
#                           sources and Makefile, the kernel's vmlinux.h, libbpf's version, the compilers
# Every failure ends with one line "scx-kernel: ..." (or build_kernel.sh's) saying what failed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${COD_VM_CACHE:-$HOME/.cache/cod-vm}
log() { echo "scx-kernel: $*" >&2; }
die() { log "$*"; exit 1; }

command -v clang-19 >/dev/null 2>&1 || die "missing: clang-19 (clang-19); 'make scx-deps' installs it"
kdir=$("$here/build_kernel.sh")
src=$("$here/build_kernel.sh" --source)
mkdir -p "$cache"
exec 9>"$cache/scx_cod.lock"
flock 9

libbpf=$cache/libbpf-scx-${src##*/linux-source-}
if [ ! -f "$libbpf/libbpf/libbpf.a" ]; then
  start=$(date +%s)
  tmp=$(mktemp -d "$cache/libbpf-scx.tmp-XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  nice -n 19 make -s -C "$here/scx_cod" SRC="$src" VMLINUX_H=/nonexistent LIBBPF_OUT="$tmp" \
    "$tmp/libbpf/libbpf.a" >&2 || die "building libbpf from $src/tools/lib/bpf failed (its message is above)"
  mv "$tmp" "$libbpf"
  trap - EXIT
  log "libbpf: $(( $(date +%s) - start )) s"
fi

key=$( { cat "$here"/scx_cod/scx_cod.bpf.c "$here"/scx_cod/scx_cod.c "$here"/scx_cod/scx_cod.h \
           "$here"/scx_cod/Makefile "$kdir/vmlinux.h"; echo "$libbpf"; clang-19 --version | head -1;
         cc --version | head -1; } | sha256sum | cut -c1-12)
bin=$cache/scx_cod-$key
if [ ! -f "$bin/scx_cod" ]; then
  start=$(date +%s)
  tmp=$(mktemp -d "$cache/scx_cod.tmp-XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  nice -n 19 make -s -C "$here/scx_cod" SRC="$src" VMLINUX_H="$kdir/vmlinux.h" LIBBPF_OUT="$libbpf" \
    OUT="$tmp" "$tmp/scx_cod" "$tmp/scx_cod.bpf.o" >&2 || die "building scx_cod failed (the compiler's message is above)"
  rm -rf "$tmp/vmlinux"
  mv "$tmp" "$bin"
  trap - EXIT
  log "scx_cod: $(( $(date +%s) - start )) s"
fi
mkdir -p "$here/scx_cod/build"
cp "$bin/scx_cod" "$bin/scx_cod.bpf.o" "$here/scx_cod/build/"
echo "$kdir"
