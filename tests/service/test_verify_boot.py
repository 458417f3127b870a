"""Compressed modules at boot: told by content, decompressed once, verified, loaded as ELF."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from service.boot.loader import Boot
from service.bundles.phase import Phase
from service.config import Config
from service.layout import Layout, kernel_config, modules_dir
from service.verify.signature.trust import TrustStore
from stager.drop import ModuleSpec, stage
from tests.kmod import SigningKey, compress, sign
from tests.service.fakes import FakeKernel, make_intake


class ImageKernel(FakeKernel):
    """A recording kernel that also keeps what each load was handed."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[tuple[str, bytes]] = []
        self.fds: list[int] = []

    def load(self, fd: int, params: str) -> None:
        self.fds.append(fd)
        super().load(fd, params)

    def load_image(self, image: bytes, name: str, params: str) -> None:
        self.images.append((name, image))
        super().load_image(image, name, params)


def pending(host: Layout, kernel: str, module: Path) -> None:
    stage(host.incoming, bundle="z", version="1", kernel=kernel, modules=[ModuleSpec(module, "")])
    intake = make_intake(host)
    [outcome] = intake.run()
    assert outcome.accepted, outcome.reasons


def boot_compressed(
    host: Layout, signed: Path, kernel: str, kind: str, drop: Path
) -> tuple[ImageKernel, bytes]:
    """Take in ``signed`` compressed as ``kind`` under a ``.ko`` name, boot it with an
    :class:`ImageKernel`; the kernel and the stored (compressed) bytes."""
    stored = compress(signed.read_bytes(), kind)
    module = drop / "ms_params.ko"  # the suffix lies: the content is compressed
    module.parent.mkdir()
    module.write_bytes(stored)
    pending(host, kernel, module)
    fake = ImageKernel()
    state = Boot(host, Config(), TrustStore.from_directory(host.trusted), fake).run()
    assert state.bundle("z").loaded[0].module == "ms_params"
    return fake, stored


@pytest.mark.parametrize("kind", ["xz", "zst", "gz"])
def test_compressed_module_is_loaded_decompressed_whatever_its_name(
    tmp_path: Path,
    host: Layout,
    modules: dict[str, Path],
    rsa_key: SigningKey,
    kernel: str,
    kind: str,
) -> None:
    """A ``.ko`` holding compressed data (the suffix lies) is decompressed by content and a
    kernel that cannot decompress modules (Debian 12's 6.1) gets the signed ELF, never a
    compressed file or the COMPRESSED flag."""
    signed = sign(modules["ms_params"], rsa_key, tmp_path / "ms_params.ko")
    fake, _stored = boot_compressed(host, signed, kernel, kind, tmp_path / "drop")
    assert fake.fds == [] and fake.compressed_loads == []
    assert fake.images == [("ms_params.ko", signed.read_bytes())]


@pytest.mark.parametrize("kind", ["xz", "zst", "gz"])
def test_a_kernel_that_decompresses_the_format_gets_the_stored_file(
    tmp_path: Path,
    host: Layout,
    modules: dict[str, Path],
    rsa_key: SigningKey,
    kernel: str,
    kind: str,
) -> None:
    """A target built as Debian 13's 6.12 is (``MODULE_DECOMPRESS`` with the xz
    decompressor) gets an xz module as it is stored, with ``MODULE_INIT_COMPRESSED_FILE``,
    after modstage verified its decompressed image; a format that kernel cannot
    decompress is decompressed by modstage as on 6.1."""
    config = kernel_config(host, kernel)
    config.write_text(
        config.read_text() + "CONFIG_MODULE_DECOMPRESS=y\nCONFIG_MODULE_COMPRESS_XZ=y\n"
    )
    signed = sign(modules["ms_params"], rsa_key, tmp_path / "ms_params.ko")
    fake, stored = boot_compressed(host, signed, kernel, kind, tmp_path / "drop")
    if kind == "xz":
        assert fake.compressed_loads == [len(stored)] and fake.images == []
    else:
        assert fake.compressed_loads == []
        assert fake.images == [("ms_params.ko", signed.read_bytes())]


def test_plain_module_is_loaded_from_the_verified_descriptor(
    host: Layout, modules: dict[str, Path], rsa_key: SigningKey, kernel: str, tmp_path: Path
) -> None:
    """An uncompressed module goes to finit_module from the descriptor it was verified from."""
    pending(host, kernel, sign(modules["ms_params"], rsa_key, tmp_path / "ms_params.ko"))
    fake = ImageKernel()
    Boot(host, Config(), TrustStore.from_directory(host.trusted), fake).run()
    assert len(fake.fds) == 1 and fake.images == []


def test_sealed_memfd_is_read_only_and_sealed() -> None:
    """The memfd handed to finit_module cannot be written through any descriptor."""
    import fcntl

    from service.host.modules import sealed_memfd

    fd = sealed_memfd(b"\x7fELF image", "m.ko")
    try:
        assert os.read(fd, 64) == b"\x7fELF image"
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        assert seals & fcntl.F_SEAL_WRITE and seals & fcntl.F_SEAL_SEAL
        with pytest.raises(OSError):
            os.write(fd, b"x")
        writable = os.open(f"/proc/self/fd/{fd}", os.O_WRONLY)
        try:
            with pytest.raises(PermissionError):  # F_SEAL_WRITE: EPERM
                os.write(writable, b"x")
        finally:
            os.close(writable)
    finally:
        os.close(fd)


def test_firmware_path_is_cleared_with_a_nul_and_bounded_to_255_bytes(tmp_path: Path) -> None:
    """param_set_copystring keeps "\\n" verbatim; a lone NUL clears; 256+ bytes is ENOSPC."""
    from service.errors import BootError
    from service.host.firmware import PATH_PARAM, FirmwareView
    from service.host.sysfs import Sysfs

    sys = tmp_path / "sys"
    (sys / PATH_PARAM).parent.mkdir(parents=True)
    (sys / PATH_PARAM).write_text("\n")
    view = FirmwareView(tmp_path / "view", Sysfs(sys), allow_foreign=False)
    view.point(True)
    assert (sys / PATH_PARAM).read_text() == str(tmp_path / "view")
    view.point(False)
    assert (sys / PATH_PARAM).read_bytes() == b"\0"
    long_view = FirmwareView(tmp_path / ("x" * 256), Sysfs(sys), allow_foreign=False)
    with pytest.raises(BootError, match=r"longer than firmware_class\.path's 255 bytes"):
        long_view.point(True)


def _disagreeing_symvers(host: Layout, kernel: str, module: Path) -> str:
    """Rewrite the target's ``Module.symvers`` so one symbol ``module`` imports has another
    CRC there (the module no longer matches the kernel); that symbol's name."""
    from service.verify.modfile.modinfo import read_versions

    symbol = next(n for n, _ in read_versions(module) if n != "module_layout")
    symvers = modules_dir(host, kernel) / "build" / "Module.symvers"
    lines = symvers.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.split("\t")[1:2] == [symbol])
    crc, rest = lines[at].split("\t", 1)
    lines[at] = f"{int(crc, 16) ^ 0x5A5A:#010x}\t{rest}"
    symvers.write_text("\n".join(lines) + "\n")
    return symbol


def test_boot_leaves_symbol_crcs_to_the_kernel(
    host: Layout, modules: dict[str, Path], rsa_key: SigningKey, kernel: str, tmp_path: Path
) -> None:
    """Boot does not refuse a module for a CRC it read in ``Module.symvers``: the kernel checks
    each imported symbol's CRC at load, so a kernel that takes the module makes it live."""
    module = sign(modules["ms_params"], rsa_key, tmp_path / "ms_params.ko")
    pending(host, kernel, module)
    _disagreeing_symvers(host, kernel, module)
    state = Boot(host, Config(), TrustStore.from_directory(host.trusted), FakeKernel()).run()
    assert [m.module for m in state.bundle("z").loaded] == ["ms_params"]


def test_kernel_einval_names_the_symbol_whose_crc_disagrees(
    host: Layout, modules: dict[str, Path], rsa_key: SigningKey, kernel: str, tmp_path: Path
) -> None:
    """When the kernel refuses a load with EINVAL, the failure names the imported symbol whose
    CRC ``Module.symvers`` gives otherwise, as ``modstage verify`` would have."""
    module = sign(modules["ms_params"], rsa_key, tmp_path / "ms_params.ko")
    pending(host, kernel, module)
    symbol = _disagreeing_symvers(host, kernel, module)
    refusing = FakeKernel(fail={"ms_params": errno.EINVAL})
    state = Boot(host, Config(), TrustStore.from_directory(host.trusted), refusing).run()
    [failed] = [g.failed for g in state.bundle("z").generations.values() if g.failed]
    assert failed.startswith(
        f"modules/ms_params.ko: EINVAL: disagrees about version of symbol {symbol} "
    )
    assert failed.endswith(
        "(finit_module: EINVAL: invalid module or parameter (or a symbol version mismatch))"
    )


def test_kernel_einval_with_agreeing_crcs_keeps_the_kernels_words(
    host: Layout, modules: dict[str, Path], rsa_key: SigningKey, kernel: str, tmp_path: Path
) -> None:
    """EINVAL for another reason (every CRC agrees): the failure is the kernel's own words."""
    pending(host, kernel, sign(modules["ms_params"], rsa_key, tmp_path / "ms_params.ko"))
    refusing = FakeKernel(fail={"ms_params": errno.EINVAL})
    state = Boot(host, Config(), TrustStore.from_directory(host.trusted), refusing).run()
    [failed] = [g.failed for g in state.bundle("z").generations.values() if g.failed]
    assert (
        failed
        == "modules/ms_params.ko: EINVAL: invalid module or parameter (or a symbol version mismatch)"
    )


def test_a_compressed_module_damaged_in_the_store_fails_its_generation(
    host: Layout, signed: dict[str, Path], kernel: str, tmp_path: Path
) -> None:
    """A compressed module whose stored stream no longer decompresses (the store damaged
    behind modstage's back) fails its generation with the file and the decompressor's
    refusal; nothing is handed to the kernel and the boot goes on."""
    module = tmp_path / "drop" / "ms_params.ko"
    module.parent.mkdir()
    module.write_bytes(compress(signed["ms_params"].read_bytes(), "xz"))
    pending(host, kernel, module)
    [gen] = [p for p in host.store.iterdir()]
    stored = gen / "modules" / "ms_params.ko"
    stored.parent.chmod(0o755)
    stored.chmod(0o644)
    stored.write_bytes(stored.read_bytes()[:-64])  # the stream's end cut off
    fake = ImageKernel()
    b = Boot(host, Config(), TrustStore.from_directory(host.trusted), fake).run().bundle("z")
    assert (b.phase, b.active) == (Phase.FAILED, None)
    assert b.generations[gen.name].failed == "modules/ms_params.ko: EINVAL: truncated xz stream"
    assert fake.calls == [] and fake.images == []
