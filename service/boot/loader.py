"""``modstage boot``: bring up each bundle's generation, early at boot, falling back.

Per bundle (in ``after`` order): persist the attempt before touching the
kernel, prepare memory onlining and the firmware view, then open each module
once, re-verify it from that descriptor and hand the same descriptor to
``finit_module``. On failure, unload in reverse what this attempt loaded, mark
the generation failed with the kernel's words and bring up the last known good.

A module whose init returns ENODEV, has PCI aliases, and none of whose devices is
present and free (:mod:`service.host.pci`, read only then) is for hardware that is
absent: the bundle is recorded ``no_device``, its attempt given back, nothing failed
and no fallback; the next boot tries the same generation again.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable
from dataclasses import replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from service import faults
from service.boot.persist import Durable, Persist
from service.boot.plan import Choice, choose, order
from service.boot.reverify import Reverified, reverify
from service.bundles.cover import carried as carried_for
from service.bundles.phase import Phase
from service.bundles.records import ModuleLoad
from service.bundles.state import BundleState, State
from service.config import Config
from service.errors import BootError, LoadError, NoDevice
from service.generations.store import Store
from service.host.firmware import FirmwareView
from service.host.modules import Kernel
from service.host.running import RunningHost
from service.host.sysfs import Sysfs
from service.layout import Layout
from service.logs import get_logger
from stager.schema.failures import ManifestError
from stager.schema.manifest import Manifest, ModuleEntry
from stager.schema.paths import normalize_module_name

if TYPE_CHECKING:  # the verify stack is imported when the first module is verified
    from service.verify.signature.trust import TrustStore
    from service.verify.targetkernel.kernel import Target

log = get_logger("modstage.boot")


class Boot:
    """One boot's loader.

    ``trust`` is the trusted certificates, or a function that reads them: it is called
    when the first module is verified, so a boot with nothing to load never reads them
    (nor imports the verify stack). ``sysfs_view`` is the kernel's sysfs (a fake in tests).
    """

    def __init__(
        self,
        layout: Layout,
        config: Config,
        trust: TrustStore | Callable[[], TrustStore],
        kernel: Kernel,
        sysfs_view: Sysfs | None = None,
        *,
        persist: Persist | None = None,
        firmware: FirmwareView | None = None,
        running: RunningHost | None = None,
    ) -> None:
        self.layout, self.config, self.trust, self.kernel = layout, config, trust, kernel
        self.persist = persist or Durable(layout, config)
        self._saved = False
        self.store = Store(self.layout.store)
        self.sysfs = sysfs_view or Sysfs(self.layout.sys)
        self.running = running if running is not None else RunningHost.read(layout)
        self.release = self.running.need_release()
        self._manifests: dict[str, Manifest] = {}
        self._loaded_by: dict[str, str] = {}  # module name -> the bundle that loaded it now
        self.firmware = firmware or FirmwareView(
            self.layout.run / "firmware",
            self.sysfs,
            allow_foreign=self.config.allow_foreign_firmware_path,
        )

    @cached_property
    def trusted(self) -> TrustStore:
        """The trusted certificates (read on first use)."""
        return self.trust() if callable(self.trust) else self.trust

    @cached_property
    def full_target(self) -> Target:
        """The running kernel's facts, its exports included (read on first use: the
        cache intake built if it is current, else ``Module.symvers`` alone; never the
        kernel's files, which take seconds).

        Intake judged the same kernel's facts already, so boot does not refuse what
        intake accepted for unknown CRCs (``strict_crcs=False``).
        """
        from service.verify.targetkernel.kernel import Target

        target = Target.from_layout(self.layout, self.release)
        return replace(target, exports=target.exports.cached_only(), strict_crcs=False)

    @cached_property
    def target(self) -> Target:
        """What boot judges modules by: :attr:`full_target` without its exports.

        The kernel resolves every import when it loads the module; the exports are read
        only to name the symbol when the kernel refuses a load (EINVAL or ENOENT).
        """
        return self.full_target.probe_only()

    def run(self) -> State:
        """Bring up every bundle; return the final state."""
        with self.persist.locked():
            state = self.persist.load(self.store)
            # the boot id is saved with the first transition (one write fewer on the boot
            # path), or alone below when no bundle has anything to do
            state = state.booted(self.running.need_boot_id())
            if self.config.hotplug_policy != "kernel":  # before the kubelet: no block missed
                from service.host.memory import hand_over

                if hand_over(self.sysfs):
                    log.info("memory.handed_over", auto_online_blocks="offline")
            self._saved = False
            choices = [
                choose(n, b, self.release, self.config.max_boot_attempts, self._floor(n))
                for n, b in state.bundles.items()
            ]
            after = {c.bundle: self._after(c.generation) for c in choices if c.generation}
            ordered, cycle = order(choices, after)
            if cycle:
                log.error("bundles.after_cycle", bundles=list(cycle))
            for choice in ordered:
                state = self._bring_up(state, choice)
            if not self._saved:
                self.persist.save(state, "boot_id")
            if not self.firmware.has_links():
                self.firmware.point(False)  # never leave a stale firmware path behind
            self.persist.mirror(state)
            return state

    def _save(self, state: State, name: str, bundle: BundleState, **status: Any) -> State:
        state = state.with_bundle(name, bundle)
        self.persist.save(state, bundle.phase.value)
        self._saved = True
        self.persist.status(name, bundle, **status)
        return state

    def _bring_up(self, state: State, choice: Choice) -> State:
        """Effect, transition, save: expire, count the attempt, load, then live or failed."""
        name, gid = choice.bundle, choice.generation
        bound = log.bind(bundle=name)
        if choice.expired and state.bundle(name).pending:
            expired = state.bundle(name).pending
            state = self._save(
                state, name, state.bundle(name).expired(choice.expired), errors=[choice.expired]
            )
            bound.error("generation.expired", generation=expired, reason=choice.expired)
        if gid is None:
            missing = self._missing(state.bundle(name))
            if missing is None:
                bound.info("bundle.nothing_to_load", note=choice.note)
                return state
            why = missing + (f"; {choice.note}" if choice.note else "")
            bound.error("bundle.no_generation_for_kernel", kernel=self.release, reason=why)
            bundle = state.bundle(name)
            return self._save(
                state, name, bundle.other_kernel(why), errors=[why], generation=bundle.active
            )
        carried = carried_for(state.bundle(name), self.release, self._floor(name))
        if carried is not None and carried.id == gid:  # plan.choose took it for this kernel
            bound.info("generation.carried", generation=gid, kernel=self.release, note=choice.note)
        booting = state.bundle(name).booting(gid, carried.id if carried else None)
        state = self._save(state, name, booting, generation=gid)
        try:  # the attempt is persisted: now the kernel
            loads = self._load(gid, name)
        except NoDevice as exc:
            bound.warning("generation.no_device", generation=gid, reason=exc.reason)
            absent = state.bundle(name).no_device(gid, exc.reason)
            return self._save(state, name, absent, errors=[exc.reason], generation=gid)
        except BootError as exc:
            bound.error("generation.failed", generation=gid, reason=exc.reason)
            failed = state.bundle(name).failed(gid, exc.reason)
            state = self._save(state, name, failed, errors=[exc.reason], generation=gid)
            if choice.fallback and choice.fallback != gid:
                return self._bring_up(state, Choice(name, choice.fallback))
            return state
        bound.info("generation.active", generation=gid, modules=len(loads))
        state = self._save(state, name, state.bundle(name).went_live(gid, loads), generation=gid)
        try:  # the digest the deployed driver pod carries (a failed one's, after a fallback)
            self.persist.publish_digest(name, state.bundle(name))
        except OSError as exc:  # the modules are live; a digest file must not fail the boot
            bound.error("digest.unwritable", error=str(exc))
        return state

    def _missing(self, bundle: BundleState) -> str | None:
        """Why ``bundle`` has no driver on the running kernel although it had one (its
        active generation targets another kernel), or None when it never had one here to
        miss (nothing active: a bundle whose first generation waits for its kernel)."""
        active = bundle.generations.get(bundle.active) if bundle.active else None
        if active is None or active.kernel == self.release:
            return None
        return (
            f"no generation for the running kernel {self.release}: nothing of the bundle is "
            f"loaded (the active {active.id[:12]} ({active.version}) targets kernel "
            f"{active.kernel})"
        )

    def _manifest(self, generation: str) -> Manifest:
        """The generation's manifest, read from the store once per boot."""
        if generation not in self._manifests:
            try:
                self._manifests[generation] = self.store.manifest(generation)
            except OSError as exc:
                raise BootError(f"cannot read the generation's manifest: {exc}") from exc
            except ManifestError as exc:
                raise BootError(f"the generation's manifest is invalid: {exc}") from exc
        return self._manifests[generation]

    def _floor(self, bundle: str) -> str | None:
        """The bundle's ``[bundles] min_version``: no generation below it is carried."""
        return self.config.bundle_policy(bundle).min_version

    def _after(self, generation: str) -> tuple[str, ...]:
        try:
            return self._manifest(generation).after
        except BootError:
            return ()  # the bundle fails when it is brought up, in its own turn

    def _load(self, generation: str, bundle: str) -> tuple[ModuleLoad, ...]:
        """Load one generation's modules in order for ``bundle`` (the state's name); undo
        this attempt's loads on failure.

        Any failure (manifest, memory onlining, firmware view, a module) becomes a
        :class:`BootError` naming the step, after this attempt's loads are undone.
        """
        root = self.store.path(generation)
        done: list[ModuleLoad] = []
        linked = False
        step = "the generation's manifest"
        try:
            manifest = self._manifest(generation)
            if manifest.memory is not None:
                from service.host.memory import apply_policy
                from service.host.onlining_log import log_onlining

                step = f"memory policy {manifest.memory.value}"
                log_onlining(apply_policy(self.sysfs, manifest.memory))
            if manifest.firmware:
                step = "the firmware view"
                linked = True
                self.firmware.link(root)
                self.firmware.point(True)
            live = self.kernel.loaded()
            ours = {m.name for m in manifest.modules}
            for module in manifest.modules:
                step = module.file
                done.append(self._load_module(root, module, live, ours, bundle))
            self._loaded_by.update((d.module, bundle) for d in done if not d.already_loaded)
        except (BootError, LoadError, OSError) as exc:
            self._undo([d.module for d in done if not d.already_loaded])
            if linked:
                self.firmware.unlink(root)
            if isinstance(exc, BootError):
                raise
            why = exc.strerror or str(exc) if isinstance(exc, OSError) else str(exc)
            raise BootError(f"{step}: {why}") from exc
        return tuple(done)

    def _load_module(
        self,
        root: Path,
        module: ModuleEntry,
        live: dict[str, str | None],
        ours: set[str],
        bundle: str,
    ) -> ModuleLoad:
        """Open the module once, re-verify what the kernel will get, load exactly that.

        The bundle's ``[bundles.<name>]`` rules on names and signers are applied again, as
        the config reads now (:meth:`_refused`): a policy tightened since intake takes
        effect at this boot.

        A plain ELF is verified from its descriptor and loaded from the same descriptor;
        a compressed one (told by content, never by suffix) is decompressed once in
        memory and verified, then handed to the kernel as it is stored where the target
        decompresses that format itself (``CONFIG_MODULE_DECOMPRESS``, Debian 13's 6.12
        for xz), else loaded from a sealed memfd with flags 0 (Debian 12's 6.1).
        """
        started = time.monotonic()
        with open(root / module.file, "rb") as f:
            checked = reverify(f, module, self.trusted, self.target)
            v, name = checked.verdict, checked.name
            if refused := self._refused(bundle, module.file, name, v.key_id):
                raise BootError("; ".join(refused))
            if (other := self._loaded_by.get(name, bundle)) != bundle:
                raise BootError(
                    f"{name}: bundle {other!r} loaded a module of that name in this boot; a "
                    "module belongs to one bundle (modstage forget the one that is the mistake)"
                )
            if name in live:
                return _already_loaded(checked, live[name])
            deps = [
                d
                for d in map(normalize_module_name, v.depends)
                if d and d not in live and d not in ours
            ]
            self.kernel.modprobe(deps)
            faults.hit("boot.finit.before")
            self._finit(f, module, checked)
            faults.hit("boot.finit.after")
        live[name] = v.srcversion
        ms = round((time.monotonic() - started) * 1000, 3)
        log.info("module.loaded", module=name, ms=ms)
        return ModuleLoad(name, v.srcversion, ms, pci=v.pci)

    def _finit(self, f: BinaryIO, module: ModuleEntry, checked: Reverified) -> None:
        """Hand the kernel exactly what was verified: the open file, the stored compressed
        file where the kernel decompresses its format, else the image in a sealed memfd. A
        refusal is explained (:meth:`_explain`); an init's ENODEV for a module with PCI
        aliases may be absent hardware (:meth:`_no_device`)."""
        image, v = checked.image, checked.verdict
        try:
            if image is None:
                self.kernel.load(f.fileno(), module.params)
            elif checked.kind is not None and checked.kind == self.target.decompress:
                self.kernel.load_compressed(f.fileno(), image, module.params)
            else:
                self.kernel.load_image(image, Path(module.file).name, module.params)
        except LoadError as exc:
            if exc.errno == errno.ENODEV and v.pci:
                self._no_device(exc, module.file, checked.name, v.pci)
            raise self._explain(exc, checked.elf, module.file) from exc

    @cached_property
    def in_tree(self) -> Callable[[str], str | None]:
        """Where the running kernel's tree has its in-tree module of a name, or None (its
        tree walked when the first module is judged: 20 to 150 ms for Debian 12's)."""
        from service.intake.admit import host_modules

        return host_modules(self.layout, self.release)

    def _refused(self, bundle: str, file: str, name: str, key_id: str | None) -> list[str]:
        """What the bundle's table refuses of a verified module (its name: none of the
        running kernel's own unless ``shadow_in_tree`` allows it, one ``modules`` matches;
        its signer: one of ``signers``), as intake refuses it
        (:mod:`service.intake.bundlerules`)."""
        from service.intake.bundlerules import name_problems, signer_problems

        policy = self.config.bundle_policy(bundle)
        problems = name_problems(
            [(file, name)],
            bundle=bundle,
            policy=policy,
            in_tree=self.in_tree,
            builtin=self.target.builtin,
        )
        signed = [(file, key_id)]
        return problems + signer_problems(signed, bundle=bundle, policy=policy, trust=self.trusted)

    def _no_device(self, exc: LoadError, file: str, name: str, aliases: tuple[str, ...]) -> None:
        """Raise :class:`NoDevice` when none of the devices ``aliases`` match is present and
        free (unbound, or bound to this module); return when one is: the init's ENODEV is then
        the module's failure."""
        from service.host.pci import devices_for, present

        mine = devices_for({name: aliases}, present(self.sysfs))
        if mine.free or mine.bound:
            return
        if not mine.devices:
            why = f"no device its {len(aliases)} PCI alias(es) match is present"
        else:
            taken = ", ".join(f"{d.address} ({d.ids}) to {d.driver}" for d in mine.others)
            why = f"every device it is for is bound to another driver: {taken}"
        raise NoDevice(f"{file}: {why} (finit_module: {exc.message})") from exc

    def _explain(self, exc: LoadError, elf: BinaryIO, display: str) -> Exception:
        """The kernel's refusal, with the symbol named when it is a CRC mismatch.

        Boot judged without the target's exports; on EINVAL or ENOENT the module is
        judged again with them, and the symbol the kernel refused becomes the reason.
        """
        from service.verify.verdict import verify_module

        if exc.errno not in (errno.EINVAL, errno.ENOENT):
            return exc
        v = verify_module(elf, display=display, trust=self.trusted, kernel=self.full_target)
        if v.ok or not v.reason:
            return exc
        return BootError(f"{display}: {v.reason} (finit_module: {exc.message})")

    def _undo(self, names: list[str]) -> None:
        for name in reversed(names):
            try:
                self.kernel.unload(name)
                log.info("module.unloaded", module=name)
            except LoadError as exc:
                log.error("module.unload_failed", module=name, reason=str(exc))


def summary(state: State, release: str | None = None) -> list[str]:
    """Each bundle's end, in name order: phase, active and pending generation (the last
    lines ``modstage boot`` prints, and its dry run), then what became of it: nothing for
    the running kernel ``release`` (when given), the generation it fell back from and why,
    or that no generation of it is live."""
    lines = []
    for name, b in sorted(state.bundles.items()):
        line = f"{name}: {b.phase.value} (active {b.active or '-'}, pending {b.pending or '-'})"
        failed = b.deployed_failure()
        kernels = {b.generations[g].kernel for g in b.keep() if g in b.generations}
        if release is not None and kernels and release not in kernels:
            line += f"; nothing for this kernel {release} (built for {', '.join(sorted(kernels))})"
        elif failed is not None and b.phase is Phase.ACTIVE and failed.id != b.active:
            line += f"; fell back from {failed.id[:12]} ({failed.version}): {failed.failed}"
        elif b.phase is Phase.FAILED:
            why = failed.failed if failed is not None else b.history[-1].note if b.history else ""
            line += f"; no driver loaded{': ' + why if why else ''}"
        pending = b.generations.get(b.pending) if b.pending else None
        if release is not None and pending is not None and pending.kernel != release:
            line += (
                f"; pending {pending.id[:12]} ({pending.version}) is for kernel {pending.kernel}"
            )
        lines.append(line)
    return lines


def _already_loaded(checked: Reverified, srcversion: str | None) -> ModuleLoad:
    """The module is live already (``srcversion``: the live one's, None if unknown): this
    build is kept, another one is a :class:`BootError`."""
    name, v = checked.name, checked.verdict
    if srcversion is None or srcversion != v.srcversion:
        raise BootError(
            f"{name}: another version is already loaded (srcversion "
            f"{srcversion or 'unknown'}, this generation has {v.srcversion or 'none'})"
        )
    return ModuleLoad(name, v.srcversion, already_loaded=True)
