"""verify_drop and verify_paths: manifest digests, firmware, hostile drop trees, order."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from service.verify.bundle import verify_paths
from service.verify.signature.trust import TrustStore
from service.verify.targetkernel.kernel import Target
from service.verify.verdict import verify_drop
from stager.schema.manifest import FirmwareEntry, Manifest, ModuleEntry
from tests.kmod import SigningKey, sign


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def drop(tmp_path: Path, modules: dict[str, Path], rsa_key: SigningKey, kernel: str) -> Path:
    """A complete drop: two signed modules in load order and one firmware file."""
    root = tmp_path / "drop"
    (root / "modules").mkdir(parents=True)
    (root / "firmware/modstage").mkdir(parents=True)
    for name in ("ms_exporter", "ms_consumer"):
        sign(modules[name], rsa_key, root / f"modules/{name}.ko")
    (root / "firmware/modstage/test.bin").write_bytes(b"\x01firmware" * 100)
    write_manifest(root, kernel)
    return root


def write_manifest(root: Path, target: str, **overrides: str) -> None:
    mods = tuple(
        ModuleEntry(f"modules/{n}.ko", overrides.get(n) or digest(root / f"modules/{n}.ko"))
        for n in ("ms_exporter", "ms_consumer")
    )
    fw_file = "firmware/modstage/test.bin"
    firmware = (FirmwareEntry(fw_file, overrides.get("fw") or digest(root / fw_file)),)
    manifest = Manifest("test", "1.0", overrides.get("kernel", target), mods, firmware)
    (root / "manifest.toml").write_bytes(manifest.to_toml())


def test_good_drop_accepts_every_file_in_manifest_order(
    drop: Path, trust: TrustStore, kernel: str, target: Target
) -> None:
    """Modules (signature + digest) then firmware (digest), each accepted, in manifest order."""
    verdicts = verify_drop(drop, trust=trust, kernel=target)
    assert [Path(v.file).name for v in verdicts] == ["ms_exporter.ko", "ms_consumer.ko", "test.bin"]
    assert all(v.ok for v in verdicts), [v.reason for v in verdicts]
    assert verdicts[2].sha256 == digest(drop / "firmware/modstage/test.bin")


@pytest.mark.parametrize("which", ["ms_consumer", "fw"])
def test_digest_other_than_the_manifests_is_rejected(
    drop: Path, trust: TrustStore, kernel: str, which: str, target: Target
) -> None:
    """A module or firmware file whose sha256 differs from the manifest's is rejected."""
    write_manifest(drop, kernel, **{which: "0" * 64})
    verdicts = verify_drop(drop, trust=trust, kernel=target)
    bad = [v for v in verdicts if not v.ok]
    assert len(bad) == 1 and bad[0].reason is not None
    assert bad[0].reason.endswith(f"is not the manifest's {'0' * 64}")


def test_manifest_for_another_kernel_is_rejected(
    drop: Path, trust: TrustStore, kernel: str, target: Target
) -> None:
    """A manifest naming another kernel than the target yields a rejected manifest verdict."""
    write_manifest(drop, kernel, kernel="6.1.0-99-amd64")
    first = verify_drop(drop, trust=trust, kernel=target)[0]
    assert first.file.endswith("manifest.toml") and not first.ok
    assert first.reason == f"EINVAL: manifest is for kernel 6.1.0-99-amd64, the target is {kernel}"


def test_missing_or_invalid_manifest(
    drop: Path, trust: TrustStore, kernel: str, target: Target
) -> None:
    """No manifest: ENOENT; an invalid one: EINVAL with the manifest's own problem text."""
    (drop / "manifest.toml").write_text('schema = 1\nbundle = "x"\n')
    (invalid,) = verify_drop(drop, trust=trust, kernel=target)
    assert invalid.reason is not None and invalid.reason.startswith("EINVAL: ")
    assert "version" in invalid.reason
    (drop / "manifest.toml").unlink()
    (missing,) = verify_drop(drop, trust=trust, kernel=target)
    assert missing.reason == "ENOENT: cannot open: No such file or directory"


def test_symlinks_and_fifos_in_a_drop_are_not_followed(
    drop: Path, trust: TrustStore, kernel: str, signed_rsa: Path, target: Target
) -> None:
    """A planted symlink (file or directory) or FIFO is refused, never read through."""
    consumer = drop / "modules/ms_consumer.ko"
    consumer.unlink()
    consumer.symlink_to(signed_rsa)
    verdicts = verify_drop(drop, trust=trust, kernel=target)
    assert verdicts[1].reason is not None and verdicts[1].reason.startswith("ELOOP")
    consumer.unlink()
    os.mkfifo(consumer)
    assert verify_drop(drop, trust=trust, kernel=target)[1].reason == (
        "EINVAL: cannot open: not a regular file"
    )
    (drop / "firmware/modstage/test.bin").rename(drop / "test.bin")
    (drop / "firmware/modstage").rmdir()
    (drop / "firmware/modstage").symlink_to(drop)
    reason = verify_drop(drop, trust=trust, kernel=target)[2].reason
    assert reason is not None and reason.startswith(("ELOOP", "ENOTDIR"))


def test_verify_paths_keeps_argument_order(
    drop: Path,
    signed_ec: Path,
    modules: dict[str, Path],
    signed: dict[str, Path],
    trust: TrustStore,
    kernel: str,
    target: Target,
) -> None:
    """Files verified in parallel and drops come back in the order they were given."""
    paths = [signed_ec, drop, modules["ms_enodev"], signed["ms_firmware"], drop / "nothere.ko"]
    verdicts = verify_paths(paths, trust=trust, kernel=target)
    assert [v.file for v in verdicts] == [
        str(signed_ec),
        *(
            str(drop / p)
            for p in (
                "modules/ms_exporter.ko",
                "modules/ms_consumer.ko",
                "firmware/modstage/test.bin",
            )
        ),
        str(modules["ms_enodev"]),
        str(signed["ms_firmware"]),
        str(drop / "nothere.ko"),
    ]
    assert [v.ok for v in verdicts] == [True, True, True, True, False, True, False]
