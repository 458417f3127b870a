"""An ML-DSA module signature, judged by the target's release and CONFIG_CRYPTO_MLDSA."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path

from service.errors import Refusal
from service.verify.signature.modsig import read_signature
from service.verify.targetkernel.kconfig import KernelConfig
from service.verify.targetkernel.kernel import Target

RSA = bytes.fromhex("06092a864886f70d010101")  # rsaEncryption, sign-file's SignerInfo algorithm
ML_DSA_65 = bytes.fromhex("0609608648016503040312")  # id-ml-dsa-65, as long


def _problems(data: bytes, target: Target) -> list[Refusal]:
    problems: list[Refusal] = []
    _, msg = read_signature(io.BytesIO(data), len(data), problems, target)
    assert msg is None
    return problems


def test_ml_dsa_is_a_kernel_refusal_or_a_policy_by_the_target(
    signed_rsa: Path, target: Target
) -> None:
    """A SignerInfo naming ML-DSA-65: 6.12's parser knows no such OID (ENOPKG, the kernel's);
    7.2's names it, and the verdict follows CONFIG_CRYPTO_MLDSA: without it the kernel has no
    verifier (a kernel refusal, EKEYREJECTED under enforcement), with it the kernel would
    verify the signature, so modstage's refusal is its named policy."""
    data = signed_rsa.read_bytes()
    assert data.count(RSA) == 1
    data = data.replace(RSA, ML_DSA_65)
    [old] = _problems(data, replace(target, release="6.12.117+deb13-amd64"))
    assert (old.errno, old.policy) == ("ENOPKG", False) and "ML-DSA" not in old.message
    off = replace(target, release="7.2.13+deb14-amd64",
                  config=KernelConfig.parse("# CONFIG_CRYPTO_MLDSA is not set\n", "test"))  # fmt: skip
    [refused] = _problems(data, off)
    assert (refused.errno, refused.enforced, refused.policy) == ("ENOPKG", "EKEYREJECTED", False)
    assert "ML-DSA-65 signature: the target kernel has no ML-DSA verifier" in refused.message
    on = replace(off, config=KernelConfig.parse("CONFIG_CRYPTO_MLDSA=y\n", "test"))
    [policy] = _problems(data, on)
    assert policy.policy and "not verified by modstage" in policy.message
