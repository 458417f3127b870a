"""The reboot backends' one registry: config, rebooter and status all read it."""

from __future__ import annotations

import json

import pytest

from service.backends import BACKENDS, admin_reboots
from service.config import Config
from service.errors import ConfigError
from service.layout import Layout
from service.reboot import CommandRebooter, KuredSentinel, NoRebooter, rebooter


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
        assert recorded == entry.commands(config.reboot.command, host) and recorded
    else:
        assert isinstance(chosen, NoRebooter) and admin_reboots(name)
        assert not record.exists()


def test_a_name_outside_the_registry_is_refused_listing_the_registry() -> None:
    """``backend = "reboot-now"`` is a config problem naming every registered backend."""
    with pytest.raises(ConfigError) as info:
        Config.from_dict({"reboot": {"backend": "reboot-now"}})
    assert f"reboot.backend: must be one of {'|'.join(BACKENDS)}" in info.value.problems


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
