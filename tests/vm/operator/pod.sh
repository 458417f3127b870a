#!/bin/sh
# The GPU operator's driver pod (its nvidia-driver-ctr container), as NVIDIA/gpu-operator's
# assets/state-driver/0500_daemonset.yaml declares its host mounts, simulated with a mount namespace in the test VM. The container's
# root is the driver image's root file system (ROOTFS, exported from the image podman built),
# under a writable overlay; in it:
#   host /run/nvidia at /run/nvidia (Bidirectional: a shared mount), in a container /run that
#   is its own tmpfs; host /run/nvidia/driver/lib/firmware over /lib/firmware; the host's
#   /etc/os-release at /host-etc/os-release; /proc, /sys, /dev. Nothing else of the host.
#   PAYLOAD (this version's signed modules, firmware, nvidia-smi and the kernelModuleConfig
#   ConfigMap) is bound over the image's /opt/modstage/{modules,firmware,bin} and /drivers.
# Usage: pod.sh ROOTFS PAYLOAD COMMAND...   (run with the container's environment)
set -eu
rootfs=$1
payload=$2
shift 2
# kubelet: hostPath DirectoryOrCreate
mkdir -p /run/nvidia/driver/lib/firmware /run/nvidia/validations
# mountPropagation: Bidirectional needs a shared host mount
if ! grep -q " /run/nvidia .*shared:" /proc/self/mountinfo; then
    mount --bind /run/nvidia /run/nvidia
    mount --make-shared /run/nvidia
fi
exec unshare -m --propagation unchanged sh -eu -c '
    rootfs=$1 payload=$2
    shift 2
    hold=$(mktemp -d /tmp/pod.XXXXXX)
    mkdir "$hold/nvidia" "$hold/layer" "$hold/root"
    mount --bind /run/nvidia "$hold/nvidia"
    mount -t tmpfs -o mode=0755 tmpfs "$hold/layer"
    mkdir "$hold/layer/upper" "$hold/layer/work"
    mount -t overlay overlay \
        -o "lowerdir=$rootfs,upperdir=$hold/layer/upper,workdir=$hold/layer/work" "$hold/root"
    r=$hold/root
    mount -t proc proc "$r/proc"
    mount --rbind /sys "$r/sys"
    mount --rbind /dev "$r/dev"
    mount -t tmpfs -o mode=0755 tmpfs "$r/run"
    mkdir "$r/run/nvidia"
    mount --move "$hold/nvidia" "$r/run/nvidia"
    mkdir -p "$r/lib/firmware"
    mount --bind /run/nvidia/driver/lib/firmware "$r/lib/firmware"
    mkdir -p "$r/host-etc" "$r/drivers"
    touch "$r/host-etc/os-release"
    mount --bind /etc/os-release "$r/host-etc/os-release"
    for d in modules firmware bin; do
        mkdir -p "$r/opt/modstage/$d"
        mount --bind "$payload/opt/modstage/$d" "$r/opt/modstage/$d"
    done
    if [ -d "$payload/drivers" ]; then mount --bind "$payload/drivers" "$r/drivers"; fi
    exec chroot "$r" "$@"
' pod "$rootfs" "$payload" "$@"
