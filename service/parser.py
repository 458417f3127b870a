"""The ``modstage`` command line: one table of verbs, and the parser built from it.

:data:`VERBS` has one row a command: its help, the function that adds its arguments
(:mod:`service.options`, the container's in :mod:`stager.args`), the function that imports
the module that runs it, its worked example and its exit codes. The parser, every
``--help``, the CLI's dispatch and the manual page (``deploy/debian/manual``) come from it.

:mod:`service.cli` builds the parser on every run, ``modstage boot`` included, through
:func:`build_parser`: given the command word it builds only that command (the whole parser
only for ``--help`` or a word it does not know), which keeps argparse's cost off the boot
path. A row's ``load`` imports its module only when the command runs, so ``modstage stage``
works in a container holding tomli-w alone and ``modstage boot`` imports nothing the boot
path does not use; written as imports, they show who runs what to the import graph
(``lint-imports``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple, TextIO

from service import options
from stager import args

if TYPE_CHECKING:
    Runner = Callable[[argparse.Namespace, TextIO], int]


def _stage() -> Runner:
    from stager.drop import run

    return run


def _wait() -> Runner:
    from stager.wait import run

    return run


def _verify() -> Runner:
    from service.cmd.verify import run

    return run


def _intake() -> Runner:
    from service.cmd.intake import run

    return run


def _boot() -> Runner:
    from service.cmd.boot import run

    return run


def _serve() -> Runner:
    from service.cmd.serve import run

    return run


def _status() -> Runner:
    from service.cmd.status import run

    return run


def _sandbox() -> Runner:
    from service.cmd.sandbox import run

    return run


def _admin() -> Runner:
    from service.cmd.admin import run

    return run


def _configcheck() -> Runner:
    from service.cmd.configcheck import run

    return run


class Verb(NamedTuple):
    """One command. A NamedTuple, not a dataclass: the table is built on every boot."""

    summary: str  # its line in the list of commands (and its description unless given)
    options: Callable[[argparse.ArgumentParser], None]  # adds its arguments
    load: Callable[[], Runner] | None  # imports what runs it (None: a group, config)
    example: str  # under "example:" in its --help: a command line naming it first
    exits: str  # its exit codes, in its --help and the manual
    description: str | None = None  # its --help's paragraph (None: the summary)
    root: bool = True  # takes --root
    host: bool = True  # a host command: --root checked, the log configured
    kernel_tree: bool = False  # its --root may be a kernel's tree alone
    parent: str | None = None  # the group it is an ACTION of (``config check``)


#: ``modstage`` itself: its example and exit codes.
EXAMPLE = "modstage status --root /tmp/sandbox"
EXITS = (
    "0 success, 1 error, 2 usage (a --root other than / that is not a modstage host or "
    "sandbox, too); each command lists its own (COMMAND --help)"
)

#: Every command, in ``modstage --help``'s order.
VERBS: dict[str, Verb] = {
    "stage": Verb(
        "(container) copy modules and firmware into a new drop",
        args.stage,
        _stage,
        example="modstage stage --into /var/lib/modstage/incoming --bundle nvidia \\\n"
        '    --version 580.95.05 --kernel "$(uname -r)" \\\n'
        "    --module nvidia.ko:NVreg_OpenRmEnableUnsupportedGpus=1 --module nvidia-uvm.ko \\\n"
        "    --firmware firmware/",
        exits="0 drop written (its path printed), 1 error (a file refused, unreadable), "
        "2 usage (no --module)",
        description=(
            "Copy signed modules and firmware into a fresh drop directory, compute their "
            "digests and write manifest.toml last, by rename. Prints the drop's path. "
            "A newer drop of a bundle supersedes its older ones for the same kernel."
        ),
        root=False,
        host=False,
    ),
    "verify": Verb(
        "check module signatures, modinfo and vermagic as the kernel will",
        options.verify,
        _verify,
        example="modstage verify --kernel 6.1.0-57-amd64 nvidia.ko nvidia-uvm.ko\n"
        "    # one bundle: nvidia-uvm.ko's imports may come from nvidia.ko, named before it",
        exits="0 every module accepted, 1 any rejected or unreadable, 2 usage",
        description=(
            "Verify module files or drop directories exactly as the kernel will at load "
            "time: appended PKCS#7 signature against trusted certificates, .modinfo, "
            "vermagic. For a drop directory the manifest's digests are checked too. "
            "Exit 0 only if every module is accepted."
        ),
        kernel_tree=True,
    ),
    "intake": Verb(
        "copy complete drops into the store, verify them, record pending generations",
        options.intake,
        _intake,
        example="modstage intake --root /tmp/sandbox",
        exits="0 every drop accepted or waiting in incoming (held, behind an admin's pending "
        "rollback, its target kernel not installed), 1 any rejected or the host failed to take "
        "one in (the drop kept), 2 usage",
    ),
    "boot": Verb(
        "load each bundle's pending or active generation (run once, early at boot)",
        options.boot,
        _boot,
        example="modstage boot --dry-run",
        exits="0 every bundle up (possibly on its last known good), or nothing done because "
        "this boot's loads already happened (see --force-live-load), 1 a bundle ended failed, "
        "or other_kernel (it has an active generation, none for the running kernel: nothing of it "
        "is loaded), 2 usage",
    ),
    "serve": Verb(
        "watch for drops, schedule reboots, online memory",
        options.nothing,
        _serve,
        example="modstage serve   # what modstage.service runs",
        exits="0 stopped by a signal, 1 cannot start, 2 usage, 78 config.toml is invalid (the "
        "unit's RestartPreventExitStatus=78: no restart until an admin fixes it)",
    ),
    "status": Verb(
        "show bundles, generations and phases",
        options.status,
        _status,
        example="modstage status --reboot-required   # kured's sentinel command: exit 0 = reboot",
        exits="0 healthy, 1 degraded, 2 failed (argparse usage errors also exit 2), "
        "4 upgrading (a bundle's driver was unloaded for a pending generation and waits for its "
        "reboot, within [reboot] upgrading_bound); --reboot-required has its own, see that option",
    ),
    "wait": Verb(
        "(container) wait until a bundle's generation is active",
        args.wait,
        _wait,
        example="modstage wait --bundle nvidia --timeout 900 --ready-file /run/modstage-ready\n"
        "    # --status-dir defaults to /var/lib/modstage/status, the host's, mounted read-only",
        exits="0 the generation is active, 1 rejected or failed (or the ready file cannot be "
        "written), 2 usage (bad option value, status directory missing for 60 s), 3 timed out, "
        "4 the generation waits for another kernel than the running one (or is active for "
        "another kernel: nothing of the bundle is loaded on the running one), 5 no device it "
        "drives was present at boot (not a failure: it loads at a boot with the device present)",
        description=(
            "Poll the bundle's status file (written by the host) until the generation is "
            "active, was rejected or failed, or waits for another kernel; print one line "
            "per change. Which generation: the one of --drop, else --generation, else the one "
            "of the last drop of BUNDLE this container staged or still sees in "
            "<status-dir>/../incoming (never an older one), else the one the status file names."
        ),
        root=False,
        host=False,
    ),
    "sandbox": Verb(
        "lay out a --root sandbox from this host's kernel",
        options.sandbox,
        _sandbox,
        example='modstage sandbox /tmp/sandbox --kernel "$(uname -r)" --trust signing_key.pem',
        exits="0 laid out, 1 a file could not be written, 2 usage (ROOT holds files and is "
        "not a sandbox, no tree for RELEASE, CERT not a certificate)",
        description=(
            "lay out a --root sandbox from this host's own kernel tree (docs/sandbox.md): the "
            "certificate, the kernel's release, module tree, config and image, an empty "
            "incoming directory, the sysfs files the boot writes"
        ),
        root=False,
    ),
    "generations": Verb(
        "list every stored generation and its role",
        options.generations,
        _admin,
        example="modstage generations nvidia --json",
        exits="0 listed, 1 state unreadable, 2 usage (an unknown bundle)",
    ),
    "retry": Verb(
        "clear a failed generation's failure so the next boot tries it again",
        options.retry,
        _admin,
        example="modstage retry nvidia 9a93e95c   # after fixing what made it fail",
        exits="0 recorded, 1 refused (not failed, not in the store, being loaded), 2 usage "
        "(an unknown bundle)",
    ),
    "rollback": Verb(
        "make an earlier generation the one the next boot loads",
        options.rollback,
        _admin,
        example="modstage rollback nvidia   # the next boot loads the generation before",
        exits="0 recorded, 1 refused (already active, failed: use retry, not in the store), "
        "2 usage (an unknown bundle)",
    ),
    "hold": Verb(
        (
            "take no new generation and ask for no reboot for BUNDLE until released: its "
            "drops wait in incoming, the boot loads its last known good (a pending one waits)"
        ),
        options.bundle,
        _admin,
        example="modstage hold nvidia",
        exits="0 held, 1 already held or state unreadable, 2 usage (an unknown bundle)",
    ),
    "release": Verb(
        "undo hold",
        options.bundle,
        _admin,
        example="modstage release nvidia",
        exits="0 released, 1 not held or state unreadable, 2 usage (an unknown bundle)",
    ),
    "forget": Verb(
        (
            "forget BUNDLE (nothing active; a pending generation goes with it): its "
            "state, generations and status files, e.g. a typo'd name that keeps the host degraded"
        ),
        options.bundle,
        _admin,
        example="modstage forget nvdia   # a typo'd bundle that was only ever rejected",
        exits="0 forgotten, 1 refused (a generation active, or being loaded) or state unreadable, "
        "2 usage (no such bundle nor status file)",
    ),
    "prune": Verb(
        "remove generations beyond retention (never active or pending)",
        options.prune,
        _admin,
        example="modstage prune --keep 2",
        exits=(
            "0 done (or nothing to prune), 1 state or config unreadable, 2 usage (--keep below 0)"
        ),
    ),
    "config": Verb(
        "check the host configuration",
        options.nothing,
        None,
        example="modstage config check",
        exits="0 config and certificates usable, 1 a problem (each named), 2 usage",
        description="",
        root=False,
    ),
    "check": Verb(
        "validate config.toml and trusted certificates",
        options.as_json,
        _configcheck,
        example="modstage config check --json",
        exits="0 config and certificates usable, 1 a problem (each named), 2 usage",
        parent="config",
    ),
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


def _epilogs(parser: argparse.ArgumentParser, example: str, exits: str) -> None:
    """Add a command's example and exit codes to its --help."""
    shown = "\n".join(f"  {line}" for line in example.splitlines())
    parser.epilog = f"example:\n{shown}\n\nexit codes: {exits}"
    parser.formatter_class = _Formatter


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


def _add(sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str) -> None:
    """Add the command ``name`` of :data:`VERBS` to ``sub``, with its group's ACTIONs."""
    verb = VERBS[name]
    p = sub.add_parser(
        name,
        help=verb.summary,
        description=verb.summary if verb.description is None else verb.description,
    )
    if verb.root:
        options.root(p)
    verb.options(p)
    p.set_defaults(command=name)
    _epilogs(p, verb.example, verb.exits)
    actions = [n for n, v in VERBS.items() if v.parent == name]
    if actions:
        inner = p.add_subparsers(dest=f"{name}_command", metavar="ACTION", required=True)
        for action in actions:
            _add(inner, action)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``modstage`` argument parser; with ``command``, only that command.

    Parsing ``modstage COMMAND ...`` needs only COMMAND's parser, and building all of
    them costs ``modstage boot`` (on every node's boot path) a few milliseconds of
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
    top = [n for n, v in VERBS.items() if v.parent is None]
    for name in [command] if command in top else top:
        _add(sub, name)
    _epilogs(parser, EXAMPLE, EXITS)
    return parser
