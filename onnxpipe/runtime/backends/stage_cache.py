"""A node's cache of stage files, kept by sha256: what the driver shipped there, checked on arrival.

The driver of a Ray pipeline (``ray_files="ship"``) asks each actor which of its stages' files its node
lacks (:meth:`StageCache.missing`), streams those in chunks (:meth:`StageCache.write`; a file of any size,
over 2 GB too, never whole in memory), and the node checks the sha256 the manifest records before the
file counts as there (:meth:`StageCache.seal`): a file damaged on the way, or a split edited after it
was exported, is refused naming the file.  A file is kept once per content, under its hash
(``blobs/<sha256>``); a stage's folder (``stages/<key>/``) links its files there under the names the
stage file refers to (its external weights beside it), so that a second run, or a second stage with the
same weights, ships nothing.

The cache is a folder of the node's machine: ``$ONNXPIPE_STAGE_CACHE``, else
``$XDG_CACHE_HOME/onnxpipe/stages``, else ``~/.cache/onnxpipe/stages``, read where the actor runs.
Writes go to a private temporary file renamed into place, so that two actors on one node shipping the
same file at once both end with one whole copy.

The driver's side is :func:`ship`: it streams the files through Ray in chunks of :data:`CHUNK_BYTES`, at
most :data:`WINDOW` chunks on their way at once (a stage of any size, 2 GB or more, ships with a bounded
share of the object store and of the driver's memory); then the actor opens its stages from its node's
copy.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from onnxpipe.core.files import file_sha256
from onnxpipe.runtime.spec import ModelFile, WorkerSpec

CACHE_ENV = "ONNXPIPE_STAGE_CACHE"
CHUNK_BYTES = 8 * 1024 * 1024
"""Bytes of one chunk of a shipped file: one object in the object store."""
WINDOW = 4
"""Chunks on their way at once: what shipping holds of the object store and of the driver's memory."""


@dataclass(frozen=True)
class ShippedFile:
    """One file of a stage: its name beside the stage file (the stage file first), content, size."""

    name: str
    sha256: str
    size: int


class ShipFailure(Exception):
    """A shipped file did not arrive whole; the message is the complete one-line explanation."""


def cache_root() -> Path:
    """Where this machine keeps shipped stage files (see the module docstring)."""
    given = os.environ.get(CACHE_ENV)
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "onnxpipe" / "stages"


@dataclass
class _Incoming:
    file: BinaryIO
    path: Path
    digest: hashlib._Hash
    written: int = 0


class StageCache:
    """The cache folder ``root`` (default: :func:`cache_root`), and the files arriving there."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = root if root is not None else cache_root()
        self._incoming: dict[str, _Incoming] = {}

    def blob(self, sha256: str) -> Path:
        return self.root / "blobs" / sha256

    def missing(self, files: Sequence[ShippedFile]) -> list[str]:
        """The hashes of ``files`` not in the cache yet, each once."""
        return list(dict.fromkeys(f.sha256 for f in files if not self.blob(f.sha256).is_file()))

    def write(self, sha256: str, offset: int, data: bytes | memoryview) -> None:
        """Bytes ``offset`` onwards of the file ``sha256``; chunks come in order, the first (empty for
        an empty file) at offset 0."""
        incoming = self._incoming.get(sha256)
        if incoming is None:
            if offset != 0:
                raise ShipFailure(f"file {sha256[:12]}: a chunk at byte {offset} came before its start")
            folder = self.root / "blobs"
            folder.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(prefix=f".{sha256[:16]}.", dir=folder)
            incoming = _Incoming(os.fdopen(fd, "wb"), Path(name), hashlib.sha256())
            self._incoming[sha256] = incoming
        if offset != incoming.written:  # out of order: what came of the file is dropped
            del self._incoming[sha256]
            incoming.file.close()
            incoming.path.unlink(missing_ok=True)
            raise ShipFailure(
                f"file {sha256[:12]}: a chunk at byte {offset} came after byte {incoming.written}"
            )
        incoming.file.write(data)
        incoming.digest.update(data)
        incoming.written += len(data)

    def seal(self, file: ShippedFile, label: str) -> None:
        """The file is whole: keep it if its sha256 is the one recorded, else refuse it naming ``label``
        (the stage) and the file."""
        incoming = self._incoming.pop(file.sha256, None)
        if incoming is None:
            raise ShipFailure(f"{label}: {file.name} was sealed before any of it arrived")
        incoming.file.close()
        got = incoming.digest.hexdigest()
        if got != file.sha256 or incoming.written != file.size:
            incoming.path.unlink(missing_ok=True)
            raise ShipFailure(
                f"{label}: {file.name} arrived with sha256 {got} ({incoming.written} bytes), not the "
                f"{file.sha256} ({file.size} bytes) its manifest records; the file changed on the way or "
                "after the split: run onnxpipe split again, or check the driver's copy"
            )
        os.replace(incoming.path, self.blob(file.sha256))

    def stage_path(self, files: Sequence[ShippedFile]) -> Path:
        """The path of the stage file of ``files`` (all in the cache), in a folder of its own where its
        other files (its external weights) lie beside it under the names it refers to them by."""
        key = hashlib.sha256("\n".join(f"{f.name}\0{f.sha256}" for f in files).encode()).hexdigest()
        folder = self.root / "stages" / key
        if not folder.is_dir():
            folder.parent.mkdir(parents=True, exist_ok=True)
            part = Path(tempfile.mkdtemp(prefix=f".{key[:16]}.", dir=folder.parent))
            for f in files:
                _link(self.blob(f.sha256), part / f.name)
            try:
                os.rename(part, folder)
            except OSError:  # another actor made it first: theirs is as good
                shutil.rmtree(part, ignore_errors=True)
        return folder / files[0].name


def _link(blob: Path, to: Path) -> None:
    """``to`` as a hard link to ``blob`` (onnxruntime reads external weights only from inside the model's
    folder, which a symbolic link out of it is not), a copy where links are not allowed."""
    to.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(blob, to)
    except OSError:
        with contextlib.suppress(FileNotFoundError):
            to.unlink()
        shutil.copyfile(blob, to)


# ---------------------------------------------------------------------------------- the driver's side


def model_files(path: Path) -> tuple[ModelFile, ...]:
    """The model at ``path`` and the external weights files beside it, hashed here (a model whose files
    no manifest records, such as the source model the baselines run)."""
    # onnx is imported here, not at the top: the actor imports this module for its cache, and a worker
    # starts without onnx (tests/unit/test_layers.py); only the driver hashes a model's files
    import onnx
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    proto = onnx.load(str(path), load_external_data=False)
    locations = (ExternalDataInfo(t).location for t in proto.graph.initializer if uses_external_data(t))
    names = [path.name, *dict.fromkeys(n for n in locations if n)]
    return tuple(ModelFile(n, file_sha256(path.parent / n)) for n in names)


def ship(ray: Any, actor: Any, specs: Sequence[WorkerSpec]) -> tuple[int, dict[int, list[ShippedFile]]]:
    """Send ``actor``'s node the files of ``specs`` it lacks; the bytes sent, and each stage's files (by
    stage index) for the actor to open them from its node's cache."""
    stage_files: dict[int, list[ShippedFile]] = {}
    sources: dict[str, tuple[ShippedFile, Path, str]] = {}
    for spec in specs:  # each file of a stage's model with its size, and where the driver reads it
        folder = Path(spec.path).parent
        stage_files[spec.index] = []
        for recorded in spec.files or model_files(Path(spec.path)):
            f = ShippedFile(recorded.name, recorded.sha256, (folder / recorded.name).stat().st_size)
            stage_files[spec.index].append(f)
            sources.setdefault(f.sha256, (f, folder / f.name, spec.label))
    missing = ray.get(actor.missing.remote([f for f, _, _ in sources.values()]))
    sent = 0
    for sha in missing:
        f, source, label = sources[sha]
        _stream(ray, actor, f, source)
        ray.get(actor.seal.remote(f, label))
        sent += f.size
    return sent, stage_files


def _stream(ray: Any, actor: Any, f: ShippedFile, source: Path) -> None:
    """``source`` to ``actor`` in chunks, at most :data:`WINDOW` on their way at once."""
    pending: list[Any] = []
    with source.open("rb") as handle:
        for offset in range(0, max(f.size, 1), CHUNK_BYTES):  # an empty file: its one empty chunk is sent
            pending.append(actor.write.remote(f.sha256, offset, handle.read(CHUNK_BYTES)))
            if len(pending) >= WINDOW:
                ray.get(pending.pop(0))
    ray.get(pending)
