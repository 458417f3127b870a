"""An image written as an OCI image layout and archive, without running a container.

An OCI image is a handful of JSON documents and tar files named by their digests: each
layer a tar of files (here gzip-compressed, ``application/vnd.oci.image.layer.v1.tar+gzip``),
the config (environment, command, labels and the uncompressed layers' digests, the
``diff_ids``), a manifest naming the config and the layers, and ``index.json`` naming the
manifest with its reference (``org.opencontainers.image.ref.name``). An OCI archive is that
layout as one tar; ``podman load``, ``skopeo copy oci-archive:`` and registries take it.

Layers made here are reproducible: entries sorted, owned by root, times fixed, gzip
without a name or time, so the same files give the same digests. A layer's blob is kept
in the directory given under its uncompressed digest: the base root file system's in the
build cache (compressed once), the others in the build's scratch directory.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
CONFIG = "application/vnd.oci.image.config.v1+json"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"
INDEX = "application/vnd.oci.image.index.v1+json"
REF_NAME = "org.opencontainers.image.ref.name"
CHUNK = 1 << 20


@dataclass(frozen=True)
class Layer:
    """One compressed layer blob: its file, digests and size."""

    blob: Path  # the gzip file
    digest: str  # sha256:... of the gzip file
    diff_id: str  # sha256:... of the uncompressed tar
    size: int
    created_by: str  # what the image's history says made it

    def descriptor(self) -> dict[str, Any]:
        """The layer's descriptor in a manifest."""
        return {"mediaType": LAYER, "digest": self.digest, "size": self.size}


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def _compress(tar: Path, blobs: Path, created_by: str) -> Layer:
    """``tar`` compressed into ``blobs`` under its digest (once per content)."""
    diff_id = _sha256_file(tar)
    blobs.mkdir(parents=True, exist_ok=True)
    known = blobs / f"{diff_id.removeprefix('sha256:')}.layer"
    if not known.is_file():
        fd, tmp = tempfile.mkstemp(dir=blobs, prefix=".layer-")
        with (
            os.fdopen(fd, "wb") as raw,
            tar.open("rb") as src,
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6) as gz,
        ):
            shutil.copyfileobj(src, gz, CHUNK)
        os.replace(tmp, known)
    return Layer(known, _sha256_file(known), diff_id, known.stat().st_size, created_by)


def layer_from_tar(tar: Path, blobs: Path, created_by: str) -> Layer:
    """A layer holding ``tar`` as it is (a root file system made by ``mmdebstrap``)."""
    return _compress(tar, blobs, created_by)


def _tarinfo(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    return info


def layer_from_tree(tree: Path, blobs: Path, created_by: str) -> Layer:
    """A layer holding ``tree``'s contents at the image's root (``tree/opt/x`` is ``/opt/x``),
    with parent directories, each entry root's, modes kept, times zero."""
    with tempfile.TemporaryDirectory(dir=blobs.parent, prefix="layer-") as tmp:
        tar = Path(tmp) / "layer.tar"
        with tarfile.open(tar, "w", format=tarfile.PAX_FORMAT) as out:
            for path in sorted(tree.rglob("*"), key=lambda p: p.relative_to(tree).parts):
                name = str(path.relative_to(tree))
                out.add(path, arcname=name, recursive=False, filter=_tarinfo)
        return _compress(tar, blobs, created_by)


def _json_blob(doc: dict[str, Any]) -> tuple[bytes, str]:
    data = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    return data, "sha256:" + hashlib.sha256(data).hexdigest()


def _add_bytes(out: tarfile.TarFile, name: str, data: bytes) -> None:
    info = _tarinfo(tarfile.TarInfo(name))
    info.size = len(data)
    out.addfile(info, io.BytesIO(data))


def _add_file(out: tarfile.TarFile, name: str, path: Path) -> None:
    info = _tarinfo(tarfile.TarInfo(name))
    info.size = path.stat().st_size
    with path.open("rb") as f:
        out.addfile(info, f)


def image_config(
    layers: list[Layer], env: dict[str, str], cmd: list[str], labels: dict[str, str], created: str
) -> dict[str, Any]:
    """The image's config: what it runs with, and its layers' uncompressed digests."""
    return {
        "created": created,
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Env": [f"{k}={v}" for k, v in env.items()],
            "Cmd": cmd,
            "Labels": labels,
            "WorkingDir": "/",
        },
        "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in layers]},
        "history": [{"created": created, "created_by": layer.created_by} for layer in layers],
    }


def write_archive(output: Path, layers: list[Layer], config: dict[str, Any], ref: str) -> str:
    """Write the OCI archive of an image of ``layers`` and ``config`` named ``ref`` to
    ``output`` (a temporary file renamed into place); the manifest's digest."""
    config_bytes, config_digest = _json_blob(config)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": {"mediaType": CONFIG, "digest": config_digest, "size": len(config_bytes)},
        "layers": [layer.descriptor() for layer in layers],
        "annotations": {k: v for k, v in config["config"]["Labels"].items()},
    }
    manifest_bytes, manifest_digest = _json_blob(manifest)
    index = {
        "schemaVersion": 2,
        "mediaType": INDEX,
        "manifests": [
            {
                "mediaType": MANIFEST,
                "digest": manifest_digest,
                "size": len(manifest_bytes),
                "annotations": {REF_NAME: ref},
            }
        ],
    }
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=output.parent, prefix=f".{output.name}-")
    try:
        with os.fdopen(fd, "wb") as raw, tarfile.open(fileobj=raw, mode="w") as out:
            _add_bytes(out, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
            _add_bytes(out, "index.json", json.dumps(index).encode())
            for digest, data in ((config_digest, config_bytes), (manifest_digest, manifest_bytes)):
                _add_bytes(out, f"blobs/sha256/{digest.removeprefix('sha256:')}", data)
            seen: set[str] = set()
            for layer in layers:
                if layer.digest not in seen:
                    seen.add(layer.digest)
                    _add_file(
                        out, f"blobs/sha256/{layer.digest.removeprefix('sha256:')}", layer.blob
                    )
        os.replace(tmp, output)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return manifest_digest


def read_archive(archive: Path) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """(manifest, config, the layers' entry names in order) of the only image in an OCI
    archive, as :func:`write_archive` writes it."""
    with tarfile.open(archive) as tar:

        def member(name: str) -> IO[bytes]:
            found = tar.extractfile(name)
            if found is None:
                raise KeyError(f"{archive}: no {name}")
            return found

        def blob(digest: str) -> IO[bytes]:
            return member(f"blobs/sha256/{digest.removeprefix('sha256:')}")

        index = json.load(member("index.json"))
        manifest = json.load(blob(index["manifests"][0]["digest"]))
        config = json.load(blob(manifest["config"]["digest"]))
        names: list[str] = []
        for layer in manifest["layers"]:
            with tarfile.open(fileobj=blob(layer["digest"]), mode="r:gz") as inner:
                names += inner.getnames()
    return manifest, config, names
