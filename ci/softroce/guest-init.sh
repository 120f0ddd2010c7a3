#!/bin/sh
# PID 1 of a Soft-RoCE guest run (started by /sbin/softroce-boot from the
# control share, which the xtask fills for each run):
#   control/env       `export K='V'` lines passed from the host
#   control/mounts    one "TAG PATH" line per 9p share to mount
#   control/workdir   the directory CMD runs in
#   control/cmd       the command (a shell script)
# It brings up eth0 and rxe0, runs cmd between markers with its output on the
# console, writes control/status (the exit code) and control/dmesg, and
# powers off. Everything before the BEGIN marker is boot noise the xtask
# keeps in a log; a FAIL marker is a setup error it reports.
ctl=/mnt/softroce-control
fail() {
    echo "@@ORBITTE-SOFTROCE-FAIL guest: $*@@"
    dmesg > "$ctl/dmesg" 2>/dev/null
    sync
    busybox poweroff -f
}
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
echo 1 > /proc/sys/kernel/printk
hostname softroce
ulimit -l unlimited || fail "ulimit -l unlimited"

while read -r tag path; do
    mkdir -p "$path"
    mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 "$tag" "$path" ||
        fail "cannot mount 9p share $tag at $path"
done < "$ctl/mounts"

modprobe virtio_net || fail "modprobe virtio_net"
ip link set lo up
i=0
while ! ip link show eth0 > /dev/null 2>&1; do
    i=$((i + 1))
    [ "$i" -le 50 ] || fail "no eth0 (is the NIC virtio-net?)"
    sleep 0.1
done
ip link set eth0 up || fail "ip link set eth0 up"
ip addr add 10.0.2.15/24 dev eth0
ip route add default via 10.0.2.2
modprobe rdma_rxe || fail "modprobe rdma_rxe"
modprobe ib_uverbs || fail "modprobe ib_uverbs"
modprobe rdma_ucm || fail "modprobe rdma_ucm"
rdma link add rxe0 type rxe netdev eth0 || fail "rdma link add rxe0 type rxe netdev eth0"

. "$ctl/env"
export ORBITTE_TEST_DEVICE=rxe0
export HOME=/root
cd "$(cat "$ctl/workdir")" || fail "cannot cd to the work folder"
# Backstop should the xtask die without stopping qemu: power off after the
# command's time limit.
(sleep "${SOFTROCE_WATCHDOG_SECS:-3600}"
    echo "@@ORBITTE-SOFTROCE-FAIL guest: watchdog: the command ran past its time limit@@"
    busybox poweroff -f) &
echo "@@ORBITTE-SOFTROCE-BEGIN@@"
# Through a pipe, not the console tty: output as in a CI log (no colours,
# stderr and stdout in one stream in order).
{ /bin/sh "$ctl/cmd" < /dev/null; echo "$?" > /run/softroce-rc; } 2>&1 | cat
rc=$(cat /run/softroce-rc 2>/dev/null || echo 255)
echo "@@ORBITTE-SOFTROCE-END rc=$rc@@"
echo "$rc" > "$ctl/status"
dmesg > "$ctl/dmesg" 2>/dev/null
sync
busybox poweroff -f
