"""The boot path imports what it uses and nothing else (a set check, not a timing).

``modstage boot`` runs on every node's boot critical path. A whole ``modstage boot`` of a
signed two-module bundle runs in a fresh interpreter (under a sandbox root, so with the
recording kernel: the build machine has no module support); the modules it leaves in
``sys.modules`` beyond a bare interpreter's are compared with the list below. A new
package on this path must be added here with the reason it is needed.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from stager.drop import ModuleSpec, stage
from tests.kmod import SigningKey, sign
from tests.service.fakes import make_host

ROOT = Path(__file__).resolve().parents[2]

#: Every package outside the standard library the boot path imports, and why.
THIRD_PARTY = {
    "service": "modstage's host side",
    "stager": "the manifest schema and the crash-safe write",
    "tomli_w": "stager.schema.validate bounds a manifest's canonical (written) size when reading it",
    "structlog": "the log (service.logs); its import brings in the rest of this list",
}
#: Imported only where installed: structlog.dev imports them if it can; modstage does not
#: depend on them (rich is the `tables` extra, python3-rich a Suggests of the package, for
#: status's tables; the build machine has them for the tests).
WHEN_INSTALLED = {
    "rich": "structlog.dev's pretty tracebacks",
    "pygments": "via rich.traceback (rich.syntax)",
    "attr": "via rich.pretty",
    "colorama": "structlog.dev's colours on a terminal",
}
#: Packages that must stay off the boot path (each was on it once).
NEVER = {
    "http": "via prometheus_client",
    "urllib": "via prometheus_client",
    "prometheus_client": "the metrics textfile has a built-in writer",
    "zstandard": "only for .ko.zst modules",
    "pyudev": "the daemon's uevent source (service.daemon.uevents), never the boot's",
    "watchdog": "the daemon's drop watcher",
    "cryptography": "ECDSA keys only (service.verify.signature.pubkey); RSA is one pow() and the "
    "kernel's rsapubkey grammar; every certificate, trusted or carried by a signature, is read "
    "by the kernel's X.509 grammar (service.verify.signature.x509)",
    "asn1crypto": "no longer a dependency: the kernel's own ASN.1 grammars read every value "
    "(service.verify.signature.asn1), ECDSA signature values and names in key ids included",
    "lzma": "only for .ko.xz modules",
    "gzip": "only for the running kernel's /proc/config.gz",
    "_cffi_backend": "via cryptography",
    "_openssl": "via cryptography",
    "secrets": "temporary names come from os.urandom",
    "zoneinfo": "the [reboot] window's time zone: boot neither reads nor judges that table",
}

PROBE = """
import io, sys
bare = set(sys.modules)
from service.cli import main
rc = main(["boot", "--root", sys.argv[1]], io.StringIO())
real = {m for m in set(sys.modules) - bare if type(sys.modules[m]).__name__ == "module"}
print(rc)
print(" ".join(sorted(real)))
"""


def outside_stdlib(names: set[str]) -> set[str]:
    """Names that are not the standard library's (sysconfig's data module counts as it)."""
    stdlib = set(sys.stdlib_module_names)
    return {n for n in names if n not in stdlib and not n.startswith("_sysconfigdata_")}


def boot_imports(root: Path) -> tuple[int, set[str]]:
    """Top-level names of the modules a whole ``modstage boot`` of ``root`` imported."""
    rc, names = boot_modules(root)
    return rc, {n.split(".")[0] for n in names}


def boot_modules(root: Path) -> tuple[int, set[str]]:
    """Every module a whole ``modstage boot`` of ``root`` imported beyond a bare interpreter."""
    bare = subprocess.run(
        [sys.executable, "-c", "import sys; print(' '.join(sys.modules))"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(root)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    names = set(out[1].split()) - set(bare) if len(out) > 1 else set()
    return int(out[0]), names


def test_boot_path_imports_only_the_expected_packages(
    tmp_path: Path, kernel: str, modules: dict[str, Path], rsa_key: SigningKey
) -> None:
    """A boot that verifies and loads a bundle imports exactly the listed third-party packages."""
    layout = make_host(tmp_path / "root", kernel, rsa_key.cert_pem)
    # what install.sh puts, but for the test modules standing in for the driver: the
    # example's [bundles.nvidia] takes only the driver's module names
    shipped = (ROOT / "deploy" / "config.example.toml").read_text()
    allowed = 'modules = ["nvidia", "nvidia_*"]'
    assert shipped.count(allowed) == 1
    layout.config.write_text(shipped.replace(allowed, 'modules = ["nvidia", "nvidia_*", "ms_*"]'))
    files = [sign(modules[n], rsa_key, tmp_path / f"{n}.ko") for n in ("ms_exporter", "ms_params")]
    stage(
        layout.incoming,
        bundle="nvidia",  # the example configuration allows no other
        version="1",
        kernel=kernel,
        modules=[ModuleSpec(f) for f in files],
    )
    subprocess.run(
        [sys.executable, "-m", "service.cli", "intake", "--root", str(layout.root)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    rc, top = boot_imports(layout.root)
    assert rc == 0
    assert outside_stdlib(top) - set(WHEN_INSTALLED) == set(THIRD_PARTY)
    assert not top & set(NEVER)


def test_empty_boot_imports_no_more_than_a_full_one(
    tmp_path: Path, rsa_key: SigningKey, kernel: str
) -> None:
    """With nothing to load the boot path still stays within the list."""
    layout = make_host(tmp_path / "root", kernel, rsa_key.cert_pem)
    rc, top = boot_imports(layout.root)
    assert rc == 0
    assert outside_stdlib(top) <= set(THIRD_PARTY) | set(WHEN_INSTALLED)
    assert not top & set(NEVER)


def test_boot_with_nothing_to_load_never_imports_the_verify_stack(
    tmp_path: Path, rsa_key: SigningKey, kernel: str
) -> None:
    """No bundle to bring up: no certificate is read and ``service.verify`` is never imported
    (it is imported with the first module verified), nor the memory onlining."""
    layout = make_host(tmp_path / "root", kernel, rsa_key.cert_pem)
    rc, names = boot_modules(layout.root)
    assert rc == 0 and "service.boot.loader" in names
    assert not {n for n in names if n.startswith("service.verify")}
    assert "service.host.memory" not in names
