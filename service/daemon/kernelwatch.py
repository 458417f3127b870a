"""The kernel watch: a kernel installed or removed is noticed at once, not at the next scan.

What the next boot runs, and whether each bundle has a generation for it, is read from the
boot directory (the kernels' images, grub's directory with ``grub.cfg`` and ``grubenv``)
and the module trees' parent (``/lib/modules``: one tree per installed kernel). One
:class:`watchdog.observers.Observer` watches each of them, not recursively (a kernel's
thousands of module files raise nothing; its tree appearing or going does), and puts a
``Kind.KERNEL`` event on the loop's queue: the loop, after a debounce, reads the next
kernel again and refreshes the node labels, ``_host.json``, the metrics and the reboot
gate (:meth:`~service.daemon.loop.Daemon.refresh_kernels`). It does not take drops in
then: a package still unpacking has made its module tree but not filled it, and a drop
judged against half a tree would be refused.

The package's kernel hook (``/etc/kernel/postinst.d/zzz-modstage``, ``postrm.d``'s) runs
after the kernel package's files are all in place, Debian's own hooks (initramfs, grub)
before it: it renames a file into :attr:`~service.layout.Layout.kernel_hook`, watched too,
which is a ``Kind.KERNEL_HOOK`` event: a full scan, so a drop that waited for that kernel's
tree is taken in.

watchdog's threads only put events on the queue. A directory missing at start (a root
without grub, a merged-/usr root's second module path) is not watched, and a watch that
cannot be placed is logged (``kernels.unwatched``); the periodic rescan still notices what
either would have.
"""

from __future__ import annotations

import os
from pathlib import Path

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from service.daemon.events import Event, Kind, Queue
from service.daemon.watcher import LOST, NOTICED
from service.layout import Layout
from service.logs import get_logger

log = get_logger("modstage.daemon")


class KernelHandler(FileSystemEventHandler):
    """watchdog's events in one watched directory as ``kind`` events, on watchdog's thread.

    ``hidden``: whether names starting with '.' count (not in the hook's directory: the
    hook's temporary file is not its word, only its rename into place is)."""

    def __init__(self, events: Queue, kind: Kind, *, hidden: bool = True) -> None:
        super().__init__()
        self.events, self.kind, self.hidden = events, kind, hidden

    def dispatch(self, event: FileSystemEvent) -> None:
        """One event from the observer: a change (or lost changes) in the directory."""
        if LOST is not None and isinstance(event, LOST):
            self.events.put(Event(self.kind, "the kernel's inotify queue overflowed"))
            return
        if event.event_type not in NOTICED:
            return
        path = os.fsdecode(getattr(event, "dest_path", "") or event.src_path)
        if self.hidden or not os.path.basename(path).startswith("."):
            self.events.put(Event(self.kind, path))


def kernel_dirs(layout: Layout) -> list[Path]:
    """The directories whose entries say which kernels are installed and which one the
    next boot runs, resolved, each once (``/lib/modules`` is ``/usr/lib/modules`` on a
    merged-/usr host), those missing left out."""
    found: list[Path] = []
    for directory in (layout.boot, layout.grub_dir, *layout.module_trees()):
        resolved = directory.resolve()
        if resolved.is_dir() and resolved not in found:
            found.append(resolved)
    return found


class KernelWatcher:
    """watchdog's observer on :func:`kernel_dirs` and the kernel hook's directory, which it
    makes (a missing one would mean no hook is heard this boot)."""

    def __init__(self, layout: Layout, events: Queue) -> None:
        self.dirs = kernel_dirs(layout)
        self.hook = layout.kernel_hook
        self.observer = Observer()
        self.files = KernelHandler(events, Kind.KERNEL)
        self.hook_handler = KernelHandler(events, Kind.KERNEL_HOOK, hidden=False)
        self.unwatched: dict[str, str] = {}  # directory: why it could not be watched

    def start(self) -> None:
        """Start watchdog's observer, then place each watch on its own: one that cannot be
        placed (the directory gone since, the user's inotify instances spent on a busy
        node) is logged and left to the periodic scan; the daemon and its drop watch go on."""
        self.observer.start()
        watches = [(d, self.files) for d in self.dirs] + [(self.hook, self.hook_handler)]
        placed = []
        for directory, handler in watches:
            try:
                if directory == self.hook:
                    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
                self.observer.schedule(handler, str(directory), recursive=False)
            except OSError as exc:
                self.unwatched[str(directory)] = exc.strerror or str(exc)
                continue
            placed.append(str(directory))
        log.info("kernels.watching", dirs=placed)
        if self.unwatched:
            log.warning("kernels.unwatched", dirs=self.unwatched, found_by="the periodic scan")

    def stop(self) -> None:
        """Stop watchdog's threads and close its watches (nothing to do if never started)."""
        if self.observer.is_alive():
            self.observer.stop()
            self.observer.join(timeout=5)
