"""The ``modstage`` command: parse, dispatch lazily, map errors to messages and exit codes.

Each command's row in :data:`service.parser.VERBS` imports the module that runs it only
when the command runs, so ``modstage stage`` works in a container holding tomli-w alone
and ``modstage boot`` imports nothing the boot path does not use. A command's
``run(args, out)`` returns the exit code; errors are mapped to messages and exit codes
here and nowhere else, and the log of a host command is configured here
(:func:`service.logs.configure`). The parser is :mod:`service.parser` (it builds only the
parser of the command given).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import TextIO

from stager.errors import StagerError

EXIT_USAGE = 2
EXIT_ERROR = 1
EXIT_UNKNOWN = 3  # status --reboot-required: cannot tell (never 1, kured's "not required")
EXIT_CONFIG = 78  # serve: the config is invalid (sysexits' EX_CONFIG; the unit does not restart)
EXIT_BROKEN_PIPE = 128 + 13  # stdout's reader went away: as a tool killed by SIGPIPE exits


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """Run ``modstage``; the one place that turns errors into messages and exit codes."""
    out = out if out is not None else sys.stdout
    words = list(sys.argv[1:] if argv is None else argv)
    from service.parser import VERBS, build_parser

    args = build_parser(words[0] if words else None).parse_args(words)
    verb = VERBS[args.command]
    error = EXIT_ERROR
    if getattr(args, "reboot_required", False):
        error = EXIT_UNKNOWN  # kured reads exit 1 as a silent "not required"
    root = getattr(args, "root", None)
    if root is not None and verb.host and error != EXIT_UNKNOWN:
        # (kured's sentinel answers every error itself, exit 3: service.status.required)
        from service.layout import root_problem

        problem = root_problem(root, kernel_tree=verb.kernel_tree)
        if problem is not None:
            print(f"modstage {args.subcommand}: error: {problem}", file=sys.stderr)
            return EXIT_USAGE
    assert verb.load is not None  # a group (config) requires its ACTION
    try:
        if verb.host:  # a host command; the container's need no log
            from service.logs import configure

            configure()  # once, here: every host command logs to stderr, never to ``out``
        run = verb.load()
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
    try:
        return run(args, out)
    except StagerError as exc:
        print(f"modstage {args.subcommand}: error: {exc}", file=sys.stderr)
        return int(getattr(exc, "exit_code", EXIT_ERROR))
    except Exception as exc:
        from service.errors import ServiceError, UsageError

        if isinstance(exc, UsageError):
            print(f"modstage {args.subcommand}: error: {exc}", file=sys.stderr)
            return error if error == EXIT_UNKNOWN else EXIT_USAGE
        if isinstance(exc, ServiceError):
            print(f"modstage {args.subcommand}: error: {exc}", file=sys.stderr)
            from service.errors import ConfigError

            if isinstance(exc, ConfigError) and args.subcommand == "serve":
                return EXIT_CONFIG  # permanent until an admin edits it: no restart loop
            return error
        if isinstance(exc, PermissionError) and exc.filename is not None:
            print(
                f"modstage {args.subcommand}: error: {exc.filename}: permission denied: "
                "run as root (sudo modstage ...)",
                file=sys.stderr,
            )
            return error if error == EXIT_UNKNOWN else EXIT_USAGE
        if isinstance(exc, OSError) and exc.filename is not None:  # a file no layer named
            print(
                f"modstage {args.subcommand}: error: {exc.filename}: "
                f"{exc.strerror or exc} (is --root a modstage host or sandbox? docs/sandbox.md)",
                file=sys.stderr,
            )
            return error
        raise


def entry() -> None:
    """The ``modstage`` console script: :func:`main`, its code the process's exit status.

    A reader that stops early (``modstage status --json | head``) closes the pipe: the next
    write, or the flush at exit, raises BrokenPipeError. modstage then stops quietly, as
    ``cat`` or ``yes`` killed by SIGPIPE do: no traceback, exit :data:`EXIT_BROKEN_PIPE`
    (128 + SIGPIPE, the status a shell shows for them). stdout is pointed at /dev/null
    first, as Python's documentation of SIGPIPE advises, so that the interpreter's own
    flush at exit does not fail again. Only stdout's own broken pipe is taken so: an EPIPE
    of anything else (the daemon's child, a socket) is raised as any error is.
    """
    try:
        code = main()
        sys.stdout.flush()  # inside the try: a closed pipe shows here, not at exit
    except BrokenPipeError:
        if not _stdout_reader_gone():
            raise
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        code = EXIT_BROKEN_PIPE
    sys.exit(code)


def _stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reading end is closed (poll reports POLLERR on the
    writing end of a pipe with no reader left)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError):
        return False


if __name__ == "__main__":
    entry()
