"""grub's fallbacks: a default that names no entry, or names a submenu, still boots a kernel.

grub-core/normal/menu.c's ``run_menu`` boots entry 0 of a menu whose ``default`` names no
entry of it (``default_entry < 0 || default_entry >= menu->size``), and
``grub_menu_execute_entry`` runs a submenu with the rest of the ``>`` path as its default
(nothing left: unset, so its entry 0). The next kernel is the kernel grub boots so, never
unknown, and the reboot gate judges the bundles against it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from service.bundles.state import State
from service.cli import main
from service.host.grub import Entry, Resolved, parse_env, resolve
from service.host.installed import InstalledKernel
from service.host.nextboot import GrubFiles, How, decide, next_kernel
from service.layout import Layout, kernel_image, modules_dir
from service.publish.announce import host_doc
from tests.service.test_reboot_required import KERNEL, active, ask, host

NEXT, OLD = "6.12.0-next", "6.1.0-old"
ADVANCED = "Advanced options for Debian GNU/Linux"

# grub-mkconfig's shape on Debian with GRUB_DEFAULT=saved: the newest kernel first, then the
# submenu with every kernel
CFG = f"""
if [ -s $prefix/grubenv ]; then
  load_env
fi
if [ "${{next_entry}}" ] ; then
   set default="${{next_entry}}"
   set next_entry=
   save_env next_entry
   set boot_once=true
else
   set default="${{saved_entry}}"
fi
menuentry 'Debian GNU/Linux' --class debian $menuentry_id_option 'gnulinux-simple-U' {{
	linux	/boot/vmlinuz-{NEXT} root=UUID=U ro quiet
}}
submenu '{ADVANCED}' $menuentry_id_option 'gnulinux-advanced-U' {{
	menuentry 'Debian GNU/Linux, with Linux {NEXT}' $menuentry_id_option 'gnulinux-{NEXT}-advanced-U' {{
		linux	/boot/vmlinuz-{NEXT} root=UUID=U ro quiet
	}}
	menuentry 'Debian GNU/Linux, with Linux {KERNEL}' $menuentry_id_option 'gnulinux-{KERNEL}-advanced-U' {{
		linux	/boot/vmlinuz-{KERNEL} root=UUID=U ro quiet
	}}
}}
"""
KERNELS = tuple(
    InstalledKernel(r, f"/boot/vmlinuz-{r}", f"/lib/modules/{r}") for r in (NEXT, KERNEL)
)
REMOVED = f"gnulinux-{OLD}-advanced-U"  # the id of a kernel's entry since removed


def env(**kv: str) -> dict[str, str]:
    """grubenv's variables as grub-editenv writes them."""
    body = "".join(f"{k}={v}\n" for k, v in kv.items())
    return parse_env(b"# GRUB Environment Block\n" + body.encode())


CASES = [
    # saved_entry, the title grub boots, words the fallback must say
    (REMOVED, "Debian GNU/Linux", (REMOVED, "grub.cfg's menu")),
    ("gnulinux-advanced-U", f"{ADVANCED}>Debian GNU/Linux, with Linux {NEXT}", (ADVANCED,)),
    (
        f"gnulinux-advanced-U>{REMOVED}",
        f"{ADVANCED}>Debian GNU/Linux, with Linux {NEXT}",
        (REMOVED, f"submenu {ADVANCED!r}"),
    ),
    ("7", "Debian GNU/Linux", ("'7'", "grub.cfg's menu")),
    ("gnulinux-simple-U>1", "Debian GNU/Linux", ("'1'",)),
]


@pytest.mark.parametrize(("saved", "title", "words"), CASES)
def test_a_default_grub_falls_back_from_names_the_kernel_grub_boots(
    saved: str, title: str, words: tuple[str, ...]
) -> None:
    """A saved_entry naming a removed kernel's id, a number past the menu, the submenu
    itself, a submenu path to a removed kernel, or a path going on past a plain entry: the
    next kernel is the one grub boots (that level's first entry; the entry itself), and
    ``fallback`` says what the default named and where."""
    got = decide(None, GrubFiles(CFG, env(saved_entry=saved)), KERNELS)
    assert (got.release, got.how, got.unknown, got.title) == (NEXT, How.SAVED_ENTRY, None, title)
    assert got.fallback is not None and all(w in got.fallback for w in words), got.fallback


def test_a_default_naming_the_entry_itself_is_no_fallback() -> None:
    """The submenu path to the running kernel's entry boots it and reports no fallback."""
    ref = f"gnulinux-advanced-U>gnulinux-{KERNEL}-advanced-U"
    got = decide(None, GrubFiles(CFG, env(saved_entry=ref)), KERNELS)
    assert (got.release, got.fallback) == (KERNEL, None)


def test_an_empty_submenu_boots_nothing_and_is_unknown() -> None:
    """grub runs an empty submenu's menu only when it has entries: a default naming one
    boots nothing, so the next kernel is unknown and says why."""
    cfg = "submenu 'empty' --id e {\n}\n" + CFG
    got = decide(None, GrubFiles(cfg, env(saved_entry="e")), KERNELS)
    assert got.release is None and got.unknown is not None and "no entries" in got.unknown


def _fallen_host(root: Path) -> Layout:
    """Running KERNEL with nvidia active, NEXT just installed and grub's saved_entry naming
    a removed kernel's entry; the host's reboot-required file written by the update."""
    layout = host(root, State({"nvidia": active()}))
    layout.boot.mkdir(parents=True, exist_ok=True)
    for release in (NEXT, KERNEL):
        kernel_image(layout, release).write_bytes(b"MZ")
        modules_dir(layout, release).mkdir(parents=True)
    layout.grub_cfg.parent.mkdir(parents=True, exist_ok=True)
    layout.grub_cfg.write_text(CFG)
    layout.grubenv.write_bytes(f"# GRUB Environment Block\nsaved_entry={REMOVED}\n".encode())
    layout.reboot_sentinel.parent.mkdir(parents=True, exist_ok=True)
    layout.reboot_sentinel.write_text("*** System restart required ***\n")
    return layout


def test_the_gate_holds_a_reboot_into_the_kernel_grub_falls_back_to(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """grub falls back to NEXT, where nvidia (active on the running kernel) has nothing:
    ``status --reboot-required`` holds the host's wanted reboot (exit 4) naming NEXT, plain
    status names NEXT as the next boot's kernel and says grub falls back, and ``_host.json``
    carries NEXT with the fallback, so a driver pod stages for it."""
    layout = _fallen_host(tmp_path)
    code, out, _ = ask(layout.root, capsys)
    assert code == 4, out
    assert f"held: the next boot runs kernel {NEXT} and nvidia has no generation for it" in out
    main(["status", "--root", str(layout.root)], sys.stdout)
    [line] = [x for x in capsys.readouterr().out.splitlines() if x.startswith("next boot:")]
    assert line.startswith(f"next boot: kernel {NEXT}, from grubenv's saved_entry")
    assert f"; grub falls back: {REMOVED!r} names no entry" in line
    doc = host_doc(layout, State({"nvidia": active()}), next_kernel(layout))
    assert (doc["next_kernel"], doc["bundles"]) == (NEXT, {"nvidia": {"next": "none"}})
    assert REMOVED in doc["next_kernel_fallback"]
    assert json.loads(json.dumps(doc)) == doc


def test_a_default_starting_with_digits_is_a_number_as_grub_reads_it() -> None:
    """grub reads a default with ``grub_strtoul`` first and matches titles only when it
    starts with no digit: ``1 rescue`` is entry 1, never the entry titled so; ``0x1`` is
    hex, ``01`` octal, and ``0xg`` no number (a title)."""
    entries = tuple(
        Entry(title, None, release)
        for title, release in (("1 rescue", "r0"), ("second", "r1"), ("0xg", "r2"))
    )
    for ref, release in (("1 rescue", "r1"), ("0x1", "r1"), ("01", "r1"), ("0xg", "r2")):
        found = resolve(entries, ref)
        assert isinstance(found, Resolved) and found.entry.release == release, ref
        assert found.fallback is None
