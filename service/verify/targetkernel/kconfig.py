"""The target build's configuration: ``CONFIG_*`` options, looked up as they are asked for.

Read from ``<root>/boot/config-<release>`` or ``/proc/config.gz`` by
:mod:`service.verify.targetkernel.kernel`; when none is found, :meth:`KernelConfig.missing`
assumes the less capable kernel (SHA-256 and SHA-512 only, ``STRICT_MODULE_RWX``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

_ASSUMED = MappingProxyType(
    {"CONFIG_CRYPTO_SHA256": "y", "CONFIG_CRYPTO_SHA512": "y", "CONFIG_STRICT_MODULE_RWX": "y"}
)
_ODD_BREAKS = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"  # str.splitlines breaks besides \n


def parse_config(text: str) -> dict[str, str]:
    """Every ``CONFIG_*`` option of a kconfig ``.config`` text."""
    options = {}
    for line in text.splitlines():
        name, eq, value = line.partition("=")
        if eq and name.startswith("CONFIG_"):
            options[name] = value.strip().strip('"')
    return options


class ConfigText(Mapping[str, str]):
    """:func:`parse_config` of ``text``, one option found at a time.

    A distribution's configuration has about 10,000 lines and a verification asks for a
    dozen options: each is the last line ``CONFIG_X=...`` of the text. A text with line
    breaks other than ``\\n`` (which :meth:`str.splitlines` also honours) is parsed whole.
    """

    def __init__(self, text: str) -> None:
        self.text = "\n" + text
        self._all: dict[str, str] | None = None
        self._found: dict[str, str | None] = {}  # each option searched for once
        if any(brk in text for brk in _ODD_BREAKS):  # a character each: faster than a regex
            self._all = parse_config(text)

    def __getitem__(self, name: str) -> str:
        if self._all is not None:
            return self._all[name]
        if name not in self._found:
            self._found[name] = self._find(name)
        value = self._found[name]
        if value is None:
            raise KeyError(name)
        return value

    def _find(self, name: str) -> str | None:
        at = self.text.rfind(f"\n{name}=") if name.startswith("CONFIG_") else -1
        if at < 0 or "\n" in name or "=" in name:
            return None
        start = at + len(name) + 2
        end = self.text.find("\n", start)
        return self.text[start : None if end < 0 else end].strip().strip('"')

    def _parsed(self) -> dict[str, str]:
        if self._all is None:
            self._all = parse_config(self.text[1:])
        return self._all

    def __iter__(self) -> Iterator[str]:
        return iter(self._parsed())

    def __len__(self) -> int:
        return len(self._parsed())


@dataclass(frozen=True)
class KernelConfig:
    """``CONFIG_*`` options of the target build, and where they came from."""

    options: Mapping[str, str]
    source: str  # a path, or "missing: ..." when none was found
    known: bool

    @classmethod
    def parse(cls, text: str, source: str) -> KernelConfig:
        """A kconfig ``.config`` text (options looked up in it as they are asked for)."""
        return cls(ConfigText(text), source, True)

    @classmethod
    def missing(cls, why: str) -> KernelConfig:
        """No configuration: the conservative assumptions of the module docstring."""
        return cls(_ASSUMED, f"missing: {why}", False)

    def enabled(self, name: str) -> bool:
        """Whether ``CONFIG_<name>`` is ``y`` or ``m``."""
        return self.options.get(f"CONFIG_{name}") in ("y", "m")
