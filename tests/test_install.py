"""``deploy/install.sh`` on a clean root: a venv under /opt that runs, units installed and
enabled, an example config that an admin's config is never replaced by, and an uninstall that
removes everything it installed (config and state stay unless --purge). The same install runs
on a Debian 13 root (Python 3.13, PEP 668, merged /usr), inside it with ``chroot``."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.installer import REPO, build_wheel, checkout, install, wheelhouse, wheelhouse_for
from tests.vm.harness import debian

pytestmark = pytest.mark.debian  # the wheelhouse and the Debian 13 root of the test cache

UNITS = ("modstage-boot.service", "modstage.service")
UNITDIR = "usr/local/lib/systemd/system"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkout, built into a wheel."""
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    """A clean root with modstage installed from the wheel (dependencies offline)."""
    root = tmp_path_factory.mktemp("root")
    done = install(root, "--from", wheel, "--wheels", wheelhouse(wheel))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "wrote /etc/modstage/config.toml" in done.stdout
    return root


def modstage(root: Path, *argv: str | Path) -> subprocess.CompletedProcess[str]:
    """The installed console script, run by the venv's interpreter (its shebang names the
    final path, /opt/modstage/bin/python, which exists only inside the root)."""
    venv = root / "opt/modstage"
    return subprocess.run(
        [str(venv / "bin/python"), str(venv / "bin/modstage"), *map(str, argv)],
        capture_output=True,
        text=True,
        check=False,
    )


def tree(root: Path) -> set[str]:
    """Every path under ``root`` outside the venv, relative."""
    return {
        str(p.relative_to(root))
        for p in root.rglob("*")
        if not p.relative_to(root).is_relative_to("opt/modstage")
    }


def test_installed_modstage_runs_from_its_own_venv(root: Path, tmp_path: Path) -> None:
    """The venv is built on Debian's /usr/bin/python3, not the system site, and the installed
    ``modstage --help`` and ``modstage status --root`` run from it."""
    venv = root / "opt/modstage"
    cfg = (venv / "pyvenv.cfg").read_text()
    assert "home = /usr/bin" in cfg and "include-system-site-packages = false" in cfg
    done = modstage(root, "--help")
    assert done.returncode == 0 and "usage: modstage" in done.stdout, done.stderr
    (tmp_path / "var/lib/modstage").mkdir(parents=True)  # a host tree, no state yet
    (tmp_path / "proc/sys/kernel/random").mkdir(parents=True)  # its running kernel
    (tmp_path / "proc/sys/kernel/osrelease").write_text("6.1.0-57-amd64\n")
    (tmp_path / "proc/sys/kernel/random/boot_id").write_text(f"{uuid.uuid4()}\n")
    done = modstage(root, "status", "--root", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "reboot: not required" in done.stdout


def test_venv_is_relocated_to_its_final_path(root: Path) -> None:
    """Nothing in the venv names the directory it was built in: shebangs, activate scripts,
    pyvenv.cfg and compiled files all say /opt/modstage (pip's record of the wheel aside)."""
    venv = root / "opt/modstage"
    assert (venv / "bin/modstage").read_text().splitlines()[0] == "#!/opt/modstage/bin/python"
    stray = subprocess.run(
        ["grep", "-rl", "--exclude=direct_url.json", str(root), str(venv)],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    assert stray == []
    pyc = next((venv / "lib").rglob("service/__pycache__/cli.*.pyc")).read_bytes()
    assert b"/opt/modstage/lib/python3" in pyc


def test_units_link_and_config_are_installed_and_enabled(root: Path) -> None:
    """Both units (as in deploy/systemd), the PATH link, the example config, trusted.d and the
    kernel hook in postinst.d and postrm.d (executable) are in place, and systemd's
    enablement links exist."""
    for unit in UNITS:
        installed = root / UNITDIR / unit
        assert installed.read_text() == (REPO / "deploy/systemd" / unit).read_text()
    link = root / "usr/local/bin/modstage"
    assert link.is_symlink() and str(link.readlink()) == "/opt/modstage/bin/modstage"
    config = root / "etc/modstage/config.toml"
    assert config.read_text() == (REPO / "deploy/config.example.toml").read_text()
    assert (root / "etc/modstage/trusted.d").is_dir()
    for hooks in ("postinst.d", "postrm.d"):
        hook = root / "etc/kernel" / hooks / "zzz-modstage"
        assert hook.read_text() == (REPO / "deploy/kernel/zzz-modstage").read_text()
        assert hook.stat().st_mode & 0o7777 == 0o755
    wants = root / "etc/systemd/system"
    assert (wants / "sysinit.target.wants/modstage-boot.service").is_symlink()
    assert (wants / "multi-user.target.wants/modstage.service").is_symlink()
    assert (root / "opt/modstage/share/doc/modstage/README.md").is_file()


def test_upgrade_keeps_the_admins_config_and_replaces_the_venv(root: Path, wheel: Path) -> None:
    """Installing again over an install swaps in a fresh venv and leaves an edited
    config.toml and trusted.d alone."""
    config = root / "etc/modstage/config.toml"
    config.write_text("# the admin's own\nmax_boot_attempts = 5\n")
    (root / "etc/modstage/trusted.d/vendor.pem").write_text("cert")
    marker = root / "opt/modstage/old-venv-marker"
    marker.touch()
    done = install(root, "--from", wheel, "--wheels", wheelhouse(wheel))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "kept the existing /etc/modstage/config.toml" in done.stdout
    assert config.read_text() == "# the admin's own\nmax_boot_attempts = 5\n"
    assert (root / "etc/modstage/trusted.d/vendor.pem").read_text() == "cert"
    assert not marker.exists() and modstage(root, "--help").returncode == 0
    assert not list((root / "opt").glob(".modstage.*"))


def test_uninstall_removes_what_it_installed_keeps_config_and_state(
    root: Path, tmp_path: Path
) -> None:
    """--uninstall removes the venv, link, units and enablement links; /etc/modstage and
    /var/lib/modstage stay. --purge then removes those too, leaving only empty directories."""
    copy = tmp_path / "root"
    shutil.copytree(root, copy, symlinks=True)
    (copy / "var/lib/modstage").mkdir(parents=True)
    (copy / "var/lib/modstage/state.json").write_text("{}")
    done = install(copy, "--uninstall")
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (copy / "opt/modstage").exists()
    left = {p for p in tree(copy) if not (copy / p).is_dir()}
    admins = {p for p in left if p.startswith("etc/modstage/trusted.d/")}
    assert left - admins == {"etc/modstage/config.toml", "var/lib/modstage/state.json"}
    done = install(copy, "--uninstall", "--purge")
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (copy / "etc/modstage").exists() and not (copy / "var/lib/modstage").exists()
    assert all((copy / p).is_dir() for p in tree(copy))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--bogus"], "unknown argument: --bogus"),
        (["--purge"], "--purge goes with --uninstall"),
        (["--python", "/nonexistent/python3"], "/nonexistent/python3 is missing"),
        (["--uninstall"], "nothing installed under"),
    ],
)
def test_bad_invocations_fail_with_a_reason(tmp_path: Path, argv: list[str], message: str) -> None:
    """A wrong option, a missing interpreter or nothing to uninstall: exit 1 and say why,
    having written nothing."""
    done = install(tmp_path, *argv)
    assert done.returncode == 1 and message in done.stderr, done.stderr
    assert list(tmp_path.iterdir()) == []


def test_script_is_posix_sh() -> None:
    """``sh -n`` accepts the installer (and shellcheck, where installed)."""
    subprocess.run(["sh", "-n", str(REPO / "deploy/install.sh")], check=True)
    if shutil.which("shellcheck"):
        subprocess.run(["shellcheck", str(REPO / "deploy/install.sh")], check=True)


@pytest.fixture(scope="module")
def trixie(wheel: Path) -> Iterator[tuple[Path, str]]:
    """A fresh Debian 13 root (``debian.install_root``: python3, python3-venv, systemd;
    cached) and a scratch directory in it holding the checkout, the wheel and cp313 wheels
    of the dependencies: (root, scratch as seen from inside)."""
    root = debian.install_root()
    scratch = Path(tempfile.mkdtemp(prefix="modstage-install-", dir=root / "tmp"))
    try:
        checkout(scratch)
        shutil.copy(wheel, scratch / wheel.name)
        shutil.copytree(wheelhouse_for("3.13"), scratch / "wheels")
        # a host tree for `modstage status --root` (a root without etc/modstage or
        # var/lib/modstage is refused as no host)
        (scratch / "host/var/lib/modstage").mkdir(parents=True)
        (scratch / "host/proc/sys/kernel/random").mkdir(parents=True)  # its running kernel
        (scratch / "host/proc/sys/kernel/osrelease").write_text("6.12.57+deb13-amd64\n")
        (scratch / "host/proc/sys/kernel/random/boot_id").write_text(f"{uuid.uuid4()}\n")
        (scratch / "target").mkdir()  # the root install.sh installs into
        yield root, f"/tmp/{scratch.name}"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def in_root(root: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """``argv`` run inside ``root`` with ``chroot`` (its own Python, glibc and systemd)."""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8", "HOME": "/root"}
    return subprocess.run(
        ["chroot", str(root), *argv], capture_output=True, text=True, check=False, env=env
    )


def test_install_on_debian_13_uses_its_python_313_venv_and_merged_usr(
    trixie: tuple[Path, str], wheel: Path
) -> None:
    """On Debian 13 the system Python (3.13) is externally managed (PEP 668) and /lib is a
    link into /usr: install.sh builds its venv on /usr/bin/python3 without touching the
    system site, installs the units under /usr/local, enables them with trixie's systemctl,
    and the installed ``modstage --help`` and ``modstage status`` run on Python 3.13."""
    root, inside = trixie
    assert (root / "lib").is_symlink() and str((root / "lib").readlink()) == "usr/lib"
    assert list(root.glob("usr/lib/python3.13/EXTERNALLY-MANAGED"))
    refused = in_root(root, "python3", "-m", "pip", "--version")
    assert refused.returncode != 0  # Debian's python3 has no pip of its own to misuse
    target = f"{inside}/target"
    done = in_root(
        root,
        *("sh", f"{inside}/source/deploy/install.sh", "--root", target),
        *("--from", f"{inside}/{wheel.name}", "--wheels", f"{inside}/wheels"),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "enabled modstage-boot.service modstage.service" in done.stdout
    installed = root / target.lstrip("/")
    cfg = (installed / "opt/modstage/pyvenv.cfg").read_text()
    assert "home = /usr/bin" in cfg and "version = 3.13." in cfg
    assert "include-system-site-packages = false" in cfg
    for unit in UNITS:
        assert (installed / UNITDIR / unit).read_text() == (
            REPO / "deploy/systemd" / unit
        ).read_text()
    wants = installed / "etc/systemd/system"
    assert (wants / "sysinit.target.wants/modstage-boot.service").is_symlink()
    assert (wants / "multi-user.target.wants/modstage.service").is_symlink()
    venv = f"{target}/opt/modstage"
    ran = in_root(root, f"{venv}/bin/python", f"{venv}/bin/modstage", "--help")
    assert ran.returncode == 0 and "usage: modstage" in ran.stdout, ran.stderr
    ran = in_root(root, f"{venv}/bin/python", "-c", "import sys; print(sys.version_info[:2])")
    assert ran.stdout.strip() == "(3, 13)", ran.stderr
    ran = in_root(
        root, f"{venv}/bin/python", f"{venv}/bin/modstage", "status", "--root", f"{inside}/host"
    )
    assert ran.returncode == 0 and "reboot: not required" in ran.stdout, ran.stdout + ran.stderr
    system_site = in_root(root, "python3", "-c", "import service")
    assert system_site.returncode != 0  # nothing went into the system Python
