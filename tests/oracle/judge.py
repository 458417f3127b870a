"""Judge cases twice (modstage's `verify --json`, the kernel's `finit_module`) and compare.

Comparison rules (what the differential test asserts):

* modstage accepts, kernel refuses: never allowed.
* modstage refuses, kernel accepts: allowed only as a named policy (the reason says "policy").
* both refuse and modstage's reason starts with an errno (`EKEYREJECTED: ...`): it must be the
  kernel's, seen through enforcement (the kernel turns ENOKEY, ENOPKG and ENODATA into
  EKEYREJECTED under `sig_enforce`). Policy refusals claim no kernel errno.
* a compressed case is judged by loading its first stream decompressed in userspace (what a
  decompressing loader hands the kernel; truncated or corrupt: EINVAL, as the in-kernel
  decompressors say); its in-kernel route (`MODULE_INIT_COMPRESSED_FILE`) is recorded too,
  and a refusal naming that route's errno (EOPNOTSUPP on a kernel without
  CONFIG_MODULE_DECOMPRESS) is accurate.
* a load refused after the kernel's `module_load` event fired (every loader check passed and
  the module's init ran and returned the errno, as the real `nvidia` does without a GPU:
  ENODEV) counts as the kernel accepting the module: the loader's verdict is the one
  modstage predicts.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.oracle.cases import Case
from tests.oracle.pki import Pki
from tests.oracle.target_kernel import active, headers

MODULE_LISTS = ("modules.builtin", "modules.builtin.modinfo", "modules.dep", "modules.order")
ENFORCED = {"ENOKEY": "EKEYREJECTED", "ENOPKG": "EKEYREJECTED", "ENODATA": "EKEYREJECTED"}
REPO = Path(__file__).resolve().parents[2]
AGREE_ACCEPT, AGREE_REFUSE = "agree-accept", "agree-refuse"
M_ACCEPT_K_REFUSE = "modstage-accept/kernel-refuse"
POLICY, UNNAMED = (
    "modstage-refuse/kernel-accept (policy)",
    "modstage-refuse/kernel-accept (UNNAMED)",
)
COLUMNS = (AGREE_ACCEPT, AGREE_REFUSE, M_ACCEPT_K_REFUSE, POLICY, UNNAMED)


def target_root(directory: Path, release: str, *, symvers: bool = False) -> Path:
    """A --root holding what a node without kernel headers has of `release` (the active
    kernel's: the host's for Debian 12, the suite's root for 6.12 and 7.2): the kernel image
    (whose ELF payload holds vmlinux's exports) and config where the kernel's packages put
    them (`boot/vmlinuz-*` and `boot/config-*`; `vmlinuz` and `config` in the module tree
    for 7.2, whose packages install nothing in /boot), the in-tree
    module tree (`lib/modules/<release>/kernel`, a symlink to the kernel's: its modules'
    exports, and their vermagic) and the module lists. Debian 13's layout is merged /usr: the
    tree is under `usr/lib/modules` and `lib` is a link to `usr/lib`, as on the node. With
    `symvers`, also build/Module.symvers (every exported symbol's CRC, as on a node with the
    headers)."""
    kernel = active()
    source = kernel.root
    host = source / "lib/modules" / release
    if kernel.own_root:
        (directory / "usr/lib").mkdir(parents=True, exist_ok=True)
        (directory / "lib").symlink_to("usr/lib", target_is_directory=True)
    modules = directory / "lib/modules" / release
    modules.mkdir(parents=True, exist_ok=True)
    (modules / "kernel").symlink_to(host / "kernel", target_is_directory=True)
    for listing in MODULE_LISTS:
        shutil.copyfile(host / listing, modules / listing)
    if symvers:
        (modules / "build").mkdir()
        shutil.copyfile(headers(kernel) / "Module.symvers", modules / "build/Module.symvers")
    boot = directory / "boot"
    boot.mkdir(exist_ok=True)
    if kernel.image == kernel.modules / "vmlinuz":
        (modules / "vmlinuz").symlink_to(kernel.image)
        shutil.copyfile(kernel.config, modules / "config")
    else:
        (boot / f"vmlinuz-{release}").symlink_to(kernel.image)
        shutil.copyfile(kernel.config, boot / f"config-{release}")
    return directory


def trusted_dir(pki: Pki, directory: Path) -> Path:
    """modstage's trusted certificates: the CA and every secondary leaf (as an admin would)."""
    directory.mkdir(parents=True, exist_ok=True)
    for cred in (pki.ca, *pki.secondary()):
        shutil.copyfile(cred.pem_cert, directory / f"{cred.name}.pem")
    return directory


def write_cases(cases: list[Case], directory: Path) -> dict[str, Path]:
    """Write every case as `<name><suffix>`; case id -> path."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for case in cases:
        path = directory / case.filename
        path.write_bytes(case.data)
        paths[case.id] = path
    return paths


def modstage_verdicts(
    paths: list[Path], root: Path, trusted: Path, release: str, *, apart: bool = True
) -> dict[str, Any]:
    """`modstage verify --apart --json` over every path in one process, each judged alone
    (as the guest loads each alone; without `apart`, as one bundle in the order given);
    resolved path -> verdict."""
    argv = [sys.executable, "-m", "service.cli", "verify", *(["--apart"] if apart else [])]
    argv.append("--json")
    argv += ["--root", str(root)]
    argv += ["--kernel", release, "--trusted", str(trusted), *map(str, paths)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=env, check=False)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"modstage verify exited {proc.returncode}: {proc.stderr[-2000:]}")
    verdicts = json.loads(proc.stdout)
    return {str(Path(v["file"]).resolve()): v for v in verdicts}


@dataclass(frozen=True)
class Outcome:
    """Both verdicts on one case and how they compare."""

    case: str
    category: str
    modstage_ok: bool
    reason: str
    kernel_errno: int  # 0 = loaded
    in_kernel_errno: int | None = None
    claim: str | None = None  # the errno modstage says the kernel gives (None: says none)
    policy: bool = False  # modstage names its refusal a policy
    init_called: bool = False  # the loader accepted it; `kernel_errno` is its init's

    @property
    def kernel_accepts(self) -> bool:
        """The kernel's loader accepted the module (it loaded, or its own init refused)."""
        return self.kernel_errno == 0 or self.init_called

    @classmethod
    def of(cls, case: Case, verdict: dict[str, Any], kernel: dict[str, Any]) -> Outcome:
        """From a `verify --json` verdict (its `errno`/`policy` fields, else read from the
        reason) and the guest's result."""
        reason = str(verdict.get("reason") or "")
        claim = verdict["errno"] if "errno" in verdict else claimed_errno(reason)
        policy = bool(verdict["policy"]) if "policy" in verdict else is_policy(reason)
        return cls(
            case.id, case.category, bool(verdict["ok"]), reason, int(kernel["errno"]),
            kernel.get("in_kernel"), _alias(claim) if claim else None, policy,
            bool(kernel.get("init_called")),
        )  # fmt: skip

    @property
    def verdict(self) -> str:
        """One of COLUMNS."""
        kernel_ok = self.kernel_accepts
        if self.modstage_ok:
            return AGREE_ACCEPT if kernel_ok else M_ACCEPT_K_REFUSE
        if not kernel_ok or self._names_in_kernel_route():
            return AGREE_REFUSE
        return POLICY if self.policy else UNNAMED

    def _names_in_kernel_route(self) -> bool:
        return bool(self.in_kernel_errno) and self.claim == errno_name(self.in_kernel_errno or 0)

    @property
    def errno_check(self) -> bool | None:
        """None if modstage claims no kernel errno here, else whether the claim is right."""
        claimed = self.claim
        if self.modstage_ok or claimed is None or self.policy:
            return None
        if self.kernel_accepts and not self._names_in_kernel_route():
            return None  # the kernel loads it: an unnamed refusal, counted in its own column
        seen = {errno_name(self.kernel_errno)}
        if self.in_kernel_errno:
            seen.add(errno_name(self.in_kernel_errno))
        return ENFORCED.get(claimed, claimed) in seen

    def kernel_text(self) -> str:
        """The kernel's verdict for humans."""
        text = "loaded" if self.kernel_errno == 0 else errno_name(self.kernel_errno)
        if self.init_called:
            text = f"loader accepted; its init returned {text}"
        if self.in_kernel_errno is not None:
            text += f" (in-kernel decompression: {errno_name(self.in_kernel_errno) or 'loaded'})"
        return text


def is_policy(reason: str) -> bool:
    """Whether a refusal names itself as a policy."""
    return "policy" in reason.lower()


def claimed_errno(reason: str) -> str | None:
    """The errno a reason starts with (`EKEYREJECTED: ...`), if any."""
    match = re.match(r"\s*(E[A-Z0-9]+)\b", reason)
    return _alias(match[1]) if match else None


def _alias(name: str) -> str:
    return "EOPNOTSUPP" if name == "ENOTSUP" else name


def errno_name(number: int) -> str:
    """`EKEYREJECTED` for 129, `EOPNOTSUPP` for 95 (not its alias ENOTSUP); '' for 0."""
    if number == 0:
        return ""
    if number == errno.EOPNOTSUPP:
        return "EOPNOTSUPP"
    return errno.errorcode.get(number, str(number))


def compare(
    cases: list[Case], paths: dict[str, Path], modstage: dict[str, Any], kernel: dict[str, Any]
) -> list[Outcome]:
    """One Outcome per case (a case modstage did not report counts as accepted: never silent)."""
    missing = {"ok": True, "reason": "NO VERDICT"}
    return [
        Outcome.of(case, modstage.get(str(paths[case.id].resolve()), missing), kernel[case.id])
        for case in cases
    ]


def table(outcomes: list[Outcome]) -> str:
    """Per category: counts per verdict column and errno agreement (agree/claimed)."""
    categories = list(dict.fromkeys(o.category for o in outcomes))
    short = ("agree-acc", "agree-ref", "M-acc/K-ref", "policy", "UNNAMED", "errno ok/claimed")
    lines = [f"{'category':<10} " + " ".join(f"{s:>11}" for s in short)]
    for category in [*categories, "TOTAL"]:
        rows = [o for o in outcomes if category in ("TOTAL", o.category)]
        counts = Counter(o.verdict for o in rows)
        checks = [o.errno_check for o in rows if o.errno_check is not None]
        cells = [str(counts[c]) for c in COLUMNS] + [f"{sum(checks)}/{len(checks)}"]
        lines.append(f"{category:<10} " + " ".join(f"{c:>11}" for c in cells))
    return "\n".join(lines)


def problems(outcomes: list[Outcome]) -> list[str]:
    """Every case that breaks a rule, with both verdicts."""
    out = []
    for o in outcomes:
        if o.verdict in (M_ACCEPT_K_REFUSE, UNNAMED) or o.errno_check is False:
            tag = o.verdict if o.errno_check is not False else "errno mismatch"
            out.append(
                f"{tag}: {o.case}: modstage {'ok' if o.modstage_ok else o.reason!r}; kernel {o.kernel_text()}"
            )
    return out
