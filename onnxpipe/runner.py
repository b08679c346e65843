"""Run a split folder's stages one after another in this process, passing tensors by name.

A small lifecycle: :meth:`StageChain.from_manifest` opens one onnxruntime session per stage,
:meth:`StageChain.run` pushes one set of model inputs through them all, :meth:`StageChain.close` (or the
``with`` block) releases the sessions.  Each stage receives exactly the tensors its manifest entry lists
(model inputs and outputs of earlier stages); a tensor is dropped once no later stage or model output
needs it, so memory holds what crosses the current cut, not every activation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

import numpy as np
import onnxruntime as ort

from onnxpipe.errors import RuntimeStageError, UsageError
from onnxpipe.manifest import MODEL_INPUT, Manifest, load_manifest


class StageChain:
    """One onnxruntime session per stage of a split folder, run in order."""

    def __init__(self, manifest: Manifest, sessions: Sequence[ort.InferenceSession], directory: Path) -> None:
        if len(sessions) != len(manifest.stages):
            raise ValueError(f"{len(sessions)} sessions for {len(manifest.stages)} stages")
        self.manifest = manifest
        self.directory = directory
        self._sessions: list[ort.InferenceSession] | None = list(sessions)
        # after stage s, keep only tensors that a later stage or the model outputs still read
        self._keep_after: list[frozenset[str]] = []
        later: set[str] = {o.name for o in manifest.model_outputs}
        for st in reversed(manifest.stages):
            self._keep_after.append(frozenset(later))
            later |= {t.name for t in st.inputs}
        self._keep_after.reverse()

    @classmethod
    def from_manifest(
        cls,
        directory: str | Path,
        *,
        threads: int = 1,
        providers: Sequence[str] = ("CPUExecutionProvider",),
        check_files: bool = True,
    ) -> StageChain:
        """Open every stage of ``directory`` (validated, stage files hash-checked) with ``threads`` each."""
        d = Path(directory)
        if threads < 1:
            raise UsageError(f"threads {threads}: give a positive number of intra-op threads")
        manifest = load_manifest(d, check_files=check_files)
        sessions: list[ort.InferenceSession] = []
        for st in manifest.stages:
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
            options.log_severity_level = 3
            try:
                sessions.append(ort.InferenceSession(str(d / st.file), options, providers=list(providers)))
            except Exception as e:
                raise RuntimeStageError(
                    f"{d / st.file}: stage {st.index} does not load in onnxruntime ({_first_line(e)}); "
                    "re-run onnxpipe split"
                ) from e
        return cls(manifest, sessions, d)

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.manifest.model_inputs)

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.manifest.model_outputs)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Model outputs for the model inputs ``feeds`` (a model output that is an input is passed back).

        Tensors are numpy arrays; sequences and maps come back as onnxruntime returns them (lists, dicts).
        """
        sessions = self._sessions
        if sessions is None:
            raise UsageError(f"{self.directory}: the stage chain is closed; open it again")
        missing = [n for n in self.input_names if n not in feeds]
        if missing:
            listed = ", ".join(self.input_names)
            raise UsageError(f"model input {missing[0]!r} is not in the feeds; give every input: {listed}")
        values: dict[str, np.ndarray] = {n: feeds[n] for n in self.input_names}
        passthrough = {
            o.name: feeds[o.name] for o in self.manifest.model_outputs if o.produced_by == MODEL_INPUT
        }
        for st, session, keep in zip(self.manifest.stages, sessions, self._keep_after, strict=True):
            stage_feeds = {t.name: values[t.name] for t in st.inputs}
            names = [t.name for t in st.outputs]
            try:
                results = session.run(names, stage_feeds)
            except Exception as e:
                raise RuntimeStageError(
                    f"{self.directory / st.file}: stage {st.index} failed ({_first_line(e)}); "
                    "check the input shapes against the manifest"
                ) from e
            values.update(zip(names, results, strict=True))
            values = {n: v for n, v in values.items() if n in keep}
        values.update(passthrough)
        return {n: values[n] for n in self.output_names}

    def close(self) -> None:
        """Release the sessions; :meth:`run` refuses to run afterwards."""
        self._sessions = None

    def __enter__(self) -> StageChain:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
