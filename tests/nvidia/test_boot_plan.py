"""The boot loader on the real driver bundle, with a recording kernel.

For each release's driver against its kernel (535 on 6.1, 550 on 6.12), the boot
re-verifies every stored module from the descriptor it loads (65 and 88 MB for
``nvidia.ko``, stripped of debug sections as DKMS leaves it), loads the in-tree modules the
driver depends on with modprobe (``drm``, ``video``, ``drm_kms_helper`` as kmod's
``depends`` says), never asks modprobe for a module of the bundle itself, and loads the five
modules in the manifest's order with their
parameters. The real kernel's verdict (``ENODEV`` from ``nvidia``'s init without a GPU) is
the VM test bed's; here the kernel is :class:`tests.service.fakes.FakeKernel`.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from service.bundles.phase import Phase
from tests.kmod import SigningKey
from tests.service.fakes import FakeKernel, boot_with, make_host, pending
from tests.vm.harness.kernel import Kernel

PARAMS = {"nvidia": "NVreg_EnableGpuFirmware=1", "nvidia-drm": "modeset=1"}


def depends(path: Path) -> list[str]:
    """kmod's ``depends`` of a module, in its order, names normalised (``-`` to ``_``)."""
    out = subprocess.run(
        ["modinfo", "-F", "depends", str(path)], capture_output=True, text=True, check=True
    ).stdout
    return [d.replace("-", "_") for d in out.strip().split(",") if d]


def test_boot_loads_the_real_bundle_after_its_in_tree_dependencies(
    tmp_path: Path,
    signed: dict[str, Path],
    firmware: Path,
    nvidia_key: SigningKey,
    driver_kernel: Kernel,
) -> None:
    """Each module's in-tree dependencies (kmod's ``depends`` less the bundle's modules; the
    kernel had nothing live at boot) go to modprobe just before it; the modules load in order with
    their parameters; the generation becomes active with all five loaded."""
    kernel = driver_kernel.release
    cert = nvidia_key.cert_pem
    host = make_host(tmp_path / "root", kernel, cert, {0: "online"}, driver_kernel.root)
    mods = [(ko, PARAMS.get(name, "")) for name, ko in signed.items()]
    generation = pending(host, kernel, mods, bundle="nvidia", firmware_dirs=(firmware,))
    ours = {name.replace("-", "_") for name in signed}
    intree = {d for ko in signed.values() for d in depends(ko)} - ours
    fake = FakeKernel(intree=dict.fromkeys(intree))
    state = boot_with(host, fake).run()
    expected: list[tuple[str, ...]] = []
    for name, ko in signed.items():
        wanted = [d for d in depends(ko) if d not in ours]  # modprobe of a live one: a no-op
        if wanted:
            expected.append(("modprobe", *wanted))
        expected.append(("load", name.replace("-", "_"), PARAMS.get(name, "")))
    assert fake.calls == expected
    bundle = state.bundle("nvidia")
    assert (bundle.phase, bundle.active, bundle.pending) == (Phase.ACTIVE, generation, None)
    assert [m.module for m in bundle.loaded] == [n.replace("-", "_") for n in signed]
