#!/bin/sh
# Stand-in for the GPU operator's init container, `k8s-driver-manager uninstall_driver`
# (NVIDIA/k8s-driver-manager), applying the decisions of its
# uninstall_driver in their order (host driver, no driver loaded, digest match, unload). Node labels, cordon and eviction have no node here: they are only said.
# Env: DRIVER_CONFIG_DIGEST (as the operator sets it), FORCE_REINSTALL, HOST_ROOT (/host).
set -u
say() { echo "uninstall_driver: $*"; }
host=${HOST_ROOT:-/}

# 1. a driver installed on the host itself: label it pre-installed and fail
if v=$(chroot "$host" nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null) \
        && [ -n "$v" ]; then
    say "host driver $v: labelling nvidia.com/gpu.deploy.driver=pre-installed"
    exit 1
fi

# 2. no driver loaded (a fresh boot): clean up, unload nouveau, uncordon
if [ ! -e /sys/module/nvidia/refcnt ]; then
    if mountpoint -q /run/nvidia/driver 2>/dev/null; then umount -l /run/nvidia/driver; fi
    rm -f /run/nvidia/nvidia-driver.pid
    if [ -e /sys/module/nouveau/refcnt ]; then rmmod nouveau || exit 1; fi
    say "no nvidia driver loaded: uncordoning"
    exit 0
fi

# 3. a driver is loaded: keep it only if the state file holds exactly our digest
say "nvidia driver loaded: pausing the GPU operands"
state=/run/nvidia/nvidia-driver.state
if [ "${FORCE_REINSTALL:-false}" != "true" ] && [ -f "$state" ] \
        && [ "$(cat "$state")" = "${DRIVER_CONFIG_DIGEST:-}" ]; then
    say "driver config unchanged (digest ${DRIVER_CONFIG_DIGEST:-}): skipping the unload"
    exit 0
fi
say "driver config changed (state file: $(cat "$state" 2>/dev/null || echo missing)): cordon, evict GPU pods, unload"
for m in nvidia_modeset nvidia_uvm nvidia_peermem nvidia_fs nvidia_vgpu_vfio gdrdrv nvidia; do
    [ -e "/sys/module/$m/refcnt" ] || continue
    rmmod "$m" || { say "cannot unload $m (in use)"; exit 1; }
    say "unloaded $m"
done
exit 0
