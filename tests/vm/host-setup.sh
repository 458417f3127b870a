#!/bin/sh
# Prepare a Debian 12 host (root) to run the VM tests: `sh tests/vm/host-setup.sh`.
#
# Installs qemu, Debian's signed 6.1 kernel with its modules, the headers and kbuild for building
# the test modules, static busybox for the guest's initramfs, kmod, and libudev for pyudev.
# --no-install-recommends keeps qemu from pulling in ~200 desktop packages, and INITRD=No skips
# rebuilding the host's own initramfs for the new kernel (most of the install time): the VM boots
# the kernel with the harness's own initramfs, and /boot's kernel is never booted by this host.
# Debian 13's 6.12 is not installed here: mmdebstrap and the archive keyring let the harness
# fetch it with a private apt configuration and build its Debian 13 root in the cache
# (`python3 -m tests.vm.harness.debian` does it ahead of time; .ci/install runs it).
# The Secure Boot node (harness/secureboot.py) boots through OVMF (ovmf), Debian's signed shim
# (shim-signed) and grub (grub-efi-amd64-signed) from an ESP image built with sfdisk (fdisk)
# and mtools; its vars are enrolled with virt-fw-vars (pip's virt-firmware, the test extra).
# Idempotent: a host that has everything installs nothing.
set -eu

PACKAGES="qemu-system-x86 linux-image-amd64 linux-headers-amd64 linux-kbuild-6.1 busybox-static kmod libudev1 mmdebstrap debian-archive-keyring ovmf shim-signed grub-efi-amd64-signed mtools fdisk"

missing=""
for package in $PACKAGES; do
    status=$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)
    [ "$status" = "install ok installed" ] || missing="$missing $package"
done

if [ -n "$missing" ]; then
    echo "host-setup: installing$missing"
    export DEBIAN_FRONTEND=noninteractive INITRD=No
    apt-get update -qq
    # shellcheck disable=SC2086
    apt-get install -y -qq --no-install-recommends $missing
fi

release=$(ls /lib/modules | sort -V | tail -n 1)
for path in /usr/bin/qemu-system-x86_64 /bin/busybox "/boot/vmlinuz-$release" \
    "/lib/modules/$release/modules.dep" "/usr/src/linux-headers-$release/Makefile" \
    /usr/share/OVMF/OVMF_CODE_4M.secboot.fd /usr/lib/shim/shimx64.efi.signed \
    /usr/lib/grub/x86_64-efi-signed/grubx64.efi.signed; do
    if [ ! -e "$path" ]; then
        echo "host-setup: $path is missing after install" >&2
        exit 1
    fi
done
echo "host-setup: ready to boot $release ($(/usr/bin/qemu-system-x86_64 --version | head -n 1))"
