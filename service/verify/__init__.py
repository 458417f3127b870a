"""Module verification exactly as the kernel will judge it at load time.

Four packages, each one concept, below the verdict:

- :mod:`service.verify.signature`: the appended signature and its certificates (the
  kernel's ASN.1 grammars, X.509, PKCS#7, public keys, keyrings, the host's trust);
- :mod:`service.verify.targetkernel`: the kernel a module is judged for (its release, build
  configuration, image and exports);
- :mod:`service.verify.modfile`: the module file itself (ELF, symbol table, ``.modinfo``,
  parameter strings);
- :mod:`service.verify.compressed`: compressed modules (what they state about their
  size, decompression under a cap, the memory budget of an intake).

On top, in the kernel's order: :mod:`~service.verify.linking` (symbol resolution),
:mod:`~service.verify.loadrules` (the load-time rules after ``.modinfo``),
:mod:`~service.verify.checks` (one file's checks in one pass),
:mod:`~service.verify.verdict` (what intake, boot and ``modstage verify`` call) and
:mod:`~service.verify.bundle` (rules over a bundle's modules as a whole). The layers are
``lint-imports`` contracts in ``pyproject.toml``.

The parse records that only carry what a parse found (``Elf``, ``Trailer``,
``PublicKey``, ``SigParams``, ``KernelKey``, ``Trusted``) are ``NamedTuple`` classes: as
immutable as a frozen dataclass and cheaper to build, which counts where ``modstage boot``
re-verifies a generation before loading it.
"""
