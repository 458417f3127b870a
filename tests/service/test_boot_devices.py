"""Boot and status with PCI devices: absent hardware is no failure, status names the drivers.

The recording kernel answers ENODEV for ``ms_pci`` (the module's init without its device, as
the real driver does); the devices are a temporary sysfs tree laid out as the kernel's.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from structlog.testing import capture_logs

from service.bundles.phase import Phase
from service.layout import Layout
from service.status.collect import collect
from service.status.health import Health
from service.status.view import lines
from tests.service.fakes import FakeKernel
from tests.service.fakes import boot_with as _boot
from tests.service.fakes import pending as _pending

EDU = "pci:v00001234d000011E8sv00001AF4sd00001100bc00scFFi00"


def _loaded(host: Layout, module: str) -> None:
    """``/sys/module/<module>`` as the kernel shows a loaded module: with ``initstate`` (a
    directory without it is built-in code's, whose name a module may not take)."""
    (host.sys / "module" / module).mkdir(parents=True, exist_ok=True)
    (host.sys / "module" / module / "initstate").write_text("live\n")


def _device(host: Layout, address: str, driver: str | None = None) -> None:
    """An edu device under the host's sysfs, bound to ``driver`` (a module of that name)."""
    real = host.sys / "devices/pci0000:00" / address
    real.mkdir(parents=True)
    (real / "modalias").write_text(EDU + "\n")
    bus = host.sys / "bus/pci/devices"
    bus.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(real, bus), bus / address)
    if driver:
        drv = host.sys / "bus/pci/drivers" / driver
        drv.mkdir(parents=True, exist_ok=True)
        _loaded(host, driver)
        if not (drv / "module").exists():
            os.symlink(os.path.relpath(host.sys / "module" / driver, drv), drv / "module")
        os.symlink(os.path.relpath(drv, real), real / "driver")


def test_absent_device_is_no_device_no_attempt_no_fallback_and_loads_once_present(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """ENODEV from a module whose aliases match no present device: the bundle is no_device,
    the attempt is given back, the generation is not failed, the last known good is not
    loaded and status stays healthy saying so (the log warns); the next boot with the device
    loads it."""
    good = _pending(host, kernel, [(signed["ms_exporter"], "")])
    _boot(host, FakeKernel()).run()
    gen = _pending(host, kernel, [(signed["ms_exporter"], ""), (signed["ms_pci"], "")], "2")
    fake = FakeKernel(fail={"ms_pci": errno.ENODEV})
    with capture_logs() as logs:
        state = _boot(host, fake).run()
    assert fake.calls == [
        ("load", "ms_exporter", ""),
        ("load", "ms_pci", ""),
        ("unload", "ms_exporter"),
    ]
    b = state.bundle("test")
    assert (b.phase, b.active, b.pending, b.loaded) == (Phase.NO_DEVICE, good, gen, ())
    [absent] = [e for e in logs if e["event"] == "generation.no_device"]
    assert (absent["bundle"], absent["generation"], absent["log_level"]) == ("test", gen, "warning")
    assert b.generations[gen].attempts == 0 and b.generations[gen].failed is None
    assert "no device its 1 PCI alias(es) match is present" in b.history[-1].note
    report = collect(host)
    assert report.health is Health.HEALTHY, report.problems
    assert "  test: no device was present at boot (nothing loaded; the next boot retries)" in lines(
        report
    )
    assert report.to_json()["bundles"]["test"]["phase"] == "no_device"
    assert not state.awaiting_reboot(kernel), "a bundle without its device must not ask a reboot"

    _device(host, "0000:00:04.0")
    fake = FakeKernel(sys=host.sys)
    state = _boot(host, fake).run()
    b = state.bundle("test")
    assert (b.phase, b.active, b.pending) == (Phase.ACTIVE, gen, None)
    assert [m.pci for m in b.loaded] == [(), ("pci:v00001234d000011E8sv*sd*bc*sc*i*",)]


def test_enodev_with_a_free_matching_device_is_the_modules_failure(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """A device the module is for is present and unbound: its ENODEV is a failure as any
    other (the generation fails, the last known good comes back)."""
    good = _pending(host, kernel, [(signed["ms_exporter"], "")])
    _boot(host, FakeKernel()).run()
    _device(host, "0000:00:04.0")
    gen = _pending(host, kernel, [(signed["ms_pci"], "")], "2")
    state = _boot(host, FakeKernel(fail={"ms_pci": errno.ENODEV})).run()
    b = state.bundle("test")
    assert (b.phase, b.active) == (Phase.ACTIVE, good)
    assert b.generations[gen].failed is not None and "ENODEV" in b.generations[gen].failed


def test_enodev_with_every_device_bound_elsewhere_names_the_driver(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """Every device the module is for is bound to another driver: no_device, the reason
    names the device and that driver."""
    _device(host, "0000:00:04.0", "vfio_pci")
    gen = _pending(host, kernel, [(signed["ms_pci"], "")])
    state = _boot(host, FakeKernel(fail={"ms_pci": errno.ENODEV})).run()
    b = state.bundle("test")
    assert (b.phase, b.pending) == (Phase.NO_DEVICE, gen)
    assert "bound to another driver: 0000:00:04.0 (1234:11e8) to vfio_pci" in b.history[-1].note


def test_status_counts_bound_devices_and_degrades_a_bundle_that_drives_none(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """Loaded, its device bound to it: "1 of 1 device bound", healthy, in --json. Its device
    taken by another driver: degraded, naming the driver; with no device: healthy."""
    _pending(host, kernel, [(signed["ms_pci"], "")])
    _device(host, "0000:00:04.0", "ms_pci")
    _boot(host, FakeKernel(sys=host.sys)).run()
    report = collect(host)
    assert report.health is Health.HEALTHY, report.problems
    assert "  test: 1 of 1 device bound" in lines(report)
    devices = report.to_json()["bundles"]["test"]["devices"]
    assert (devices["present"], devices["bound"]) == (1, 1)
    assert devices["devices"][0] | {"modalias": ""} == {
        "address": "0000:00:04.0",
        "ids": "1234:11e8",
        "modalias": "",
        "driver": "ms_pci",
        "module": "ms_pci",
        "ours": True,
    }

    (host.sys / "devices/pci0000:00/0000:00:04.0/driver").unlink()
    _device_driver(host, "0000:00:04.0", "ms_pci_rival")
    report = collect(host)
    assert report.health is Health.DEGRADED
    assert report.problems[0].reason == (
        "its modules drive none of its devices: 0 of 1 device bound; "
        "0000:00:04.0 (1234:11e8) bound to ms_pci_rival"
    )

    (host.sys / "devices/pci0000:00/0000:00:04.0/driver").unlink()
    report = collect(host)
    assert "bound to nothing" in report.bundles["test"].reasons[0]

    (host.sys / "bus/pci/devices/0000:00:04.0").unlink()
    report = collect(host)
    assert report.health is Health.HEALTHY and "  test: no device present" in lines(report)


def _device_driver(host: Layout, address: str, driver: str) -> None:
    drv = host.sys / "bus/pci/drivers" / driver
    drv.mkdir(parents=True)
    _loaded(host, driver)
    os.symlink(os.path.relpath(host.sys / "module" / driver, drv), drv / "module")
    real = host.sys / "devices/pci0000:00" / address
    os.symlink(os.path.relpath(drv, real), real / "driver")


def test_dry_run_names_the_devices_the_bundle_would_drive(
    host: Layout, signed: dict[str, Path], kernel: str
) -> None:
    """``boot --dry-run`` of a bundle with PCI aliases says which present devices its
    modules match and who drives them now; nothing is written."""
    import io

    from service.cmd.boot import dry_run

    _pending(host, kernel, [(signed["ms_pci"], "")])
    _device(host, "0000:00:04.0", "ms_pci_rival")
    before = host.state.read_bytes()
    out = io.StringIO()
    dry_run(host, out)
    assert (
        "preview:    devices now: 0 of 1 device bound; 0000:00:04.0 (1234:11e8) bound to "
        "ms_pci_rival" in out.getvalue().splitlines()
    ), out.getvalue()
    assert host.state.read_bytes() == before
