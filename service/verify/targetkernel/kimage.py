"""The exports of a kernel image (``/boot/vmlinuz-<release>``), read as the kernel keeps them.

A bzImage carries its vmlinux as a compressed payload (setup header: ``payload_offset``
at 0x248, ``payload_length`` at 0x24c, counted from the protected-mode code after
``setup_sects + 1`` sectors), followed by kbuild's 4-byte little-endian decompressed size.
Debian 12 compresses it with xz, Debian 13 with zstd. The payload is an ELF with section
headers and no symbol table: ``__ksymtab`` and ``__ksymtab_gpl`` hold 12-byte entries of
three self-relative ``s32`` offsets (value, name, namespace; the names in
``__ksymtab_strings``), ``__kcrctab`` and ``__kcrctab_gpl`` the parallel ``u32`` CRCs.
Since 7.1 ("module: use kflagstab instead of *_gpl sections", 55fcb926b6d8) ``__ksymtab``
holds every export and ``__kflagstab`` a parallel byte per entry whose bit 0 says GPL-only
(``KSYM_FLAG_GPL_ONLY``); without ``MODVERSIONS`` there is no ``__kcrctab``.
That is what ``find_symbol`` searches and ``check_version`` compares (x86-64 and arm64
build with ``HAVE_ARCH_PREL32_RELOCATIONS``). A plain ELF vmlinux is read the same way.

The same image says which ``/sys/module/<name>`` entries the kernel makes for built-in code
at boot (:func:`builtin_sysfs`), the names a module may not take (``mod_sysfs_init``:
"module is already loaded", EINVAL): ``param_sysfs_builtin`` walks ``__param`` (40-byte
``struct kernel_param`` on 64-bit: name pointer first, ``perm`` at 24) and gives every
parameter with a non-zero ``perm`` an entry named by its prefix before the first dot
(``MODULE_PARAM_PREFIX``: kfence's parameters are ``kfence.*`` although the object is
``core``), or ``kernel`` without a dot (``core_param``); ``version_sysfs_builtin`` walks
``__modver`` (``struct module_version_attribute``: the attribute's name pointer, to
``"version"``, first, ``module_name`` two pointers before its end) and gives each
``MODULE_VERSION`` its module's entry. Both layouts are the same in 6.1, 6.12 and 7.2
(``include/linux/moduleparam.h``, ``include/linux/module.h``). Built-in drivers that register
with a module name add entries at run time; those only the running kernel's ``/sys/module``
shows.

It also holds the certificates the kernel loads into ``.builtin_trusted_keys`` at boot
(:func:`builtin_certificates`): ``certs/system_certificates.S`` puts them in
``.init.rodata`` (``.init.data`` in an x86 vmlinux) as DER certificates one after the other
from an 8-byte boundary (``system_certificate_list``), followed at the next 8-byte boundary
by ``system_certificate_list_size`` and ``module_cert_size``, two 64-bit lengths the first
of which is the list's own. Debian's images carry no symbol table (their ``System.map`` is a
placeholder), so the list is found by that shape: a run of certificates whose length the
quad after it states; a certificate elsewhere in the image (a self-test's) is not followed
by its length.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import NamedTuple

from service.errors import ModuleRejected, TargetFileError
from service.verify.compressed.decompress import compression, decompress
from service.verify.modfile.symtab import KSYM_FLAG_GPL_ONLY, Export

MAX_IMAGE = 256 << 20  # modstage policy: a decompressed vmlinux larger than this is refused
_SHDR = struct.Struct("<IIQQQQIIQQ")
_ENTRY = 12  # struct kernel_symbol with PREL32: value_offset, name_offset, namespace_offset


class Image(NamedTuple):
    """What the kernel's image says about the modules it loads."""

    exports: dict[str, Export]  # every symbol vmlinux exports
    builtin_sysfs: frozenset[str]  # the /sys/module names of built-in code
    kflagstab: bool  # exports carry a flags table (7.1 on): a module's must too
    module_namespaces: bool  # the loader knows `module:` namespaces (MODULE_NAMESPACE_LOADER)


def read_image(path: Path, cap: int = MAX_IMAGE) -> Image:
    """The facts of the image at ``path``; :class:`TargetFileError` names what is wrong."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TargetFileError(path, f"cannot read: {exc.strerror or exc}") from exc
    try:
        elf = vmlinux(data, cap)
        sections = _sections(elf)
        knows = MODULE_NAMESPACE_LOADER in elf
        return Image(_exports(elf), builtin_sysfs(elf), b"__kflagstab" in sections, knows)
    except (struct.error, IndexError, ValueError) as exc:
        raise TargetFileError(path, f"damaged: {exc}") from exc


def vmlinux(data: bytes, cap: int = MAX_IMAGE) -> bytes:
    """The ELF inside a bzImage (or ``data`` itself when it is an ELF already)."""
    if data[:4] == b"\x7fELF":
        return data
    if len(data) < 0x250 or data[0x202:0x206] != b"HdrS":
        raise ValueError("neither a bzImage (no HdrS setup header) nor an ELF")
    (version,) = struct.unpack_from("<H", data, 0x206)
    if version < 0x208:
        raise ValueError(f"boot protocol {version:#x} has no payload fields")
    setup_sects = data[0x1F1] or 4
    offset, length = struct.unpack_from("<II", data, 0x248)
    start = (setup_sects + 1) * 512 + offset
    payload = data[start : start + length]
    if length < 8 or len(payload) != length:
        raise ValueError(f"payload [{start}, +{length}) lies outside the {len(data)}-byte file")
    kind = compression(payload[:6])
    if kind is None:
        raise ValueError(f"unknown payload format (starts {payload[:4].hex()})")
    (stated,) = struct.unpack_from("<I", payload, length - 4)
    if stated > cap:
        raise ValueError(f"payload states {stated} decompressed bytes, over the cap of {cap}")
    stream = memoryview(payload)[: length - 4]
    at = 0

    def read(n: int) -> bytes:
        nonlocal at
        chunk = bytes(stream[at : at + n])
        at += len(chunk)
        return chunk

    try:
        elf = decompress(read, kind, min(stated, cap), exact=False)
    except ModuleRejected as exc:
        raise ValueError(f"{kind} payload: {exc.reason}") from exc
    if elf[:4] != b"\x7fELF":
        raise ValueError("the decompressed payload is not an ELF")
    return elf


def _sections(elf: bytes) -> dict[bytes, tuple[int, int, int]]:
    """Section name -> (address, file offset, size)."""
    (shoff,) = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)
    if shentsize != _SHDR.size or shnum == 0 or shoff + shnum * _SHDR.size > len(elf):
        raise ValueError("no section header table (a stripped image?)")
    headers = [_SHDR.unpack_from(elf, shoff + i * _SHDR.size) for i in range(shnum)]
    names_at = headers[shstrndx][4]
    out = {}
    for name, _type, _flags, addr, offset, size, *_ in headers:
        end = elf.index(b"\0", names_at + name)
        if offset + size > len(elf) and _type != 8:  # SHT_NOBITS occupies no file bytes
            raise ValueError(f"section {elf[names_at + name : end]!r} lies outside the image")
        out[elf[names_at + name : end]] = (addr, offset, size)
    return out


def _exports(elf: bytes) -> dict[str, Export]:
    sections = _sections(elf)
    if b"__ksymtab" not in sections or b"__ksymtab_strings" not in sections:
        raise ValueError("no __ksymtab or __ksymtab_strings section")
    strings = sections[b"__ksymtab_strings"]
    out: dict[str, Export] = {}
    for table, crcs, gpl in ((b"__ksymtab", b"__kcrctab", False),
                             (b"__ksymtab_gpl", b"__kcrctab_gpl", True)):  # fmt: skip
        if table not in sections:
            continue
        addr, offset, size = sections[table]
        crc_table = sections.get(crcs)
        count = size // _ENTRY
        flags = sections.get(b"__kflagstab") if table == b"__ksymtab" else None
        if flags is not None and flags[2] < count:
            raise ValueError("__kflagstab holds fewer flags than __ksymtab entries")
        if crc_table is not None and crc_table[2] < 4 * count:
            raise ValueError(f"{crcs.decode()} holds fewer CRCs than {table.decode()} entries")
        for i in range(count):
            entry = addr + _ENTRY * i
            _value, name_rel, ns_rel = struct.unpack_from("<iii", elf, offset + _ENTRY * i)
            name = _string(elf, strings, entry + 4 + name_rel)
            namespace = _string(elf, strings, entry + 8 + ns_rel) if ns_rel else ""
            crc = None
            if crc_table is not None:
                (crc,) = struct.unpack_from("<I", elf, crc_table[1] + 4 * i)
            only_gpl = gpl or (flags is not None and bool(elf[flags[1] + i] & KSYM_FLAG_GPL_ONLY))
            out[name] = Export(crc, only_gpl, namespace, "vmlinux")
    return out


def _string(elf: bytes, strings: tuple[int, int, int], address: int) -> str:
    addr, offset, size = strings
    if not addr <= address < addr + size:
        raise ValueError(f"a symbol name at {address:#x} lies outside __ksymtab_strings")
    at = offset + address - addr
    return elf[at : elf.index(b"\0", at, offset + size)].decode("utf-8", "replace")


#: What the loader prints when a module imports a `module:` namespace (setup_modinfo): in an
#: image whose loader has verify_module_namespace (Debian's 7.2), and in no other. Debian's
#: 6.12.117 exports a symbol in `module:kvm` (a stable backport of the export macro) while
#: its loader treats that as an ordinary namespace: the exports' names cannot tell.
MODULE_NAMESPACE_LOADER = b"module tries to import module namespace"
_PARAM = 40  # sizeof(struct kernel_param) on 64-bit: name, mod, ops, perm u16, level, flags, arg
_PARAM_PERM = 24


def builtin_sysfs(elf: bytes) -> frozenset[str]:
    """The ``/sys/module`` names the kernel gives its built-in code at boot (module docstring)."""
    sections = _sections(elf)
    names: set[str] = set()
    if b"__param" in sections:
        _addr, offset, size = sections[b"__param"]
        if size % _PARAM:
            raise ValueError(f"__param is {size} bytes, not a multiple of {_PARAM}")
        for at in range(offset, offset + size, _PARAM):
            (name_at,) = struct.unpack_from("<Q", elf, at)
            (perm,) = struct.unpack_from("<H", elf, at + _PARAM_PERM)
            if perm == 0:
                continue
            name = _c_string(elf, sections, name_at)
            names.add(name.split(".", 1)[0] if "." in name else "kernel")
    if sections.get(b"__modver", (0, 0, 0))[2]:
        _addr, offset, size = sections[b"__modver"]
        (first,) = struct.unpack_from("<Q", elf, offset)
        if _c_string(elf, sections, first) != "version":
            raise ValueError('__modver\'s first entry is not a "version" attribute')
        starts = [at for at in range(offset, offset + size, 8)
                  if struct.unpack_from("<Q", elf, at)[0] == first]  # fmt: skip
        stride = starts[1] - starts[0] if len(starts) > 1 else size
        if stride < 24 or size % stride:
            raise ValueError(f"__modver's {size} bytes do not divide into entries of {stride}")
        for at in range(offset, offset + size, stride):
            (module_at,) = struct.unpack_from("<Q", elf, at + stride - 16)
            names.add(_c_string(elf, sections, module_at))
    return frozenset(n.replace("-", "_") for n in names)


def _c_string(elf: bytes, sections: dict[bytes, tuple[int, int, int]], address: int) -> str:
    """The NUL-terminated string at virtual ``address`` in a section with file bytes."""
    for addr, offset, size in sections.values():
        if addr and addr <= address < addr + size and offset + size <= len(elf):
            at = offset + address - addr
            end = elf.find(b"\0", at, offset + size)
            if end < 0:
                break
            return elf[at:end].decode("utf-8", "replace")
    raise ValueError(f"a name pointer {address:#x} points into no section of the image")


def read_builtin_certificates(path: Path, cap: int = MAX_IMAGE) -> list[bytes]:
    """The DER certificates built into the image at ``path`` (:func:`builtin_certificates`);
    :class:`TargetFileError` names what is wrong."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TargetFileError(path, f"cannot read: {exc.strerror or exc}") from exc
    try:
        return builtin_certificates(vmlinux(data, cap))
    except (struct.error, IndexError, ValueError) as exc:
        raise TargetFileError(path, f"damaged: {exc}") from exc


def _der_length(data: bytes, at: int) -> int | None:
    """The whole length of the DER SEQUENCE at ``at`` with a 2-octet length, or None."""
    if data[at : at + 2] != b"\x30\x82" or at + 4 > len(data):
        return None
    return 4 + int.from_bytes(data[at + 2 : at + 4], "big")


def builtin_certificates(elf: bytes) -> list[bytes]:
    """The certificates of ``system_certificate_list`` (module docstring); ValueError when the
    image has no such list."""
    sections = _sections(elf)
    for name in (b".init.data", b".init.rodata"):
        if name not in sections:
            continue
        addr, offset, size = sections[name]
        end_of = offset + size
        at = elf.find(b"\x30\x82", offset, end_of)
        while at >= 0:
            if (addr + at - offset) % 8 == 0:
                found = _list_at(elf, at, end_of)
                if found:
                    return found
            at = elf.find(b"\x30\x82", at + 1, end_of)
    raise ValueError("no built-in certificate list (system_certificate_list) in the image")


def _list_at(elf: bytes, start: int, limit: int) -> list[bytes]:
    """The certificates from ``start`` if a run of them there is followed by its length."""
    certs = []
    at = start
    while (length := _der_length(elf, at)) is not None and at + length <= limit:
        certs.append(elf[at : at + length])
        at += length
        quad = (at + 7) & ~7
        if quad + 16 <= limit:
            total, module_cert = struct.unpack_from("<QQ", elf, quad)
            if total == at - start and 0 < module_cert <= total:
                return certs
    return []
