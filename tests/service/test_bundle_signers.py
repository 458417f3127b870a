"""A bundle whose ``[bundles.<name>]`` table names ``signers`` takes only modules one of those
trusted certificates signed: a module another trusted key signed is refused at intake, naming
the module's file, the signer found and the signers allowed. A certificate is named by its
file name in ``trusted.d`` or by a key identifier in hex (its subjectKeyIdentifier as openssl
prints it, or the key id the signature carries as ``modstage verify --json`` prints it).

The host trusts two keys: the session's RSA key (``make_host`` puts its certificate in
``trusted.d``) and a second vendor's key, added here.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from service.config import Config
from service.errors import ConfigError
from service.host.running import RunningHost
from service.layout import Layout
from service.verify.signature.trust import TrustStore
from service.verify.verdict import verify_module
from stager.drop import ModuleSpec, stage
from tests.kmod import SigningKey, sign
from tests.service.fakes import make_intake


def skid_as_openssl_prints_it(key: SigningKey) -> str:
    """The certificate's subjectKeyIdentifier as ``openssl x509 -text`` prints it
    (``AB:CD:…``), read by openssl, not by modstage."""
    out = subprocess.run(
        ["openssl", "x509", "-noout", "-ext", "subjectKeyIdentifier", "-in", str(key.cert_pem)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return out.splitlines()[-1].strip()


def take(host: Layout, module: Path, signers: list[str] | None, bundle: str = "demo") -> tuple:
    """Stage ``module`` as ``bundle`` and take it in with ``[bundles.demo] signers``
    (no table when None); the outcome's reasons, empty when it was accepted."""
    stage(host.incoming, bundle=bundle, version="1", kernel=RunningHost.read(host).need_release(),
          modules=[ModuleSpec(module, "")])  # fmt: skip
    tables = {} if signers is None else {"bundles": {"demo": {"signers": signers}}}
    [outcome] = make_intake(host, Config.from_dict(tables)).run()
    assert outcome.accepted == (not outcome.reasons)
    return outcome.reasons


def test_a_module_another_trusted_key_signed_is_refused_naming_module_signer_and_signers(
    both: Layout, module: Path, rsa_key: SigningKey
) -> None:
    """``signers = ["vendor.pem"]``: ms_params, signed by the RSA key the host also trusts,
    is refused before any generation exists, naming the module's file, the signer's
    subject, certificate file and key identifier, and the signers allowed."""
    skid = skid_as_openssl_prints_it(rsa_key).replace(":", "").lower()
    assert take(both, module, ["vendor.pem"]) == (
        f"modules/ms_params.ko: signed by 'modstage rsa' ({rsa_key.cert_pem.name}, key "
        f'identifier {skid}); [bundles.demo] signers = ["vendor.pem"] allows only those',
    )
    assert list(both.store.iterdir()) == []


def test_the_signers_certificate_named_by_its_file_admits_it(
    both: Layout, module: Path, rsa_key: SigningKey
) -> None:
    """Naming the signer's certificate file in ``trusted.d`` (beside another) takes it in."""
    assert take(both, module, ["vendor.pem", rsa_key.cert_pem.name]) == ()


def test_the_signers_key_identifier_admits_it_as_openssl_or_modstage_verify_prints_it(
    both: Layout, module: Path, rsa_key: SigningKey, vendor_key: SigningKey, debian_target
) -> None:
    """The subjectKeyIdentifier as openssl prints it (upper case, colons) names the signer
    although the signature names its key by issuer and serial; so does that key id as
    ``modstage verify --json`` prints it. The other vendor's identifier does not."""
    refused = take(both, module, [skid_as_openssl_prints_it(vendor_key)])
    assert len(refused) == 1 and "signed by 'modstage rsa'" in refused[0]
    assert take(both, module, [skid_as_openssl_prints_it(rsa_key)]) == ()
    trust = TrustStore.from_directory(both.trusted)
    with module.open("rb") as f:
        key_id = verify_module(f, display="m", trust=trust, kernel=debian_target).key_id
    assert key_id is not None and key_id != skid_as_openssl_prints_it(rsa_key)
    assert take(both, module, [key_id]) == ()


def test_a_signer_named_by_key_identifier_when_the_module_is_signed_by_skid(
    both: Layout,
    modules: dict[str, Path],
    vendor_key: SigningKey,
    rsa_key: SigningKey,
    tmp_path: Path,
) -> None:
    """A module signed by the vendor's key with ``sign-file -k`` (the signature names the key
    by subjectKeyIdentifier) is taken in when ``signers`` names that identifier, and
    refused when it names only the other certificate's file."""
    signed = sign(modules["ms_params"], vendor_key, tmp_path / "ms_params.ko", skid=True)
    [why] = take(both, signed, [rsa_key.cert_pem.name])
    assert "signed by 'other vendor' (vendor.pem, key identifier" in why
    assert take(both, signed, [skid_as_openssl_prints_it(vendor_key)]) == ()


def test_other_bundles_and_a_bundle_without_signers_take_any_trusted_signer(
    both: Layout, signed: dict[str, Path]
) -> None:
    """``signers`` binds its own bundle only: another bundle's drop signed by the same key,
    and any drop under a config without ``signers``, is taken in."""
    assert take(both, signed["ms_exporter"], ["vendor.pem"], bundle="other") == ()
    assert take(both, signed["ms_params"], None) == ()


@pytest.mark.parametrize(
    "entry", ["", "nvidia", "abc", "/etc/modstage/trusted.d/nvidia.pem", "nvidia.key"]
)
def test_an_entry_that_names_no_certificate_is_a_config_problem(entry: str) -> None:
    """An entry that is neither hex (an even count of digits, colons allowed) nor a file name
    with a certificate suffix is a problem naming the key and the entry."""
    with pytest.raises(ConfigError) as info:
        Config.from_dict({"bundles": {"demo": {"signers": [entry]}}})
    [problem] = info.value.problems
    assert problem.startswith(f"bundles.demo.signers: {entry!r} is neither a key identifier")


def test_key_identifiers_and_certificate_files_are_read() -> None:
    """Hex in either case, with or without colons, and ``*.pem``/``.der``/``.crt``/``.cer``
    file names load as written."""
    entries = ["AB:CD:01", "abcd01", "nvidia.pem", "Vendor.DER", "x.crt", "y.cer"]
    config = Config.from_dict({"bundles": {"demo": {"signers": entries}}})
    assert config.bundle_policy("demo").signers == tuple(entries)
