"""Guest-side helpers of the oracle: keyrings and the batch loader (standard library only).

Imported by the VM agent (the repository is on its sys.path): `vm.eval("__import__(
'tests.oracle.guest', fromlist=['x']).keyring_keys('.builtin_trusted_keys')")`.
"""

from __future__ import annotations

import ctypes
import errno
import json
import lzma
import os
import time
from typing import Any

SYS_ADD_KEY = 248  # x86_64
SYS_KEYCTL = 250
KEYCTL_DESCRIBE = 6
KEYCTL_READ = 11
SYS_FINIT_MODULE = 313
SYS_DELETE_MODULE = 176
MODULE_INIT_COMPRESSED_FILE = 4
_libc = ctypes.CDLL(None, use_errno=True)


def keyring_id(description: str) -> int:
    """The serial of the keyring called `description` (e.g. `.secondary_trusted_keys`)."""
    with open("/proc/keys") as f:
        for line in f:
            words = line.split()
            if words[7] == "keyring" and words[8].rstrip(":") == description:
                return int(words[0], 16)
    raise LookupError(f"no keyring {description} in /proc/keys")


def _describe(serial: int) -> str:
    buf = ctypes.create_string_buffer(4096)
    n = _libc.syscall(SYS_KEYCTL, KEYCTL_DESCRIBE, serial, buf, len(buf))
    if n < 0:
        return f"<errno {ctypes.get_errno()}>"
    return buf.value.decode(errors="replace")


def keyring_keys(description: str) -> list[str]:
    """The descriptions (`type;uid;gid;perm;description`) of the keys in a keyring."""
    buf = ctypes.create_string_buffer(4096)
    n = _libc.syscall(SYS_KEYCTL, KEYCTL_READ, keyring_id(description), buf, len(buf))
    if n < 0:
        raise OSError(ctypes.get_errno(), f"KEYCTL_READ {description}")
    raw = buf.raw[: min(n, len(buf))]
    serials = [int.from_bytes(raw[i : i + 4], "little") for i in range(0, len(raw), 4)]
    return [_describe(s) for s in serials]


def add_certificate(der: bytes, keyring: str = ".secondary_trusted_keys") -> int:
    """add_key("asymmetric", "", der, keyring): the new key's serial, or -errno."""
    rc = _libc.syscall(SYS_ADD_KEY, b"asymmetric", b"", der, len(der), keyring_id(keyring))
    return int(rc) if rc >= 0 else -ctypes.get_errno()


def finit(path: str, flags: int = 0) -> int:
    """finit_module(path, "", flags): 0 or the errno."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        rc = _libc.syscall(SYS_FINIT_MODULE, fd, b"", flags)
        return 0 if rc == 0 else ctypes.get_errno()
    finally:
        os.close(fd)


def unload(name: str) -> int:
    """delete_module(name, O_NONBLOCK): 0 or the errno."""
    rc = _libc.syscall(SYS_DELETE_MODULE, name.encode(), os.O_NONBLOCK)
    return 0 if rc == 0 else ctypes.get_errno()


def first_stream(data: bytes, kind: str) -> bytes:
    """The first complete stream of `data`, decompressed as 6.1's in-kernel decompressors do
    (kernel/module/decompress.c: stop at the end of the stream, ignore what follows);
    ValueError if the stream is truncated or corrupt (the kernel's EINVAL)."""
    import zlib

    if kind == "xz":
        xz = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
        out = xz.decompress(data)
    elif kind == "gz":
        xz = zlib.decompressobj(wbits=31)  # type: ignore[assignment]
        out = xz.decompress(data)
    else:
        import zstandard  # the host's Python runs in the guest

        xz = zstandard.ZstdDecompressor().decompressobj()  # type: ignore[assignment]
        out = xz.decompress(data)
    if not xz.eof:
        raise ValueError(f"truncated {kind} stream")
    return bytes(out)


TRACING = "/sys/kernel/tracing"


def trace_module_loads() -> None:
    """Mount tracefs if needed, empty its buffer and enable the `module:module_load` event.

    load_module() fires that event after every loader check (signature, vermagic, symbols and
    their CRCs, relocations, parameters) and right before it calls the module's init; a load
    whose errno came after the event was refused by the module's own init, not the loader."""
    if not os.path.isdir(f"{TRACING}/events"):
        os.makedirs(TRACING, exist_ok=True)
        if _libc.mount(b"nodev", TRACING.encode(), b"tracefs", 0, None) != 0:
            raise OSError(ctypes.get_errno(), f"mount tracefs on {TRACING}")
    _empty_trace()
    with open(f"{TRACING}/events/module/module_load/enable", "w") as f:
        f.write("1")


def _empty_trace() -> None:
    with open(f"{TRACING}/trace", "w"):
        pass  # opened for writing with O_TRUNC: the buffer is emptied


def init_was_called(name: str) -> bool:
    """Whether `module_load` fired for `name` since the buffer was last emptied."""
    with open(f"{TRACING}/trace") as f:  # "... module_load: <name> <taint flags>"
        loaded = [
            line.split("module_load: ", 1)[1].split() for line in f if "module_load: " in line
        ]
    return any(words[:1] == [name] for words in loaded)


def judge(
    path: str, name: str, compressed: str, scratch: str, unload_loaded: bool = False
) -> dict[str, Any]:
    """The kernel's verdict on one case: errno of a plain load (0 = loaded; every case has
    its own module name, so a loaded one may stay, or is unloaded with `unload_loaded`).
    A refused load records `init_called`: whether the loader accepted the module and the
    errno is its init's (`trace_module_loads`).

    A compressed case records the in-kernel route (`MODULE_INIT_COMPRESSED_FILE`, EOPNOTSUPP
    without CONFIG_MODULE_DECOMPRESS) as `in_kernel`; `errno` is the load of its first
    stream decompressed in userspace (what a decompressing kernel or loader hands over), or
    EINVAL when that stream is truncated or corrupt.
    """
    result: dict[str, Any] = {"name": name}
    if compressed:
        result["in_kernel"] = finit(path, MODULE_INIT_COMPRESSED_FILE)
        if result["in_kernel"] == 0:
            unload(name)
        with open(path, "rb") as f:
            raw = f.read()
        try:
            plain = first_stream(raw, compressed)
        except Exception as exc:  # the kernel's decompressors say EINVAL
            result["errno"] = errno.EINVAL
            result["note"] = f"decompression failed: {exc}"
            return result
        path = os.path.join(scratch, f"{name}.ko")
        with open(path, "wb") as f:
            f.write(plain)
    _empty_trace()
    began = time.monotonic()
    result["errno"] = finit(path)
    result["load_ms"] = round((time.monotonic() - began) * 1000, 1)
    if result["errno"] != 0:
        result["init_called"] = init_was_called(name)
    if result["errno"] == 0 and unload_loaded:
        result["unload"] = unload(name)
    return result


def judge_all(plan_path: str, out_path: str, scratch: str = "/run") -> int:
    """Judge every case of the JSON plan [{path, name, compressed}]; write results as JSON."""
    with open(plan_path) as f:
        plan = json.load(f)
    trace_module_loads()
    results = {c["id"]: judge(c["path"], c["name"], c["compressed"], scratch) for c in plan}
    with open(out_path, "w") as f:
        json.dump(results, f)
    return len(results)
