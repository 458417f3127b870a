"""A kernel update on a real node: one reboot, and the driver comes up on the new kernel.

A Debian 12 node runs 6.1 with bundle ``demo`` active. Debian 13's 6.12 is installed into it
as a package would install it (its module tree, image, config and System.map appear under
``/lib/modules`` and ``/boot``; the test bed binds the tree from the 6.12 root and copies the
files) and, since the test bed has no grub, ``[kernel] next`` names it as grub's default
would. unattended-upgrades' ``/var/run/reboot-required`` asks for the reboot:

1. ``status --reboot-required`` holds it (exit 4, naming 6.12 and ``demo``), ``_host.json``
   says ``demo`` has nothing for 6.12 and the node label ``demo.next=none``;
2. ``demo`` staged for 6.12 (test modules built against 6.12's headers, signed with its own
   sign-file) is judged on the 6.1 node against 6.12's files and accepted, pending for it;
   the gate lifts (exit 0) and ``_host.json`` says ``ready``;
3. a driver upgrade for the running 6.1 (version 2) then takes the bundle's one pending slot:
   the gate stays open, since the 6.12 generation is carried for its kernel (``_host.json``:
   ``ready``, version 1);
4. one reboot, into 6.12 (the same state disk, Debian 13's root): ``modstage boot`` loads the
   carried 6.12 generation, the module is live, ``status`` is healthy, version 2 stays pending
   for 6.1;
5. booting back into 6.1 (as grub's one-time entry would) loads version 2, built for it.

The second test is the update with no driver for the new kernel: the hold, its bound, a
boot without the driver, and the drop that brings it back with one reboot. Its daemon notices
6.12 installed at once (the kernel watch) and hears the package's kernel hook.

Runs under the 6.1 parametrisation (it boots 6.12 as the second kernel).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from service.bundles.phase import Phase
from tests.kmod import SigningKey, make_key
from tests.vm.harness import Vm, exports_cache, kmod
from tests.vm.harness.kernel import Kernel
from tests.vm.node import (
    daemon_events,
    drop,
    live_modules,
    modstage,
    prepare,
    start_daemon,
    state,
    wait_until,
)

pytestmark = [pytest.mark.vm, pytest.mark.kernels("6.1")]

NODE_FEATURES = "/etc/kubernetes/node-feature-discovery/features.d"
HOOK = Path(__file__).resolve().parents[2] / "deploy/kernel/zzz-modstage"


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> SigningKey:
    """The driver vendor's key, trusted by the node (both kernels' modules are signed with it)."""
    return make_key(tmp_path_factory.mktemp("update-vendor"), "rsa4096", cn="vendor key")


def _signed(kernel: Kernel, key: SigningKey, out: Path) -> Path:
    """ms_exporter built against ``kernel``'s headers, signed by its own sign-file."""
    out.mkdir(parents=True, exist_ok=True)
    built = kmod.build_modules(kernel)["ms_exporter"]
    return kmod.sign(kernel, built, key, out / "ms_exporter.ko")


def _install(vm: Vm, new: Kernel) -> None:
    """``new`` installed into the running node as its package installs it."""
    tree = f"/lib/modules/{new.release}"
    vm.run(f"mkdir -p {tree} && mount --bind {new.modules} {tree}").check()
    for name in (f"vmlinuz-{new.release}", f"config-{new.release}", f"System.map-{new.release}"):
        source = new.root / "boot" / name
        if source.exists():
            vm.run(["cp", str(source), f"/boot/{name}"]).check()
    if not (new.root / "boot" / f"vmlinuz-{new.release}").exists():
        vm.run(["cp", str(new.image), f"/boot/vmlinuz-{new.release}"]).check()


def test_a_kernel_update_takes_one_reboot_and_the_driver_comes_up_on_the_new_kernel(
    kernel: Kernel, key: SigningKey, tmp_path: Path
) -> None:
    """The steps of the module docstring, each checked on the node."""
    new = Kernel.named("6.12")
    certs = {"vendor.pem": key.cert_pem.read_bytes()}
    config = (
        f'[kernel]\nnext = "{new.release}"\n'
        '[publish]\nstatus_dirs = ["/run/nvidia/modstage/status"]\n'
    )
    old_ko = _signed(kernel, key, tmp_path / "old")
    new_ko = _signed(new, key, tmp_path / "new")
    share = tmp_path / "state"
    exports_cache.seed(share, new)  # what intake would read from 6.12's tree over 9p, minutes
    with Vm(share, name="update-6.1", kernel=kernel) as node:
        node.start()
        prepare(node, certs)
        drop(node, "demo", "1", kernel.release, [(old_ko, "")])
        assert modstage(node, "intake")[0] == 0
        rc, out = modstage(node, "boot", replay_boot=False)
        assert rc == 0, out
        first = state(node).bundle("demo")
        assert first.phase is Phase.ACTIVE and "ms_exporter" in live_modules(node)

        _install(node, new)
        node.run(f"mkdir -p {NODE_FEATURES} /var/run").check()
        node.run("echo '*** System restart required ***' > /var/run/reboot-required").check()
        prepare(node, certs, config)
        _publish(node)
        code, out = modstage(node, "status", "--reboot-required")
        assert code == 4, out
        assert f"held: the next boot runs kernel {new.release} and demo has no generation" in out
        assert "wanted: /var/run/reboot-required exists" in out
        assert _host(share)["bundles"]["demo"]["next"] == "none"
        assert _host(share)["next_kernel"] == new.release
        labels = node.read(f"{NODE_FEATURES}/modstage")
        assert "modstage.io/demo.next=none" in labels, labels

        drop(node, "demo", "1", new.release, [(new_ko, "")])
        rc, out = modstage(node, "intake", timeout=600)  # 6.12's files read over 9p
        assert rc == 0, out
        b = state(node).bundle("demo")
        assert b.active == first.active and b.pending is not None
        assert b.generations[b.pending].kernel == new.release
        pending = b.pending
        code, out = modstage(node, "status", "--reboot-required")
        assert code == 0, out
        assert _host(share)["bundles"]["demo"]["next"] == "ready"

        drop(node, "demo", "2", kernel.release, [(old_ko, "")])  # an upgrade for 6.1
        rc, out = modstage(node, "intake")
        assert rc == 0, out
        upgrade = state(node).bundle("demo").pending
        assert upgrade not in (None, pending)
        code, out = modstage(node, "status", "--reboot-required")
        assert code == 0, out  # the 6.12 generation is carried for its kernel
        _publish(node)
        cover = _host(share)["bundles"]["demo"]
        assert cover == {"next": "ready", "next_generation": pending, "next_version": "1"}
        node.poweroff()

    with Vm(share, name="update-6.12", kernel=new) as node:
        node.start()  # one reboot, into the kernel the update installed
        prepare(node, certs)
        rc, out = modstage(node, "boot", replay_boot=False)
        assert rc == 0, out
        assert f"is for kernel {kernel.release}" in out, out
        b = state(node).bundle("demo")
        assert (b.phase, b.active, b.pending) == (Phase.ACTIVE, pending, upgrade)
        assert "ms_exporter" in live_modules(node)
        code, out = modstage(node, "status")
        assert code == 0 and "host: ok" in out, out
        node.poweroff()

    with Vm(share, name="update-back-6.1", kernel=kernel) as node:
        node.start()  # back into the older kernel
        prepare(node, certs)
        rc, out = modstage(node, "boot", replay_boot=False)
        assert rc == 0, out
        b = state(node).bundle("demo")
        assert (b.phase, b.active, b.pending) == (Phase.ACTIVE, upgrade, None)
        assert "ms_exporter" in live_modules(node)


def _publish(vm: Vm) -> None:
    """What every intake, boot, verb and daemon scan does: publish the state for the cluster
    (the node labels, ``_host.json``)."""
    vm.python(
        "from pathlib import Path\n"
        "from service.config import Config\n"
        "from service.layout import Layout\n"
        "from service.publish.operator import mirror_status\n"
        "mirror_status(Layout(Path('/')), Config.load(Path('/etc/modstage/config.toml')))\n"
    )


def _host(share: Path, *, missing_ok: bool = False) -> dict[str, Any]:
    """The host's announcement, read on the host side of the state share ({} while there is
    none, with ``missing_ok``)."""
    path = share / "status" / "_host.json"
    if missing_ok and not path.exists():
        return {}
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def test_a_kernel_without_a_driver_holds_then_boots_without_it_and_one_drop_brings_it_back(
    kernel: Kernel, key: SigningKey, tmp_path: Path
) -> None:
    """A 6.1 node with ``demo`` active; 6.12 installed, no drop for it:

    1. the daemon (its periodic scan five minutes away) announces 6.12 in ``_host.json`` and
       the labels within seconds of the install, and hears the package's kernel hook;
    2. ``status --reboot-required`` holds the reboot (exit 4, naming demo); with
       ``[kernel] hold_max = 1`` the hold has ended: exit 0, while ``status``, ``_host.json``
       (``none``) and the labels (``demo.next=none``) say demo boots without its driver;
    3. the reboot into 6.12: ``modstage boot`` names demo as having no generation for 6.12
       (exit 1), ``status`` grades it failed (exit 2), ``modstage wait --bundle demo`` says
       it waits for its kernel (exit 4, not 0);
    4. a drop for 6.12 is accepted there, and one reboot into 6.12 brings demo live."""
    new = Kernel.named("6.12")
    certs = {"vendor.pem": key.cert_pem.read_bytes()}
    kernel_table = f'[kernel]\nnext = "{new.release}"\n'
    publish = '[publish]\nstatus_dirs = ["/run/nvidia/modstage/status"]\n'
    old_ko = _signed(kernel, key, tmp_path / "old")
    new_ko = _signed(new, key, tmp_path / "new")
    share = tmp_path / "state"
    exports_cache.seed(share, new)
    with Vm(share, name="nodriver-6.1", kernel=kernel) as node:
        node.start()
        prepare(node, certs)
        drop(node, "demo", "1", kernel.release, [(old_ko, "")])
        assert modstage(node, "intake")[0] == 0
        rc, out = modstage(node, "boot", replay_boot=False)
        assert rc == 0 and "ms_exporter" in live_modules(node), out
        first = state(node).bundle("demo").active

        node.run(f"mkdir -p {NODE_FEATURES} /var/run").check()
        prepare(node, certs, kernel_table + publish)
        log = start_daemon(node, "kernel-watch.log")
        wait_until(  # the first scan: [kernel] next names a kernel with no image yet
            lambda: (
                any(e["event"] == "daemon.ready" for e in daemon_events(log))
                and _host(share, missing_ok=True).get("next_kernel", "") is None
            ),
            120,
            "the first scan",
        )
        installed = time.monotonic()
        _install(node, new)
        wait_until(lambda: _host(share)["next_kernel"] == new.release, 60, "6.12 announced")
        seconds = time.monotonic() - installed
        assert _host(share)["bundles"]["demo"]["next"] == "none"
        assert "modstage.io/demo.next=none" in node.read(f"{NODE_FEATURES}/modstage")
        events = [e["event"] for e in daemon_events(log)]
        assert "kernels.changed" in events, events
        [watching] = [e for e in daemon_events(log) if e["event"] == "kernels.watching"]
        trees = node.eval("os.path.realpath('/lib/modules')")  # merged /usr: /usr/lib/modules
        assert {"/boot", trees, "/run/modstage/kernel-hook"} <= set(watching["dirs"]), watching
        hooks = "/etc/kernel/postinst.d"
        hook = f"mkdir -p {hooks} && cp {HOOK} {hooks}/ && {hooks}/{HOOK.name} {new.release}"
        node.run(hook).check()
        wait_until(
            lambda: any(e["event"] == "kernels.hook" for e in daemon_events(log)), 60, "the hook"
        )
        node.python("daemon.terminate(); daemon.wait(timeout=60)")
        print(f"\n6.12 announced {seconds:.1f} s after its install began")

        node.run("echo '*** System restart required ***' > /var/run/reboot-required").check()
        code, out = modstage(node, "status", "--reboot-required")
        assert code == 4, out
        assert f"held: the next boot runs kernel {new.release} and demo has no generation" in out
        prepare(node, certs, kernel_table + "hold_max = 1\n" + publish)
        code, out = modstage(node, "status", "--reboot-required")
        assert code == 0, out
        code, out = modstage(node, "status")
        assert "demo has no generation for it: it boots without its driver" in out, out
        _publish(node)
        assert _host(share)["bundles"]["demo"] == {"next": "none"}
        assert "modstage.io/demo.next=none" in node.read(f"{NODE_FEATURES}/modstage")
        node.poweroff()

    with Vm(share, name="nodriver-6.12", kernel=new) as node:
        node.start()  # the reboot the gate let through
        prepare(node, certs)
        node.run(f"mkdir -p {NODE_FEATURES}").check()  # nfd's directory, kept on a node
        rc, out = modstage(node, "boot", replay_boot=False)
        assert rc == 1, out
        assert f"demo: other_kernel (active {first}" in out, out
        assert f"nothing for this kernel {new.release}" in out, out
        assert state(node).bundle("demo").phase is Phase.OTHER_KERNEL
        labels = node.read(f"{NODE_FEATURES}/modstage")
        assert "modstage.io/demo.phase=other_kernel" in labels, labels
        code, out = modstage(node, "status")
        assert code == 2 and f"no generation for the running kernel {new.release}" in out, out
        code, out = modstage(node, "wait", "--bundle", "demo", "--timeout", "5")
        assert code == 4 and "targets another kernel than the running" in out, out
        drop(node, "demo", "1", new.release, [(new_ko, "")])
        rc, out = modstage(node, "intake", timeout=600)
        assert rc == 0, out
        b = state(node).bundle("demo")
        assert b.pending is not None and b.generations[b.pending].kernel == new.release
        pending = b.pending
        node.poweroff()

    with Vm(share, name="nodriver-6.12-again", kernel=new) as node:
        node.start()  # one reboot, into 6.12 again
        prepare(node, certs)
        rc, out = modstage(node, "boot", replay_boot=False)
        assert rc == 0, out
        b = state(node).bundle("demo")
        assert (b.phase, b.active, b.pending) == (Phase.ACTIVE, pending, None)
        assert "ms_exporter" in live_modules(node)
        code, out = modstage(node, "status")
        assert code == 0 and "host: ok" in out, out
