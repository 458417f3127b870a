"""``modstage verify`` end to end through ``service.cli.main``: output, JSON, exit codes."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from service.cli import main
from tests.hosts import KEEP, running_host
from tests.kmod import SigningKey, install_target, sign


@pytest.fixture
def trusted(tmp_path: Path, rsa_key: SigningKey, ec_key: SigningKey) -> Path:
    """A trust directory with the RSA key as PEM and the ECDSA key as DER."""
    directory = tmp_path / "trusted.d"
    directory.mkdir()
    (directory / "rsa.pem").write_bytes(rsa_key.cert_pem.read_bytes())
    (directory / "ec.der").write_bytes(ec_key.cert_der.read_bytes())
    return directory


@pytest.fixture
def root(tmp_path: Path, kernel: str) -> Path:
    """A target root: the Debian kernel's in-tree module and config (plus ECDSA)."""
    return install_target(tmp_path / "root", kernel, config_extra="CONFIG_CRYPTO_ECDSA=y\n")


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return main(["verify", *argv], out), out.getvalue()


def test_all_accepted_exits_0_with_one_line_each(
    trusted: Path,
    root: Path,
    signed_rsa: Path,
    modules: dict[str, Path],
    ec_key: SigningKey,
    kernel: str,
    tmp_path: Path,
) -> None:
    """Every file accepted: exit 0, one 'ok' line per file with signer and hash algorithm,
    then the target's notes once (where its exports came from) and the bundle they made."""
    signed_ec = sign(modules["ms_exporter"], ec_key, tmp_path / "ec.ko", hash="sha384", skid=True)
    code, out = run(
        "--root",
        str(root),
        "--trusted",
        str(trusted),
        "--kernel",
        kernel,
        str(signed_rsa),
        str(signed_ec),
    )
    lines = out.splitlines()
    assert code == 0 and len(lines) == 4
    assert lines[0] == f'ok        {signed_rsa}  signer="modstage rsa" hash=sha256 name=ms_params'
    assert lines[1].startswith("ok ") and 'signer="modstage ec" hash=sha384' in lines[1]
    assert lines[2] == f"note: symbols: {root}/lib/modules/{kernel}/build/Module.symvers"
    assert lines[3] == f"note: judged as one bundle in the order given: {signed_rsa}, {signed_ec}"


def test_one_rejection_exits_1_and_prints_the_reason(
    trusted: Path, signed_rsa: Path, modules: dict[str, Path], kernel: str
) -> None:
    """One unsigned file among good ones: exit 1; its line says REJECTED and why."""
    code, out = run(
        "--trusted", str(trusted), "--kernel", kernel, str(signed_rsa), str(modules["ms_enodev"])
    )
    assert code == 1
    bad = out.splitlines()[1]
    assert bad.startswith(f"REJECTED  {modules['ms_enodev']}  signer=- hash=- name=ms_enodev")
    assert bad.endswith("reason: ENODATA: module is unsigned (no signature marker)")


def test_json_lists_the_required_fields(
    trusted: Path, root: Path, signed_ec: Path, kernel: str
) -> None:
    """--json: file, ok, errno, policy, reason, signer, hash, name, vermagic, target facts."""
    flags = "SMP mod_unload modversions "  # the target's flags differ: same_magic fails
    code, out = run(
        "--json",
        "--root",
        str(root),
        "--trusted",
        str(trusted),
        "--kernel",
        f"{kernel} {flags}",
        str(signed_ec),
    )
    (obj,) = json.loads(out)
    assert code == 1
    assert {"file", "ok", "reason", "signer", "hash", "name", "vermagic", "sha256"} <= set(obj)
    assert (obj["ok"], obj["signer"], obj["hash"], obj["name"]) == (
        False,
        "modstage ec",
        "sha384",
        "ms_params",
    )
    assert (obj["errno"], obj["policy"]) == ("ENOEXEC", False)
    assert obj["reason"].startswith("ENOEXEC: vermagic") and "does not match" in obj["reason"]
    assert obj["target"]["vermagic_source"] == "--kernel"
    assert obj["target"]["config_source"] == str(root / f"boot/config-{kernel}")


def test_json_errno_is_the_enforced_one_and_target_facts_say_their_source(
    trusted: Path, root: Path, modules: dict[str, Path], kernel: str
) -> None:
    """Unsigned: reason ENODATA, errno EKEYREJECTED (sig_enforce); vermagic from an in-tree module."""
    code, out = run(
        "--json",
        "--root",
        str(root),
        "--trusted",
        str(trusted),
        "--kernel",
        kernel,
        str(modules["ms_enodev"]),
    )
    (obj,) = json.loads(out)
    assert code == 1 and obj["reason"].startswith("ENODATA")
    assert (obj["errno"], obj["policy"]) == ("EKEYREJECTED", False)
    assert obj["target"]["vermagic_source"].endswith(f"lib/modules/{kernel}/kernel/lib/crc8.ko")
    assert obj["target"]["vermagic"].startswith(kernel + " ")
    assert obj["target"]["notes"] == [f"symbols: {root}/lib/modules/{kernel}/build/Module.symvers"]


def test_defaults_come_from_the_root(
    root: Path, trusted: Path, signed_rsa: Path, kernel: str
) -> None:
    """Without --kernel/--trusted: the running release and /etc/modstage/trusted.d under --root."""
    running_host(root, kernel, boot_id=None)
    (root / "etc/modstage").mkdir(parents=True)
    trusted.rename(root / "etc/modstage/trusted.d")
    assert run("--root", str(root), str(signed_rsa))[0] == 0
    running_host(root, "6.2.0-1-amd64", KEEP)
    code, out = run("--root", str(root), str(signed_rsa))
    assert code == 1 and "not 6.2.0-1-amd64" in out


def test_operational_errors_are_one_line_exit_1(
    tmp_path: Path, signed_rsa: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A kernel's tree without a trust directory or a running kernel: one message on
    stderr, exit 1."""
    root = tmp_path / "root"
    (root / "lib/modules").mkdir(parents=True)
    assert run("--root", str(root), "--kernel", "6.1.0-57-amd64", str(signed_rsa)) == (1, "")
    assert "cannot list trusted certificates" in capsys.readouterr().err
    assert run("--root", str(root), str(signed_rsa)) == (1, "")
    err = capsys.readouterr().err.strip()
    assert err.startswith("modstage verify: error: cannot read the running kernel release")
    assert err.endswith("pass --kernel RELEASE") and "\n" not in err


def test_kernel_keys_without_a_readable_image_fails_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`modstage verify --kernel-keys` against a root whose target image cannot be read
    fails (exit 1) naming the image and why, instead of judging with fewer keys than asked
    for."""
    root = tmp_path / "root"
    (root / "lib/modules/6.1.0-57-amd64/kernel").mkdir(parents=True)
    module = tmp_path / "m.ko"
    module.write_bytes(b"\x7fELF")
    out = io.StringIO()
    code = main(["verify", "--root", str(root), "--kernel", "6.1.0-57-amd64", "--kernel-keys",
                 str(module)], out)  # fmt: skip
    said = capsys.readouterr().err
    assert code == 1 and out.getvalue() == ""
    assert "--kernel-keys" in said and "boot/vmlinuz-6.1.0-57-amd64" in said, said
