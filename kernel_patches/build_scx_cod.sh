#!/bin/bash
# Build scx_cod (kernel_patches/scx_cod) against the sched_ext kernel build_kernel.sh builds or
# finds in the cache: its BTF (vmlinux.h) and its source tree's libbpf.  Prints the kernel's
# cache directory (bzImage there); scx_cod and scx_cod.bpf.o go to kernel_patches/scx_cod/build/.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
kdir=$("$here/build_kernel.sh")
src=$("$here/build_kernel.sh" --source)
nice -n 19 make -s -C "$here/scx_cod" SRC="$src" VMLINUX_H="$kdir/vmlinux.h" OUT="$here/scx_cod/build" >&2
echo "$kdir"
