"""The driver's side of shipping stage files to the nodes of a Ray cluster (``ray_files="ship"``).

Once an actor has started on its node, the driver asks it which of its stages' files the node's cache
lacks (:mod:`~onnxpipe.runtime.backends.stage_cache`), streams those through Ray in chunks of
:data:`CHUNK_BYTES`, at most :data:`WINDOW` chunks on their way at once (a stage of any size, 2 GB or
more, ships with a bounded share of the object store and of the driver's memory), and has the node check
each file's sha256 on arrival.  Files the node has already (an earlier run, another stage with the same
weights) are not sent again.  Then the actor opens its stages from its node's copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import onnx

from onnxpipe.core.files import file_sha256
from onnxpipe.ir.external import external_info, is_external
from onnxpipe.runtime.backends.stage_cache import ShippedFile
from onnxpipe.runtime.spec import ModelFile, WorkerSpec

CHUNK_BYTES = 8 * 1024 * 1024
"""Bytes of one chunk of a shipped file: one object in the object store."""
WINDOW = 4
"""Chunks on their way at once: what shipping holds of the object store and of the driver's memory."""


def model_files(path: Path) -> tuple[ModelFile, ...]:
    """The model at ``path`` and the external weights files beside it, hashed here (a model whose files
    no manifest records, such as the source model the baselines run)."""
    proto = onnx.load(str(path), load_external_data=False)
    locations = (external_info(t)[0] for t in proto.graph.initializer if is_external(t))
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
