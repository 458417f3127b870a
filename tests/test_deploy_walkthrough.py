"""deploy/README.md's walk from a signing key to a GPU pool: its commands are real.

The key is made by the walkthrough's own ``openssl`` commands and builds an image with
``build-image`` (small real modules for this machine's kernel in place of NVIDIA's: the
real driver's build is tests/nvidia/test_build_image.py); the ``build-image`` command parses
as written and names the files step 1 makes; the certificate goes where modstage looks; the
pushed name is the built one and the operator's example names that repository.
"""

from __future__ import annotations

import io
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml
from buildimage.cli import main, parser

from service.layout import Layout
from tests.deploy.conftest import prebuilt
from tests.kmod import cache_root, kernel_release

ROOT = Path(__file__).resolve().parents[1]
SECTION = "## From a signing key to a GPU pool"


def steps() -> list[list[str]]:
    """The commands of the walkthrough's ``sh`` block, comments dropped."""
    text = (ROOT / "deploy/README.md").read_text()
    section = text[text.index(SECTION) :]
    [block] = re.findall(r"```sh\n(.*?)```", section, re.S)[:1]
    return [w for w in (shlex.split(line, comments=True) for line in block.splitlines()) if w]


def _one(program: str) -> list[str]:
    [found] = [words for words in steps() if Path(words[0]).name == program]
    return found


def test_the_walkthrough_key_signs_modules_build_image_packages(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Step 1's openssl commands, run as written, make a key and certificate that
    build-image signs with and modstage verify accepts (the image is written), and the DER
    form MokManager enrolls."""
    for words in steps():
        if words[0] == "openssl":
            subprocess.run(words, cwd=tmp_path, check=True, capture_output=True)
    der = subprocess.run(
        [
            "openssl",
            "x509",
            "-inform",
            "DER",
            "-in",
            "signing.der",
            "-noout",
            "-ext",
            "extendedKeyUsage",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "Code Signing" in der
    release = kernel_release()
    modules = prebuilt(tmp_path / "prebuilt", release, ["ms_params"])
    base = tmp_path / "base.tar"
    subprocess.run(["tar", "-cf", str(base), "-T", "/dev/null"], check=True)
    argv = ["--prebuilt", str(modules), "--version", "1.0", "--kernel", release]
    argv += ["--key", str(tmp_path / "signing.key"), "--cert", str(tmp_path / "signing.pem")]
    argv += ["--output", str(tmp_path / "out.oci.tar"), "--base", str(base)]
    assert main([*argv, "--cache", str(cache_root())], io.StringIO()) == 0, capsys.readouterr().err
    assert (tmp_path / "out.oci.tar").is_file()


def test_the_walkthrough_commands_fit_together() -> None:
    """build-image parses as written with step 1's files; the certificate is installed where
    modstage looks for trusted certificates; skopeo pushes the archive build-image writes
    under the name it was built with; the operator's example names that repository and
    image; the files it applies exist."""
    args = parser().parse_args(_one("build-image")[1:])
    assert (args.key, args.cert.name) == ("signing.key", "signing.pem")
    assert len(args.kernel) == 2
    assert args.tag.rsplit(":", 1)[1].startswith(args.driver.rsplit("-", 1)[0] + "-")
    install = _one("install")
    assert Path(install[-1]).parent == Layout(Path("/")).trusted
    skopeo = _one("skopeo")
    assert skopeo[2:] == [f"oci-archive:{args.output}", f"docker://{args.tag}"]
    [applied] = [w[-1] for w in steps() if w[0] == "kubectl"]
    [policy] = [
        doc["spec"]["driver"]
        for doc in yaml.safe_load_all((ROOT / applied).read_text())
        if doc and doc["kind"] == "ClusterPolicy"
    ]
    assert args.tag.startswith(f"{policy['repository']}/{policy['image']}:")
    assert _one("mokutil")[-1] == "signing.der"
