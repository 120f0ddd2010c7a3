#!/bin/busybox sh
# /init of the Soft-RoCE guest's initramfs: load the virtio and ext4
# modules (numbered in dependency order), mount the root filesystem and hand
# over to its /sbin/softroce-boot. Any failure powers the guest off with a
# message the xtask shows, instead of a kernel panic or a hang.
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
fail() {
    echo "@@ORBITTE-SOFTROCE-FAIL initramfs: $*@@"
    poweroff -f
}
for ko in /modules/*.ko; do
    insmod "$ko" || fail "insmod $ko failed"
done
i=0
while [ ! -b /dev/vda ]; do
    i=$((i + 1))
    [ "$i" -le 100 ] || fail "no /dev/vda after 10 s (is the rootfs attached as virtio?)"
    sleep 0.1
done
mount -t ext4 -o rw /dev/vda /newroot || fail "cannot mount /dev/vda"
umount /proc /sys
umount /dev
exec switch_root /newroot /sbin/softroce-boot
