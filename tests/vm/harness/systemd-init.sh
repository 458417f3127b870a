#!/bin/busybox sh
# PID 1 in systemd mode (kernel argument modstage.mode=systemd): init.sh's stage 2 executes
# this script instead of running the agent. It lays an install tree over the guest's root
# (modstage.tree=DIR on the host: /opt/* bind-mounted, everything else copied), writes the
# units of the test bed into the overlay's /etc, masks what the test bed does not need, and
# executes systemd as PID 1 with modstage-vm.target as the default target:
#   modstage-vm.target  wants  containerd.service, kubelet.service (stand-ins that record the
#                              modules loaded when they start), the modstage units the install
#                              enabled for multi-user.target, and the agent
#   modstage-vm-agent.service  the harness agent, after all of those; when it exits by itself
#                              it powers off (status 0) or reboots (status 100), as init.sh does
# Without a usable systemd it says so on the console and powers off: the host's boot fails.
B=/run/modstage-vm/bin/busybox
PY=$1 AGENT=$2 REPO=$3
UNITS=/etc/systemd/system
SAW=/run/modstage-vm-saw

fail() {
    echo "modstage-vm: systemd-init: $*" >/dev/console
    $B sync
    $B poweroff -f
}

arg() {
    for word in $($B cat /proc/cmdline); do
        case "$word" in "modstage.$1="*) echo "${word#*=}"; return ;; esac
    done
}

lay_tree() {
    tree=$1
    [ -d "$tree" ] || fail "modstage.tree=$tree is not a directory"
    for entry in "$tree"/*; do
        [ -e "$entry" ] || continue
        if [ "${entry##*/}" = opt ]; then
            for dir in "$entry"/*; do
                $B mkdir -p "/opt/${dir##*/}"
                $B mount --bind "$dir" "/opt/${dir##*/}" || fail "cannot bind $dir"
            done
        else
            $B cp -a "$entry" / || fail "cannot copy $entry"
        fi
    done
}

standin() {  # a oneshot that records /proc/modules when it starts
    $B cat >"$UNITS/$1.service" <<EOF
[Unit]
Description=stand-in for $1 (modstage VM test bed)
$2
[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/sh -c 'mkdir -p $SAW && cat /proc/modules > $SAW/$1'
EOF
}

write_units() {
    wants="containerd.service kubelet.service modstage-vm-agent.service"
    for unit in "$UNITS"/multi-user.target.wants/modstage*; do
        [ -e "$unit" ] && wants="$wants ${unit##*/}"
    done
    $B cat >"$UNITS/modstage-vm.target" <<EOF
[Unit]
Description=modstage VM test bed
Requires=basic.target
After=basic.target
Wants=$wants
AllowIsolate=yes
EOF
    standin containerd ""
    standin kubelet "After=containerd.service"
    $B cat >"$UNITS/modstage-vm-agent.service" <<EOF
[Unit]
Description=modstage VM agent
After=basic.target $wants
[Service]
Environment=HOME=/root LANG=C.UTF-8 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
WorkingDirectory=/
ExecStart=$PY $AGENT $REPO
ExecStopPost=/bin/sh -c '[ "\$\$EXIT_CODE" = exited ] || exit 0; \\
  if [ "\$\$EXIT_STATUS" = 100 ]; then systemctl --no-block reboot; \\
  else systemctl --no-block poweroff; fi'
StandardOutput=journal+console
StandardError=journal+console
EOF
}

# Units the test bed does not need; each costs seconds under TCG (tmpfiles-setup walks the
# host's trees over 9p for about 90 s). tmp.mount: Debian 13 mounts a tmpfs on /tmp, which
# would hide a checkout under /tmp (the repository's own share, where the agent runs from).
MASK="tmp.mount dbus.socket systemd-initctl.socket systemd-journald-audit.socket
kmod-static-nodes.service proc-sys-fs-binfmt_misc.automount sys-fs-fuse-connections.mount
sys-kernel-config.mount sys-kernel-debug.mount sys-kernel-tracing.mount dev-hugepages.mount
dev-mqueue.mount systemd-ask-password-console.path systemd-binfmt.service
systemd-firstboot.service systemd-journal-flush.service systemd-machine-id-commit.service
systemd-pcrphase-sysinit.service systemd-pcrphase.service systemd-random-seed.service
systemd-repart.service systemd-sysusers.service systemd-update-utmp.service
systemd-timesyncd.service systemd-pstore.service systemd-remount-fs.service
systemd-fsck-root.service systemd-hwdb-update.service ldconfig.service
systemd-journal-catalog-update.service systemd-update-done.service keyboard-setup.service
console-setup.service apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer
e2scrub_all.timer fstrim.timer man-db.timer systemd-tmpfiles-clean.timer
systemd-tmpfiles-setup.service"

[ -x /lib/systemd/systemd ] || fail "no /lib/systemd/systemd on the host: apt-get install systemd"
tree=$(arg tree)
[ -z "$tree" ] || lay_tree "$tree"
# The state share is 9p without a cache, where every lookup makes a new inode, so the
# daemon's inotify watch on incoming/ would never fire; a node's incoming directory is on
# local disk, so give the guest a local one (tmpfs, empty at every boot).
$B mkdir -p /var/lib/modstage/incoming
$B mount -t tmpfs -o mode=0755 incoming /var/lib/modstage/incoming || fail "no tmpfs for incoming/"
$B mkdir -p "$UNITS"
write_units
for unit in $MASK; do
    $B ln -sf /dev/null "$UNITS/$unit"
done
# the test bed's target as the default too: with systemd.unit= on its argv alone, Debian
# 13's systemd 257 came up to a serial login, not to the test bed's target
$B ln -sf modstage-vm.target "$UNITS/default.target"
exec /lib/systemd/systemd systemd.unit=modstage-vm.target
