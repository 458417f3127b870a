"""The container commands' arguments: ``modstage stage`` and ``modstage wait``.

``service.parser`` adds these subcommands to the one ``modstage`` parser (their help, example
and exit codes are in its verb table); their arguments live beside the code that runs them
(:mod:`stager.drop`, :mod:`stager.wait`), and need the standard library alone.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def stage(p: argparse.ArgumentParser) -> None:
    """``modstage stage``: where the drop goes, what it says and carries."""
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


def wait(p: argparse.ArgumentParser) -> None:
    """``modstage wait``: which generation to wait for, where, how long, what to signal."""
    p.add_argument(
        "--status-dir",
        type=Path,
        default=Path("/var/lib/modstage/status"),
        metavar="DIR",
        help="the status directory mounted into the container (default: %(default)s)",
    )
    p.add_argument("--bundle", required=True, help="bundle (slot) name, e.g. nvidia")
    p.add_argument(
        "--generation", metavar="ID", help="generation id (64 hex digits, or a prefix of 8 or more)"
    )
    p.add_argument(
        "--timeout",
        type=float,
        metavar="S",
        help="give up after S seconds, S >= 0 (exit 3; default: wait forever)",
    )
    p.add_argument(
        "--drop",
        type=Path,
        metavar="DIR",
        help="the drop 'modstage stage' printed: wait for its generation, see its rejection",
    )
    p.add_argument(
        "--interval", type=float, default=1.0, metavar="S", help="poll every S seconds (default 1)"
    )
    p.add_argument(
        "--ready-file",
        type=Path,
        metavar="PATH",
        help="create PATH once the generation is active (readiness probe)",
    )
    p.add_argument(
        "--boot-id-file",
        type=Path,
        default=Path("/proc/sys/kernel/random/boot_id"),
        metavar="PATH",
        help="this boot's id: a generation is active only once loaded in it (default: %(default)s)",
    )
