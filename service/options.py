"""Each command's arguments (the host's; the container's are in :mod:`stager.args`).

One function a command, given the command's parser: :data:`service.parser.VERBS` names
it beside the command's help, example, exit codes and the module that runs it.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def root(parser: argparse.ArgumentParser) -> None:
    """``--root``: every host command's."""
    parser.add_argument(
        "--root",
        type=Path,
        default=Path("/"),
        metavar="PREFIX",
        help="root every default path (/etc, /var, /run, /sys, /proc) under PREFIX (default: /); "
        "any other PREFIX is a sandbox: modules are never loaded, the machine never rebooted",
    )


def verify(p: argparse.ArgumentParser) -> None:
    """``verify``: the certificates, the target kernel, each FILE or DIR."""
    p.add_argument(
        "--trusted",
        type=Path,
        metavar="DIR",
        help="certificate directory (default: /etc/modstage/trusted.d under --root)",
    )
    p.add_argument(
        "--kernel",
        metavar="RELEASE",
        help=(
            "target kernel release (default: the running kernel); its vermagic and config "
            "are read under --root (lib/modules/RELEASE, boot/config-RELEASE, or vmlinuz "
            "and config in lib/modules/RELEASE where /boot has none)"
        ),
    )
    p.add_argument(
        "--kernel-keys",
        action="store_true",
        help=(
            "also trust the certificates built into the target kernel's image (what it "
            "loads into .builtin_trusted_keys), so that the distribution's own modules are "
            "judged without extracting its key; the trusted directory may then be absent"
        ),
    )
    p.add_argument("--json", action="store_true", help="print a JSON list of verdicts")
    p.add_argument(
        "--apart",
        action="store_true",
        help=(
            "judge each FILE alone, as loaded on a kernel where none of the other files "
            "named is loaded (default: FILEs named together are one bundle, loaded in the "
            "order given)"
        ),
    )
    p.add_argument(
        "paths",
        type=Path,
        nargs="+",
        metavar="FILE|DIR",
        help="a module file (.ko, .ko.xz, .ko.zst, .ko.gz) or a drop directory. FILEs named "
        "together are judged as one bundle, in the order given (as intake and modprobe "
        "resolve them); a DIR is a drop, judged as its own bundle",
    )


def intake(p: argparse.ArgumentParser) -> None:
    """``intake``: which drops (default: every complete one)."""
    p.add_argument(
        "drops",
        type=Path,
        nargs="*",
        metavar="DROP",
        help="drop directories (default: every complete drop in incoming/)",
    )


def boot(p: argparse.ArgumentParser) -> None:
    """``boot``: preview, or load again in a boot that loaded already."""
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print what the next boot would do (order, parameters, firmware, memory "
        "policy, verdicts), decided as the boot decides (a config.toml with a typo salvaged "
        "alike); every printed line starts 'preview:' and every log line carries "
        "preview=true; changes nothing",
    )
    p.add_argument(
        "--force-live-load",
        action="store_true",
        help="run even though modstage boot already ran in this boot, or the daemon started "
        "before it: this loads and unloads modules in the running system, which a driver in "
        "use may not survive (without it, such a run changes nothing and says so, exit 0)",
    )


def status(p: argparse.ArgumentParser) -> None:
    """``status``: as JSON, with issuers, or kured's sentinel answer."""
    p.add_argument("--json", action="store_true", help="print the status as JSON")
    p.add_argument(
        "--issuers",
        action="store_true",
        help="also show each signer's whole issuer name (--json always has it)",
    )
    p.add_argument(
        "--reboot-required",
        action="store_true",
        help="exit 0 if a reboot is required, 1 if not, 3 if modstage cannot tell "
        "(the reason on stderr); kured's sentinel command",
    )


def sandbox(p: argparse.ArgumentParser) -> None:
    """``sandbox``: where, for which kernel, trusting which certificate."""
    p.add_argument(
        "sandbox",
        type=Path,
        metavar="ROOT",
        help="the sandbox's directory: new, empty, or a sandbox already (it gains only what "
        "it lacks)",
    )
    p.add_argument(
        "--kernel",
        required=True,
        metavar="RELEASE",
        help="the kernel release the sandbox runs; /lib/modules/RELEASE and its config and "
        "image in /boot (or in that tree) must be this host's",
    )
    p.add_argument(
        "--trust",
        required=True,
        type=Path,
        metavar="CERT",
        help="the PEM or DER certificate whose key signs the modules (copied to "
        "etc/modstage/trusted.d)",
    )


BUNDLE = "the bundle (slot) name its manifest gives, e.g. nvidia (modstage status lists them)"
#: What ``GEN`` is for each verb that takes one.
GEN = {
    "retry": "the failed generation to try again: its id or a unique prefix of it (default: "
    "the bundle's newest failed one; modstage generations BUNDLE lists them)",
    "rollback": "the stored generation the next boot loads: its id or a unique prefix of it "
    "(default: the one before the active one; the active one itself cancels a pending "
    "generation)",
}


def nothing(p: argparse.ArgumentParser) -> None:
    """A command without arguments of its own (``serve``)."""


def generations(p: argparse.ArgumentParser) -> None:
    """``generations``: one bundle or all."""
    p.add_argument("bundle", nargs="?", metavar="BUNDLE", help=f"only this bundle: {BUNDLE}")
    as_json(p)


def bundle(p: argparse.ArgumentParser) -> None:
    """``hold``, ``release``, ``forget``: the bundle."""
    p.add_argument("bundle", metavar="BUNDLE", help=BUNDLE)
    as_json(p)


def retry(p: argparse.ArgumentParser) -> None:
    """``retry``: the bundle and which failed generation."""
    p.add_argument("bundle", metavar="BUNDLE", help=BUNDLE)
    p.add_argument("generation", nargs="?", metavar="GEN", help=GEN["retry"])
    as_json(p)


def rollback(p: argparse.ArgumentParser) -> None:
    """``rollback``: the bundle and which stored generation."""
    p.add_argument("bundle", metavar="BUNDLE", help=BUNDLE)
    p.add_argument("generation", nargs="?", metavar="GEN", help=GEN["rollback"])
    as_json(p)


def prune(p: argparse.ArgumentParser) -> None:
    """``prune``: how many to keep."""
    p.add_argument(
        "--keep", type=int, metavar="N", help="keep the newest N per bundle (default: retain)"
    )
    as_json(p)


def as_json(p: argparse.ArgumentParser) -> None:
    """``--json``: the admin's verbs and ``config check``."""
    p.add_argument("--json", action="store_true", help="print JSON")
