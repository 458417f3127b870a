"""build-image: nothing is written unless every module is signed and accepted by modstage
verify against its kernel's files; what is written is one OCI image with each kernel's
signed modules in /opt/modstage/modules/<release>/ and the build's report."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest
from buildimage.cli import main
from buildimage.oci import read_archive

from tests.deploy.conftest import prebuilt
from tests.kmod import SigningKey


def _build(
    tmp_path: Path, cache: Path, base: Path, key: str, cert: Path, release: str, names: list[str]
) -> tuple[int, str, str, Path]:
    """Run build-image on prebuilt small modules; (exit code, stdout, stderr, output)."""
    modules = prebuilt(tmp_path / "prebuilt", release, names)
    output = tmp_path / "out/driver.oci.tar"
    argv = ["--prebuilt", str(modules), "--version", "1.0", "--kernel", release]
    argv += ["--key", key, "--cert", str(cert), "--output", str(output), "--json"]
    argv += ["--base", str(base), "--cache", str(cache)]
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        err = io.StringIO()
        mp.setattr("sys.stderr", err)
        code = main(argv, out)
    return code, out.getvalue(), err.getvalue(), output


def test_a_wrong_key_for_the_certificate_fails_before_anything_is_written(
    tmp_path: Path,
    build_cache: Path,
    base: Path,
    key: SigningKey,
    other_key: SigningKey,
    release: str,
) -> None:
    """Another key than the certificate's (same subject, issuer and serial): the build
    stops at the first module, naming it and sign-file's reason; no archive exists."""
    code, _out, err, output = _build(
        tmp_path, build_cache, base, str(other_key.key), key.cert_pem, release, ["ms_params"]
    )
    assert code == 1
    assert "sign-file ms_params.ko failed" in err
    assert "private key does not match certificate" in err
    assert not output.exists() and not output.parent.exists()


def test_a_module_modstage_verify_refuses_is_never_packaged(
    tmp_path: Path, build_cache: Path, base: Path, key: SigningKey, release: str
) -> None:
    """ms_consumer imports ms_exporter's symbol; built without it, the kernel would refuse
    it at load: modstage verify says so, the build fails naming the module and the reason,
    and no archive exists."""
    code, _out, err, output = _build(
        tmp_path, build_cache, base, str(key.key), key.cert_pem, release, ["ms_consumer"]
    )
    assert code == 1, err
    assert f"kernel {release}: modstage verify refused ms_consumer.ko: ENOENT" in err
    assert "ms_exporter_value" in err
    assert not output.exists() and not output.parent.exists()


def test_accepted_modules_make_one_image_with_its_report(
    tmp_path: Path, build_cache: Path, base: Path, key: SigningKey, release: str
) -> None:
    """Both modules signed and accepted: the archive's image carries them, signed, in
    /opt/modstage/modules/<release>/ in load order with the module digests, kernel and
    signer in /opt/modstage/build.json and the labels; the environment names no single
    kernel (nvidia-driver takes the node's); the base's files come first."""
    names = ["ms_exporter", "ms_consumer"]
    code, out, err, output = _build(
        tmp_path, build_cache, base, str(key.key), key.cert_pem, release, names
    )
    assert code == 0, err
    report = json.loads(out)
    manifest, config, entries = read_archive(output)
    assert entries[:2] == ["etc/os-release", "bin/true"]
    for name in names:
        assert f"opt/modstage/modules/{release}/{name}.ko" in entries
    env = dict(e.split("=", 1) for e in config["config"]["Env"])
    assert env["DRIVER_VERSION"] == "1.0" and "KERNEL_VERSION" not in env
    assert env["MODSTAGE_MODULES"] == "ms_exporter ms_consumer"
    assert config["config"]["Labels"]["io.modstage.kernels"] == release
    assert config["config"]["Labels"]["io.modstage.signer"] == "CN=pool key"
    assert report["image"]["manifest"].startswith("sha256:")
    files = _layer_files(output, manifest)
    stored = json.loads(files["opt/modstage/build.json"])
    assert stored["kernels"] == report["kernels"]
    for name in names:
        data = files[f"opt/modstage/modules/{release}/{name}.ko"]
        assert data.endswith(b"~Module signature appended~\n")
        module = stored["kernels"][release]["modules"][f"{name}.ko"]
        assert module["sha256"] == hashlib.sha256(data).hexdigest()
        assert module["signer"] == "pool key" and module["hash"] == "sha256"


def test_a_second_run_with_the_same_inputs_writes_the_same_layers(
    tmp_path: Path, build_cache: Path, base: Path, key: SigningKey, release: str
) -> None:
    """Layers are reproducible (sorted, root's, times zero): the same modules signed again
    give the base and stager layers the same digests (a registry stores them once)."""
    layers = []
    for run in ("a", "b"):
        code, _out, err, output = _build(
            tmp_path / run, build_cache, base, str(key.key), key.cert_pem, release, ["ms_params"]
        )
        assert code == 0, err
        manifest, _config, _entries = read_archive(output)
        layers.append([layer["digest"] for layer in manifest["layers"]])
    assert layers[0][:3] == layers[1][:3]


def _layer_files(archive: Path, manifest: dict[str, object]) -> dict[str, bytes]:
    files: dict[str, bytes] = {}
    with tarfile.open(archive) as outer:
        for layer in manifest["layers"]:  # type: ignore[attr-defined]
            blob = outer.extractfile(f"blobs/sha256/{layer['digest'].removeprefix('sha256:')}")
            assert blob is not None
            with tarfile.open(fileobj=blob, mode="r:gz") as inner:
                for member in inner.getmembers():
                    if member.isfile():
                        f = inner.extractfile(member)
                        assert f is not None
                        files[member.name] = f.read()
    return files
