#!/usr/bin/env bash
# Builds sluice's packages from one description, deploy/nfpm.yaml, with
# nfpm (a Go tool of this module: go tool nfpm): Debian's deb, the RPM
# distributions' rpm and Alpine's apk for amd64, arm64 and armv7, and
# OpenWrt's ipk for arm64, armv7 and mipsle. Each carries the version of
# scripts/version.sh and the static binary of scripts/dist.sh.
#
#   scripts/packages.sh [FORMAT:ARCH...]   e.g. deb:amd64 ipk:mipsle
#
# Writes out/pkg/*.{deb,rpm,apk,ipk}, a line "package: FILE" for each.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
export VERSION=${VERSION:-$(scripts/version.sh)}
export COMMIT=${COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
targets=("$@")
((${#targets[@]})) || targets=(deb:amd64 rpm:amd64 apk:amd64 deb:arm64 rpm:arm64 apk:arm64 ipk:arm64
	deb:armv7 rpm:armv7 apk:armv7 ipk:armv7 ipk:mipsle)
# dist.sh's target and nfpm's name of each architecture.
declare -A dist=([amd64]=amd64 [arm64]=arm64 [armv7]=arm:7 [mipsle]=mipsle:softfloat)
declare -A nfpm=([amd64]=amd64 [arm64]=arm64 [armv7]=arm7 [mipsle]=mipsle)
# OpenWrt names the CPU, not only the instruction set: the common one of
# each family (the static binary runs on all of a family; opkg refuses
# another name unless opkg.conf lists it or --force-architecture).
declare -A openwrt=([amd64]=x86_64 [arm64]=aarch64_generic [armv7]=arm_cortex-a7_neon-vfpv4 [mipsle]=mipsel_24kc)
declare -A want=()
for t in "${targets[@]}"; do
	arch=${t#*:}
	[[ -n ${dist[$arch]:-} && $t == *:* ]] || { echo "packages: $t: want FORMAT:ARCH, ARCH one of ${!dist[*]}" >&2; exit 2; }
	want[${dist[$arch]}]=1
done
out=out/pkg
rm -rf "$out" && mkdir -p "$out"
# What every package shares: man pages, completions, documents, units.
stage=$PWD/$out/stage # deploy/nfpm.yaml names it
make --no-print-directory install GO="$GO" DESTDIR="$stage" PREFIX=/usr UNITDIR=/lib/systemd/system >/dev/null
GO=$GO scripts/dist.sh "${!want[@]}"
for t in "${targets[@]}"; do
	format=${t%%:*} arch=${t#*:}
	cp out/dist/sluice-*-linux-"${dist[$arch]/:/-}" "$out/sluice" # deploy/nfpm.yaml names it
	v=$VERSION a=${nfpm[$arch]}
	[[ $format == apk ]] && v=$(scripts/version.sh --apk --from "$VERSION")
	[[ $format == ipk ]] && a=${openwrt[$arch]}
	before=$(ls "$out")
	ARCH=$a VERSION=$v "$GO" tool nfpm package --config deploy/nfpm.yaml --packager "$format" --target "$out/" >/dev/null
	# One line per package, which make deb's callers read.
	comm -13 <(echo "$before") <(ls "$out") | sed "s|^|package: $out/|"
done
rm -rf "$stage" "$out/sluice"
