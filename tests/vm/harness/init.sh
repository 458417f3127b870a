#!/bin/busybox sh
# PID 1 of the test VM, in two stages. Stage 1 (on the initramfs) mounts the host's root
# read-only over virtio-9p with a tmpfs overlay on top (or, given modstage.rootdisk=DEV, an
# overlay kept on that ext4 disk), the state share at /var/lib/modstage
# (or, given modstage.statedisk=DEV, that ext4 disk there and the share at /mnt/modstage-share),
# and binds the initramfs itself at /run/modstage-vm. It then chroots PID 1 into the overlay
# and re-executes this script from there as stage 2. PID 1 must own the new root because the
# kernel resolves firmware (and usermode helpers) against PID 1's root; it must still execute
# from tmpfs because a PID 1 on the 9p root gets EIO while powering off and panics. Stage 2
# runs the guest agent (the host's own Python) and, when it exits, powers off (status 0) or
# reboots (status 100).
B=/run/modstage-vm/bin/busybox
if [ "$1" = stage2 ]; then
    export HOME=/root LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
    export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    cd /
    # systemd as PID 1 (tests/vm/harness/systemd-init.sh, from the repository): never returns
    [ "$2" = systemd ] && exec $B sh "$5/tests/vm/harness/systemd-init.sh" "$3" "$4" "$5"
    if [ "$2" = shell ]; then
        echo "modstage-vm: shell in the guest; 'exit' powers off (Ctrl-A x kills qemu)"
        $B setsid $B cttyhack /bin/bash -l
        rc=0
    else
        "$3" "$4" "$5"
        rc=$?
    fi
    $B sync
    $B umount /var/lib/modstage 2>/dev/null
    $B umount /mnt/modstage-share 2>/dev/null
    [ "$rc" = 100 ] && $B reboot -f
    [ "$rc" = 0 ] || echo "modstage-vm: agent exited with status $rc"
    $B poweroff -f
fi

/bin/busybox mkdir -p /sbin /usr/bin /usr/sbin /proc /sys /dev
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

fail() {
    echo "modstage-vm: init: $*" >/dev/console
    sync
    poweroff -f
}

arg() {
    for word in $(cat /proc/cmdline); do
        case "$word" in "modstage.$1="*) echo "${word#*=}"; return ;; esac
    done
}

# wait up to 10 s for the block device $1 to appear ($2 names it if it does not)
block_device() {
    tries=0
    until [ -b "$1" ]; do
        tries=$((tries + 1))
        [ "$tries" -gt 100 ] && fail "no $2 $1"
        usleep 100000
    done
}

while read -r module; do
    insmod "/modules/$module" || fail "insmod $module failed"
done </modules.order

NINEP="trans=virtio,version=9p2000.L,msize=512000"
mkdir -p /lower /rw /newroot
mount -t 9p -o "$NINEP,ro,cache=loose" hostroot /lower || fail "cannot mount the host root"
rootdisk=$(arg rootdisk)
if [ -n "$rootdisk" ]; then
    # The overlay's upper layer on an ext4 disk (modstage.rootdisk=DEV, harness/disk.py): what
    # the guest writes to its root survives a reboot, as on an installed host. The modules
    # come from the root's own tree (ext4's crc32c first, as for the state disk below).
    mount -t proc proc /lower/proc || fail "cannot mount /proc for modprobe"
    chroot /lower modprobe -a virtio_blk crc32c_generic ext4 || fail "cannot load ext4"
    umount /lower/proc
    block_device "$rootdisk" "root disk"
    mount -t ext4 "$rootdisk" /rw || fail "cannot mount the root disk $rootdisk"
else
    mount -t tmpfs -o mode=0755 rw /rw
fi
mkdir -p /rw/upper /rw/work
mount -t overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work overlay /newroot \
    || fail "cannot mount the overlay root"
mount -t proc proc /newroot/proc
mount -t sysfs sysfs /newroot/sys
mount -t devtmpfs devtmpfs /newroot/dev
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts devpts /newroot/dev/pts
mount -t tmpfs -o mode=0755 tmpfs /newroot/run
# /tmp stays the overlay (host /tmp below, tmpfs above): a checkout under /tmp must be visible
mount -t tmpfs -o mode=1777 tmpfs /newroot/dev/shm
mkdir -p /newroot/var/lib/modstage
disk=$(arg statedisk)
if [ -n "$disk" ]; then
    # The state on a virtio disk (harness/disk.py), the share beside it. modprobe runs in the
    # new root, where the host's module tree is; ext4 asks for crc32c through the crypto API,
    # whose request_module would run the initramfs's busybox modprobe: load it first.
    chroot /newroot modprobe -a virtio_blk crc32c_generic ext4 || fail "cannot load ext4"
    block_device "$disk" "state disk"
    mount -t ext4 -o "$(arg statemount)" "$disk" /newroot/var/lib/modstage \
        || fail "cannot mount the state disk $disk"
    mkdir -p /newroot/mnt/modstage-share
    mount -t 9p -o "$NINEP,cache=none" state /newroot/mnt/modstage-share || fail "no state share"
    # the exports cache the harness seeded on the share (harness/exports_cache.py)
    if [ -d /newroot/mnt/modstage-share/cache ] && [ ! -e /newroot/var/lib/modstage/cache ]; then
        cp -a /newroot/mnt/modstage-share/cache /newroot/var/lib/modstage/cache
    fi
else
    mount -t 9p -o "$NINEP,cache=none" state /newroot/var/lib/modstage || fail "no state share"
fi
if [ -n "$(arg reposhare)" ]; then
    # a root of its own (Debian 13): the repository on its share, at the host's path
    repo=$(arg repo)
    mkdir -p "/newroot$repo"
    mount -t 9p -o "$NINEP,ro,cache=loose" repo "/newroot$repo" || fail "no repository share"
fi
grep -q debugfs /proc/filesystems && mount -t debugfs debugfs /newroot/sys/kernel/debug

mkdir -p /newroot/run/modstage-vm
mount --bind / /newroot/run/modstage-vm
cd /newroot
exec chroot /newroot $B sh /run/modstage-vm/init stage2 \
    "$(arg mode)" "$(arg python)" "$(arg agent)" "$(arg repo)"
