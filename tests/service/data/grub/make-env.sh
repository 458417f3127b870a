#!/bin/sh
# Remake the edited grubenv fixtures with grub's own tools (grub-common 2.06-13+deb12u2):
# each starts from a fresh block (grub-editenv create), as grub-set-default and grub-reboot
# edit it on a host.
set -eu
cd "$(dirname "$0")"
mk() { rm -f "$1"; grub-editenv "$1" create; }

mk grubenv-empty

mk bookworm/grubenv-saved-title
grub-editenv bookworm/grubenv-saved-title set \
  "saved_entry=Advanced options for Debian GNU/Linux>Debian GNU/Linux, with Linux 6.1.0-50-amd64"

mk bookworm/grubenv-saved-id
grub-editenv bookworm/grubenv-saved-id set \
  "saved_entry=gnulinux-advanced-4b1c6c5e-0f0b-4bde-9a34-2f6d1c3e7a10>gnulinux-6.1.0-50-amd64-advanced-4b1c6c5e-0f0b-4bde-9a34-2f6d1c3e7a10"

mk bookworm/grubenv-saved-number
grub-editenv bookworm/grubenv-saved-number set "saved_entry=1>2"

mk bookworm/grubenv-saved-stale   # a kernel since removed
grub-editenv bookworm/grubenv-saved-stale set \
  "saved_entry=Advanced options for Debian GNU/Linux>Debian GNU/Linux, with Linux 6.1.0-40-amd64"

mk trixie/grubenv-saved-and-next   # grub-set-default 1>2, then grub-reboot 1>0
grub-editenv trixie/grubenv-saved-and-next set "saved_entry=1>2"
grub-editenv trixie/grubenv-saved-and-next set "next_entry=1>0"

mk trixie/grubenv-saved-title
grub-editenv trixie/grubenv-saved-title set \
  "saved_entry=Advanced options for Debian GNU/Linux>Debian GNU/Linux, with Linux 6.12.117+deb13-amd64"

mk trixie/grubenv-next-recovery
grub-editenv trixie/grubenv-next-recovery set \
  "next_entry=gnulinux-advanced-4b1c6c5e-0f0b-4bde-9a34-2f6d1c3e7a10>gnulinux-7.3.4+deb13-amd64-recovery-4b1c6c5e-0f0b-4bde-9a34-2f6d1c3e7a10"

mk grubenv-escaped   # a backslash and a newline in a value
grub-editenv grubenv-escaped set "saved_entry=a\\b
c" next_entry=1
