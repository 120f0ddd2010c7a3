#!/bin/sh
# /sbin/softroce-boot in the guest's root filesystem (PID 1 after the
# initramfs): mount the control share and run the guest-init.sh the xtask put
# there, so that changing the init logic does not rebuild the image.
PATH=/usr/sbin:/usr/bin:/sbin:/bin
export PATH
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
if modprobe 9pnet_virtio && modprobe 9p &&
    mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 control /mnt/softroce-control &&
    [ -f /mnt/softroce-control/guest-init.sh ]; then
    exec /bin/sh /mnt/softroce-control/guest-init.sh
fi
echo "@@ORBITTE-SOFTROCE-FAIL boot: cannot mount the control share@@"
busybox poweroff -f
