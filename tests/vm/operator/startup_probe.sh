#!/bin/sh
# The operator's startup probe (NVIDIA/gpu-operator's ConfigMap nvidia-driver-startup-probe),
# run inside the pod: the nvidia module is loaded and nvidia-smi works, then readiness is
# written atomically.
[ -e /sys/module/nvidia/refcnt ] || { echo "startup-probe: nvidia not loaded"; exit 1; }
nvidia-smi || { echo "startup-probe: nvidia-smi failed"; exit 1; }
touch /run/nvidia/validations/.driver-ctr-ready.tmp
mv /run/nvidia/validations/.driver-ctr-ready.tmp /run/nvidia/validations/.driver-ctr-ready
