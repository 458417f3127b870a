"""``modstage intake PATH``: a drop of any incoming directory the daemon watches, nothing else."""

from __future__ import annotations

import io
from pathlib import Path

from service.bundles.phase import Phase
from service.bundles.statefile import load
from service.cli import main
from stager.drop import ModuleSpec, stage
from tests.kmod import SigningKey, sign
from tests.service.fakes import make_host


def test_a_drop_of_a_configured_incoming_directory_is_taken(
    tmp_path: Path, kernel: str, modules: dict[str, Path], rsa_key: SigningKey
) -> None:
    """The operator's pod directory counts once configured; an unconfigured one is refused."""
    host = make_host(tmp_path / "root", kernel, rsa_key.cert_pem)
    pod, other = host.host("/run/nvidia/modstage/incoming"), host.host("/run/elsewhere")
    pod.mkdir(parents=True)
    other.mkdir(parents=True)
    host.config.parent.mkdir(parents=True, exist_ok=True)
    host.config.write_text(
        'incoming_dirs = ["/var/lib/modstage/incoming", "/run/nvidia/modstage/incoming"]\n'
    )
    module = [ModuleSpec(sign(modules["ms_exporter"], rsa_key, tmp_path / "m.ko"))]
    stray = stage(other, bundle="b", version="1", kernel=kernel, modules=module)
    drop = stage(pod, bundle="b", version="1", kernel=kernel, modules=module)
    out = io.StringIO()
    assert main(["intake", "--root", str(host.root), str(stray)], out) == 2  # usage
    assert stray.is_dir()
    assert main(["intake", "--root", str(host.root), str(drop)], out) == 0
    assert "pending b generation" in out.getvalue()
    assert load(host.state).bundle("b").phase is Phase.PENDING
