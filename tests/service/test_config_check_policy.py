"""``modstage config check`` shows the policy that applies to each bundle: the certificates
that may sign its modules, its module globs, ``shadow_in_tree``, ``min_version``, the
parameters it may and may never set, and its firmware allowances; every bundle the config
names, and ``*`` for any other when ``allowed_bundles`` is empty. A ``signers`` entry that
names no trusted certificate is a problem.

The host trusts the session's RSA key (``make_host``) and a second vendor's key, added here.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from service.cli import main
from service.layout import Layout
from service.verify.signature.trust import TrustStore
from tests.kmod import SigningKey


def check(host: Layout, config: str, *flags: str) -> tuple[int, str]:
    """``config check`` of ``host`` with ``config`` as its config.toml: (exit code, stdout)."""
    host.config.parent.mkdir(parents=True, exist_ok=True)
    host.config.write_text(config)
    out = io.StringIO()
    return main(["config", "check", "--root", str(host.root), *flags], out), out.getvalue()


def identifier(host: Layout, file: str) -> str:
    """The key identifier config check shows for ``trusted.d/<file>``: its SKID."""
    [key] = [k for k in TrustStore.from_directory(host.trusted).keys if k.source.endswith(file)]
    return key.key_ids[-1].hex()


NVIDIA = """\
allowed_bundles = ["nvidia", "extra"]
forbidden_params = ["NVreg_RestrictProfilingToAdminUsers"]
[bundles.nvidia]
signers = ["vendor.pem"]
modules = ["nvidia", "nvidia_*"]
shadow_in_tree = ["i2c_*"]
min_version = "550.0"
params = ["NVreg_*", "modeset"]
firmware_override = ["nvidia/*/gsp_*.bin"]
"""


def test_each_bundles_effective_policy_is_shown_one_line_a_rule(both: Layout) -> None:
    """A table's bundle shows each of its rules, its signers as the certificates they name
    (file, subject, key identifier), ``forbidden_params`` beside its ``params``; a bundle
    ``allowed_bundles`` names without a table shows the defaults; exit 0."""
    code, out = check(both, NVIDIA)
    assert code == 0, out
    vendor = identifier(both, "vendor.pem")
    lines = [line for line in out.splitlines() if line.startswith("bundle ")]
    assert lines[6:] == [
        f"bundle nvidia: signers: vendor.pem (other vendor, key identifier {vendor})",
        "bundle nvidia: modules: nvidia, nvidia_*",
        "bundle nvidia: shadow_in_tree: i2c_*",
        "bundle nvidia: min_version: 550.0",
        "bundle nvidia: params: only NVreg_*, modeset; never "
        "NVreg_RestrictProfilingToAdminUsers (forbidden_params)",
        "bundle nvidia: firmware: what its modules declare; firmware_override: nvidia/*/gsp_*.bin",
    ]
    every = ", ".join(
        f"{Path(k.source).name} ({k.subject}, key identifier {k.key_ids[-1].hex()})"
        for k in TrustStore.from_directory(both.trusted).keys
    )
    assert "vendor.pem" in every and lines[0] == f"bundle extra: signers: {every}"
    assert lines[1:6] == [
        "bundle extra: modules: any name",
        "bundle extra: shadow_in_tree: none (no module named like the target kernel's own)",
        "bundle extra: min_version: none",
        "bundle extra: params: any; never NVreg_RestrictProfilingToAdminUsers (forbidden_params)",
        "bundle extra: firmware: what its modules declare; firmware_override: none (no host "
        "firmware file)",
    ]
    assert "any other bundle" not in out  # allowed_bundles names them all


def test_json_names_every_bundle_and_any_other_when_any_name_is_allowed(
    both: Layout, rsa_key: SigningKey
) -> None:
    """``--json``'s ``bundles``: the table's bundle with the certificates its signers allow
    (here by key identifier, in openssl's spelling), and ``*`` with the defaults, every
    trusted certificate signing for it, when ``allowed_bundles`` is empty."""
    rsa = identifier(both, rsa_key.cert_pem.name)
    spelled = ":".join(rsa[i : i + 2] for i in range(0, len(rsa), 2)).upper()
    code, out = check(both, f'[bundles.demo]\nsigners = ["{spelled}"]\n', "--json")
    assert code == 0, out
    bundles: dict[str, Any] = json.loads(out)["bundles"]
    assert sorted(bundles) == ["*", "demo"]
    [only] = bundles["demo"]["signed_by"]
    assert (Path(only["file"]).name, only["key_identifier"]) == (rsa_key.cert_pem.name, rsa)
    assert bundles["demo"]["signers"] == [spelled]
    assert sorted(Path(c["file"]).name for c in bundles["*"]["signed_by"]) == sorted(
        p.name for p in both.trusted.iterdir()
    )
    assert {k: v for k, v in bundles["*"].items() if k != "signed_by"} == {
        "signers": [],
        "modules": [],
        "shadow_in_tree": [],
        "min_version": None,
        "params": {"allow": [], "deny": []},
        "firmware": [],
        "firmware_override": [],
    }


def test_a_signers_entry_that_names_no_trusted_certificate_is_a_problem(both: Layout) -> None:
    """An entry matching no certificate of ``trusted.d`` (a file not there, an identifier no
    certificate has) is one problem each, naming the key and the entry: exit 1. The entries
    that match still show their certificate."""
    code, out = check(both, '[bundles.demo]\nsigners = ["vendor.pem", "gone.pem", "ab:cd"]\n')
    assert code == 1, out
    problems = [line for line in out.splitlines() if line.startswith("problem: ")]
    assert problems == [
        f"problem: {both.config}: bundles.demo.signers: {e!r} names no certificate in "
        "trusted.d (by file name or key identifier): it allows no signer"
        for e in ("gone.pem", "ab:cd")
    ]
    assert "bundle demo: signers: vendor.pem (other vendor, key identifier" in out
