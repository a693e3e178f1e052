#!/usr/bin/env bash
# build-image.sh DIR: builds the Soft-RoCE guest that run-in-vm.sh boots, into DIR.
#
# Nothing is installed on the host: Debian packages are fetched with `apt-get download`
# and unpacked with `dpkg -x`. DIR ends up holding
#   vmlinux        the uncompressed kernel (qemu enters it through PVH: under software
#                  emulation the bzImage's own xz decompression would take about a minute)
#   initrd.img     busybox plus the few modules needed to mount the host's / over 9p
#   rootfs/        RDMA userspace and the kernel's modules, laid over the host's / in the guest
#   kver           the kernel release
set -euo pipefail
DIR=${1:?usage: build-image.sh DIR}
HERE=$(cd "$(dirname "$0")" && pwd)

# The guest's RDMA userspace: the rxe provider, perftest (ib_write_bw/lat, the baseline),
# ibv_devinfo, Debian's pyverbs (the independent peer) and kmod (modprobe, depmod).
USERSPACE="libibverbs1 ibverbs-providers librdmacm1 libibumad3 libnl-3-200 libnl-route-3-200
  ibverbs-utils perftest python3-pyverbs libpci3 pci.ids kmod libkmod2"
# What the first stage needs to reach the host's /: virtio-pci, 9p over virtio, overlayfs.
STAGE1_MODULES="virtio_pci 9pnet_virtio 9p overlay"

say() { echo "[softroce] $*" >&2; }

# linux-image-amd64 is a metapackage: resolve the one kernel it stands for (a wildcard
# would fetch every ABI and flavour, about 1.6 GB). The -cloud flavour has no rdma_rxe.
kernel_package() {
    apt-cache depends linux-image-amd64 2>/dev/null | awk '$1 == "Depends:" && $2 ~ /^linux-image-/ {print $2; exit}'
}

mkdir -p "$DIR/debs"
KPKG=$(kernel_package)
if [ -z "$KPKG" ]; then
    apt-get update -qq
    KPKG=$(kernel_package)
fi
[ -n "$KPKG" ] || { say "cannot resolve the kernel behind linux-image-amd64"; exit 1; }
KVER=${KPKG#linux-image-}
say "fetching $KPKG, busybox-static and the RDMA userspace"
(cd "$DIR/debs" && apt-get download -q "$KPKG" busybox-static $USERSPACE 2>&1 |
    grep -v -e 'unsandboxed' -e '^Get:' >&2 || true)
for p in "$KPKG" busybox-static $USERSPACE; do
    ls "$DIR/debs/${p}_"*.deb >/dev/null 2>&1 || { say "download of $p failed"; exit 1; }
done

STAGE=$(mktemp -d "$DIR/stage.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE/kernel" "$STAGE/rootfs" "$STAGE/busybox" "$STAGE/initrd"
dpkg -x "$DIR/debs/${KPKG}_"*.deb "$STAGE/kernel"
dpkg -x "$DIR/debs/busybox-static_"*.deb "$STAGE/busybox"
for p in $USERSPACE; do dpkg -x "$DIR/debs/${p}_"*.deb "$STAGE/rootfs"; done

# The host is merged-/usr (/bin -> usr/bin). dpkg -x makes real bin/ lib/ ... directories,
# which in the guest's overlay would hide those symlinks (and with them /bin/sh).
for d in bin sbin lib lib64; do
    if [ -d "$STAGE/rootfs/$d" ] && [ ! -L "$STAGE/rootfs/$d" ]; then
        mkdir -p "$STAGE/rootfs/usr/$d"
        cp -a "$STAGE/rootfs/$d/." "$STAGE/rootfs/usr/$d/"
        rm -rf "${STAGE:?}/rootfs/$d"
    fi
done

# The package's postinst would run depmod; run the kmod just unpacked under that name
# (kmod picks its tool from argv[0]).
ln -s "$STAGE/rootfs/usr/bin/kmod" "$STAGE/depmod"
LD_LIBRARY_PATH="$STAGE/rootfs/usr/lib/x86_64-linux-gnu" "$STAGE/depmod" -b "$STAGE/kernel" "$KVER"
MODROOT=$STAGE/kernel
mkdir -p "$STAGE/rootfs/usr/lib/modules"
mv "$MODROOT/lib/modules/$KVER" "$STAGE/rootfs/usr/lib/modules/"

python3 "$HERE/extract_vmlinux.py" "$STAGE/kernel/boot/vmlinuz-$KVER" "$STAGE/vmlinux"

# Stage-1 initramfs.
I=$STAGE/initrd
mkdir -p "$I/bin" "$I/modules" "$I/proc" "$I/sys" "$I/dev" "$I/host" "$I/pkgs" "$I/tmp" "$I/root"
cp "$STAGE/busybox/bin/busybox" "$I/bin/busybox"
python3 "$HERE/module_order.py" "$STAGE/rootfs/usr/lib/modules/$KVER" $STAGE1_MODULES > "$I/modules/order"
while read -r m; do cp "$STAGE/rootfs/usr/lib/modules/$KVER/$m" "$I/modules/"; done < "$I/modules/order"
sed -i 's|.*/||' "$I/modules/order"
cp "$HERE/stage1-init.sh" "$I/init"
chmod 755 "$I/init"
(cd "$I" && find . | "$STAGE/busybox/bin/busybox" cpio -o -H newc 2>/dev/null | gzip -1 > "$STAGE/initrd.img")

# Publish atomically: a concurrent or interrupted build never leaves a half image.
rm -rf "$DIR/rootfs" "$DIR/vmlinux" "$DIR/initrd.img"
mv "$STAGE/rootfs" "$DIR/rootfs"
mv "$STAGE/vmlinux" "$STAGE/initrd.img" "$DIR/"
echo "$KVER" > "$DIR/kver"
say "image ready in $DIR (kernel $KVER)"
