"""How the oracle's guest reads the kernel's `module_load` events (tests/oracle/guest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.oracle import guest


def test_a_module_load_event_is_matched_by_the_whole_module_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only an event naming the module exactly counts (a prefix or a longer name does not),
    with or without taint flags after the name; an empty buffer holds none."""
    monkeypatch.setattr(guest, "TRACING", str(tmp_path))
    trace = tmp_path / "trace"
    trace.write_text(
        "# tracer: nop\n"
        "  python3-301 [000] .....  41.20: module_load: nvidia_modeset PO\n"
        "  python3-301 [000] .....  42.91: module_load: msorc_00007\n"
    )
    assert guest.init_was_called("nvidia_modeset") and guest.init_was_called("msorc_00007")
    assert not guest.init_was_called("nvidia") and not guest.init_was_called("msorc_0000")
    guest._empty_trace()
    assert trace.read_text() == "" and not guest.init_was_called("nvidia_modeset")
