"""The container commands' arguments: ``modstage stage`` and ``modstage wait``.

``service.cli`` adds these subcommands to the one ``modstage`` parser; they live
beside the code that runs them (:mod:`stager.drop`, :mod:`stager.wait`), and need
the standard library alone.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


def add_stage(sub: Subparsers) -> argparse.ArgumentParser:
    """``modstage stage``: where the drop goes, what it says and carries."""
    p = sub.add_parser(
        "stage",
        help="(container) copy modules and firmware into a new drop",
        description=(
            "Copy signed modules and firmware into a fresh drop directory, compute their "
            "digests and write manifest.toml last, by rename. Prints the drop's path. "
            "A newer drop of a bundle supersedes the older ones."
        ),
    )
    p.add_argument(
        "--into",
        type=Path,
        required=True,
        metavar="DIR",
        help="the incoming directory, e.g. /var/lib/modstage/incoming",
    )
    _bundle_options(p)
    _contents(p)
    _extras(p)
    p.set_defaults(command="stager.drop")
    return p


def _bundle_options(p: argparse.ArgumentParser) -> None:
    """The manifest's header: bundle, version, kernel."""
    p.add_argument("--bundle", required=True, help="bundle (slot) name, e.g. nvidia")
    p.add_argument(
        "--version",
        required=True,
        dest="bundle_version",
        help="version of what the bundle carries, e.g. 580.95.05",
    )
    p.add_argument("--kernel", required=True, help="kernel release the modules are built for")


def _contents(p: argparse.ArgumentParser) -> None:
    """The files the drop carries: modules (with parameters) and firmware."""
    p.add_argument(
        "--module",
        action="append",
        required=True,
        metavar="FILE[:PARAMS]",
        help="a module file (.ko, .ko.xz, .ko.zst, .ko.gz; anything else is refused), "
        "optionally with its parameters after the first ':'; repeat in load order (at least one)",
    )
    p.add_argument(
        "--params-dir",
        type=Path,
        metavar="DIR",
        help="directory of <module>.conf parameter files (GPU operator's "
        "kernelModuleConfig); merged into matching modules, --module wins",
    )
    p.add_argument(
        "--firmware",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="firmware directory; its files keep their relative paths",
    )


def _extras(p: argparse.ArgumentParser) -> None:
    """The bundle's order, memory policy and the operator's config digest."""
    p.add_argument(
        "--after",
        action="append",
        default=[],
        metavar="BUNDLE",
        help="a bundle whose modules must be loaded before this one's",
    )
    p.add_argument(
        "--memory",
        metavar="POLICY",
        help="auto_online_blocks policy: offline|online|online_kernel|online_movable",
    )
    p.add_argument(
        "--config-digest",
        metavar="DIGEST",
        help="the GPU operator's DRIVER_CONFIG_DIGEST; the host writes it to its configured "
        "state file once this generation is live",
    )


def add_wait(sub: Subparsers) -> argparse.ArgumentParser:
    """``modstage wait``: which generation to wait for, where, how long, what to signal."""
    wait = sub.add_parser(
        "wait",
        help="(container) wait until a bundle's generation is active",
        description=(
            "Poll the bundle's status file (written by the host) until the generation is "
            "active, was rejected or failed, or waits for another kernel; print one line "
            "per change. Which generation: the one of --drop, else --generation, else the one "
            "of the last drop of BUNDLE this container staged or still sees in "
            "<status-dir>/../incoming (never an older one), else the one the status file names."
        ),
    )
    wait.add_argument(
        "--status-dir",
        type=Path,
        default=Path("/var/lib/modstage/status"),
        metavar="DIR",
        help="the status directory mounted into the container (default: %(default)s)",
    )
    wait.add_argument("--bundle", required=True, help="bundle (slot) name, e.g. nvidia")
    wait.add_argument(
        "--generation", metavar="ID", help="generation id (64 hex digits, or a prefix of 8 or more)"
    )
    wait.add_argument(
        "--timeout",
        type=float,
        metavar="S",
        help="give up after S seconds, S >= 0 (exit 3; default: wait forever)",
    )
    wait.add_argument(
        "--drop",
        type=Path,
        metavar="DIR",
        help="the drop 'modstage stage' printed: wait for its generation, see its rejection",
    )
    wait.add_argument(
        "--interval", type=float, default=1.0, metavar="S", help="poll every S seconds (default 1)"
    )
    wait.add_argument(
        "--ready-file",
        type=Path,
        metavar="PATH",
        help="create PATH once the generation is active (readiness probe)",
    )
    wait.add_argument(
        "--boot-id-file",
        type=Path,
        default=Path("/proc/sys/kernel/random/boot_id"),
        metavar="PATH",
        help="this boot's id: a generation is active only once loaded in it (default: %(default)s)",
    )
    wait.set_defaults(command="stager.wait")
    return wait
