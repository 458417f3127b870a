"""The oracle's guest: Debian's kernel (the active one: 12's 6.1 or 13's 6.12) with the test CA
built in, enforcement switched on late.

`boot_oracle(state_dir)` boots it and prepares it in the order the kernel needs:

1. boot without `module.sig_enforce` (Debian's own modules no longer have a trusted key, so
   the initramfs modules load only while enforcement is off, tainting the kernel `E`);
2. on 6.1, load `sha512_generic` and `sha3_generic` (sha384/sha512/sha3 digests;
   Debian-signed); Debian 13's 6.12 has both built in; then the in-tree modules asked for
   with `preload` (those the real NVIDIA driver imports from: `drm` and friends);
3. add the secondary leaves to `.secondary_trusted_keys` (the kernel checks each one was
   signed by a built-in key and refuses what it cannot parse);
4. `echo 1 > /sys/module/module/parameters/sig_enforce` (one way: it cannot be unset).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.kmod.keys import SIGN_FILE
from tests.oracle.pki import Cred, Pki
from tests.oracle.target_kernel import active
from tests.vm.harness import Vm
from tests.vm.harness.builtin_key import BuiltinKeyKernel
from tests.vm.harness.kmod import sign_in_root

GUEST = "__import__('tests.oracle.guest', fromlist=['guest'])"
# The digests a kernel builds as modules (CONFIG_CRYPTO_SHA3=m on 7.2, where it is `sha3`):
# loaded before enforcement, as a node trusting Debian's key would load them on demand
DIGEST_MODULES = {"6.1": ("sha512_generic", "sha3_generic"), "7.2": ("sha3",)}


@dataclass
class OracleVm:
    """A prepared oracle guest and what its preparation recorded."""

    vm: Vm
    added: dict[str, int]  # secondary leaf -> key serial, or -errno if the kernel refused it

    def guest(self, call: str, timeout: float = 60) -> Any:
        """Evaluate `tests.oracle.guest.<call>` in the guest."""
        return self.vm.eval(f"{GUEST}.{call}", timeout=timeout)


def boot_oracle(
    state_dir: Path, pki: Pki, preload: tuple[str, ...] = (), **options: Any
) -> OracleVm:
    """Boot and prepare the oracle guest of the active kernel (see the module docstring)."""
    kernel = BuiltinKeyKernel.with_cert(pki.ca.der, active())
    vm = Vm.boot(state_dir, name=f"oracle-{kernel.series}", kernel=kernel, **options)
    try:
        if kernel.series in DIGEST_MODULES:  # built in on 6.12 (CONFIG_CRYPTO_SHA512=y, SHA3=y)
            vm.run(["modprobe", "-a", *DIGEST_MODULES[kernel.series]]).check()
        if preload:
            vm.run(["modprobe", "-a", *preload]).check()
        oracle = OracleVm(vm, {})
        for cred in pki.secondary():
            path = vm.put(cred.pem_cert, f"keys/{cred.name}.pem")
            oracle.added[cred.name] = oracle.guest(
                f"add_certificate(__import__('ssl').PEM_cert_to_DER_cert(open({path!r}).read()))"
            )
        vm.run("echo 1 > /sys/module/module/parameters/sig_enforce").check()
    except BaseException:
        vm.close()
        raise
    return oracle


def sign_file(
    data: bytes, cred: Cred, out: Path, hash: str = "sha256", skid: bool = False
) -> bytes:
    """`data` signed by the active kernel's kbuild sign-file with `cred` (`skid`: -k)."""
    out.write_bytes(data)
    kernel = active()
    if kernel.own_root:
        argv = [*(["-k"] if skid else []), hash, cred.pem_key.name, cred.pem_cert.name]
        sign_in_root(kernel, argv, [cred.pem_key, cred.pem_cert], out)
        return out.read_bytes()
    argv = [str(SIGN_FILE), *(["-k"] if skid else []), hash, str(cred.pem_key), str(cred.pem_cert)]
    proc = subprocess.run([*argv, str(out)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"sign-file {hash} {cred.name} failed: {proc.stderr.strip()}")
    return out.read_bytes()
