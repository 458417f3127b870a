"""The ``modstage`` argument parser: every command's options, help and exit codes.

:mod:`service.cli` builds the parser on every run, ``modstage boot`` included, through
:func:`build_parser`: given the command word it builds only that command's group (the
whole parser, fifteen subcommand parsers, only for ``--help`` or a word it does not
know), which keeps argparse's cost off the boot path. Each subcommand names the module
that runs it (``command``), imported by the CLI only when it runs. Each command's exit
codes are in :data:`EXIT_CODES` and in its ``--help``. The container commands'
arguments live beside their code, in :mod:`stager.args`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from stager.args import add_stage, add_wait

if TYPE_CHECKING:
    from stager.args import Subparsers


def _root(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--root",
        type=Path,
        default=Path("/"),
        metavar="PREFIX",
        help="root every default path (/etc, /var, /run, /sys, /proc) under PREFIX (default: /); "
        "any other PREFIX is a sandbox: modules are never loaded, the machine never rebooted",
    )


def _verify(sub: Subparsers) -> None:
    p = sub.add_parser(
        "verify",
        help="check module signatures, modinfo and vermagic as the kernel will",
        description=(
            "Verify module files or drop directories exactly as the kernel will at load "
            "time: appended PKCS#7 signature against trusted certificates, .modinfo, "
            "vermagic. For a drop directory the manifest's digests are checked too. "
            "Exit 0 only if every module is accepted."
        ),
    )
    _root(p)
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
    p.set_defaults(command="service.cmd.verify")


def _host(sub: Subparsers, name: str, module: str, help_: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help_, description=help_)
    _root(p)
    p.set_defaults(command=module)
    return p


def _intake(sub: Subparsers) -> None:
    """`intake`: take complete drops in."""
    intake = _host(
        sub,
        "intake",
        "service.cmd.intake",
        "copy complete drops into the store, verify them, record pending generations",
    )
    intake.add_argument(
        "drops",
        type=Path,
        nargs="*",
        metavar="DROP",
        help="drop directories (default: every complete drop in incoming/)",
    )


def _boot(sub: Subparsers) -> None:
    """`boot`: the early-boot loader."""
    boot = _host(
        sub,
        "boot",
        "service.cmd.boot",
        "load each bundle's pending or active generation (run once, early at boot)",
    )
    boot.add_argument(
        "--dry-run",
        action="store_true",
        help="print what the next boot would do (order, parameters, firmware, memory "
        "policy, verdicts), decided as the boot decides (a config.toml with a typo salvaged "
        "alike); every printed line starts 'preview:' and every log line carries "
        "preview=true; changes nothing",
    )
    boot.add_argument(
        "--force-live-load",
        action="store_true",
        help="run even though modstage boot already ran in this boot, or the daemon started "
        "before it: this loads and unloads modules in the running system, which a driver in "
        "use may not survive (without it, such a run changes nothing and says so, exit 0)",
    )


def _serve_status(sub: Subparsers) -> None:
    """`serve` and `status`: the daemon and the admin's view."""
    _host(sub, "serve", "service.cmd.serve", "watch for drops, schedule reboots, online memory")
    status = _host(sub, "status", "service.cmd.status", "show bundles, generations and phases")
    status.add_argument("--json", action="store_true", help="print the status as JSON")
    status.add_argument(
        "--issuers",
        action="store_true",
        help="also show each signer's whole issuer name (--json always has it)",
    )
    status.add_argument(
        "--reboot-required",
        action="store_true",
        help="exit 0 if a reboot is required, 1 if not, 3 if modstage cannot tell "
        "(the reason on stderr); kured's sentinel command",
    )


def _sandbox(sub: Subparsers) -> None:
    """`sandbox`: lay out a --root sandbox from this host's kernel."""
    text = (
        "lay out a --root sandbox from this host's own kernel tree (docs/sandbox.md): the "
        "certificate, the kernel's release, module tree, config and image, an empty incoming "
        "directory, the sysfs files the boot writes"
    )
    p = sub.add_parser(
        "sandbox", help="lay out a --root sandbox from this host's kernel", description=text
    )
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
    p.set_defaults(command="service.cmd.sandbox")


EXIT_CODES = {
    "modstage": "0 success, 1 error, 2 usage (a --root other than / that is not a modstage host or "
    "sandbox, too); each command lists its own (COMMAND --help)",
    "stage": "0 drop written (its path printed), 1 error (a file refused, unreadable), "
    "2 usage (no --module)",
    "verify": "0 every module accepted, 1 any rejected or unreadable, 2 usage",
    "intake": "0 every drop accepted or waiting in incoming (held, behind an admin's pending "
    "rollback, its target kernel not installed), 1 any rejected or the host failed to take "
    "one in (the drop kept), 2 usage",
    "boot": "0 every bundle up (possibly on its last known good), or nothing done because "
    "this boot's loads already happened (see --force-live-load), 1 a bundle ended failed, "
    "or other_kernel (it has an active generation, none for the running kernel: nothing of it "
    "is loaded), 2 usage",
    "serve": "0 stopped by a signal, 1 cannot start, 2 usage, 78 config.toml is invalid (the "
    "unit's RestartPreventExitStatus=78: no restart until an admin fixes it)",
    "status": "0 healthy, 1 degraded, 2 failed (argparse usage errors also exit 2), "
    "4 upgrading (a bundle's driver was unloaded for a pending generation and waits for its "
    "reboot, within [reboot] upgrading_bound); --reboot-required has its own, see that option",
    "wait": "0 the generation is active, 1 rejected or failed (or the ready file cannot be "
    "written), 2 usage (bad option value, status directory missing for 60 s), 3 timed out, "
    "4 the generation waits for another kernel than the running one (or is active for "
    "another kernel: nothing of the bundle is loaded on the running one), 5 no device it drives "
    "was present at boot (not a failure: it loads at a boot with the device present)",
    "generations": "0 listed, 1 state unreadable, 2 usage (an unknown bundle)",
    "retry": "0 recorded, 1 refused (not failed, not in the store, being loaded), 2 usage "
    "(an unknown bundle)",
    "rollback": "0 recorded, 1 refused (already active, failed: use retry, not in the store), "
    "2 usage (an unknown bundle)",
    "hold": "0 held, 1 already held or state unreadable, 2 usage (an unknown bundle)",
    "release": "0 released, 1 not held or state unreadable, 2 usage (an unknown bundle)",
    "forget": "0 forgotten, 1 refused (a generation active, or being loaded) or state unreadable, "
    "2 usage (no such bundle nor status file)",
    "prune": "0 done (or nothing to prune), 1 state or config unreadable, 2 usage (--keep below 0)",
    "sandbox": "0 laid out, 1 a file could not be written, 2 usage (ROOT holds files and is "
    "not a sandbox, no tree for RELEASE, CERT not a certificate)",
    "config": "0 config and certificates usable, 1 a problem (each named), 2 usage",
    "check": "0 config and certificates usable, 1 a problem (each named), 2 usage",
}


class _Version(argparse.Action):
    """``--version``: looked up only when asked (importlib.metadata is off the boot path)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object, **__: object) -> None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = version("modstage")
        except PackageNotFoundError:
            found = "unknown (not installed)"
        print(f"modstage {found}")
        parser.exit()


BUNDLE = "the bundle (slot) name its manifest gives, e.g. nvidia (modstage status lists them)"
#: What ``GEN`` is for each verb that takes one.
GEN = {
    "retry": "the failed generation to try again: its id or a unique prefix of it (default: "
    "the bundle's newest failed one; modstage generations BUNDLE lists them)",
    "rollback": "the stored generation the next boot loads: its id or a unique prefix of it "
    "(default: the one before the active one; the active one itself cancels a pending "
    "generation)",
}


def _admin(sub: Subparsers) -> None:
    """The admin's verbs (service/cmd/admin.py, configcheck.py); each has --json."""
    module = "service.cmd.admin"
    gens = _host(sub, "generations", module, "list every stored generation and its role")
    gens.add_argument("bundle", nargs="?", metavar="BUNDLE", help=f"only this bundle: {BUNDLE}")
    verbs = {
        "retry": "clear a failed generation's failure so the next boot tries it again",
        "rollback": "make an earlier generation the one the next boot loads",
        "hold": "take no new generation and ask for no reboot for BUNDLE until released: its "
        "drops wait in incoming, the boot loads its last known good (a pending one waits)",
        "release": "undo hold",
        "forget": "forget BUNDLE (nothing active; a pending generation goes with it): its "
        "state, generations and status files, e.g. a typo'd name that keeps the host degraded",
    }
    for verb, text in verbs.items():
        p = _host(sub, verb, module, text)
        p.add_argument("bundle", metavar="BUNDLE", help=BUNDLE)
        if verb in GEN:
            p.add_argument("generation", nargs="?", metavar="GEN", help=GEN[verb])
    prune = _host(
        sub, "prune", module, "remove generations beyond retention (never active or pending)"
    )
    prune.add_argument(
        "--keep", type=int, metavar="N", help="keep the newest N per bundle (default: retain)"
    )
    for name in ("generations", *verbs, "prune"):
        sub.choices[name].set_defaults(verb=name)
    config = sub.add_parser("config", help="check the host configuration")
    csub = config.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    _host(csub, "check", "service.cmd.configcheck", "validate config.toml and trusted certificates")
    for p in (*(sub.choices[n] for n in ("generations", *verbs, "prune")), csub.choices["check"]):
        p.add_argument("--json", action="store_true", help="print JSON")


#: One worked example per command, shown under "example:" in its --help (the first line a
#: command line naming it; ``\`` continues it, as in a shell).
EXAMPLES = {
    "modstage": "modstage status --root /tmp/sandbox",
    "stage": "modstage stage --into /var/lib/modstage/incoming --bundle nvidia \\\n"
    '    --version 580.95.05 --kernel "$(uname -r)" \\\n'
    "    --module nvidia.ko:NVreg_OpenRmEnableUnsupportedGpus=1 --module nvidia-uvm.ko \\\n"
    "    --firmware firmware/",
    "verify": "modstage verify --kernel 6.1.0-57-amd64 nvidia.ko nvidia-uvm.ko\n"
    "    # one bundle: nvidia-uvm.ko's imports may come from nvidia.ko, named before it",
    "intake": "modstage intake --root /tmp/sandbox",
    "boot": "modstage boot --dry-run",
    "serve": "modstage serve   # what modstage.service runs",
    "status": "modstage status --reboot-required   # kured's sentinel command: exit 0 = reboot",
    "wait": "modstage wait --bundle nvidia --timeout 900 --ready-file /run/modstage-ready\n"
    "    # --status-dir defaults to /var/lib/modstage/status, the host's, mounted read-only",
    "generations": "modstage generations nvidia --json",
    "retry": "modstage retry nvidia 9a93e95c   # after fixing what made it fail",
    "rollback": "modstage rollback nvidia   # the next boot loads the generation before",
    "hold": "modstage hold nvidia",
    "release": "modstage release nvidia",
    "forget": "modstage forget nvdia   # a typo'd bundle that was only ever rejected",
    "prune": "modstage prune --keep 2",
    "config": "modstage config check",
    "check": "modstage config check --json",
    "sandbox": 'modstage sandbox /tmp/sandbox --kernel "$(uname -r)" --trust signing_key.pem',
}


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Paragraphs filled to the terminal's width, as argparse fills them; an indented line
    or one ending in ``\\`` (an example's command) kept as it is written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        fill = argparse.HelpFormatter._fill_text
        out = []
        for paragraph in text.split("\n\n"):
            lines = paragraph.splitlines()
            if any(line.startswith(" ") or line.endswith("\\") for line in lines):
                out.append("\n".join(indent + line for line in lines))
            else:
                out.append(fill(self, paragraph, width, indent))
        return "\n\n".join(out)


def _epilogs(parser: argparse.ArgumentParser, name: str = "modstage") -> None:
    """Add each command's example and exit codes to its --help, recursively."""
    example = "\n".join(f"  {line}" for line in EXAMPLES[name].splitlines())
    codes = EXIT_CODES.get(name, EXIT_CODES["modstage"])
    parser.epilog = f"example:\n{example}\n\nexit codes: {codes}"
    parser.formatter_class = _Formatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub_parser in action.choices.items():
                _epilogs(sub_parser, sub_name)


#: Each command's parser builder, in ``modstage --help``'s order (a builder adds its group).
COMMANDS: dict[str, Callable[[Subparsers], object]] = {
    "stage": add_stage,
    "verify": _verify,
    "intake": _intake,
    "boot": _boot,
    "serve": _serve_status,
    "status": _serve_status,
    "wait": add_wait,
    "sandbox": _sandbox,
    **dict.fromkeys(
        ("generations", "retry", "rollback", "hold", "release", "forget", "prune", "config"),
        _admin,
    ),
}


class _Parser(argparse.ArgumentParser):
    """An argument parser that refuses the arguments it does not know itself.

    argparse hands a subcommand's unknown arguments (``status nosuch``, ``boot --dry-run
    --json``) up to the top-level parser, which prints its own usage; every parser of
    modstage's (subcommands inherit the class) reports them with its own usage instead.
    """

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        """Parse ``args``; what is left over is this parser's usage error (exit 2)."""
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed, extras


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``modstage`` argument parser; with ``command``, only that command's group.

    Parsing ``modstage COMMAND ...`` needs only COMMAND's parser, and building all
    fifteen costs ``modstage boot`` (on every node's boot path) a few milliseconds of
    gettext lookups; ``modstage --help`` and anything else get the whole parser.
    """
    parser: argparse.ArgumentParser = _Parser(  # its subcommands' parsers are _Parser too
        prog="modstage",
        description=(
            "Stage signed out-of-tree kernel modules from a container and load them on the "
            "host at the next reboot, falling back to the last good set."
        ),
    )
    parser.add_argument("--version", action=_Version, nargs=0, help="print the version and exit")
    sub = parser.add_subparsers(dest="subcommand", metavar="COMMAND", required=True)
    builders = [COMMANDS[command]] if command in COMMANDS else COMMANDS.values()
    for build in dict.fromkeys(builders):
        build(sub)
    _epilogs(parser)
    return parser
