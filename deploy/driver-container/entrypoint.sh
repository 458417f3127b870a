#!/usr/bin/env bash
# Driver container entrypoint for a modstage host: instead of loading the NVIDIA modules
# itself (a host with modstage refuses that), it stages them and waits for the host.
#
# What the NVIDIA GPU operator hands a driver container, and where it goes here:
#   DRIVER_VERSION      the driver version (also the image tag)      -> --version
#   /drivers/<m>.conf   kernelModuleConfig parameter files           -> --params-dir
#   firmware            /lib/firmware/nvidia/$DRIVER_VERSION (GSP)   -> --firmware
# and it treats the driver as ready once /run/nvidia/validations/.driver-ctr-ready exists.
# The operator runs the container as `<entrypoint> init`; other arguments are ignored.
set -euo pipefail

: "${DRIVER_VERSION:?DRIVER_VERSION must name the driver version}"
KERNEL_VERSION="${KERNEL_VERSION:-$(uname -r)}"
MODULE_DIR="${MODULE_DIR:-/opt/modstage/modules/${KERNEL_VERSION}}"
PARAMS_DIR="${PARAMS_DIR:-/drivers}"
FIRMWARE_DIR="${FIRMWARE_DIR:-/lib/firmware/nvidia/${DRIVER_VERSION}}"
INCOMING="${MODSTAGE_INCOMING:-/var/lib/modstage/incoming}"
STATUS_DIR="${MODSTAGE_STATUS:-/var/lib/modstage/status}"
READY_FILE="${READY_FILE:-/run/nvidia/validations/.driver-ctr-ready}"
WAIT_TIMEOUT="${WAIT_TIMEOUT:-}"
# Load order: nvidia first; the others need its symbols.
MODULES="${MODULES:-nvidia nvidia-modeset nvidia-uvm nvidia-drm}"

log() { printf 'driver-ctr: %s\n' "$*"; }

rm -f "${READY_FILE}"

module_args=()
for name in ${MODULES}; do
    file="${MODULE_DIR}/${name}.ko"
    [[ -f "${file}" ]] || { log "missing signed module ${file}"; exit 1; }
    module_args+=(--module "${file}")
done

# The firmware keeps its path under the firmware search path (nvidia/<version>/...),
# so stage it from a tree whose root is that search path.
fw_root="$(mktemp -d)"
trap 'rm -rf "${fw_root}"' EXIT
fw_args=()
if [[ -d "${FIRMWARE_DIR}" ]]; then
    mkdir -p "${fw_root}/nvidia"
    cp -a "${FIRMWARE_DIR}" "${fw_root}/nvidia/${DRIVER_VERSION}"
    fw_args=(--firmware "${fw_root}")
fi
params_args=()
[[ -d "${PARAMS_DIR}" ]] && params_args=(--params-dir "${PARAMS_DIR}")

log "staging nvidia ${DRIVER_VERSION} for kernel ${KERNEL_VERSION}"
drop="$(modstage stage --into "${INCOMING}" --bundle nvidia --version "${DRIVER_VERSION}" \
    --kernel "${KERNEL_VERSION}" "${module_args[@]}" "${params_args[@]}" "${fw_args[@]}")"
log "staged ${drop}; waiting for the host (it may reboot the node)"

wait_args=()
[[ -n "${WAIT_TIMEOUT}" ]] && wait_args=(--timeout "${WAIT_TIMEOUT}")
modstage wait --status-dir "${STATUS_DIR}" --bundle nvidia --drop "${drop}" \
    --ready-file "${READY_FILE}" "${wait_args[@]}"
log "nvidia ${DRIVER_VERSION} is loaded; ready"

# The operator expects its driver container to keep running; the readiness file stays.
trap - EXIT
rm -rf "${fw_root}"
exec sleep infinity
