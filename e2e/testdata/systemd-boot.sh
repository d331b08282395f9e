#!/bin/bash
# Boots systemd as PID 1 of fresh pid, mount, net, cgroup and uts
# namespaces (unshare runs this), with /etc, /usr and /var as overlays
# on tmpfs: the package installs there with dpkg as on a real machine,
# and nothing of it reaches the machine's own files. Used by
# TestDebUnitsStartUnderSystemd; the test drives the units with
# systemctl through nsenter.
#
#   unshare --mount --pid --net --cgroup --uts --fork --kill-child \
#     systemd-boot.sh DEB
set -euo pipefail
deb=$1
mount --make-rprivate /
mount -t tmpfs tmpfs /run
scratch=/run/sluice-test
mkdir -p "$scratch"
cp "$deb" "$scratch/sluice.deb"
for d in etc usr var; do
  mkdir -p "$scratch/$d/upper" "$scratch/$d/work"
  mount -t overlay overlay -o "lowerdir=/$d,upperdir=$scratch/$d/upper,workdir=$scratch/$d/work" "/$d"
done
# What a booting systemd cleans or fills (tmpfiles clears /tmp) is the
# namespace's own; /sys read-only as in any container.
mount -t tmpfs tmpfs /tmp
mkdir -p /run/lock
umount -R /sys/fs/cgroup 2>/dev/null || true
mount -o remount,bind,ro /sys 2>/dev/null || mount -t sysfs -o ro sysfs /sys
mount -t cgroup2 cgroup2 /sys/fs/cgroup
hostname sluice-deb-test

# The policy the package installs names eth0.
ip link set lo up
ip link add eth0 type veth peer name eth0peer
ip link set eth0 up
ip link set eth0peer up

# man-db's index would be rebuilt for the new pages: minutes under
# emulation, and not what is tested.
rm -f /var/lib/man-db/auto-update
echo "boot: dpkg -i"
DEBIAN_FRONTEND=noninteractive dpkg -i "$scratch/sluice.deb"

# Nothing but what the test starts: an empty default target, and the
# early units that would touch the kernel's global settings masked.
mkdir -p /etc/systemd/system
printf '[Unit]\nDescription=sluice package test\n' >/etc/systemd/system/sluice-test.target
for u in systemd-sysctl.service systemd-modules-load.service systemd-udevd.service \
         systemd-udev-trigger.service systemd-udevd-control.socket systemd-udevd-kernel.socket \
         systemd-binfmt.service proc-sys-fs-binfmt_misc.automount systemd-networkd.service \
         systemd-networkd-wait-online.service systemd-timesyncd.service; do
  ln -sf /dev/null "/etc/systemd/system/$u"
done
echo "boot: systemd"
export container=sluice-test
exec /lib/systemd/systemd --system --unit=sluice-test.target --log-target=console
