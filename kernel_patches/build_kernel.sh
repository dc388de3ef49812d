#!/bin/bash
# Build COD's guest kernel: Debian's linux-source-6.12 with sched_ext and BTF (kernel_patches/README.md).
#
#   kernel_patches/build_kernel.sh          build (or find) it; prints the cache directory holding it
#   kernel_patches/build_kernel.sh --source prints the unpacked source tree (for scx_cod's build)
#
# Config: tinyconfig + the tree's kernel/configs/kvm_guest.config + kernel_patches/scx.config,
# merged by scripts/kconfig/merge_config.sh. Every option scx.config sets must survive olddefconfig,
# or the build stops and names it. The result is cached by (source version, hash of the final
# .config) under $COD_VM_CACHE (else ~/.cache/cod-vm), beside the Debian kernel of the VM harness:
#   linux-source-VERSION/             the unpacked source (apt-get download + dpkg -x; nothing installed)
#   kbuild-scx-VERSION/               the object tree (kept: a changed config rebuilds incrementally)
#   kernel-scx-VERSION-HASH/          bzImage, config, vmlinux.h (the kernel's BTF as C, for scx_cod)
#   kernel-scx-VERSION-in-KEY         a link to the above, KEY hashing what made its config (the
#                                     fragment, this script, gcc, pahole): a later run needs no kconfig pass
# Each is made in a temporary directory and renamed; a lock serialises builds.
# Every failure ends with one line "scx-kernel: ..." saying what is missing or what failed.
# Needs: flex bison bc libelf-dev libssl-dev dwarves (pahole) gcc make bpftool xz (Makefile: SCX_APT_PACKAGES).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
fragment=$here/scx.config
cache=${COD_VM_CACHE:-$HOME/.cache/cod-vm}
pkg=linux-source-6.12
jobs=${SCX_JOBS:-$(nproc)}

log() { echo "scx-kernel: $*" >&2; }
die() { log "$*"; exit 1; }
phase_start=$(date +%s)
phase() { local now; now=$(date +%s); log "$1: $(( now - phase_start )) s"; phase_start=$now; }

# ---- what the build needs (one line naming every missing piece and its Debian package) --------
missing=""
need_cmd() { command -v "$1" >/dev/null 2>&1 || missing="$missing $1 ($2)"; }
need_file() { [ -e "$1" ] || missing="$missing $1 ($2)"; }
for c in gcc make flex bison bc perl; do need_cmd "$c" "$c"; done
need_cmd xz xz-utils
need_cmd pahole dwarves
need_cmd bpftool bpftool
need_cmd apt-get apt
need_file /usr/include/libelf.h libelf-dev
need_file /usr/include/openssl/opensslv.h libssl-dev
need_file /usr/include/zlib.h zlib1g-dev
[ -z "$missing" ] || die "missing:$missing; 'make scx-deps' installs them"

mkdir -p "$cache"
exec 9>"$cache/kbuild-scx.lock"
flock 9

# ---- the source -----------------------------------------------------------------------------
version=$(apt-cache policy "$pkg" 2>/dev/null | awk '/Candidate:/ {print $2}')
if [ -z "$version" ] || [ "$version" = "(none)" ]; then
  # No apt metadata (offline): the newest source already unpacked, if any.
  src=$(ls -d "$cache"/linux-source-* 2>/dev/null | sort -V | tail -1 || true)
  [ -n "$src" ] || die "apt knows no $pkg: run 'apt-get update' (bookworm-security must be in the sources)"
  version=${src##*/linux-source-}
else
  version=$(echo "$version" | tr -c 'A-Za-z0-9.\n-' '_')
  src=$cache/linux-source-$version
fi
if [ ! -d "$src" ]; then
  tmp=$(mktemp -d "$cache/linux-source.tmp-XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  log "downloading $pkg $version into $cache"
  (cd "$tmp" && apt-get download -q "$pkg" >&2) ||
    die "could not download $pkg with apt-get (no network, or no bookworm-security in the sources?)"
  dpkg -x "$tmp"/*.deb "$tmp/deb"
  log "unpacking the source"
  tar -xf "$tmp"/deb/usr/src/"$pkg".tar.xz -C "$tmp" || die "could not unpack $pkg (disk full?)"
  mv "$tmp/$pkg" "$src"
  rm -rf "$tmp"
  trap - EXIT
  phase "source download and unpack"
fi
if [ "${1:-}" = "--source" ]; then echo "$src"; exit 0; fi

# ---- the config -----------------------------------------------------------------------------
# What the final .config follows from, besides the source: the fragment, this script's recipe
# (an edit costs one kconfig pass, which finds the same config), and the tools kconfig asks.
key=$( { echo "$version"; cat "$fragment" "$0"; gcc --version | head -1; pahole --version; } | sha256sum | cut -c1-12)
link=$cache/kernel-scx-$version-in-$key
if [ -f "$link/bzImage" ]; then readlink -f "$link"; exit 0; fi

obj=$cache/kbuild-scx-$version
mkdir -p "$obj"
make -s -C "$src" O="$obj" tinyconfig >/dev/null
"$src/scripts/kconfig/merge_config.sh" -m -O "$obj" "$obj/.config" \
  "$src/kernel/configs/kvm_guest.config" "$fragment" >/dev/null
make -s -C "$src" O="$obj" olddefconfig >/dev/null
missing=""
while IFS= read -r line; do
  case "$line" in
    CONFIG_*=*) grep -qx "$line" "$obj/.config" || missing="$missing ${line%%=*}" ;;
    "# CONFIG_"*" is not set") opt=${line#\# }; opt=${opt%% *}
      grep -q "^$opt=" "$obj/.config" && missing="$missing $opt(should be off)" ;;
  esac
done <"$fragment"
[ -z "$missing" ] || die "the merged config lacks what scx.config asks for (a dependency is off):$missing"
hash=$(sha256sum "$obj/.config" | cut -c1-12)
out=$cache/kernel-scx-$version-$hash
phase "config"
if [ ! -f "$out/bzImage" ]; then
  # ---- the build ----------------------------------------------------------------------------
  log "building $pkg $version (config $hash) with $jobs jobs in $obj"
  nice -n 19 make -s -C "$src" O="$obj" -j"$jobs" bzImage >&2 ||
    die "make bzImage failed in $obj (the compiler's message is above)"
  phase "bzImage"
  tmp=$(mktemp -d "$cache/kernel-scx.tmp-XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  cp "$obj/arch/x86/boot/bzImage" "$tmp/bzImage"
  cp "$obj/.config" "$tmp/config"
  bpftool btf dump file "$obj/vmlinux" format c >"$tmp/vmlinux.h" ||
    die "bpftool could not dump the BTF of $obj/vmlinux (was pahole too old to write it?)"
  echo "$version" >"$tmp/version"
  mv "$tmp" "$out"
  trap - EXIT
  phase "vmlinux.h"
fi
ln -sfn "$(basename "$out")" "$link"
echo "$out"
