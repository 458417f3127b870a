"""The whole modstage story on a real kernel, narrated: ``python -m tests.vm.demo``.

A driver container stages a signed bundle on the node, the daemon verifies it and asks for a
reboot through the `command` backend, the node reboots, ``modstage boot`` loads the modules in
order with their parameters and firmware, hot-added memory is onlined, and ``modstage status``
is printed after each step. Everything runs in a QEMU guest booting Debian's signed kernel.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from tests.kmod import build_modules, kernel_release, make_key, sign
from tests.vm.harness import Vm
from tests.vm.node import live_modules, modstage, prepare, start_daemon, wait_until

CONFIG = """\
hotplug_policy = "online_movable"
[reboot]
backend = "command"
command = ["/bin/busybox", "reboot", "-f"]
min_delay = 15
"""


def say(text: str) -> None:
    """Narrate one step."""
    print(f"\n\033[1m==> {text}\033[0m", flush=True)


def show_status(vm: Vm) -> None:
    """Print ``modstage status`` as an admin on the node sees it."""
    rc, out = modstage(vm, "status")
    print(out.rstrip(), f"\n(exit code {rc})", flush=True)


def main() -> int:
    """Run the demo; exit 0 when every step did what it says."""
    work = Path(tempfile.mkdtemp(prefix="modstage-demo-"))
    kernel = kernel_release()
    say("Vendor side: build the test modules against Debian's headers, sign with sign-file")
    key = make_key(work / "key", "rsa4096", cn="Example GPU vendor")
    built = build_modules()
    modules = {
        n: sign(built[n], key, work / f"{n}.ko")
        for n in ("ms_exporter", "ms_consumer", "ms_params", "ms_firmware")
    }
    (work / "firmware" / "modstage").mkdir(parents=True)
    (work / "firmware" / "modstage" / "test.bin").write_bytes(b"\x42" * 65536)
    say(f"Boot the node: Debian {kernel} under QEMU; the host trusts the vendor certificate")
    with Vm.boot(work / "state", name="demo") as vm:
        certs = {"vendor.pem": key.cert_pem.read_bytes()}
        prepare(vm, certs, CONFIG)
        show_status(vm)
        # The state share is 9p, which raises no inotify events in the guest; a node's incoming
        # directory is on local disk, so give the guest a local one (tmpfs) for the drops.
        vm.run(
            "mkdir -p /var/lib/modstage/incoming && mount -t tmpfs tmpfs /var/lib/modstage/incoming"
        ).check()
        say("Start the host daemon (modstage serve)")
        log = start_daemon(vm, "daemon.log")
        wait_until(lambda: "daemon.ready" in log.read_text(), 60, "the daemon")
        say("Hot-add 512 MiB of memory over QMP; the daemon onlines it (ZONE_MOVABLE)")
        vm.hotplug_memory("512M")
        wait_until(lambda: log.read_text().count("memory.onlined") >= 4, 60, "memory onlining")
        for line in log.read_text().splitlines():
            if "memory.onlined" in line:
                event = json.loads(line)
                print(f"  memory{event['block']}: {event['state']} after {event['latency_ms']} ms")
        show_status(vm)
        say("Driver container: modstage stage (the modules, parameters, firmware)")
        for name, path in modules.items():
            vm.put(path, f"vendor/{name}.ko")
        vm.put(work / "firmware/modstage/test.bin", "vendor/firmware/modstage/test.bin")
        rc, out = modstage(
            vm,
            "stage",
            "--into",
            "/var/lib/modstage/incoming",
            "--bundle",
            "demo",
            "--version",
            "1.0",
            "--kernel",
            kernel,
            "--module",
            "/var/lib/modstage/vendor/ms_exporter.ko",
            "--module",
            "/var/lib/modstage/vendor/ms_consumer.ko",
            "--module",
            "/var/lib/modstage/vendor/ms_params.ko:count=42 label=demo",
            "--module",
            "/var/lib/modstage/vendor/ms_firmware.ko",
            "--firmware",
            "/var/lib/modstage/vendor/firmware",
        )
        print(f"  staged {out.strip()} (exit {rc})")
        say("The daemon verifies the drop and records it pending (a reboot is now required)")
        wait_until(lambda: "drop.accepted" in log.read_text(), 120, "the intake")
        show_status(vm)
        say("After the minimum delay the daemon asks for the reboot (command backend)")
        wait_until(lambda: not vm.running, 180, "the reboot")
        print(f"  qemu ended: the node rebooted (exit {vm.returncode})")
        for line in log.read_text().splitlines():
            if any(e in line for e in ("drop.accepted", "reboot.requested")):
                print("  " + line)
        say("Next boot: modstage boot (the oneshot) loads the generation")
        vm.start()
        prepare(vm, certs, CONFIG)
        rc, out = modstage(vm, "boot")
        print(out.rstrip())
        loaded = [m for m in reversed(live_modules(vm)) if m.startswith("ms_")]
        print(f"  live, in load order: {', '.join(loaded)}")
        print(
            f"  ms_params count={vm.read('/sys/module/ms_params/parameters/count')}"
            f" label={vm.read('/sys/module/ms_params/parameters/label')}"
        )
        print(f"  ms_firmware fw_size={vm.read('/sys/module/ms_firmware/parameters/fw_size')}")
        say("The daemon starts after the boot unit and sees the reboot it asked for happened")
        log2 = start_daemon(vm, "daemon-2.log")
        wait_until(lambda: "reboot.happened" in log2.read_text(), 120, "the daemon's reconcile")
        show_status(vm)
        ok = loaded == ["ms_exporter", "ms_consumer", "ms_params", "ms_firmware"] and rc == 0
    say("Demo " + ("complete" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
