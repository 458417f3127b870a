"""modstage's Debian package, tested as Debian tests packages.

``deploy/debian/build`` builds it twice from this tree (0.1.0 and a bumped 0.1.1, about 15 s
each). The lintian of Debian 12 and of Debian 13, each in a root of its release, judge it
(no error, no warning, no override; Debian 12's one informational tag named with the
reason); it builds in clean Debian 12 and 13 roots holding exactly the documented build
dependencies; its manual, written from the parser, covers every command and exit status;
its purge script removes what modstage made outside its directories; ``piuparts`` installs
it into a clean root of Debian 12 and of Debian 13, removes it (``tests/piuparts/
post_remove_*``: the config, the certificates and the state are kept), purges it (nothing
left, the state, store, labels and metrics the ``post_install_*`` script wrote included),
and upgrades the first build to the second from a local apt repository. The clean roots
are made once with ``mmdebstrap`` into the test cache. Costs: build 30 s, the roots about
30 s each once, lintian 10 s a release, piuparts about 100 s a suite.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.kmod.build import cache_root

# dpkg-buildpackage, lintian, piuparts and the Debian roots of the test cache
pytestmark = pytest.mark.debian

ROOT = Path(__file__).resolve().parent.parent
MIRROR = "http://deb.debian.org/debian"
SUITES = ("bookworm", "trixie")
#: what piuparts (Debian 12's, 1.1.7) does not know to ignore in a newer suite's root: trixie's
#: debconf leaves its temporary directory behind after any package configures (not
#: modstage's: modstage uses no debconf; trixie's own piuparts ignores it)
IGNORE = {"trixie": ["/var/cache/debconf/tmp.ci/"]}


@pytest.fixture(scope="module")
def debs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The package built from the tree (0.1.0) and again as 0.1.1, the upgrade's target."""
    out = tmp_path_factory.mktemp("debs")
    built = {}
    for version in ("", "0.1.1"):
        argv = [str(ROOT / "deploy/debian/build"), "--out", str(out)]
        done = subprocess.run(
            argv + (["--version", version] if version else []),
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-4000:]
        deb = Path(done.stdout.strip().splitlines()[-1])
        built[version or "0.1.0"] = deb
    return built


def _contents(deb: Path) -> dict[str, tarfile.TarInfo]:
    data = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(data.stdout)) as tar:
        return {m.name.removeprefix(".").rstrip("/"): m for m in tar.getmembers()}


def _file(deb: Path, name: str) -> str:
    """A file of the package's data (``name`` without the leading ``/``)."""
    data = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(data.stdout)) as tar:
        member = tar.extractfile(f"./{name}")
        assert member is not None, name
        return member.read().decode()


def _control(deb: Path, name: str) -> str:
    """A file of the package's control archive (postinst, prerm, conffiles)."""
    data = subprocess.run(["dpkg-deb", "--ctrl-tarfile", str(deb)], capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(data.stdout)) as tar:
        member = tar.extractfile(f"./{name}")
        assert member is not None, name
        return member.read().decode()


def test_the_package_installs_what_a_debian_host_expects(debs: dict[str, Path]) -> None:
    """Architecture all, Debian's python3 libraries as dependencies (Debian 12's lowest
    versions, watchdog for the drop watch, rich only suggested), /usr/bin/modstage, both
    units running /usr/bin/modstage, the example config as the conffile
    /etc/modstage/config.toml, the kernel hook as the conffiles
    /etc/kernel/postinst.d/zzz-modstage and postrm.d's (0755), /var/lib/modstage 0755,
    the modules private to the command in /usr/share/modstage (Debian's Python policy:
    nothing in dist-packages), and nothing under /opt or /usr/local."""
    deb = debs["0.1.0"]
    fields = subprocess.run(
        ["dpkg-deb", "-f", str(deb), "Architecture", "Depends", "Suggests", "Version"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "Architecture: all" in fields and "Version: 0.1.0" in fields
    for dep in (
        "python3-cryptography (>= 38.0.4)",
        "python3-zstandard (>= 0.20)",
        "python3-structlog (>= 22.3)",
        "python3-pyudev (>= 0.24)",
        "python3-tomli-w (>= 1.0)",
        "python3-watchdog (>= 2.2.1)",
        "python3:any (>= 3.11~)",
        "tzdata",
    ):
        assert dep in fields, fields
    # status's tables only: structlog imports rich whenever it is installed, and every boot
    # would pay for it (docs/performance.md)
    assert "Suggests: python3-rich (>= 13.3)" in fields
    assert "rich" not in fields.split("Depends:", 1)[1].split("\n")[0]
    files = _contents(deb)
    assert not [p for p in files if p.startswith(("/opt", "/usr/local"))]
    assert files["/usr/bin/modstage"].mode & 0o111
    # Debian's Python policy: private modules, not the generic names service and stager in
    # the shared dist-packages
    assert "/usr/share/modstage/service/daemon/loop.py" in files
    assert "/usr/share/modstage/stager/schema/manifest.py" in files
    assert not [p for p in files if "dist-packages" in p or "site-packages" in p]
    assert 'sys.path.insert(0, "/usr/share/modstage")' in _file(deb, "usr/bin/modstage")
    state = files["/var/lib/modstage"]
    assert state.isdir() and state.mode & 0o7777 == 0o755
    hooks = [f"/etc/kernel/{d}/zzz-modstage" for d in ("postinst.d", "postrm.d")]
    assert sorted(_control(deb, "conffiles").split()) == sorted(
        ["/etc/modstage/config.toml", *hooks]
    )
    for hook in hooks:  # a kernel package's run-parts runs them (deploy/kernel/zzz-modstage)
        assert files[hook].mode & 0o7777 == 0o755, hook
        assert _file(deb, hook[1:]) == (ROOT / "deploy/kernel/zzz-modstage").read_text()
    config = _file(deb, "etc/modstage/config.toml")
    assert config == (ROOT / "deploy/config.example.toml").read_text()
    for unit in ("modstage.service", "modstage-boot.service"):
        text = _file(deb, f"usr/lib/systemd/system/{unit}")
        assert "ExecStart=/usr/bin/modstage " in text and "/usr/local" not in text, unit
        assert "/opt/" not in text, unit


def test_the_daemon_is_started_and_restarted_the_boot_unit_only_enabled(
    debs: dict[str, Path],
) -> None:
    """dh_installsystemd's scripts: both units enabled on install; the daemon started on
    install, restarted after an upgrade and stopped on removal; the boot unit (it loads
    modules) never started, stopped or restarted by any maintainer script of either build
    (a boot unit stopped on upgrade could be started again in the running system)."""
    postinst = _control(debs["0.1.0"], "postinst")
    prerm = _control(debs["0.1.0"], "prerm")
    assert "deb-systemd-helper enable 'modstage-boot.service'" in postinst
    assert "deb-systemd-helper enable 'modstage.service'" in postinst
    assert "_dh_action=restart" in postinst and "$_dh_action 'modstage.service'" in postinst
    assert "deb-systemd-invoke stop 'modstage.service'" in prerm
    for deb in debs.values():
        for script in _scripts(deb).values():
            invoked = [ln for ln in script.splitlines() if "deb-systemd-invoke" in ln]
            assert not [ln for ln in invoked if "modstage-boot" in ln], invoked
            assert "systemctl start modstage-boot" not in script


def test_the_package_carries_the_admins_documents(debs: dict[str, Path]) -> None:
    """The manual, written from the parser at build time: every command (``config check``
    too) has its section with each of its options, its example and exit status, and EXIT
    STATUS lists every command; the config's manual names every key of docs/config.md;
    groff renders both without a warning. Both units' ``Documentation=`` is the manual;
    README.Debian, NEWS.Debian, bash completion (valid bash) and the examples (alert rules,
    Kubernetes manifests, driver container, example config) are shipped; the installed
    metadata, which ``--version`` reads, says the package's own version."""
    import gzip

    from service.parser import VERBS, build_parser

    for version, deb in debs.items():
        files = _contents(deb)
        docs = "/usr/share/doc/modstage"
        for name in ("README.Debian", "NEWS.Debian.gz", "examples/modstage-alerts.yml"):
            assert f"{docs}/{name}" in files, name
        for name in ("kubernetes/kured-daemonset.yaml", "driver-container/Containerfile"):
            assert f"{docs}/examples/{name}" in files, name
        assert f"{docs}/examples/config.example.toml" in files
        for unit in ("modstage.service", "modstage-boot.service"):
            text = _file(deb, f"usr/lib/systemd/system/{unit}")
            assert "Documentation=man:modstage(1) man:modstage-config(5)" in text.splitlines()
        metadata = _file(deb, f"usr/share/modstage/modstage-{version}.dist-info/METADATA")
        assert f"Version: {version}" in metadata.splitlines()
        completion = _file(deb, "usr/share/bash-completion/completions/modstage")
        assert subprocess.run(["bash", "-n"], input=completion, text=True).returncode == 0
    deb = debs["0.1.0"]
    data = subprocess.run(["dpkg-deb", "--fsys-tarfile", str(deb)], capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(data.stdout)) as tar:
        pages = {}
        for name in ("man1/modstage.1.gz", "man5/modstage-config.5.gz"):
            member = tar.extractfile(f"./usr/share/man/{name}")
            assert member is not None, name
            pages[name] = gzip.decompress(member.read()).decode()
    manual = pages["man1/modstage.1.gz"]
    exit_status = manual[manual.index(".SH EXIT STATUS") :]
    parser = build_parser()
    names = [f"{v.parent} {n}" if v.parent else n for n, v in VERBS.items() if v.load]
    for name in names:
        section = f".SS modstage {name}".replace("-", "\\-")
        assert section in manual, name
        assert f".B {name}\n" in exit_status, name
        words = name.split()
        sub = parser._subparsers._group_actions[0].choices[words[0]]  # type: ignore[union-attr]
        if len(words) == 2:
            sub = sub._subparsers._group_actions[0].choices[words[1]]  # type: ignore[union-attr]
        for action in sub._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert option.replace("-", "\\-") in manual, (name, option)
    keys = re.findall(r"^\| `([a-z_]+)` \|", (ROOT / "docs/config.md").read_text(), re.M)
    assert len(keys) > 20
    for key in keys:
        assert f".B {key}\n".replace("-", "\\-") in pages["man5/modstage-config.5.gz"], key
    for text in pages.values():
        done = subprocess.run(
            ["groff", "-man", "-z", "-ww"], input=text, capture_output=True, text=True
        )
        assert done.returncode == 0 and done.stderr == "", done.stderr


def _scripts(deb: Path) -> dict[str, str]:
    """Every maintainer script the package carries, by name."""
    data = subprocess.run(["dpkg-deb", "--ctrl-tarfile", str(deb)], capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(data.stdout)) as tar:
        names = [m.name.removeprefix("./") for m in tar.getmembers()]
    scripts = {"preinst", "postinst", "prerm", "postrm"}
    return {n: _control(deb, n) for n in names if n in scripts}


def _purge_root(root: Path, firmware_path: str, foreign_exporter: bool) -> None:
    """A node's files as modstage leaves them, under ``root``."""
    files = {
        "etc/modstage/config.toml": "",
        "etc/kubernetes/node-feature-discovery/features.d/modstage": "modstage.io/x=1\n",
        "etc/kubernetes/node-feature-discovery/features.d/other": "other.io/y=1\n",
        "sys/module/firmware_class/parameters/path": firmware_path,
        "var/lib/prometheus/node-exporter/modstage.prom": "modstage_up 1\n",
        "var/lib/modstage/state.json": "{}",
        "run/modstage/firmware/x.bin": "fw",
    }
    if foreign_exporter:
        files["var/lib/prometheus/node-exporter/other.prom"] = "other 1\n"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


@pytest.mark.parametrize("foreign", [False, True], ids=["own", "foreign"])
def test_purge_removes_everything_modstage_made_outside_its_directories(
    tmp_path: Path, foreign: bool
) -> None:
    """The package's postrm, ``purge`` under ``DPKG_ROOT``: modstage's label file in NFD's
    features.d goes (NFD's directory and another file in it stay), firmware_class.path is
    cleared when it names modstage's view and left alone when it names another's, the
    metrics file goes and node-exporter's directory with it when nothing else is in it (no
    package owns it here), the config, state and runtime directories go."""
    root = tmp_path / "root"
    _purge_root(root, "/opt/other/firmware\n" if foreign else "/run/modstage/firmware\n", foreign)
    done = subprocess.run(
        ["sh", str(ROOT / "deploy/debian/postrm"), "purge"],
        env={"DPKG_ROOT": str(root), "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    left = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    expected = [
        "etc",
        "etc/kubernetes",
        "etc/kubernetes/node-feature-discovery",
        "etc/kubernetes/node-feature-discovery/features.d",
        "etc/kubernetes/node-feature-discovery/features.d/other",
        "run",
        "sys",
        "sys/module",
        "sys/module/firmware_class",
        "sys/module/firmware_class/parameters",
        "sys/module/firmware_class/parameters/path",
        "var",
        "var/lib",
    ]
    if foreign:
        expected += [
            "var/lib/prometheus",
            "var/lib/prometheus/node-exporter",
            "var/lib/prometheus/node-exporter/other.prom",
        ]
    assert left == sorted(expected)
    firmware = (root / "sys/module/firmware_class/parameters/path").read_text()
    assert firmware == ("/opt/other/firmware\n" if foreign else "\0")


#: what each release's lintian may say of the package, at info level only: Debian 12's notes
#: that the units have no init.d script (modstage is systemd-only: its daemon is Type=notify
#: with systemd's watchdog and sandbox, its boot unit ordered before sysinit.target); Debian
#: 13's lintian no longer has that tag, so an override of it would be an error there
LINTIAN_INFO = {
    "bookworm": {
        f"I: modstage: package-supports-alternative-init-but-no-init.d-script "
        f"[usr/lib/systemd/system/{unit}]"
        for unit in ("modstage-boot.service", "modstage.service")
    },
    "trixie": set(),
}
README_BUILD = re.compile(r"^apt-get install --no-install-recommends (build-essential .*)$", re.M)


def _root(suite: str, packages: list[str]) -> Path:
    """A root of ``suite`` (mmdebstrap's apt variant) holding ``packages``, made once into the
    test cache (a directory: commands run in it with chroot)."""
    name = f"{suite}-{hashlib.sha256(' '.join(sorted(packages)).encode()).hexdigest()[:12]}"
    root = cache_root() / "roots" / name
    if not root.exists():
        partial = root.with_name(name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.parent.mkdir(parents=True, exist_ok=True)
        argv = ["mmdebstrap", "--variant=apt", "--quiet", f"--include={','.join(packages)}"]
        subprocess.run([*argv, suite, str(partial), MIRROR], check=True, timeout=1800)
        partial.rename(root)
    return root


@pytest.mark.parametrize("suite", SUITES)
def test_lintian_of_each_release_finds_nothing(suite: str, debs: dict[str, Path]) -> None:
    """The lintian of Debian 12 and of Debian 13, each in a root of its release (pedantic,
    info shown), finds no error, no warning and no tag but :data:`LINTIAN_INFO`'s, in both
    builds, with no override shipped: one package is right for both releases."""
    root = _root(suite, ["lintian"])
    for deb in debs.values():
        shutil.copy(deb, root / "tmp" / deb.name)
        argv = ["lintian", "--fail-on", "error,warning", "--pedantic", "--display-info"]
        done = subprocess.run(
            ["chroot", str(root), *argv, f"/tmp/{deb.name}"],
            capture_output=True,
            text=True,
            check=False,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
        )
        (root / "tmp" / deb.name).unlink()
        tags = {line for line in done.stdout.splitlines() if line[:2] in ("E:", "W:", "I:", "P:")}
        assert done.returncode == 0 and tags == LINTIAN_INFO[suite], done.stdout + done.stderr
    assert not (ROOT / "deploy/debian/modstage.lintian-overrides").exists()


@pytest.mark.parametrize("suite", SUITES)
def test_the_package_builds_in_a_clean_root_with_the_documented_dependencies(
    suite: str, tmp_path: Path
) -> None:
    """In a root of each release holding exactly the build dependencies deploy/README.md
    tells an admin to install (and deploy/debian/build names), ``deploy/debian/build``
    builds the package from a copy of the tree."""
    documented = README_BUILD.search((ROOT / "deploy/README.md").read_text())
    assert documented, "deploy/README.md names no build dependencies"
    packages = documented[1].split()
    assert " ".join(packages) in (ROOT / "deploy/debian/build").read_text()
    root = _root(suite, packages)
    src = root / "tmp" / f"modstage-src-{os.getpid()}"
    try:
        src.mkdir()
        sources = ["pyproject.toml", "README.md", "service", "stager", "deploy", "docs"]
        tar = subprocess.run(
            ["tar", "-C", str(ROOT), "--exclude=__pycache__", "-cf", "-", *sources],
            capture_output=True,
            check=True,
        )
        subprocess.run(["tar", "-C", str(src), "-xf", "-"], input=tar.stdout, check=True)
        inside = "/" + str(src.relative_to(root))
        done = subprocess.run(
            ["chroot", str(root), "sh", "-c", f"cd {inside} && deploy/debian/build --out out"],
            capture_output=True,
            text=True,
            check=False,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
            timeout=600,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert [p.name for p in (src / "out").iterdir()] == ["modstage_0.1.0_all.deb"]
    finally:
        shutil.rmtree(src, ignore_errors=True)


def _base(suite: str) -> Path:
    """A clean minbase root of ``suite`` as piuparts takes it, made once (cached)."""
    base = cache_root() / "piuparts" / f"{suite}-minbase.tar.gz"
    if not base.exists():
        base.parent.mkdir(parents=True, exist_ok=True)
        partial = base.with_name(f"{suite}-minbase.partial.tar.gz")
        subprocess.run(
            ["mmdebstrap", "--variant=minbase", "--quiet", suite, str(partial), MIRROR],
            check=True,
            timeout=1200,
        )
        partial.rename(base)
    return base


@pytest.mark.parametrize("suite", SUITES)
def test_piuparts_installs_upgrades_removes_and_purges_cleanly(
    suite: str, debs: dict[str, Path], tmp_path: Path
) -> None:
    """piuparts on a clean root of the suite: install and purge leave nothing behind,
    remove keeps config and state (tests/piuparts), and 0.1.0 (from a local apt
    repository) upgrades to 0.1.1 and purges cleanly."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / debs["0.1.0"].name).write_bytes(debs["0.1.0"].read_bytes())
    packages = subprocess.run(
        ["dpkg-scanpackages", "."], cwd=repo, capture_output=True, text=True, check=True
    ).stdout
    (repo / "Packages").write_text(packages)
    done = subprocess.run(
        [
            *("piuparts", "--basetgz", str(_base(suite)), "-d", suite, "-m", MIRROR),
            f"--scriptsdir={ROOT / 'tests/piuparts'}",
            *(f"--ignore={path}" for path in IGNORE.get(suite, [])),
            f"--bindmount={repo}",
            f"--extra-repo=deb [trusted=yes] file://{repo} ./",
            str(debs["0.1.1"]),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=1200,
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0 and "PASS: All tests." in log, log[-6000:]
    assert "Unpacking modstage (0.1.1) over (0.1.0)" in log, "no upgrade was tested"
    assert "modstage: every module imports" in log
    assert log.count("modstage: remove kept the configuration and the state") >= 2
