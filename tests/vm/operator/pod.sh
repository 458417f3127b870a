#!/bin/sh
# The GPU operator's driver pod (its nvidia-driver-ctr container), as FIELD-FACTS.md §1
# describes its host mounts, simulated with a mount namespace in the test VM:
#   host /run/nvidia at /run/nvidia (Bidirectional: a shared mount), in a container /run
#   that is its own tmpfs; host /run/nvidia/driver/lib/firmware over /lib/firmware; no
#   /var/lib/modstage and no /etc/modstage of the host; the image's files at /opt/modstage;
#   the kernelModuleConfig ConfigMap at /drivers.
# Usage: pod.sh IMAGE_DIR COMMAND...   (the environment is the container's, see ENV_*)
set -eu
image=$1
shift
# kubelet: hostPath DirectoryOrCreate
mkdir -p /run/nvidia/driver/lib/firmware /run/nvidia/validations /opt/modstage /drivers
# mountPropagation: Bidirectional needs a shared host mount
if ! grep -q " /run/nvidia .*shared:" /proc/self/mountinfo; then
    mount --bind /run/nvidia /run/nvidia
    mount --make-shared /run/nvidia
fi
exec unshare -m --propagation unchanged sh -eu -c '
    image=$1; shift
    hold=$(mktemp -d /tmp/pod.XXXXXX)
    mkdir "$hold/nvidia" "$hold/fw"
    mount --bind /run/nvidia "$hold/nvidia"
    mount --bind /run/nvidia/driver/lib/firmware "$hold/fw"
    mount --bind "$image/opt/modstage" /opt/modstage
    if [ -d "$image/drivers" ]; then mount --bind "$image/drivers" /drivers; fi
    mount -t tmpfs -o mode=0755 tmpfs /run
    mkdir /run/nvidia
    mount --move "$hold/nvidia" /run/nvidia
    mount --bind "$hold/fw" /lib/firmware
    umount "$hold/fw"
    mount -t tmpfs -o mode=0700 tmpfs /var/lib/modstage
    mkdir -p /etc/modstage && mount -t tmpfs -o mode=0700 tmpfs /etc/modstage
    exec "$@"
' pod "$image" "$@"
