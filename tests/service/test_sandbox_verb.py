"""``modstage sandbox`` lays out a root the host commands run on, and docs/sandbox.md's cycle
(sandbox, stage, intake, boot, status) ends healthy when run exactly as written."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from service.cli import main
from service.host.running import RunningHost
from service.layout import Layout, kernel_config, kernel_image, modules_dir
from service.verify.targetkernel.kernel import Target
from stager.drop import ModuleSpec, stage
from tests.hosts import KEEP, running_host
from tests.kmod import SigningKey, sign

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs/sandbox.md"


def documented_commands(heading: str = "### A whole cycle") -> list[str]:
    """The commands of the first ``sh`` block under ``heading`` in docs/sandbox.md, each
    continued line joined to its command."""
    text = DOC.read_text()
    section = text[text.index(heading) :]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None, f"docs/sandbox.md: no sh block under {heading!r}"
    return [" ".join(c.split()) for c in block[1].replace("\\\n", " ").splitlines() if c.strip()]


def test_the_documented_module_and_key_come_from_a_clone(tmp_path: Path, kernel: str) -> None:
    """The doc's block that builds ``ms_params.ko`` from the clone's test sources and signs
    it with a fresh key runs as written (``CLONE`` this repository, ``RELEASE`` the headers'
    kernel); the sandbox it leads to trusts that key, and intake takes the module in."""
    env = {**os.environ, "CLONE": str(REPO), "RELEASE": kernel, "PYTHONPATH": str(REPO)}
    for command in documented_commands("### The module and the key, from a clone"):
        run = subprocess.run(
            ["sh", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert run.returncode == 0, f"{command}\n{run.stdout}{run.stderr}"
    assert b"~Module signature appended~" in (tmp_path / "ms_params.ko").read_bytes()
    root = tmp_path / "root"
    trust = str(tmp_path / "signing_key.pem")
    assert main(["sandbox", str(root), "--kernel", kernel, "--trust", trust], io.StringIO()) == 0
    stage(
        Layout(root).incoming,
        bundle="demo",
        version="1",
        kernel=kernel,
        modules=[ModuleSpec(tmp_path / "ms_params.ko")],
    )
    assert main(["intake", "--root", str(root)], io.StringIO()) == 0


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``modstage ARGV`` in-process: its exit code, stdout and stderr."""
    out = io.StringIO()
    code = main(argv, out)
    return code, out.getvalue(), capsys.readouterr().err


def test_the_documented_cycle_ends_healthy(
    tmp_path: Path, kernel: str, modules: dict[str, Path], rsa_key: SigningKey
) -> None:
    """Each command of the doc's block exits 0 run as written (with ``modstage`` on PATH, a
    module built for the Debian headers' kernel and signed by the test kit), in the doc's
    order sandbox, stage, intake, boot, status; status then says the host is healthy and
    the module live with the srcversion intake recorded."""
    commands = documented_commands()
    verbs = [c.split()[1] for c in commands]
    assert verbs == ["sandbox", "stage", "intake", "boot", "status"]
    shim = tmp_path / "bin/modstage"
    shim.parent.mkdir()
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m service.cli "$@"\n')
    shim.chmod(0o755)
    shutil.copyfile(rsa_key.cert_pem, tmp_path / "signing_key.pem")
    sign(modules["ms_params"], rsa_key, tmp_path / "ms_params.ko")
    env = {
        **os.environ,
        "PATH": f"{shim.parent}:{os.environ['PATH']}",
        "PYTHONPATH": str(REPO),
        "RELEASE": kernel,
    }
    env.pop("NOTIFY_SOCKET", None)
    done = []
    for command in commands:
        run = subprocess.run(
            ["sh", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        done.append(run)
        assert run.returncode == 0, f"{command}\n{run.stdout}{run.stderr}"
    assert done[-1].stdout.startswith("host: ok"), done[-1].stdout
    root = tmp_path / "root"
    status = subprocess.run(
        [str(shim), "status", "--root", str(root), "--json"],
        env=env,
        capture_output=True,
        text=True,
    )
    doc = json.loads(status.stdout)
    assert (status.returncode, doc["health"]) == (0, "healthy")
    (loaded,) = doc["bundles"]["demo"]["loaded"]
    assert loaded["module"] == "ms_params" and loaded["live"]["srcversion"] == loaded["srcversion"]


def test_the_sandbox_holds_the_docs_table(
    tmp_path: Path, kernel: str, rsa_key: SigningKey, capsys: pytest.CaptureFixture[str]
) -> None:
    """The laid-out root holds docs/sandbox.md's table: the certificate's copy, the release
    and a boot id under proc, the two sys files, an empty incoming, and the host's module
    tree, config and image, read through the links as verification reads them (the real
    vermagic and config)."""
    root = tmp_path / "sandbox"
    code, out, err = cli(
        ["sandbox", str(root), "--kernel", kernel, "--trust", str(rsa_key.cert_pem)], capsys
    )
    assert code == 0, err
    layout = Layout(root)
    trusted = layout.trusted / rsa_key.cert_pem.name
    assert trusted.read_bytes() == rsa_key.cert_pem.read_bytes() and not trusted.is_symlink()
    assert RunningHost.read(layout).need_release() == kernel
    assert uuid.UUID(layout.boot_id.read_text().strip())
    assert (layout.sys / "devices/system/memory/auto_online_blocks").read_text() == "offline\n"
    assert (layout.sys / "module/firmware_class/parameters/path").read_text() == "\n"
    assert list(layout.incoming.iterdir()) == []
    host = Layout(Path("/"))
    tree = modules_dir(layout, kernel)
    assert {p.name for p in tree.iterdir()} == {p.name for p in modules_dir(host, kernel).iterdir()}
    assert (tree / "modules.dep").read_bytes() == (
        modules_dir(host, kernel) / "modules.dep"
    ).read_bytes()
    assert kernel_config(layout, kernel) == root / f"boot/config-{kernel}"
    assert kernel_image(layout, kernel).resolve() == kernel_image(host, kernel).resolve()
    target = Target.from_layout(layout, kernel)
    assert target.vermagic is not None and target.vermagic.startswith(kernel)
    assert target.config.known
    assert f"sandbox {root}: kernel {kernel}" in out


def test_a_sandbox_again_adds_only_what_it_lacks(
    tmp_path: Path, kernel: str, rsa_key: SigningKey, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a sandbox, ``sandbox`` keeps what is there (a changed boot id, the state) and lays
    out only what was removed."""
    root = tmp_path / "sandbox"
    argv = ["sandbox", str(root), "--kernel", kernel, "--trust", str(rsa_key.cert_pem)]
    assert cli(argv, capsys)[0] == 0
    layout = Layout(root)
    running_host(layout, KEEP, "kept")
    layout.state.write_text("{}")
    shutil.rmtree(layout.incoming)
    code, out, _ = cli(argv, capsys)
    assert code == 0 and "1 paths laid out" in out
    assert layout.boot_id.read_text() == "kept\n" and layout.state.read_text() == "{}"
    assert layout.incoming.is_dir()


@pytest.mark.parametrize("problem", ["root", "release", "key", "bogus"])
def test_what_sandbox_refuses_is_one_line_exit_2_and_nothing_written(
    problem: str,
    tmp_path: Path,
    kernel: str,
    rsa_key: SigningKey,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A ROOT holding files that is no sandbox, a RELEASE the host has no tree for (the
    path named), a CERT that is no certificate (its key file) and ``/`` itself are usage
    errors: exit 2, one line naming the argument, nothing created (``/``: see below)."""
    root = tmp_path / "sandbox"
    release, cert = kernel, rsa_key.cert_pem
    if problem == "root":
        root.mkdir()
        (root / "notes.txt").write_text("mine\n")
    elif problem == "release":
        release = "0.0.0-nosuch"
    elif problem == "key":
        cert = rsa_key.key
    else:  # a certificate block that holds no certificate
        cert = tmp_path / "bogus.pem"
        cert.write_text("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    before = sorted(tmp_path.rglob("*"))
    code, out, err = cli(["sandbox", str(root), "--kernel", release, "--trust", str(cert)], capsys)
    expected = {
        "root": f"{root} exists and is not empty nor a modstage sandbox",
        "release": f"--kernel {release}: no module tree for it: /lib/modules/{release} does not",
        "key": f"--trust {cert}: not a PEM or DER certificate",
        "bogus": f"--trust {cert}: not a PEM or DER certificate",
    }[problem]
    assert (code, out) == (2, "")
    assert expected in err and len(err.splitlines()) == 1, err
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.parametrize("spelled", ["/", "/tmp/.."])
def test_the_host_itself_is_never_a_sandbox(spelled: str, kernel: str, rsa_key: SigningKey) -> None:
    """``/`` however spelled is refused by the plan and again by the writer (each tested
    alone, never run on the host: the writer is given nothing to write)."""
    from service.cmd.sandbox import apply, plan
    from service.errors import UsageError

    with pytest.raises(UsageError, match="this host's own root, not a sandbox"):
        plan(Path(spelled), kernel, rsa_key.cert_pem)
    with pytest.raises(UsageError, match="this host's own root, not a sandbox"):
        apply(Path(spelled), [])
