"""Run a split folder's stages one after another in this process, passing tensors by name.

A small lifecycle: :meth:`StageChain.from_manifest` opens one engine per stage (onnxruntime on the CPU,
or, with ``engines``, each stage on its own runtime: :mod:`onnxpipe.core.runtimes`; one chain may mix
them), :meth:`StageChain.run` pushes one set of model inputs through them all, :meth:`StageChain.close`
(or the ``with`` block) releases the sessions.  Each stage receives exactly the tensors its manifest
entry lists (model inputs and outputs of earlier stages); a tensor is dropped once no later stage or
model output needs it, so memory holds what crosses the current cut, not every activation.

:func:`run_stage_by_stage` computes the same for several input sets with only one stage open at a time,
so a model larger than memory twice over can still be checked (``onnxpipe verify`` uses it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from onnxpipe.core.errors import RuntimeStageError, UsageError, error_line
from onnxpipe.core.progress import ClosesOnExit
from onnxpipe.core.runtime_kinds import kind_of
from onnxpipe.core.runtimes import Engine, EngineConfig, open_engine
from onnxpipe.manifest import MODEL_INPUT, Manifest, StageEntry, load_manifest

Values = dict[str, Any]
"""Tensors by name: numpy arrays, or the lists and dicts onnxruntime returns for sequences and maps."""


class StageChain(ClosesOnExit):
    """One engine per stage of a split folder, run in order."""

    def __init__(self, manifest: Manifest, sessions: Sequence[Engine], directory: Path) -> None:
        if len(sessions) != len(manifest.stages):
            raise ValueError(f"{len(sessions)} sessions for {len(manifest.stages)} stages")
        self.manifest = manifest
        self.directory = directory
        self._sessions: list[Engine] | None = list(sessions)
        self._keep_after = keep_after(manifest)

    @classmethod
    def from_manifest(
        cls,
        directory: str | Path,
        *,
        threads: int = 1,
        check_files: bool = True,
        engines: Sequence[EngineConfig] | None = None,
    ) -> StageChain:
        """Open every stage of ``directory`` (validated, stage files hash-checked) with ``threads`` each,
        in onnxruntime on the CPU, or stage ``s`` as ``engines[s]`` says."""
        d, manifest, configs = _folder(directory, threads, check_files, engines)
        return cls(
            manifest, [open_stage(d, st, c) for st, c in zip(manifest.stages, configs, strict=True)], d
        )

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.manifest.model_inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.manifest.model_outputs)

    def run(self, feeds: Mapping[str, np.ndarray]) -> Values:
        """Model outputs for the model inputs ``feeds`` (a model output that is an input is passed back).

        Tensors are numpy arrays; sequences and maps come back as onnxruntime returns them (lists, dicts).
        """
        sessions = self._sessions
        if sessions is None:
            raise UsageError(f"{self.directory}: the stage chain is closed; open it again")
        values = model_inputs(self.manifest, feeds)
        for st, session, keep in zip(self.manifest.stages, sessions, self._keep_after, strict=True):
            values = run_stage(self.directory, st, session, values, keep)
        return model_outputs(self.manifest, feeds, values)

    def close(self, graceful: bool = True) -> None:
        """Release the engines; :meth:`run` refuses to run afterwards (nothing runs in between, so
        ``graceful`` changes nothing)."""
        for engine in self._sessions or []:
            engine.close()
        self._sessions = None


def run_stage_by_stage(
    directory: str | Path,
    all_feeds: Sequence[Mapping[str, np.ndarray]],
    *,
    threads: int = 1,
    check_files: bool = True,
    engines: Sequence[EngineConfig] | None = None,
) -> list[Values]:
    """Model outputs for each feed set, opening one stage at a time (stage ``s`` runs every set, closes).

    Equal to ``[chain.run(f) for f in all_feeds]`` but holds one stage's weights at a time plus the
    tensors crossing the current cut for every feed set.  ``engines[s]``: the runtime stage ``s`` runs on
    (default: onnxruntime on the CPU).
    """
    d, manifest, configs = _folder(directory, threads, check_files, engines)
    states = [model_inputs(manifest, feeds) for feeds in all_feeds]
    for st, kept, config in zip(manifest.stages, keep_after(manifest), configs, strict=True):
        session = open_stage(d, st, config)
        states = [run_stage(d, st, session, values, kept) for values in states]
        session.close()
        del session
    return [model_outputs(manifest, feeds, values) for feeds, values in zip(all_feeds, states, strict=True)]


# --------------------------------------------------------------------------------------------------
# steps shared by both ways of running


def keep_after(manifest: Manifest) -> list[frozenset[str]]:
    """Per stage: the tensors a later stage or the model outputs still read once it has run."""
    keep: list[frozenset[str]] = []
    later: set[str] = {o.name for o in manifest.model_outputs}
    for st in reversed(manifest.stages):
        keep.append(frozenset(later))
        later |= {t.name for t in st.inputs}
    keep.reverse()
    return keep


def _folder(
    directory: str | Path, threads: int, check_files: bool, engines: Sequence[EngineConfig] | None
) -> tuple[Path, Manifest, list[EngineConfig]]:
    """The split folder, its manifest, and each stage's engine: ``engines[s]``, else onnxruntime on the
    CPU with ``threads`` (:func:`~onnxpipe.core.runtimes.open_engine` refuses fewer than one)."""
    d = Path(directory)
    manifest = load_manifest(d, check_files=check_files)
    if engines is None:
        return d, manifest, [EngineConfig(threads=threads)] * manifest.k
    if len(engines) != manifest.k:
        raise UsageError(f"{len(engines)} engine settings given for the {manifest.k} stages")
    return d, manifest, list(engines)


def open_stage(directory: Path, st: StageEntry, config: EngineConfig) -> Engine:
    """Stage ``st`` on ``config``'s runtime."""
    return open_engine(
        directory / st.file,
        config,
        fail=lambda e: RuntimeStageError(
            f"{directory / st.file}: stage {st.index} does not load in {config.label} ({error_line(e)}); "
            "run it on another runtime or re-run onnxpipe split"
        ),
    )


def model_inputs(manifest: Manifest, feeds: Mapping[str, np.ndarray]) -> Values:
    names = [t.name for t in manifest.model_inputs]
    missing = [n for n in names if n not in feeds]
    if missing:
        raise UsageError(
            f"model input {missing[0]!r} is not in the feeds; give every input: {', '.join(names)}"
        )
    return {n: feeds[n] for n in names}


def run_stage(
    directory: Path, st: StageEntry, session: Engine, values: Values, keep: frozenset[str]
) -> Values:
    """Run one stage on ``values``; return what later stages and the model outputs still need."""
    stage_feeds = {t.name: values[t.name] for t in st.inputs}
    names = [t.name for t in st.outputs]
    if not names:  # only dead ends (nodes whose outputs nothing reads): nothing to compute
        return {n: v for n, v in values.items() if n in keep}
    try:
        results = session.run(names, stage_feeds)
    except Exception as e:
        on = "" if kind_of(session.runtime).reference else f" in {session.runtime.value}"
        raise RuntimeStageError(
            f"{directory / st.file}: stage {st.index} failed{on} ({error_line(e)}); "
            "check the input shapes against the manifest"
        ) from e
    merged = {**values, **dict(zip(names, results, strict=True))}
    return {n: v for n, v in merged.items() if n in keep}


def model_outputs(manifest: Manifest, feeds: Mapping[str, np.ndarray], values: Values) -> Values:
    """The model outputs from the last stage's ``values``; outputs that are model inputs come from feeds."""
    outputs = manifest.model_outputs
    return {o.name: (feeds if o.produced_by == MODEL_INPUT else values)[o.name] for o in outputs}
