"""Under a sandbox ``--root`` status searches no kernel keyring (the sandbox's modules are not
for the running kernel, and it has no /proc/keys): each signer line says so calmly, and no
line says the keyrings cannot be searched."""

from __future__ import annotations

import io
from pathlib import Path

from service.bundles.statefile import load
from service.cli import main
from service.host.running import RunningHost
from service.layout import Layout
from service.status.signer_rows import NO_KEYRINGS, signer_rows
from tests.service.fakes import pending


def test_a_sandbox_searches_no_keyring_and_says_so_calmly(
    host: Layout, kernel: str, signed: dict[str, Path]
) -> None:
    """A sandbox with a pending generation of a signed module: its signer row has no keyring
    and the sandbox note; plain status shows the note on the signer line, as no problem,
    and never "cannot search the kernel's keyrings"."""
    assert RunningHost.read(host).sandboxed
    pending(host, kernel, [(signed["ms_params"], "")], version="1.0")
    bundle = load(host.state).bundle("test")
    [row] = signer_rows(host, bundle)  # the default keyrings: a sandbox's
    assert (row.keyring, row.note) == (None, NO_KEYRINGS)
    out = io.StringIO()
    main(["status", "--root", str(host.root)], out)
    text = out.getvalue().splitlines()
    assert not [ln for ln in text if "cannot search" in ln], text
    assert not [ln for ln in text if ln.startswith("  !") and "keyring" in ln], text
    signers = [ln for ln in text if ln.startswith("  signer of ")]
    assert signers and all(ln.endswith(f": {NO_KEYRINGS}") for ln in signers), text
