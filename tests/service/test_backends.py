"""The reboot backends' one registry: config, rebooter and status all read it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from service.cmd.configcheck import check
from service.config import Config
from service.errors import ConfigError, RebootError
from service.host.running import RunningHost
from service.layout import Layout, kernel_image
from service.rebooting.backends import BACKENDS, admin_reboots, authenticode_signed
from service.rebooting.request import CommandRebooter, KuredSentinel, NoRebooter, rebooter


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_every_registered_backend_is_accepted_built_and_asks_as_registered(
    host: Layout, name: str
) -> None:
    """Each registry entry is a valid ``[reboot] backend``, builds a rebooter of that name,
    and asking records exactly the registered way: kured's sentinel, the commands (under a
    sandbox root only recorded), or nothing (an admin reboots)."""
    config = Config.from_dict({"reboot": {"backend": name, "command": ["/sbin/reboot", "-f"]}})
    chosen = rebooter(config.reboot, host)
    entry = BACKENDS[name]
    assert chosen.name == name
    chosen.request("test")
    record = host.run / "reboot-commands"
    if entry.sentinel:
        assert isinstance(chosen, KuredSentinel) and chosen.path.read_text() == "modstage: test\n"
    elif entry.commands is not None:
        assert isinstance(chosen, CommandRebooter)
        recorded = [json.loads(line) for line in record.read_text().splitlines()]
        assert recorded == entry.commands(
            config.reboot.command, host, RunningHost.read(host).need_release()
        )
        assert recorded
    else:
        assert isinstance(chosen, NoRebooter) and admin_reboots(name)
        assert not record.exists()


def test_a_name_outside_the_registry_is_refused_listing_the_registry() -> None:
    """``backend = "reboot-now"`` is a config problem naming every registered backend."""
    with pytest.raises(ConfigError) as info:
        Config.from_dict({"reboot": {"backend": "reboot-now"}})
    assert f"reboot.backend: 'reboot-now' is not one of {'|'.join(BACKENDS)}" in info.value.problems


@pytest.mark.parametrize("name", [n for n, b in sorted(BACKENDS.items()) if b.needs_command])
def test_a_backend_that_runs_the_configured_command_needs_one(name: str) -> None:
    """A backend registered with ``needs_command`` refuses an empty ``[reboot] command``."""
    with pytest.raises(ConfigError, match=r"reboot\.command: required"):
        Config.from_dict({"reboot": {"backend": name}})


def test_only_a_backend_that_asks_nothing_leaves_the_reboot_to_an_admin() -> None:
    """Status's "waiting for an admin" holds for the backends that neither write a sentinel
    nor run a command, and for no unknown name (an intent from another version)."""
    assert [n for n in BACKENDS if admin_reboots(n)] == ["none"]
    assert not admin_reboots("gone") and not admin_reboots(None)


def _locked_down_host(host: Layout, image: bytes, mode: str) -> None:
    host.lockdown.parent.mkdir(parents=True, exist_ok=True)
    host.lockdown.write_text(mode + "\n")
    path = kernel_image(host, RunningHost.read(host).need_release())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(image)


def _without_signature(image: bytes) -> bytes:
    """The image with its PE certificate-table entry emptied, as ``sbattach --remove`` does."""
    pe = int.from_bytes(image[0x3C:0x40], "little")
    optional = pe + 24
    magic = int.from_bytes(image[optional : optional + 2], "little")
    entry = optional + (112 if magic == 0x20B else 96) + 4 * 8
    return image[:entry] + bytes(8) + image[entry + 8 :]


@pytest.fixture(scope="module")
def debian_image() -> bytes:
    """Debian's signed kernel image from this machine's /boot (an EFI-stub PE)."""
    [image] = sorted(Path("/boot").glob("vmlinuz-*"))[-1:]
    return image.read_bytes()


def test_kexec_under_lockdown_is_refused_before_the_reboot_for_an_unsigned_image(
    host: Layout, debian_image: bytes
) -> None:
    """Lockdown makes the kernel refuse an unsigned kexec image: ``config check`` names the
    problem, and asking refuses with it instead of running kexec; Debian's signed image,
    or no lockdown, passes."""
    _locked_down_host(host, _without_signature(debian_image), "none [integrity] confidentiality")
    kexec = rebooter(Config.from_dict({"reboot": {"backend": "kexec"}}).reboot, host)
    with pytest.raises(RebootError, match=r"kexec under lockdown .*carries no Authenticode"):
        kexec.request("x")
    assert not (host.run / "reboot-commands").exists()
    (host.config.parent).mkdir(parents=True, exist_ok=True)
    host.config.write_text('[reboot]\nbackend = "kexec"\n')
    assert any("kexec under lockdown" in p for p in check(host)["problems"])
    _locked_down_host(host, debian_image, "none [integrity] confidentiality")
    assert not any("kexec" in p for p in check(host)["problems"])
    kexec.request("x")
    _locked_down_host(host, _without_signature(debian_image), "[none] integrity confidentiality")
    kexec.request("x")
    assert len((host.run / "reboot-commands").read_text().splitlines()) == 4


@pytest.mark.kbuild  # debian_image reads this machine's /boot
def test_the_signature_reader_knows_debians_image_and_refuses_what_is_not_pe(
    tmp_path: Path, debian_image: bytes
) -> None:
    """Debian's image is signed, the same with its certificate table emptied is not, and a
    file that is not a PE image (or is missing) is unknown, never "signed"."""
    signed, bare, junk = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    signed.write_bytes(debian_image)
    bare.write_bytes(_without_signature(debian_image))
    junk.write_bytes(b"\x7fELF" + bytes(4096))
    assert authenticode_signed(signed) is True
    assert authenticode_signed(bare) is False
    assert authenticode_signed(junk) is None and authenticode_signed(tmp_path / "d") is None


def test_kexec_boots_the_kernel_the_next_boot_runs(host: Layout) -> None:
    """A kernel update installed 6.12.0-next: kexec loads its image and initrd (the boot a
    reboot would make), not the running kernel again; ``[kernel] next`` naming the running
    kernel brings it back to the running one."""
    nxt = "6.12.0-next"
    (host.root / "boot").mkdir(exist_ok=True)
    kernel_image(host, nxt).write_bytes(b"MZ")
    chosen = rebooter(Config.from_dict({"reboot": {"backend": "kexec"}}).reboot, host)
    chosen.request("kernel update")
    [load, go] = [
        json.loads(line) for line in (host.run / "reboot-commands").read_text().splitlines()
    ]
    assert load[:4] == ["kexec", "-s", "-l", str(kernel_image(host, nxt))]
    assert load[4] == f"--initrd={host.root / 'boot' / f'initrd.img-{nxt}'}" and go == [
        "systemctl",
        "kexec",
    ]
    (host.run / "reboot-commands").unlink()
    running = RunningHost.read(host).need_release()
    kernel_image(host, running).parent.mkdir(parents=True, exist_ok=True)
    if not kernel_image(host, running).exists():
        kernel_image(host, running).write_bytes(b"MZ")
    again = rebooter(Config.from_dict({"reboot": {"backend": "kexec"}}).reboot, host, running)
    again.request("same kernel")
    [load, _] = [
        json.loads(line) for line in (host.run / "reboot-commands").read_text().splitlines()
    ]
    assert load[3] == str(kernel_image(host, running))
