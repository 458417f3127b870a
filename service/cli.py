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

from stager.schema.failures import StagerError

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
    # kured reads exit 1 as a silent "not required": its sentinel command's errors exit 3
    error = EXIT_UNKNOWN if getattr(args, "reboot_required", False) else EXIT_ERROR
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
        return _not_installed(exc, args.subcommand, error)
    try:
        return run(args, out)
    except Exception as exc:
        code = _failed(exc, args.subcommand, error)
        if code is None:  # no layer named it: a bug, raised with its traceback
            raise
        return code


def _not_installed(exc: ModuleNotFoundError, command: str, error: int) -> int:
    """Say that ``command`` cannot run here (a module of its own missing from this build, or
    a host dependency missing) and return its exit code."""
    if exc.name is not None and exc.name.startswith(("service.", "stager.")):
        print(f"modstage {command}: not available in this build", file=sys.stderr)
        return EXIT_USAGE
    print(
        f"modstage {command}: missing dependency {exc.name!r} (install modstage[host] on the host)",
        file=sys.stderr,
    )
    return error


def _failed(exc: Exception, command: str, error: int) -> int | None:
    """Say why ``command`` failed with ``exc`` and return its exit code (``error``: the
    command's code for an error); None for an exception no layer named.

    The container side's errors carry their code; a usage error and a file modstage may not
    open (run it as root) are usage (2); an invalid config ends ``serve`` with
    :data:`EXIT_CONFIG`, permanent until an admin edits it, so the unit does not restart
    in a loop; any other error of the host side, or a file no layer named, is ``error``.
    """
    usage = error if error == EXIT_UNKNOWN else EXIT_USAGE
    if isinstance(exc, StagerError):
        said, code = str(exc), int(getattr(exc, "exit_code", EXIT_ERROR))
    else:
        from service.errors import ConfigError, ServiceError, UsageError

        if isinstance(exc, UsageError):
            said, code = str(exc), usage
        elif isinstance(exc, ServiceError):
            serve_config = isinstance(exc, ConfigError) and command == "serve"
            said, code = str(exc), EXIT_CONFIG if serve_config else error
        elif isinstance(exc, PermissionError) and exc.filename is not None:
            said = f"{exc.filename}: permission denied: run as root (sudo modstage ...)"
            code = usage
        elif isinstance(exc, OSError) and exc.filename is not None:  # a file no layer named
            said = (
                f"{exc.filename}: {exc.strerror or exc} "
                "(is --root a modstage host or sandbox? docs/sandbox.md)"
            )
            code = error
        else:
            return None
    print(f"modstage {command}: error: {said}", file=sys.stderr)
    return code


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
