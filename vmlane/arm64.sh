#!/usr/bin/env bash
# The arm64 smoke lane: Debian's arm64 kernel booted under qemu (TCG,
# `-M virt`) with an initramfs of busybox (Debian's busybox-static) and
# the static arm64 sluice that `make dist` ships, and the commands a
# gateway's operator runs, on a dummy device in the guest: doctor,
# apply (an HTB tree classified by sluice's BPF program, and one by
# u32), show, plan (no changes), export, reset, and the agent serving
# /metrics. It proves the binary, its BPF object and its netlink on the
# architecture the small gateways run, on their kernel (issue 61).
#
#   vmlane/arm64.sh [6.1 | 6.12]      (root; default 6.1)
#
# Fetched with apt into /var/lib/sluice-vm/arm64 (SLUICE_VM_CACHE): the
# kernel package and busybox-static, for arm64 (dpkg --add-architecture
# arm64, once). Prints "arm64: smoke passed" and exits 0, or says what
# failed and exits 1; 2 when it cannot run here (says why).
set -euo pipefail

kernel=${1:-6.1}
repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${SLUICE_VM_CACHE:-/var/lib/sluice-vm}/arm64
work=$(mktemp -d /tmp/sluice-arm64.XXXXXX)
trap 'rm -rf "$work"' EXIT
say() { echo "arm64: $*"; }
novm() { say "cannot run: $*" >&2; exit 2; }

case $kernel in
  6.1) meta=linux-image-arm64 ;;
  6.12) meta=linux-image-6.12-arm64 ;;
  *) novm "kernel $kernel: want 6.1 or 6.12" ;;
esac
[[ $(id -u) -eq 0 ]] || novm "needs root (apt-get for the arm64 packages)"
need=()
command -v qemu-system-aarch64 >/dev/null || need+=(qemu-system-arm)
command -v cpio >/dev/null || need+=(cpio)
command -v depmod >/dev/null || need+=(kmod)
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  dpkg --add-architecture arm64
  apt-get update -qq
fi
if ((${#need[@]})); then
  say "installing ${need[*]}"
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

depends() { apt-cache show "$1:arm64" 2>/dev/null | awk -F': ' '/^Depends:/ {print $2; exit}' | sed 's/ (.*//; s/,.*//; s/:arm64//'; }
pkg=$(depends "$meta")
if [[ -z $pkg ]]; then
  apt-get update -qq
  pkg=$(depends "$meta")
fi
[[ -n $pkg ]] || novm "no Debian arm64 kernel package for $kernel ($meta)"
ver=${pkg#linux-image-}
mkdir -p "$cache"
# fetch PKG DIR: the arm64 package unpacked into DIR, once.
fetch() {
  local p=$1 dir=$2 deb
  [[ -d $dir ]] && return
  say "fetching $p"
  (cd "$cache" && rm -f "$p"_*.deb && apt-get download -q "$p:arm64" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
  deb=$(ls "$cache/$p"_*.deb 2>/dev/null | head -1 || true)
  [[ -n $deb ]] || novm "could not download $p:arm64 (apt-get download)"
  rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
  dpkg-deb -x "$deb" "$dir.tmp"
  rm -rf "$dir" && mv "$dir.tmp" "$dir" && rm -f "$deb"
}
fetch "$pkg" "$cache/$ver"
fetch busybox-static "$cache/busybox"
image=$cache/$ver/boot/vmlinuz-$ver
[[ -f $image ]] || novm "$pkg has no boot/vmlinuz-$ver"
[[ -f $cache/$ver/lib/modules/$ver/modules.dep ]] || depmod -b "$cache/$ver" "$ver"
say "kernel $ver"

# The static binary, as make dist builds it.
say "building sluice for linux/arm64"
version=$(cd "$repo" && scripts/version.sh)
commit=$(cd "$repo" && git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
(cd "$repo" && CGO_ENABLED=0 GOOS=linux GOARCH=arm64 ${GO:-go} build -trimpath \
  -ldflags "-s -w -X sluice/version.stamped=$version -X sluice/version.commit=$commit" -o "$work/sluice" ./cmd/sluice)

# The initramfs: busybox, sluice, the modules the smoke needs with what
# they depend on (in load order), the policies and the smoke script.
root=$work/root
mkdir -p "$root"/{bin,proc,sys,dev,run,tmp,etc,var/lib,lib/modules}
cp "$cache/busybox/bin/busybox" "$root/bin/busybox"
cp "$work/sluice" "$root/bin/sluice"
modules=(dummy veth sch_htb sch_ingress sch_fq_codel cls_u32 cls_bpf act_mirred ifb)
: >"$root/modules.load"
for m in "${modules[@]}"; do
  # Built in ("builtin NAME") needs nothing; a module the kernel lacks
  # the smoke's own step says.
  { modprobe -d "$cache/$ver" -S "$ver" --show-depends "$m" 2>/dev/null || true; } | awk '$1 == "insmod" {print $2}' |
    while read -r ko; do
      rel=${ko#"$cache/$ver"}
      grep -qxF "$rel" "$root/modules.load" && continue
      mkdir -p "$root$(dirname "$rel")"
      cp "$ko" "$root$rel"
      echo "$rel" >>"$root/modules.load"
    done
done
cp "$repo/vmlane/arm64-guest.sh" "$root/init"
chmod 755 "$root/init" "$root/bin/busybox"
(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) >"$work/initrd.gz"

say "booting (emulated: a minute or two)"
log=${SLUICE_ARM64_LOG:-$work/console.log}
timeout "${SLUICE_ARM64_TIMEOUT:-1800}" qemu-system-aarch64 -M virt -cpu max -smp 2 -m 1024 -nographic -no-reboot \
  -kernel "$image" -initrd "$work/initrd.gz" -append "console=ttyAMA0 panic=-1 quiet" </dev/null >"$log" 2>&1 || true
sed -n '/^smoke:/p' "$log"
if grep -q '^smoke: passed' "$log"; then
  say "smoke passed ($(grep -m1 '^smoke: kernel' "$log" | sed 's/^smoke: //'))"
  exit 0
fi
say "smoke FAILED; the console's last lines:"
tail -n 40 "$log"
exit 1
