"""Plain ``status`` and ``status --reboot-required`` give one answer: the text view says
``reboot: unknown: <file> could not be read (<reason>)`` exactly when kured's sentinel
command exits 3 ("cannot tell"), naming the same file and reason."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from service.bundles.state import State
from service.cli import main
from service.layout import Layout
from service.status.required import UNKNOWN
from tests.hosts import KEEP, running_host
from tests.service.test_reboot_required import host, pending

CAUSES: list[tuple[str, Callable[[Layout], object]]] = [
    ("no kernel release", lambda layout: running_host(layout, None, KEEP)),
    ("empty kernel release", lambda layout: running_host(layout, "", KEEP)),
    ("no boot id", lambda layout: running_host(layout, KEEP, None)),
    ("corrupt state", lambda layout: layout.state.write_text("{not json")),
    (
        "invalid config",
        lambda layout: (layout.etc.mkdir(parents=True), layout.config.write_text("x = 1\n")),
    ),
]


def status(root: Path, *extra: str) -> tuple[int, str]:
    """``modstage status --root ROOT EXTRA...`` in this process: (exit code, stdout)."""
    out = io.StringIO()
    code = main(["status", "--root", str(root), *extra], out)
    return code, out.getvalue()


def sentinel(root: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """``status --reboot-required``: (exit code, why it cannot tell, or "")."""
    capsys.readouterr()
    code = main(["status", "--root", str(root), "--reboot-required"], io.StringIO())
    err = capsys.readouterr().err.strip()
    return code, err.partition("cannot tell: ")[2]


@pytest.mark.parametrize(("case", "spoil"), CAUSES, ids=[c[0] for c in CAUSES])
def test_plain_status_says_unknown_exactly_when_the_sentinel_cannot_tell(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    case: str,
    spoil: Callable[[Layout], object],
) -> None:
    """Over each cause: the sentinel exits 3, and plain status's reboot line (and its JSON
    ``reboot.unknown``) carries the very reason it printed; the host is not ``ok`` (an
    unreadable boot id alone leaves the grade to the bundles)."""
    layout = host(tmp_path, State({"nvidia": pending()}))  # waits for a reboot
    spoil(layout)
    code, why = sentinel(tmp_path, capsys)
    assert code == UNKNOWN and " could not be read (" in why, case
    exit_code, text = status(tmp_path)
    top = text.splitlines()
    assert top[1] == f"reboot: unknown: {why}", case
    if case != "no boot id":
        assert not top[0].startswith("host: ok") and exit_code != 0, case
    _, raw = status(tmp_path, "--json")
    assert json.loads(raw)["reboot"]["unknown"] == why, case


def test_when_the_sentinel_can_tell_plain_status_does_not_say_unknown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A readable host: the sentinel answers 0 (backend none, a generation waits) and plain
    status says the reboot is required, healthy, with ``reboot.unknown`` null."""
    host(tmp_path, State({"nvidia": pending()}))
    assert sentinel(tmp_path, capsys) == (0, "")
    exit_code, text = status(tmp_path)
    top = text.splitlines()
    assert top[0].startswith("host: ok") and top[1].startswith("reboot: required for nvidia")
    assert exit_code == 0
    _, raw = status(tmp_path, "--json")
    assert json.loads(raw)["reboot"]["unknown"] is None


def test_an_unreadable_kernel_release_is_a_degraded_host_problem(tmp_path: Path) -> None:
    """Without the running kernel's release the host is degraded (exit 1), and the problem
    names the file: nothing is checked against a kernel status cannot name."""
    layout = running_host(host(tmp_path, State({"nvidia": pending()})), None, KEEP)
    exit_code, raw = status(tmp_path, "--json")
    doc = json.loads(raw)
    assert (exit_code, doc["health"], doc["kernel"]) == (1, "degraded", None)
    reasons = [p["reason"] for p in doc["problems"] if p["bundle"] is None]
    assert any(r.startswith(f"{layout.os_release} could not be read (") for r in reasons)
