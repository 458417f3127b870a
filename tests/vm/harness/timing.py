"""Boot times of every VM started in this process, for the pytest summary."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BootRecord:
    """One boot: which VM, how long from starting qemu to the agent's first answer."""

    name: str
    seconds: float
    accel: str


BOOTS: list[BootRecord] = []
RETRIES: list[tuple[str, str]] = []  # (VM, its console) of boots tried again


def record_boot(name: str, seconds: float, accel: str) -> None:
    """Remember one boot."""
    BOOTS.append(BootRecord(name, seconds, accel))


def record_retry(name: str, console: str) -> None:
    """Remember a boot that ended by itself before its agent answered, and was tried again."""
    RETRIES.append((name, console))
    print(f"\n{name}: the guest ended before its agent answered; booting it once more:\n{console}")


def summary() -> list[str]:
    """Lines describing the boots so far (empty if none)."""
    if not BOOTS:
        return []
    times = sorted(boot.seconds for boot in BOOTS)
    accels = ", ".join(sorted({boot.accel for boot in BOOTS}))
    lines = [
        f"{len(BOOTS)} boots ({accels}): min {times[0]:.1f} s, "
        f"median {times[len(times) // 2]:.1f} s, max {times[-1]:.1f} s, "
        f"total {sum(times):.1f} s"
    ]
    lines += [f"  {boot.name}: {boot.seconds:.1f} s" for boot in BOOTS]
    lines += [f"  {name}: ended before its agent answered, booted once more" for name, _ in RETRIES]
    return lines
