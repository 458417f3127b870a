"""The ``modstage`` command: parse, dispatch lazily, map errors to messages and exit codes.

Each subcommand names the module that runs it; that module is imported only
when the subcommand runs, so ``modstage stage`` works in a container holding
tomli-w alone and ``modstage boot`` imports nothing the boot path does not use.
A command's ``run(args, out)`` returns the exit code; errors are mapped to
messages and exit codes here and nowhere else. The parser is
:mod:`service.parser`; the boot unit's own command line is read without it
(:func:`boot_line`).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, TextIO, cast

from stager.errors import StagerError

if TYPE_CHECKING:
    import argparse

    Runner = Callable[[argparse.Namespace, TextIO], int]

EXIT_USAGE = 2
EXIT_ERROR = 1
EXIT_UNKNOWN = 3  # status --reboot-required: cannot tell (never 1, kured's "not required")


def boot_line(words: Sequence[str]) -> argparse.Namespace | None:
    """``modstage boot [--root PREFIX] [--dry-run]`` read without argparse; None otherwise.

    The boot unit's command line runs on every node's boot path, where importing
    argparse and building even one command's parser costs about 3 ms. Anything else
    (help, an abbreviated, repeated or unknown option, a value that looks like an
    option) is left to :func:`service.parser.build_parser`, which also words the errors;
    ``tests/service/test_cli.py`` checks that both read the forms taken here alike.
    """
    if not words or words[0] != "boot":
        return None
    root: str | None = None
    dry_run = False
    rest = iter(words[1:])
    for word in rest:
        if word == "--dry-run" and not dry_run:
            dry_run = True
        elif word == "--root" and root is None:
            root = next(rest, None)
            if root is None or root.startswith("-"):
                return None
        elif word.startswith("--root=") and root is None:
            root = word.removeprefix("--root=")
        else:
            return None
    args = SimpleNamespace(
        version=None,
        subcommand="boot",
        root=Path("/" if root is None else root),
        dry_run=dry_run,
        command="service.cmd.boot",
    )
    return cast("argparse.Namespace", args)  # the commands read attributes only


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run ``modstage``; the one place that turns errors into messages and exit codes."""
    out = out if out is not None else sys.stdout
    words = list(sys.argv[1:] if argv is None else argv)
    args = boot_line(words)
    if args is None:
        from service.parser import build_parser

        args = build_parser(words[0] if words else None).parse_args(words)
    error = EXIT_ERROR
    if getattr(args, "reboot_required", False):
        error = EXIT_UNKNOWN  # kured reads exit 1 as a silent "not required"
    gc.disable()  # what importing a command allocates lives as long as the process:
    try:  # collecting during the imports (a tenth of ``modstage boot``) finds nothing
        module = importlib.import_module(args.command)
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.startswith(("service.", "stager.")):
            print(f"modstage {args.subcommand}: not available in this build", file=sys.stderr)
            return EXIT_USAGE
        print(
            f"modstage {args.subcommand}: missing dependency {exc.name!r} "
            "(install modstage[host] on the host)",
            file=sys.stderr,
        )
        return error
    finally:
        gc.freeze()  # and later collections need not scan it again
        gc.enable()
    run: Runner = module.run
    try:
        return run(args, out)
    except StagerError as exc:
        print(f"modstage {args.subcommand}: error: {exc}", file=sys.stderr)
        return int(getattr(exc, "exit_code", EXIT_ERROR))
    except Exception as exc:
        from service.errors import ServiceError

        if isinstance(exc, ServiceError):
            print(f"modstage {args.subcommand}: error: {exc}", file=sys.stderr)
            return error
        raise


def entry() -> None:
    """The ``modstage`` console script: :func:`main`; ``boot`` then ends the process at once.

    ``modstage boot`` is on every node's boot critical path: systemd starts the kubelet
    when it exits. Everything it persists is durable (the crash-safe write fsyncs) and
    its lock is released before :func:`main` returns, so the interpreter's teardown
    (freeing every imported module's objects, a seventh of the whole process) buys
    nothing: the output is flushed and ``os._exit`` ends it. Other commands exit normally.
    """
    code = main()
    if sys.argv[1:2] == ["boot"]:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
