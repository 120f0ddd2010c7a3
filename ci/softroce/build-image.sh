#!/bin/sh
# Builds the Soft-RoCE guest image from Debian packages (run by
# `cargo xtask softroce build`; needs root for debootstrap and chroot).
#
# usage: build-image.sh OUT_DIR SUITE MIRROR PACKAGES(comma-separated)
#
# Writes into OUT_DIR:
#   bzImage          the Debian kernel as packaged
#   initramfs.cpio.gz  busybox + the virtio/ext4 modules; its /init mounts
#                    /dev/vda and switch_roots to /sbin/softroce-boot
#   rootfs.ext4      the root filesystem (attached read-only with snapshot=on)
#   kernel-release   the kernel's release string
# The xtask extracts the uncompressed vmlinux from bzImage afterwards.
set -eu

out=$1 suite=$2 mirror=$3 packages=$4
here=$(cd "$(dirname "$0")" && pwd)
root=$out/root

step() { echo "softroce-build: $*"; }

step "debootstrap $suite from $mirror"
# The kernel package's postinst would build Debian's initrd (35 MB, seconds of
# work we throw away): INITRD=No makes /etc/kernel/postinst.d/initramfs-tools
# skip it.
INITRD=No debootstrap --variant=minbase --include="$packages" "$suite" "$root" "$mirror"

kver=$(ls "$root/lib/modules")
[ "$(echo "$kver" | wc -w)" = 1 ] || { echo "expected one kernel in the guest, found: $kver" >&2; exit 1; }
echo "$kver" > "$out/kernel-release"
cp "$root/boot/vmlinuz-$kver" "$out/bzImage"

step "trimming kernel modules of $kver"
# rdma_rxe loads its crc32 algorithm through request_module, which
# modules.dep does not list: keep all of crypto, arch (x86 crypto) and lib.
mods=$root/lib/modules/$kver
mv "$mods/kernel" "$mods/kernel.all"
for keep in crypto arch lib net \
    fs/ext4 fs/jbd2 fs/mbcache.ko fs/9p fs/netfs fs/fscache fs/configfs \
    drivers/virtio drivers/block/virtio_blk.ko \
    drivers/net/virtio_net.ko drivers/net/net_failover.ko drivers/net/veth.ko \
    drivers/net/dummy.ko drivers/infiniband/core drivers/infiniband/sw; do
    mkdir -p "$(dirname "$mods/kernel/$keep")"
    mv "$mods/kernel.all/$keep" "$mods/kernel/$keep"
done
rm -rf "$mods/kernel.all"
chroot "$root" depmod "$kver"
# Fail now, not at boot, when a module the guest needs lost a dependency.
for m in virtio_pci virtio_blk ext4 virtio_net 9pnet_virtio 9p \
    rdma_rxe ib_uverbs rdma_ucm veth crc32_generic; do
    chroot "$root" modprobe -S "$kver" --show-depends "$m" > /dev/null
done

step "initramfs (busybox, virtio and ext4 modules)"
ird=$out/initramfs
mkdir -p "$ird/bin" "$ird/lib/x86_64-linux-gnu" "$ird/lib64" "$ird/modules" \
    "$ird/proc" "$ird/sys" "$ird/dev" "$ird/newroot"
cp "$root/bin/busybox" "$ird/bin/busybox"
for lib in $(chroot "$root" ldd /bin/busybox | grep -o '/lib[^ ]*'); do
    cp -L "$root$lib" "$ird$lib"
done
n=0
for m in virtio_pci virtio_blk ext4; do
    chroot "$root" modprobe -S "$kver" --show-depends "$m" | awk '$1 == "insmod" { print $2 }'
done | awk '!seen[$0]++' | while read -r ko; do
    n=$((n + 1))
    cp "$root$ko" "$ird/modules/$(printf '%02d' "$n")-$(basename "$ko")"
done
cp "$here/initramfs-init.sh" "$ird/init"
chmod 755 "$ird/init"
(cd "$ird" && find . | sort | cpio --quiet -o -H newc | gzip -1) > "$out/initramfs.cpio.gz"
rm -rf "$ird"

step "root filesystem image"
install -m 755 "$here/boot.sh" "$root/sbin/softroce-boot"
mkdir -p "$root/mnt/softroce-control"
rm -rf "$root/boot"/* "$root/usr/share/doc" "$root/usr/share/man" \
    "$root/usr/share/info" "$root/usr/share/locale" \
    "$root/var/cache/apt/archives"/*.deb "$root/var/lib/apt/lists"/*
used_mb=$(du -sm "$root" | awk '{ print $1 }')
size_mb=$((used_mb + used_mb / 2 + 256))
mkfs.ext4 -q -F -L softroce -O ^has_journal -d "$root" "$out/rootfs.ext4" "${size_mb}M"
rm -rf "$root"
step "done: kernel $kver, root filesystem ${used_mb} MB used"
