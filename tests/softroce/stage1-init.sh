#!/bin/busybox sh
# /init of the guest's initramfs: mount the host's / (read-only, 9p tag "host") under the
# RDMA userspace (9p tag "pkgs"), with a tmpfs on top so the guest may write anywhere, then
# hand over to the project's guest-init.sh (its path is rdv_init= on the kernel command line).
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
halt_now() { echo "softroce stage1: $*"; echo o > /proc/sysrq-trigger; sleep 10; }
while read -r m; do insmod "/modules/$m" || halt_now "insmod $m failed"; done < /modules/order
NINEP="trans=virtio,version=9p2000.L,ro,cache=loose,msize=262144"
mount -t 9p -o "$NINEP" host /host || halt_now "cannot mount the host's / over 9p"
# A second export, not a path under /host: overlayfs refuses (ELOOP) a lower layer that
# lies inside another lower layer of the same filesystem.
mount -t 9p -o "$NINEP" pkgs /pkgs || halt_now "cannot mount the package tree over 9p"
mount -t tmpfs -o mode=755 tmpfs /tmp
mkdir -p /tmp/upper /tmp/work
mount -t overlay overlay -o lowerdir=/pkgs:/host,upperdir=/tmp/upper,workdir=/tmp/work /root ||
    halt_now "cannot stack the overlay root"
INIT=$(sed -n 's/.*rdv_init=\([^ ]*\).*/\1/p' /proc/cmdline)
umount /proc /sys /dev
exec switch_root /root /bin/sh "$INIT"
