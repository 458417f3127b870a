"""Which kernel the next boot runs: read from real grub files of Debian 12 and 13.

The fixtures under ``data/grub`` are grub-mkconfig's and grub-editenv's own output
(``data/grub/README.md`` says where each came from and how it was made). In them the default
is the *older* kernel's submenu entry, by id, while grubenv holds a one-time ``next_entry=0``
(the newer kernel): a reader that ignores grubenv, takes ``GRUB_DEFAULT`` from
``/etc/default/grub`` or the newest kernel gets these wrong.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from service.host import grub
from service.host.installed import InstalledKernel, compare_versions, installed, newest
from service.host.nextboot import GrubFiles, How, decide, next_kernel, read_grub
from service.layout import Layout
from tests.hosts import running_host
from tests.strategies import debian_versions

DATA = Path(__file__).parent / "data" / "grub"
BOOKWORM = ("6.12.95+deb12-amd64", "6.1.0-50-amd64")
TRIXIE = ("7.3.4+deb13-amd64", "6.12.117+deb13-amd64")
ADVANCED = "Advanced options for Debian GNU/Linux"
CACHED = Path.home() / ".cache/modstage-test/roots"


def kernels(*releases: str, image: bool = True) -> tuple[InstalledKernel, ...]:
    """Installed kernels, each with a module tree and (``image``) an image."""
    return tuple(
        InstalledKernel(r, f"/boot/vmlinuz-{r}" if image else None, f"/lib/modules/{r}")
        for r in releases
    )


def files(cfg: str, env: str) -> GrubFiles:
    """A fixture grub.cfg and grubenv, read as the host's are."""
    return GrubFiles((DATA / cfg).read_text(), grub.parse_env((DATA / env).read_bytes()))


def sandbox(root: Path, cfg: str | None, env: str | None, releases: tuple[str, ...]) -> Layout:
    """A root with ``releases`` installed (image and module tree) and the fixture grub files."""
    for release in releases:
        (root / "boot").mkdir(parents=True, exist_ok=True)
        (root / f"boot/vmlinuz-{release}").write_bytes(b"MZ")
        (root / f"lib/modules/{release}/kernel").mkdir(parents=True)
    (root / "boot/grub").mkdir(parents=True, exist_ok=True)
    if cfg is not None:
        shutil.copy(DATA / cfg, root / "boot/grub/grub.cfg")
    if env is not None:
        shutil.copy(DATA / env, root / "boot/grub/grubenv")
    return Layout(root)


CASES = [
    # cfg, env, release, how, title
    ("bookworm/grub.cfg", "bookworm/grubenv", BOOKWORM[0], How.NEXT_ENTRY, "Debian GNU/Linux"),
    (
        "bookworm/grub.cfg",
        "grubenv-empty",
        BOOKWORM[1],
        How.GRUB_DEFAULT,
        f"{ADVANCED}>Debian GNU/Linux, with Linux 6.1.0-50-amd64",
    ),
    # GRUB_DEFAULT=0: saved_entry is not read
    (
        "trixie/grub-0.cfg",
        "trixie/grubenv-saved-title",
        TRIXIE[0],
        How.GRUB_DEFAULT,
        "Debian GNU/Linux",
    ),
    ("trixie/grub.cfg", "trixie/grubenv", TRIXIE[0], How.NEXT_ENTRY, "Debian GNU/Linux"),
    (
        "trixie/grub.cfg",
        "grubenv-empty",
        TRIXIE[1],
        How.GRUB_DEFAULT,
        f"{ADVANCED}>Debian GNU/Linux, with Linux 6.12.117+deb13-amd64",
    ),
    # GRUB_DEFAULT=saved with saved_entry by title path, id path and number path
    ("bookworm/grub-saved.cfg", "bookworm/grubenv-saved-title", BOOKWORM[1], How.SAVED_ENTRY, None),
    ("bookworm/grub-saved.cfg", "bookworm/grubenv-saved-id", BOOKWORM[1], How.SAVED_ENTRY, None),
    (
        "bookworm/grub-saved.cfg",
        "bookworm/grubenv-saved-number",
        BOOKWORM[1],
        How.SAVED_ENTRY,
        f"{ADVANCED}>Debian GNU/Linux, with Linux 6.1.0-50-amd64",
    ),
    ("trixie/grub-saved.cfg", "trixie/grubenv-saved-title", TRIXIE[1], How.SAVED_ENTRY, None),
    # no saved_entry yet: grub boots the first entry
    ("trixie/grub-saved.cfg", "grubenv-empty", TRIXIE[0], How.SAVED_ENTRY, "Debian GNU/Linux"),
    # next_entry wins over saved_entry, once
    (
        "trixie/grub-saved.cfg",
        "trixie/grubenv-saved-and-next",
        TRIXIE[0],
        How.NEXT_ENTRY,
        f"{ADVANCED}>Debian GNU/Linux, with Linux 7.3.4+deb13-amd64",
    ),
    (
        "trixie/grub.cfg",
        "trixie/grubenv-next-recovery",
        TRIXIE[0],
        How.NEXT_ENTRY,
        f"{ADVANCED}>Debian GNU/Linux, with Linux 7.3.4+deb13-amd64 (recovery mode)",
    ),
]


@pytest.mark.parametrize(("cfg", "env", "release", "how", "title"), CASES)
def test_real_grub_files_name_the_next_kernel_and_how(
    cfg: str, env: str, release: str, how: How, title: str | None
) -> None:
    """On Debian 12's and 13's own grub.cfg and grubenv, the release is the one grub boots
    (next_entry over saved_entry over grub.cfg's default; numbers, titles and ids through
    the submenu), and ``how`` names which of them decided it."""
    installed_ = kernels(*(BOOKWORM if cfg.startswith("bookworm") else TRIXIE))
    got = decide(None, files(cfg, env), installed_)
    assert (got.release, got.how, got.unknown) == (release, how, None)
    assert got.title is not None and got.entry is not None
    assert got.title == title if title is not None else release in got.title


def test_a_stale_saved_entry_boots_the_submenus_first_entry_naming_it() -> None:
    """A saved_entry naming a removed kernel's entry in the submenu boots that submenu's
    first entry, as grub falls back; the fallback names the entry and the submenu
    searched."""
    got = decide(
        None, files("bookworm/grub-saved.cfg", "bookworm/grubenv-saved-stale"), kernels(*BOOKWORM)
    )
    assert (got.release, got.how, got.unknown) == (BOOKWORM[0], How.SAVED_ENTRY, None)
    assert got.title == f"{ADVANCED}>Debian GNU/Linux, with Linux {BOOKWORM[0]}"
    assert got.fallback is not None
    assert "6.1.0-40-amd64" in got.fallback and f"submenu {ADVANCED!r}" in got.fallback


def test_an_entry_whose_kernel_has_no_image_is_unknown() -> None:
    """grub's default names 6.1.0-50-amd64, whose vmlinuz is gone (only its module tree is
    left): the next kernel is unknown, and the reason says no image."""
    installed_ = kernels(BOOKWORM[0]) + kernels(BOOKWORM[1], image=False)
    got = decide(None, files("bookworm/grub.cfg", "grubenv-empty"), installed_)
    assert got.release is None and got.unknown is not None
    assert "no image" in got.unknown and BOOKWORM[1] in got.unknown


def test_the_config_names_the_kernel_over_grub() -> None:
    """``[kernel] next`` decides over grub's files; one naming a kernel without an image is
    unknown, never taken on trust."""
    grub_files = files("bookworm/grub.cfg", "bookworm/grubenv")
    got = decide(BOOKWORM[1], grub_files, kernels(*BOOKWORM))
    assert (got.release, got.how, got.unknown) == (BOOKWORM[1], How.CONFIG, None)
    missing = decide("6.1.0-40-amd64", grub_files, kernels(*BOOKWORM))
    assert missing.release is None and missing.how is How.CONFIG
    assert missing.unknown is not None and "no image" in missing.unknown


def test_without_grub_the_newest_installed_image_boots_in_dpkg_order() -> None:
    """No grub.cfg: the newest installed kernel with an image, by dpkg's order (6.1.0-50
    after 6.1.0-9, 6.12 after 6.1), where string order would pick 6.1.0-9; a newer kernel
    without an image is passed over."""
    installed_ = kernels("6.1.0-9-amd64", "6.1.0-50-amd64") + kernels("7.0-amd64", image=False)
    got = decide(None, None, installed_)
    assert (got.release, got.how) == ("6.1.0-50-amd64", How.NEWEST_INSTALLED)
    got = decide(None, None, kernels("6.1.0-50-amd64", "6.12.95+deb12-amd64"))
    assert got.release == "6.12.95+deb12-amd64"
    nothing = decide(None, None, kernels("7.0-amd64", image=False))
    assert nothing.release is None and nothing.unknown is not None


def test_the_layout_reads_grub_and_the_installed_kernels_under_its_root(tmp_path: Path) -> None:
    """next_kernel reads /boot/grub and /boot, /lib/modules under the root: Debian 12's real
    files give the next_entry's kernel; with grub.cfg removed, the newest installed one."""
    layout = sandbox(tmp_path, "bookworm/grub.cfg", "bookworm/grubenv", BOOKWORM[::-1])
    assert next_kernel(layout).release == BOOKWORM[0]
    assert next_kernel(layout).how is How.NEXT_ENTRY
    (tmp_path / "boot/grub/grubenv").unlink()  # no grubenv: grub reads an empty one
    assert next_kernel(layout).release == BOOKWORM[1]
    (tmp_path / "boot/grub/grub.cfg").unlink()
    got = next_kernel(layout)
    assert (got.release, got.how) == (BOOKWORM[0], How.NEWEST_INSTALLED)


@pytest.mark.skipif(not CACHED.is_dir(), reason="no cached Debian roots")
@pytest.mark.parametrize(
    ("pattern", "release"),
    [("grub-bookworm-*", BOOKWORM[0]), ("grub-trixie-*", TRIXIE[0])],
)
def test_a_real_debian_root_read_in_place(pattern: str, release: str) -> None:
    """A whole Debian root (read only): its grubenv's next_entry=0 names the newer kernel,
    and both installed kernels are listed with image and module tree (merged /usr)."""
    roots = sorted(CACHED.glob(pattern))
    if not roots:
        pytest.skip(f"no {pattern} root cached")
    layout = Layout(roots[0])
    got = next_kernel(layout)
    assert (got.release, got.how) == (release, How.NEXT_ENTRY)
    listed = installed(layout)
    assert listed[0].release == release and len(listed) == 2
    assert all(k.image and k.modules for k in listed)


def test_installed_kernels_lists_images_and_module_trees(tmp_path: Path) -> None:
    """Every release with an image or a module tree (either /lib/modules or, alone,
    /usr/lib/modules) is listed once, newest first, saying which it has; dpkg's temporary
    files and odd names are not kernels."""
    (tmp_path / "boot").mkdir()
    for name in ("vmlinuz-6.1.0-50-amd64", "vmlinuz-6.1.0-9-amd64", "vmlinuz-x.dpkg-tmp"):
        (tmp_path / "boot" / name).write_bytes(b"MZ")
    (tmp_path / "boot/vmlinuz-").write_bytes(b"MZ")
    (tmp_path / "lib/modules/6.1.0-50-amd64").mkdir(parents=True)
    (tmp_path / "usr/lib/modules/6.12.95+deb12-amd64").mkdir(parents=True)
    got = installed(Layout(tmp_path))
    assert [k.release for k in got] == ["6.12.95+deb12-amd64", "6.1.0-50-amd64", "6.1.0-9-amd64"]
    assert [(bool(k.image), bool(k.modules)) for k in got] == [
        (False, True),
        (True, True),
        (True, False),
    ]


def test_a_fifo_or_huge_grub_cfg_is_unreadable_not_a_hang(tmp_path: Path) -> None:
    """grub.cfg as a FIFO is refused without blocking; one past the size cap is refused;
    both say why and name no kernel. A grubenv that is a directory is unreadable too."""
    layout = sandbox(tmp_path, None, None, BOOKWORM)
    os.mkfifo(layout.grub_cfg)
    got = next_kernel(layout)
    assert got.release is None and got.unknown is not None and "not a regular" in got.unknown
    layout.grub_cfg.unlink()
    layout.grub_cfg.write_bytes(b"#" * (grub.MAX_CFG_BYTES + 1))
    got = next_kernel(layout)
    assert got.unknown is not None and "larger than" in got.unknown
    shutil.copy(DATA / "bookworm/grub.cfg", layout.grub_cfg)
    layout.grubenv.mkdir()
    got = next_kernel(layout)
    assert got.release is None and got.unknown is not None and "grubenv" in got.unknown


def test_a_block_without_grubs_signature_sets_nothing() -> None:
    """grub's load_env refuses a block that does not start with its signature, so a
    next_entry in such a file changes nothing. In a real block (grub-editenv's, with a
    backslash and a newline in a value) the escapes are undone."""
    real = (DATA / "bookworm/grubenv").read_bytes()
    assert grub.parse_env(real) == {"next_entry": "0"}
    damaged = real.replace(b"# GRUB Environment Block", b"# GRUB environment block", 1)
    assert grub.parse_env(damaged) == {}
    cfg = (DATA / "bookworm/grub.cfg").read_text()
    got = decide(None, GrubFiles(cfg, grub.parse_env(damaged)), kernels(*BOOKWORM))
    assert (got.release, got.how) == (BOOKWORM[1], How.GRUB_DEFAULT)
    block = (DATA / "grubenv-escaped").read_bytes()
    assert grub.parse_env(block) == {"saved_entry": "a\\b\nc", "next_entry": "1"}


def test_grub_entry_paths_resolve_as_grub_resolves_them() -> None:
    """Numbers (decimal, 0x hex) index one menu, submenus counting; '>' walks into a
    submenu and '>>' is a '>' in a title; a path ending at a submenu boots its first entry,
    one going on past a plain entry boots that entry, a number past the end the first
    entry, each saying so; an empty menu boots nothing."""
    menu = grub.parse_menu((DATA / "bookworm/grub.cfg").read_text())
    path = grub.resolve(menu.entries, "0x1>3")
    assert isinstance(path, grub.Resolved) and path.entry.release == BOOKWORM[1]
    assert "recovery" in path.title
    odd = (grub.Entry("a>b", None, "1.0"),)
    found = grub.resolve(odd, "a>>b")
    assert isinstance(found, grub.Resolved) and found.entry.release == "1.0"
    assert path.fallback is None
    first = f"{ADVANCED}>Debian GNU/Linux, with Linux {BOOKWORM[0]}"
    for ref, title in (("1", first), ("0>1", "Debian GNU/Linux"), ("2", "Debian GNU/Linux")):
        found = grub.resolve(menu.entries, ref)
        assert isinstance(found, grub.Resolved) and found.title == title
        assert found.fallback is not None
    assert isinstance(grub.resolve((), "0"), str)


def test_a_default_from_another_variable_is_not_guessed() -> None:
    """``set default="${chosen}"`` (a variable grub-mkconfig never writes there) is
    unknown, naming the variable."""
    cfg = (DATA / "bookworm/grub.cfg").read_text() + '\nset default="${chosen}"\n'
    got = decide(None, GrubFiles(cfg, {}), kernels(*BOOKWORM))
    assert got.release is None and got.unknown is not None and "${chosen}" in got.unknown


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400), st.binary(max_size=300))
def test_no_grub_cfg_or_grubenv_makes_it_raise(cfg: str, env: bytes) -> None:
    """Any text as grub.cfg and any bytes as grubenv give an answer, never an exception;
    unbalanced braces and broken quoting are skipped."""
    real = (DATA / "trixie/grub.cfg").read_text()
    for text in (cfg, real[: len(cfg)] + cfg, "}\n" + cfg + "\nmenuentry 'x {\n"):
        got = decide(None, GrubFiles(text, grub.parse_env(grub.ENV_SIGNATURE + env)), ())
        assert (got.release is None) == (got.unknown is not None)


PAIRS = [
    ("6.1.0-50-amd64", "6.1.0-9-amd64"),
    ("6.12.95+deb12-amd64", "6.1.0-50-amd64"),
    ("7.3.4+deb13-amd64", "6.12.117+deb13-amd64"),
    ("6.12.117+deb13-amd64", "6.12.117+deb13-cloud-amd64"),
    ("6.1.0-50-rt-amd64", "6.1.0-50-amd64"),
    ("6.13~rc1-amd64", "6.13-amd64"),
    ("1:1.0", "2.0"),
    ("1.0~", "1.0"),
    ("1.0a", "1.0+"),
]


def _dpkg(a: str, b: str) -> int:
    """``dpkg --compare-versions``'s sign for (a, b); 2 when dpkg rejects a version."""
    for sign, op in ((-1, "lt"), (0, "eq"), (1, "gt")):
        done = subprocess.run(["dpkg", "--compare-versions", a, op, b], capture_output=True)
        if done.returncode == 0 and not done.stderr:
            return sign
        if done.stderr:
            return 2
    return 2


def _sign(n: int) -> int:
    return (n > 0) - (n < 0)


needs_dpkg = pytest.mark.skipif(shutil.which("dpkg") is None, reason="dpkg not installed")


@needs_dpkg
@pytest.mark.parametrize(("a", "b"), PAIRS)
def test_versions_order_as_dpkg_orders_them(a: str, b: str) -> None:
    """Kernel releases compare as ``dpkg --compare-versions`` compares them, both ways."""
    assert _sign(compare_versions(a, b)) == _dpkg(a, b)
    assert _sign(compare_versions(b, a)) == _dpkg(b, a)


@needs_dpkg
@settings(max_examples=150, deadline=None)
@given(debian_versions, debian_versions)
def test_any_two_versions_order_as_dpkg_orders_them(a: str, b: str) -> None:
    """For generated versions (epochs, revisions, '~', '+', letters) the sign of the
    comparison is dpkg's own."""
    expected = _dpkg(a, b)
    assume(expected != 2)
    assert _sign(compare_versions(a, b)) == expected


def test_newest_is_not_string_order() -> None:
    """String order puts 6.1.0-9 last; dpkg's puts 6.1.0-50 there."""
    assert newest(["6.1.0-50-amd64", "6.1.0-9-amd64"]) == "6.1.0-50-amd64"
    assert newest([]) is None


def test_read_grub_is_none_without_grub_cfg(tmp_path: Path) -> None:
    """No grub.cfg at all is not an error: the caller falls back to the installed kernels."""
    assert read_grub(Layout(tmp_path)) is None


def test_status_shows_the_next_kernel_how_and_the_installed_ones(tmp_path: Path) -> None:
    """``modstage status`` names the next boot's kernel and where it was read, plain and in
    ``--json``, and lists the installed kernels marking the running one, the next boot's and
    what each lacks; ``[kernel] next`` in the config changes both."""
    import io
    import json

    from service.cli import main

    layout = sandbox(tmp_path, "bookworm/grub.cfg", "bookworm/grubenv", BOOKWORM)
    (tmp_path / "boot/vmlinuz-6.1.0-40-amd64").write_bytes(b"MZ")  # its modules removed
    layout.config.parent.mkdir(parents=True)
    running_host(layout, BOOKWORM[1], boot_id=None)
    out = io.StringIO()
    main(["status", "--root", str(tmp_path)], out)
    assert (
        f"next boot: kernel {BOOKWORM[0]}, from grubenv's one-time next_entry '0' "
        "(Debian GNU/Linux)"
    ) in out.getvalue().splitlines()
    assert (
        f"kernels: {BOOKWORM[0]} (next boot), {BOOKWORM[1]} (running), "
        "6.1.0-40-amd64 (no module tree)"
    ) in out.getvalue().splitlines()
    layout.config.write_text(f'[kernel]\nnext = "{BOOKWORM[1]}"\n')
    out = io.StringIO()
    main(["status", "--root", str(tmp_path), "--json"], out)
    doc = json.loads(out.getvalue())
    assert doc["next_kernel"] == {
        "release": BOOKWORM[1],
        "how": "config",
        "entry": None,
        "title": None,
        "unknown": None,
        "fallback": None,
    }
    assert [(k["release"], k["modules"] is not None) for k in doc["kernels"]] == [
        (BOOKWORM[0], True),
        (BOOKWORM[1], True),
        ("6.1.0-40-amd64", False),
    ]


def test_blocks_nested_past_the_bound_still_close() -> None:
    """Blocks nested deeper than MAX_DEPTH are counted, not kept, so their closing braces
    still balance: Debian's menu after 200 nested blocks closed is read whole, and one
    inside 50 still open (a function's body, which grub does not run) is not a menu."""
    real = (DATA / "trixie/grub.cfg").read_text()
    menu = grub.parse_menu("function f {\n" * 200 + "}\n" * 200 + real)
    assert [e.title for e in menu.entries][:2] == ["Debian GNU/Linux", ADVANCED]
    inside = grub.parse_menu("function f {\n" * 200 + "}\n" * 150 + real + "}\n" * 50)
    assert inside.entries == ()
