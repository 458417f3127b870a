"""``build-image``: one command from a driver version and a pool's kernels to a signed image.

::

    deploy/driver-container/build-image --driver 550.163.01-2 \\
        --kernel 6.1.0-57-amd64 --kernel 6.12.117+deb13-amd64=/srv/roots/trixie \\
        --key signing.key --cert signing.pem --output nvidia-driver.oci.tar \\
        [--tag registry.example/nvidia/driver:550.163.01] [--cache DIR] [--base base.tar]

For every kernel it builds (or reuses from the cache) the modules, strips, signs with that
kernel's ``sign-file`` and has ``modstage verify`` judge them against that kernel's files and
the certificate; only when every kernel's modules are accepted does it gather the firmware and
``nvidia-smi`` and write the OCI archive (and, with ``--tag``, load it into podman). It prints
the report it also stores in the image (``/opt/modstage/build.json``): driver, kernels,
module digests, signer, timings. Exit 0 built, 1 failed (the reason on stderr), 2 usage.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from buildimage import BuildError
from buildimage.image import STAGED_MODULES, Contents, base_tar, write
from buildimage.kernel import KernelFiles
from buildimage.modules import DriverSource, KernelModules, prepare
from buildimage.nvidia import gsp_firmware, nvidia_smi
from buildimage.sign import Signer

EXIT_FAILED = 1


def default_cache() -> Path:
    """``$MODSTAGE_BUILD_CACHE``, else ``$XDG_CACHE_HOME/modstage-build``."""
    named = os.environ.get("MODSTAGE_BUILD_CACHE")
    if named:
        return Path(named)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "modstage-build"


def parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(
        prog="build-image",
        description="Build, sign and verify NVIDIA's modules for each kernel and write one "
        "driver image for modstage hosts (an OCI archive).",
    )
    driver = p.add_mutually_exclusive_group(required=True)
    driver.add_argument(
        "--driver", metavar="VERSION", help="Debian nvidia-kernel-source version, e.g. 550.163.01-2"
    )
    driver.add_argument(
        "--prebuilt",
        type=Path,
        metavar="DIR",
        help="modules already built, unsigned: DIR/<release>/*.ko for every --kernel",
    )
    p.add_argument("--open", action="store_true", help="nvidia-open-kernel-source instead")
    p.add_argument(
        "--version", help="the driver version an image of --prebuilt modules names (DRIVER_VERSION)"
    )
    p.add_argument(
        "--kernel",
        action="append",
        required=True,
        metavar="RELEASE[=ROOT]",
        help="a kernel the pool runs; ROOT is a Debian root with its linux-headers, "
        "linux-image and compiler (default: this machine's /). Repeat for several kernels",
    )
    p.add_argument(
        "--key", required=True, help="signing key: a PEM file, or a PKCS#11 URI (pkcs11:...)"
    )
    p.add_argument("--cert", type=Path, required=True, help="its X.509 certificate (PEM or DER)")
    p.add_argument("--output", type=Path, required=True, help="the OCI archive to write")
    p.add_argument("--tag", help="the image's name; also load it into podman under that name")
    p.add_argument(
        "--firmware", type=Path, help="with --prebuilt: a directory of GSP firmware files"
    )
    p.add_argument("--nvidia-smi", type=Path, help="with --prebuilt: nvidia-smi and libnvidia-ml")
    p.add_argument("--staged", default=None, help="modules the pod stages, in load order")
    p.add_argument("--base", type=Path, help="base root file system tar (default: mmdebstrap)")
    p.add_argument("--cache", type=Path, help=f"build cache (default: {default_cache()})")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    return p


def _signer_subject(cert: Path) -> str:
    form = "PEM" if cert.read_bytes().lstrip().startswith(b"-----BEGIN") else "DER"
    done = subprocess.run(
        ["openssl", "x509", "-inform", form, "-noout", "-subject", "-nameopt", "RFC2253"],
        input=cert.read_bytes(),
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        raise BuildError(f"{cert}: not an X.509 certificate: {done.stderr.decode().strip()}")
    return done.stdout.decode().strip().removeprefix("subject=")


def _report(
    source: DriverSource, version: str, kernels: list[KernelModules], signer: Signer
) -> dict[str, Any]:
    key_ids = {m["key_id"] for k in kernels for m in k.record["modules"].values()}
    return {
        "driver": {"version": version, "source": source.describe()},
        "kernels": {k.kernel.release: k.record for k in kernels},
        "signer": {
            "subject": _signer_subject(signer.cert),
            "cert_sha256": hashlib.sha256(signer.cert.read_bytes()).hexdigest(),
            "key_id": sorted(key_ids)[0] if len(key_ids) == 1 else sorted(key_ids),
            "key": "pkcs11" if signer.key_file is None else "file",
        },
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _load(output: Path) -> None:
    done = subprocess.run(
        ["podman", "load", "-i", str(output)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise BuildError(f"podman load -i {output} failed: {done.stderr.strip()[-2000:]}")


def _size(path: Path | None) -> int:
    if path is None:
        return 0
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def build(args: argparse.Namespace, progress: TextIO) -> dict[str, Any]:
    """Everything :func:`main` does once the arguments are read, saying each step on
    ``progress``; the report."""
    cache = (args.cache or default_cache()).resolve()
    cache.mkdir(parents=True, exist_ok=True)
    flavor = "open" if args.open else "proprietary"
    source = DriverSource(args.driver, args.prebuilt, flavor)
    version = args.version or (args.driver.rsplit("-", 1)[0] if args.driver else None)
    if version is None:
        raise BuildError("--prebuilt needs --version (the driver version the image names)")
    signer = Signer(args.key, args.cert.resolve())
    kernels = [KernelFiles.from_arg(text) for text in args.kernel]
    with tempfile.TemporaryDirectory(dir=cache, prefix="build-") as tmp:
        scratch = Path(tmp)
        prepared = []
        for kernel in kernels:
            print(f"build-image: kernel {kernel.release}: {source.describe()}", file=progress)
            prepared.append(prepare(source, kernel, signer, cache, scratch))
            print(f"build-image: kernel {kernel.release}: signed, verified", file=progress)
        firmware = args.firmware
        smi = args.nvidia_smi
        if args.driver:
            firmware = gsp_firmware(cache, args.driver) / "nvidia" / version
            smi = nvidia_smi(cache, args.driver)
        base = args.base.resolve() if args.base else base_tar(cache)
        staged = args.staged or (STAGED_MODULES if args.driver else " ".join(prepared[0].names))
        contents = Contents(version, prepared, firmware, smi, base, staged)
        report = _report(source, version, prepared, signer)
        ref = args.tag or f"localhost/modstage/nvidia-driver:{version}"
        digest = write(contents, report, args.output.resolve(), ref, cache, scratch)
        inputs = sum(_size(p) for p in (base, firmware, smi))
        inputs += sum(_size(k.directory / f"{n}.ko") for k in prepared for n in k.names)
    report["image"] = {
        "ref": ref,
        "manifest": digest,
        "archive": str(args.output),
        "archive_bytes": args.output.stat().st_size,
        "inputs_bytes": inputs,
    }
    if args.tag:
        _load(args.output)
    return report


def render(report: dict[str, Any], out: TextIO) -> None:
    """The report as lines a person reads."""
    print(f"driver   {report['driver']['version']} ({report['driver']['source']})", file=out)
    print(f"signer   {report['signer']['subject']} key id {report['signer']['key_id']}", file=out)
    for release, record in report["kernels"].items():
        built = record.get("build_seconds", "-")
        print(
            f"kernel   {release}  build {built} s  sign {record['sign_seconds']} s  "
            f"verify {record['verify_seconds']} s",
            file=out,
        )
        for name, module in record["modules"].items():
            print(f"  {name:<20} sha256:{module['sha256']}  {module['bytes']} bytes", file=out)
    image = report["image"]
    print(f"image    {image['ref']} {image['manifest']}", file=out)
    print(
        f"archive  {image['archive']} {image['archive_bytes']} bytes "
        f"(inputs {image['inputs_bytes']} bytes)",
        file=out,
    )


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Build the image; 0 built, 1 failed, 2 usage (argparse)."""
    out = out or sys.stdout
    args = parser().parse_args(argv)
    try:
        report = build(args, sys.stderr)
    except BuildError as exc:
        print(f"build-image: {exc}", file=sys.stderr)
        return EXIT_FAILED
    if args.json:
        print(json.dumps(report, indent=1), file=out)
    else:
        render(report, out)
    return 0
