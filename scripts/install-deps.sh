#!/usr/bin/env bash
# Installs what sluice's build, tests, lab and benchmarks need on a fresh
# Debian or Ubuntu machine: iproute2 (tc, ip, ss), nftables, iperf3, ping, clang,
# llvm and libbpf-dev (BPF objects), Chromium (the lab report's
# rendering test), wondershaper and FireQOS (import's equivalence
# tests), qemu and its helpers (the stock-kernel lane, the arm64 smoke lane), qemu-user
# (the arm suites) and groff (the man pages). Go must
# already be installed (https://go.dev/doc/install); modules come from
# the Go module proxy. Idempotent: does nothing when all is present.
set -euo pipefail

need=()
command -v tc >/dev/null 2>&1 || need+=(iproute2)
command -v iperf3 >/dev/null 2>&1 || need+=(iperf3)
command -v ping >/dev/null 2>&1 || need+=(iputils-ping)
command -v sysctl >/dev/null 2>&1 || need+=(procps)
command -v ss >/dev/null 2>&1 || need+=(iproute2)
# BPF programs: clang and libbpf's headers rebuild them (CI checks that
# the committed objects are current; `go build` itself needs neither).
command -v clang >/dev/null 2>&1 || need+=(clang)
command -v llvm-strip >/dev/null 2>&1 || need+=(llvm)
[[ -f /usr/include/bpf/bpf_helpers.h ]] || need+=(libbpf-dev)
# The package test installs the .deb with dpkg and starts its units
# under a systemd of its own (e2e/deb_units_test.go).
[[ -x /lib/systemd/systemd ]] || need+=(systemd)
command -v dpkg-deb >/dev/null 2>&1 || need+=(dpkg)
# The rpm package's headers, files and scripts are read with rpm
# (e2e/package_test.go, TestPackagesForEveryFormat).
command -v rpm >/dev/null 2>&1 || need+=(rpm)
command -v nsenter >/dev/null 2>&1 || need+=(util-linux)
# `sluice import` is checked against the tools it imports from, run for
# real (e2e/import_test.go): Debian's wondershaper and fireqos.
[[ -x /sbin/wondershaper ]] || need+=(wondershaper)
[[ -x /usr/sbin/fireqos ]] || need+=(fireqos)
# Conformance drives a mark rule's class by having the bed's gateway
# mark its flows, as a firewall would (nft).
command -v nft >/dev/null 2>&1 || need+=(nftables)
# The lab's report test opens the HTML report in headless Chromium.
command -v chromium >/dev/null 2>&1 || need+=(chromium)
# The unit suites of the pure packages run for arm64 and armv7 under
# qemu-user (make unit-cross); the man pages are rendered with groff.
command -v qemu-aarch64 >/dev/null 2>&1 || need+=(qemu-user)
command -v groff >/dev/null 2>&1 || need+=(groff-base)
# The stock-kernel lane (vmlane/vmtest.sh, which `make test` prepares
# beside the host suite, where installing packages could race the
# package tests' dpkg): qemu, kmod, file, busybox, and a Python venv
# for virtme-ng.
command -v qemu-system-x86_64 >/dev/null 2>&1 || need+=(qemu-system-x86)
command -v depmod >/dev/null 2>&1 || need+=(kmod)
command -v file >/dev/null 2>&1 || need+=(file)
command -v busybox >/dev/null 2>&1 || need+=(busybox-static)
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need+=(python3-venv)
# The arm64 smoke lane (vmlane/arm64.sh, beside the host suite too):
# qemu-system-arm and cpio, and arm64 in dpkg's architectures, so that
# it only downloads (apt-get download) while the suite runs.
command -v qemu-system-aarch64 >/dev/null 2>&1 || need+=(qemu-system-arm)
command -v cpio >/dev/null 2>&1 || need+=(cpio)
arm64=""
if command -v dpkg >/dev/null 2>&1 && ! dpkg --print-foreign-architectures | grep -qx arm64; then
  arm64=1
fi

if ((${#need[@]})) || [[ -n $arm64 ]]; then
  if [[ $(id -u) -ne 0 ]]; then
    echo "install-deps: need root to install ${need[*]}${arm64:+ (and to add the arm64 architecture to dpkg)}" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  [[ -z $arm64 ]] || dpkg --add-architecture arm64
  apt-get update -qq
  ((${#need[@]} == 0)) || apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if ! command -v go >/dev/null 2>&1; then
  echo "install-deps: Go is required (https://go.dev/doc/install)" >&2
  exit 1
fi
go mod download
