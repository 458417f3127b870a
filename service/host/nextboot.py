"""Which kernel the next boot runs, read from the host's files; and how that was decided.

In order:

1. the host config's ``[kernel] next`` (the admin's word, for a boot loader modstage does
   not read);
2. grub: ``/boot/grub/grub.cfg``'s default as grub evaluates it with ``/boot/grub/grubenv``
   (:mod:`service.host.grub`): the one-time ``next_entry`` (``grub-reboot``), else
   ``saved_entry`` where the default is ``${saved_entry}`` (``GRUB_DEFAULT=saved``), else
   grub.cfg's own default (``GRUB_DEFAULT``); an unset default is the first entry;
3. without a grub.cfg: the newest installed kernel that has an image (dpkg's version order,
   :mod:`service.host.installed`).

A grub default that names no entry, or a submenu, is resolved as grub falls back (the first
entry of that menu level, :func:`service.host.grub.resolve`); :attr:`NextKernel.fallback`
says so. When it cannot tell, :attr:`NextKernel.unknown` says why (grub.cfg unreadable, a
menu with no entries, the kernel named has no image) and ``release`` is None: modstage never
guesses a kernel to verify against. :func:`decide` is pure; :func:`next_kernel` reads the
files under a :class:`~service.layout.Layout`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from service.host import grub
from service.host.installed import InstalledKernel, installed, newest
from service.layout import Layout


class How(enum.StrEnum):
    """Where the next boot's kernel was read."""

    CONFIG = "config"  # [kernel] next
    NEXT_ENTRY = "next_entry"  # grubenv's one-time entry (grub-reboot)
    SAVED_ENTRY = "saved_entry"  # grubenv's saved entry (grub-set-default, GRUB_DEFAULT=saved)
    GRUB_DEFAULT = "grub_default"  # grub.cfg's own default (GRUB_DEFAULT)
    NEWEST_INSTALLED = "newest_installed"  # no grub.cfg: the newest kernel with an image


@dataclass(frozen=True)
class NextKernel:
    """The next boot's kernel ``release`` and ``how`` it was decided; ``entry`` is the
    grub default followed (as written) and ``title`` the menu entry it names (submenus
    joined by ``>``); ``fallback`` says where grub falls back from what the default names
    (None: it names the entry). ``release`` None: ``unknown`` says why it cannot be told."""

    release: str | None
    how: How
    entry: str | None = None
    title: str | None = None
    unknown: str | None = None
    fallback: str | None = None


@dataclass(frozen=True)
class GrubFiles:
    """grub.cfg's text and grubenv's variables, or why either could not be read."""

    cfg: str | None  # None: unreadable (``problem``)
    env: dict[str, str] | None  # None: unreadable (``problem``)
    problem: str | None = None


def _image_problem(release: str, kernels: tuple[InstalledKernel, ...], said: str) -> str | None:
    """Why ``release`` cannot boot: it has no image (None: it has)."""
    if any(k.release == release and k.image for k in kernels):
        return None
    return f"{said} kernel {release}, which has no image (/boot/vmlinuz-{release})"


def _from_grub(files: GrubFiles, kernels: tuple[InstalledKernel, ...]) -> NextKernel:
    if files.cfg is None or files.env is None:
        return NextKernel(None, How.GRUB_DEFAULT, unknown=files.problem or "grub unreadable")
    menu = grub.parse_menu(files.cfg)
    next_entry = files.env.get("next_entry", "")
    value = menu.default(next_entry)
    how = How.GRUB_DEFAULT
    if value == grub.NEXT_ENTRY:
        how, value = How.NEXT_ENTRY, next_entry
    elif value == grub.SAVED_ENTRY:
        how, value = How.SAVED_ENTRY, files.env.get("saved_entry", "")
    elif "$" in value:
        why = f"grub.cfg sets its default from {value!r}, which modstage does not evaluate"
        return NextKernel(None, how, value, unknown=why)
    ref = value or "0"  # unset or empty: grub boots the first entry
    found = grub.resolve(menu.entries, ref)
    if isinstance(found, str):
        why = f"grub's default {ref!r} ({how.value}): {found}"
        return NextKernel(None, how, ref, unknown=why)
    release = found.entry.release
    if release is None:
        why = f"grub entry {found.title!r} names no /boot/vmlinuz-<release> on a linux line"
        return NextKernel(None, how, ref, found.title, unknown=why, fallback=found.fallback)
    no_image = _image_problem(release, kernels, f"grub entry {found.title!r} boots")
    release = None if no_image else release
    return NextKernel(release, how, ref, found.title, no_image, found.fallback)


def decide(
    configured: str | None, files: GrubFiles | None, kernels: tuple[InstalledKernel, ...]
) -> NextKernel:
    """The next boot's kernel from plain values: ``configured`` (``[kernel] next``),
    grub's files (None: there is no grub.cfg) and the installed kernels."""
    if configured is not None:
        no_image = _image_problem(configured, kernels, "[kernel] next names")
        return NextKernel(None if no_image else configured, How.CONFIG, unknown=no_image)
    if files is not None:
        return _from_grub(files, kernels)
    best = newest(k.release for k in kernels if k.image)
    if best is None:
        why = "no grub.cfg, and no installed kernel has an image (/boot/vmlinuz-<release>)"
        return NextKernel(None, How.NEWEST_INSTALLED, unknown=why)
    return NextKernel(best, How.NEWEST_INSTALLED)


def read_grub(layout: Layout) -> GrubFiles | None:
    """grub's files under ``layout`` (None: there is no grub.cfg). A missing grubenv is an
    empty one, as grub reads it."""
    try:
        cfg = grub.read_capped(layout.grub_cfg, grub.MAX_CFG_BYTES)
    except grub.Unreadable as exc:
        return GrubFiles(None, None, f"grub.cfg unreadable: {exc}")
    if cfg is None:
        return None
    try:
        env = grub.read_capped(layout.grubenv, grub.MAX_ENV_BYTES)
    except grub.Unreadable as exc:
        return GrubFiles(None, None, f"grubenv unreadable: {exc}")
    text = cfg.decode("utf-8", "replace")
    return GrubFiles(text, grub.parse_env(env) if env is not None else {})


def next_kernel(layout: Layout, configured: str | None = None) -> NextKernel:
    """The kernel the next boot of the host under ``layout`` runs (``configured``: the
    config's ``[kernel] next``)."""
    return decide(configured, read_grub(layout), installed(layout))
