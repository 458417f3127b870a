"""``status/<bundle>.json`` has one type, :class:`stager.schema.statusfile.StatusFile`, for the
host that writes it and for ``wait`` and ``status`` that read it; its bytes did not change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.bundles.phase import Phase
from service.layout import Layout
from service.publish.bundle_status import write_status
from stager.schema.statusfile import GenerationInfo, StatusFile, StatusFileError
from stager.wait import judge
from tests.hosts import running_host
from tests.stager.test_wait import GEN, KERNEL, OLD, Awaited, failed, pending

# Written by the writer before the shared type (``**extra`` in service/publish/bundle_status.py).
OLD_REJECTED = """{
 "active": "@OLD@",
 "bundle": "nvidia",
 "drop": "nvidia.1.x",
 "errors": [
  "bad sig"
 ],
 "failed": {
  "@GEN@": "ENOKEY: not signed"
 },
 "generation": "@OLD@",
 "kernel": "6.1.0-test",
 "pending": null,
 "pending_kernel": null,
 "phase": "rejected",
 "reboot": {
  "at": 1.5,
  "backend": "kured",
  "boot_id": "b",
  "bundles": [
   "nvidia"
  ],
  "reason": "r"
 },
 "running_kernel": "6.1.0-test",
 "updated": 1764560000.123,
 "version": "2"
}
""".replace("@OLD@", OLD).replace("@GEN@", GEN)
OLD_PENDING = """{
 "active": "@OLD@",
 "bundle": "nvidia",
 "errors": [],
 "failed": {},
 "generation": "@GEN@",
 "pending": "@GEN@",
 "pending_kernel": "6.1.0-test",
 "phase": "pending",
 "running_kernel": "6.1.0-test",
 "updated": 1764560000.123
}
""".replace("@OLD@", OLD).replace("@GEN@", GEN)
REBOOT = {"at": 1.5, "backend": "kured", "boot_id": "b", "bundles": ["nvidia"], "reason": "r"}


def host(tmp_path: Path) -> Layout:
    """A layout whose running kernel is KERNEL."""
    return running_host(tmp_path, KERNEL, boot_id=None)


@pytest.mark.parametrize("text", [OLD_REJECTED, OLD_PENDING])
def test_a_file_written_by_the_old_writer_reads_back_byte_for_byte(text: str) -> None:
    """Every key the old writer wrote is read, and written back to the very same bytes."""
    status = StatusFile.from_json(text.encode(), "nvidia.json")
    assert status.to_json() == text.encode()


def test_the_writer_writes_what_the_old_writer_wrote(tmp_path: Path) -> None:
    """Same keys and values as before (the time aside), the optional keys only when given
    (``live`` where it is known);
    a rejection adds ``rejected`` (the drop and its first reason), kept by later writes, and
    ``taken`` (the drops taken in) is always written, empty here."""
    layout = host(tmp_path)
    write_status(
        layout,
        "nvidia",
        failed(),
        phase=Phase.REJECTED,
        errors=["bad sig"],
        drop="nvidia.1.x",
        version="2",
        kernel=KERNEL,
        reboot=REBOOT,
    )
    written = json.loads((layout.status / "nvidia.json").read_bytes())
    assert written.pop("updated") > 0
    expected = json.loads(OLD_REJECTED)
    del expected["updated"]
    assert written == {**expected, "rejected": {"nvidia.1.x": "bad sig"}, "taken": {}}
    write_status(layout, "nvidia", pending())
    written = json.loads((layout.status / "nvidia.json").read_bytes())
    assert written.pop("updated") > 0
    expected = {k: v for k, v in json.loads(OLD_PENDING).items() if k != "updated"}
    # its active generation has nothing recorded loaded and the bundle is not active: not live
    expected["live"] = False
    assert written == {**expected, "rejected": {"nvidia.1.x": "bad sig"}, "taken": {}}
    (layout.status / "nvidia.json").unlink()
    write_status(layout, "nvidia", pending())
    written = json.loads((layout.status / "nvidia.json").read_bytes())
    assert written.pop("updated") > 0
    assert written == {**expected, "taken": {}}


def test_wait_and_the_writer_share_the_type(tmp_path: Path) -> None:
    """What ``write_status`` returns is what ``wait`` reads from the file."""
    layout = host(tmp_path)
    status = write_status(layout, "nvidia", pending(), reboot=REBOOT)
    assert StatusFile.read(layout.status / "nvidia.json") == status
    assert judge(status, Awaited(GEN)).message == f"pending (generation {GEN[:12]})"


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        ([], "is not a JSON object"),
        ({"bundle": "nvidia"}, "phase: missing"),
        ({"bundle": "nvidia", "phase": 3}, "phase: must be a string, not an integer"),
        (
            {"bundle": "nvidia", "phase": "active", "updated": True},
            "updated: must be a number, not a boolean",
        ),
        (
            {"bundle": "nvidia", "phase": "active", "errors": "x"},
            "errors: must be an array of strings, not a string",
        ),
        (
            {"bundle": "nvidia", "phase": "active", "failed": {GEN: 1}},
            f"failed.{GEN}: must be a string, not an integer",
        ),
        (
            {"bundle": "nvidia", "phase": "active", "reboot": []},
            "reboot: must be a table or null, not an array",
        ),
        (
            {"bundle": "nvidia", "phase": "active", "generations": {GEN: {}}},
            f"generations.{GEN}.version: missing",
        ),
    ],
)
def test_a_bad_file_is_refused_naming_the_file_and_the_key(
    tmp_path: Path, doc: object, words: str
) -> None:
    """A known key of the wrong type (or no phase) is an error naming the file and the key."""
    path = tmp_path / "nvidia.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(StatusFileError, match=str(path)) as info:
        StatusFile.read(path)
    assert words in str(info.value)


def test_garbage_is_refused_and_a_missing_file_is_none(tmp_path: Path) -> None:
    """Not JSON: an error naming the file; no file: None (the host has not written yet)."""
    path = tmp_path / "nvidia.json"
    assert StatusFile.read(path) is None
    path.write_text("{")
    with pytest.raises(StatusFileError, match=f"{path}: unreadable status file"):
        StatusFile.read(path)


def test_unknown_keys_are_ignored_and_missing_ones_take_defaults() -> None:
    """A host of another version may write more or fewer keys: wait still judges the file."""
    doc = {"bundle": "nvidia", "phase": "active", "active": GEN, "future_key": {"x": 1}}
    status = StatusFile.from_dict(doc)
    assert status == StatusFile("nvidia", "active", active=GEN)
    assert judge(status, Awaited(GEN)).code == 0


def test_a_pods_copy_carries_the_generations() -> None:
    """The copy published for a pod (``generations``) reads and writes back unchanged."""
    gens = {GEN: GenerationInfo("2", KERNEL, "ENOKEY"), OLD: GenerationInfo("1", KERNEL)}
    status = StatusFile("nvidia", "active", active=OLD, generations=gens)
    assert StatusFile.from_json(status.to_json()) == status
    assert json.loads(status.to_json())["generations"][OLD] == {
        "version": "1",
        "kernel": KERNEL,
        "failed": None,
    }
