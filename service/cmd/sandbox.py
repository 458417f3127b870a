"""``modstage sandbox ROOT --kernel RELEASE --trust CERT``: lay out a ``--root`` sandbox.

The root holds what docs/sandbox.md's table lists, taken from this host's own kernel
tree: the certificate (its certificates alone, mode 0644, never a private key the file also
holds), the running kernel's facts under ``proc`` (the release, a fresh boot id), the
release's module tree (a directory of links to each entry of ``/lib/modules/RELEASE``: the
modules, their lists, ``build``), its config and image in ``boot`` (links), an empty
``incoming``, and the ``sys`` files the boot writes (memory onlining ``offline``, an empty
firmware path). The links are to admin-owned files that verification only reads; nothing
under the root is written through them.

:func:`plan` decides (what goes where, every refusal collected first); :func:`apply`
writes. A root that holds files and is not a sandbox is refused; an existing sandbox
gains only what it lacks (its state and store are left as they are).
"""

from __future__ import annotations

import argparse
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from service.errors import ServiceError, TrustError, UsageError
from service.layout import Layout, kernel_config, kernel_image, modules_dir, root_problem

HOST = Layout(Path("/"))


@dataclass(frozen=True)
class Entry:
    """One path under the root: a directory, a file with ``text``, or a link to ``target``
    (a file copied from ``source``, when given)."""

    path: str
    text: str | None = None
    target: str | None = None
    source: Path | None = None


def _is_host(root: Path) -> bool:
    """``root`` is ``/``, however spelled."""
    return root.resolve() == Path(root.resolve().anchor)


def _tree(release: str, host: Layout) -> tuple[list[Entry], list[str]]:
    """Links to the host's module tree, config and image of ``release``; the problems."""
    modules = modules_dir(host, release)
    if not modules.is_dir():
        return [], [f"--kernel {release}: no module tree for it: {modules} does not exist"]
    entries, problems = [Entry(f"lib/modules/{release}")], []
    for item in sorted(modules.iterdir()):
        # a link keeps its own target (build -> /usr/src/linux-headers-RELEASE)
        target = os.readlink(item) if item.is_symlink() else str(item)
        entries.append(Entry(f"lib/modules/{release}/{item.name}", target=target))
    for what, found in (
        ("config", kernel_config(host, release)),
        ("image", kernel_image(host, release)),
    ):
        if not found.is_file():
            problems.append(f"--kernel {release}: no kernel {what}: {found} does not exist")
        elif found.parent == host.root / "boot":  # one in the module tree is linked already
            entries.append(Entry(f"boot/{found.name}", target=str(found)))
    return entries, problems


def _certificate(cert: Path) -> tuple[Entry | None, list[str]]:
    """The certificate's copy in ``trusted.d`` (named so the trust store reads it)."""
    from service.verify.signature.trust import SUFFIXES, TrustedKey, split_certificates

    try:
        data = cert.read_bytes()
        ders = list(split_certificates(data, str(cert)))
        for der in ders:
            TrustedKey.from_der(der, str(cert))
    except OSError as exc:
        return None, [f"--trust {cert}: cannot read: {exc.strerror}"]
    except TrustError as exc:
        return None, [f"--trust {cert}: not a PEM or DER certificate: {exc.reason}"]
    name = cert.name
    pem = b"-----BEGIN" in data
    if cert.suffix.lower() not in SUFFIXES:
        name += ".pem" if pem else ".der"
    if pem:  # the certificates alone: a kernel's signing_key.pem holds its private key too
        return Entry(f"etc/modstage/trusted.d/{name}", text="".join(map(_pem, ders))), []
    return Entry(f"etc/modstage/trusted.d/{name}", source=cert), []


def _pem(der: bytes) -> str:
    """One certificate as a PEM block."""
    import base64
    import textwrap

    body = "\n".join(textwrap.wrap(base64.b64encode(der).decode(), 64))
    return f"-----BEGIN CERTIFICATE-----\n{body}\n-----END CERTIFICATE-----\n"


def plan(root: Path, release: str, cert: Path, host: Layout = HOST) -> list[Entry]:
    """What the sandbox at ``root`` holds, in the order it is laid out; raises
    :class:`UsageError` naming every problem of the arguments."""
    problems = []
    if _is_host(root):
        problems.append(f"{root} is this host's own root, not a sandbox")
    elif root.exists() and (not root.is_dir() or any(root.iterdir())):  # noqa: SIM102
        if root_problem(root) is not None:  # files, but no sandbox: refused
            problems.append(
                f"{root} exists and is not empty nor a modstage sandbox (name a new or "
                "empty directory)"
            )
    tree, found = _tree(release, host)
    trusted, bad = _certificate(cert)
    problems += found + bad
    if problems or trusted is None:
        raise UsageError("; ".join(problems))
    return [
        trusted,
        Entry("proc/sys/kernel/osrelease", text=f"{release}\n"),
        Entry("proc/sys/kernel/random/boot_id", text=f"{uuid.uuid4()}\n"),
        *tree,
        Entry("var/lib/modstage/incoming"),
        Entry("sys/devices/system/memory/auto_online_blocks", text="offline\n"),
        Entry("sys/module/firmware_class/parameters/path", text="\n"),
    ]


def apply(root: Path, entries: list[Entry]) -> list[str]:
    """Make each entry the root lacks (an existing path is kept); the paths made. ``/`` is
    refused here too: a sandbox is never the host itself."""
    if _is_host(root):
        raise UsageError(f"{root} is this host's own root, not a sandbox")
    made = []
    for entry in entries:
        path = root / entry.path
        if path.exists() or path.is_symlink():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if entry.target is not None:
            path.symlink_to(entry.target)
        elif entry.source is not None:
            shutil.copyfile(entry.source, path)
            path.chmod(0o644)
        elif entry.text is not None:
            path.write_text(entry.text)
            path.chmod(0o644)
        else:
            path.mkdir()
        made.append(entry.path)
    return made


def run(args: argparse.Namespace, out: TextIO) -> int:
    """Lay out the sandbox and say what it holds; 2 for arguments it cannot act on."""
    root: Path = args.sandbox
    entries = plan(root, args.kernel, args.trust)
    try:
        made = apply(root, entries)
    except OSError as exc:
        where = exc.filename or root
        raise ServiceError(f"cannot lay out {where}: {exc.strerror or exc}") from exc
    kept = len(entries) - len(made)
    print(
        f"sandbox {root}: kernel {args.kernel}, trusting {entries[0].path.rsplit('/', 1)[1]}; "
        f"{len(made)} paths laid out" + (f", {kept} kept as they were" if kept else ""),
        file=out,
    )
    print(f"next: modstage stage --into {root / 'var/lib/modstage/incoming'} ...", file=out)
    return 0
