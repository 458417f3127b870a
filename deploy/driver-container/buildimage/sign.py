"""Modules signed with their kernel's own ``sign-file``, then judged by ``modstage verify``.

The key is a file or a PKCS#11 URI (``pkcs11:...``), handed to ``sign-file`` as is, so an
HSM's key never leaves it; the certificate is a file (PEM or DER), which ``sign-file`` reads
for the issuer and serial it writes into the signature and which ``modstage verify`` trusts.
For a kernel in a root of its own, ``sign-file`` runs in that root: the module, certificate
and key file are copied into a scratch directory of the root's ``/tmp`` and removed after.

The verdict is modstage's: ``modstage verify --root`` against a host root whose target is
the kernel's own files (:meth:`buildimage.kernel.KernelFiles.install_target`), the modules
named together in load order as the host's intake judges a drop, the certificate the only
trusted key. Any refusal is a :class:`ModuleRefused` naming every refused module and why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from buildimage import BuildError
from buildimage.kernel import KernelFiles
from buildimage.nvidia import strip_argv

#: The repository the builder belongs to: ``modstage verify`` is run from it by default.
REPO = Path(__file__).resolve().parents[3]


class ModuleRefused(BuildError):
    """``modstage verify`` refused modules for a kernel: ``(file, reason)`` each."""

    def __init__(self, release: str, refused: list[tuple[str, str]]) -> None:
        self.release = release
        self.refused = refused
        words = "; ".join(f"{Path(f).name}: {reason}" for f, reason in refused)
        super().__init__(f"kernel {release}: modstage verify refused {words}")


@dataclass(frozen=True)
class Signer:
    """The signing key (a file or a PKCS#11 URI) and its certificate (a file)."""

    key: str
    cert: Path
    hash: str = "sha256"

    @property
    def key_file(self) -> Path | None:
        """The key as a file, or None for a PKCS#11 URI."""
        return None if self.key.startswith("pkcs11:") else Path(self.key)


def strip(kernel: KernelFiles, modules: list[Path], scratch: Path) -> None:
    """``strip -g`` each of ``modules`` in place, as DKMS does, with the kernel's binutils."""
    with kernel.scratch(scratch) as work:
        for module in modules:
            shutil.copyfile(module, work / module.name)
        kernel.run(work, strip_argv([m.name for m in modules]), "strip -g")
        for module in modules:
            shutil.copyfile(work / module.name, module)


def sign(kernel: KernelFiles, modules: list[Path], signer: Signer, scratch: Path) -> None:
    """Sign each of ``modules`` in place with ``kernel``'s own ``sign-file``."""
    tool = kernel.sign_file
    if not kernel.at(tool).is_file():
        raise BuildError(f"kernel {kernel.release}: no {kernel.at(tool)} (its headers' sign-file)")
    with kernel.scratch(scratch) as work:
        inside = Path("/" + str(work.relative_to(kernel.root))) if kernel.own_root else work
        shutil.copyfile(signer.cert, work / "signing-cert")
        key = signer.key
        if signer.key_file is not None:
            fd = os.open(work / "signing-key", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as out:
                out.write(signer.key_file.read_bytes())
            key = str(inside / "signing-key")
        for module in modules:
            shutil.copyfile(module, work / module.name)
            argv = [str(tool), signer.hash, key, str(inside / "signing-cert"), module.name]
            kernel.run(work, argv, f"sign-file {module.name}")
            shutil.copyfile(work / module.name, module)


def _trusted(cert: Path, into: Path) -> Path:
    into.mkdir(parents=True, exist_ok=True)
    data = cert.read_bytes()
    suffix = ".pem" if data.lstrip().startswith(b"-----BEGIN") else ".der"
    (into / f"signer{suffix}").write_bytes(data)
    return into


def modstage_argv() -> list[str]:
    """The ``modstage`` command: the repository's own (``$MODSTAGE_BUILD_MODSTAGE`` may
    name another, e.g. an installed ``modstage``)."""
    named = os.environ.get("MODSTAGE_BUILD_MODSTAGE")
    if named:
        return named.split()
    return [sys.executable, "-c", "from service.cli import entry; entry()"]


def verify(
    kernel: KernelFiles, target_root: Path, cert: Path, modules: list[Path]
) -> list[dict[str, Any]]:
    """``modstage verify`` of ``modules`` (one bundle, in load order) against ``kernel``'s
    files installed under ``target_root``, trusting ``cert`` alone: the verdicts (JSON), or
    :class:`ModuleRefused` naming each refused module and the reason."""
    kernel.install_target(target_root)
    with tempfile.TemporaryDirectory(prefix="modstage-trust-") as tmp:
        trusted = _trusted(cert, Path(tmp) / "trusted.d")
        argv = [*modstage_argv(), "verify", "--root", str(target_root), "--trusted", str(trusted)]
        argv += ["--kernel", kernel.release, "--json", *map(str, modules)]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        }
        done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    try:
        verdicts: list[dict[str, Any]] = json.loads(done.stdout)
    except json.JSONDecodeError:
        raise BuildError(
            f"kernel {kernel.release}: modstage verify gave no verdicts ({done.returncode}): "
            f"{done.stderr.strip()[-2000:]}"
        ) from None
    refused = [(str(v["file"]), str(v["reason"])) for v in verdicts if not v["ok"]]
    if refused or done.returncode != 0 or len(verdicts) != len(modules):
        raise ModuleRefused(kernel.release, refused or [("(all)", done.stderr.strip())])
    return verdicts
