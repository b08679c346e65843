"""The runtimes a stage file can be fed to, behind one small protocol: load, run, time, close.

onnxpipe exists to feed stages to heterogeneous runtimes, so a stage's runtime is a choice per device
(``runtime`` in the devices file, docs/devices.md), not a property of the whole pipeline:

* ``onnxruntime`` (the default): an :class:`onnxruntime.InferenceSession` with the device's execution
  provider and its options, configured by :mod:`onnxpipe.core.ortsession`;
* ``openvino``: OpenVINO reads the ``.onnx`` file itself (external data included) and compiles it for
  ``openvino_device`` (``CPU``, ``GPU``, ``NPU``...) with ``openvino_config``;
* ``tract``: Sonos' tract, a pure-Rust engine, through its Python package.

Each engine lives in its module, ``onnxpipe.core.engine_<runtime>`` (the registry's
:attr:`~onnxpipe.core.runtime_kinds.RuntimeKind.engine_module`), imported only when asked for: the
packages of OpenVINO and tract are optional extras (``pip install 'onnxpipe[openvino]'``,
``'onnxpipe[tract]'``) and a missing one is one line naming the extra (:func:`require`), never an
ImportError traceback.

Every engine binds tensors by name on input and returns outputs in the order asked for; runtimes that
rename outputs (tract names them after their producing node) are bound by the stage file's output
position, which the manifest keeps in order.
"""

from __future__ import annotations

import importlib
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Protocol

import numpy as np

from onnxpipe.core.choices import Runtime
from onnxpipe.core.errors import UsageError
from onnxpipe.core.extras import install_hint
from onnxpipe.core.runtime_kinds import EngineConfig as EngineConfig
from onnxpipe.core.runtime_kinds import kind_of

OPENVINO_CPU_DEFAULTS: Mapping[str, str] = {
    "INFERENCE_PRECISION_HINT": "f32",
    "NUM_STREAMS": "1",
    "PERFORMANCE_HINT": "LATENCY",
}
"""OpenVINO's CPU plugin runs in bf16 on CPUs that have it unless told otherwise, which would make a stage
differ from the model it was cut from by far more than verify's tolerance; f32 keeps OpenVINO comparable
to onnxruntime.  One stream at latency: a stage serves one micro-batch at a time.  ``openvino_config``
overrides any of these."""


def require(runtime: Runtime) -> ModuleType:
    """The Python package of ``runtime``, or a one-line :class:`UsageError` naming the extra to install."""
    kind = kind_of(runtime)
    name = kind.package
    try:
        return importlib.import_module(name)
    except ImportError as e:
        how = install_hint(kind.extra) if kind.extra else f"pip install {name}"
        raise UsageError(
            f"runtime {runtime.value} needs the {name} package, which is not installed here ({e}); "
            f"install it with {how} or give the device another runtime"
        ) from None


def available(runtime: Runtime) -> bool:
    """Whether ``runtime``'s package imports here."""
    try:
        require(runtime)
    except UsageError:
        return False
    return True


def runs_here(config: EngineConfig) -> bool:
    """Whether this machine can open an engine for ``config``: the runtime's package is installed and its
    engine module sees the device (for onnxruntime, the provider; for OpenVINO, the device, ``GPU.1``
    counting as ``GPU``)."""
    if not available(config.runtime):
        return False
    return bool(importlib.import_module(config.kind.engine_module).runs_here(config))


class Engine:
    """One loaded stage (or whole model) on one runtime.

    What every engine shares lives here: its file's input and output names, no run once closed, and no
    run for no outputs (onnxruntime refuses one); an engine's module writes :meth:`_run`,
    :meth:`layer_seconds` and :meth:`_release`.
    """

    runtime: Runtime

    def __init__(self, inputs: tuple[str, ...], outputs: tuple[str, ...]) -> None:
        self.input_names = inputs
        """The file's inputs, in order (weights listed as inputs excluded)."""
        self.output_names = outputs
        """The file's outputs, in order."""
        self._closed = False

    def run(self, names: Sequence[str], feeds: Mapping[str, np.ndarray]) -> list[Any]:
        """The outputs ``names`` (in that order) for the inputs ``feeds``, by name."""
        if self._closed:
            raise RuntimeError("the engine is closed")
        return self._run(names, feeds) if names else []

    def _run(self, names: Sequence[str], feeds: Mapping[str, np.ndarray]) -> list[Any]:
        raise NotImplementedError

    def layer_seconds(self, feeds: Mapping[str, np.ndarray]) -> dict[str, float] | None:
        """Seconds per layer of one run as the runtime reports them (its own layer names), or None when
        it reports none; the caller maps the names back to the model's nodes."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the runtime's resources; the engine does not run afterwards."""
        self._closed = True
        self._release()

    def _release(self) -> None:
        """Drop the runtime's objects (a session, a compiled model)."""


def file_io(path: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The declared inputs and outputs of the model file at ``path``, in its order, read without its
    weights: what an engine that renames tensors binds by position.  Inputs that are also initializers
    (IR 3 files list every weight as an input) are not inputs a caller feeds, and are left out."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    weights = {t.name for t in graph.initializer} | {t.values.name for t in graph.sparse_initializer}
    return tuple(i.name for i in graph.input if i.name not in weights), tuple(o.name for o in graph.output)


def open_engine(
    path: str | Path,
    config: EngineConfig,
    *,
    fail: Callable[[Exception], Exception] | None = None,
) -> Engine:
    """An engine for the model at ``path`` on ``config``'s runtime.

    A missing runtime package is always a :class:`UsageError` naming its extra.  If the model does not
    load and ``fail`` is given, raises ``fail(error)``; without it the runtime's error propagates.
    """
    if config.threads < 1:
        raise UsageError(f"threads {config.threads}: give a positive number of intra-op threads")
    require(config.runtime)
    module = importlib.import_module(config.kind.engine_module)
    try:
        engine: Engine = module.load(Path(path), config)
    except UsageError:
        raise
    except Exception as e:
        if fail is None:
            raise
        raise fail(e) from e
    return engine


def median_seconds(call: Callable[[], object], *, runs: int, warmup: int) -> float:
    """Median wall seconds of ``runs`` calls (at least one) after ``warmup`` untimed ones: the one way
    onnxpipe times a run, whatever runs it."""
    for _ in range(max(0, warmup)):
        call()
    times: list[float] = []
    for _ in range(max(1, runs)):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


ALONE_BLOCK = 5
"""Timed runs of one stage in a row when the stages are timed alone, before the next one's turn."""


class Runs(Protocol):
    """What :func:`time_in_turns` times: an onnxruntime session, an :class:`Engine` or a test's fake."""

    def run(self, names: Sequence[str], feeds: Mapping[str, Any], /) -> object:
        """The outputs ``names`` for the inputs ``feeds``."""
        ...


def time_in_turns(
    stages: Sequence[tuple[Runs, Sequence[str], Mapping[str, Any]]],
    *,
    runs: int = 30,
    block: int = ALONE_BLOCK,
    clock: Callable[[], float] | None = None,
) -> list[float]:
    """Median seconds of ``runs`` runs of each stage, the stages taking turns ``block`` timed runs at a
    time (each turn after one untimed run that brings the stage's weights back into the caches), in
    forward then backward order; timed by ``clock`` (default: the wall clock, ``time.perf_counter``).

    Why turns: a machine whose speed drifts (a neighbour on a shared host) then slows every stage alike,
    and the cut, which depends on the stages' relative times, stays where it belongs.  Timed one stage
    after the other (``block >= runs``), each stage's time is that of its own minute
    (``benchmarks/bench_calibrate.py`` measures the difference).  ``stages``: a session (or engine), the
    names of the outputs it is run for and its feeds; calibration times a plan's stages so, node
    splitting the pieces of a cut node.
    """
    if block < 1 or runs < 1:
        raise ValueError(f"time_in_turns needs runs and block of at least 1, got runs={runs}, block={block}")
    now = clock or time.perf_counter
    times: list[list[float]] = [[] for _ in stages]
    turn = 0
    while any(len(t) < runs for t in times):
        order = range(len(stages)) if turn % 2 == 0 else range(len(stages) - 1, -1, -1)
        for s in order:
            if len(times[s]) >= runs:
                continue
            session, names, feeds = stages[s]
            session.run(names, feeds)
            for _ in range(min(block, runs - len(times[s]))):
                start = now()
                session.run(names, feeds)
                times[s].append(now() - start)
        turn += 1
    return [statistics.median(t) for t in times]


def bind_outputs(
    names: Sequence[str], declared: Sequence[str], results: Sequence[Any], where: str
) -> list[Any]:
    """``results`` (one per ``declared`` output, in the file's order) picked out for ``names``."""
    position = {n: i for i, n in enumerate(declared)}
    missing = [n for n in names if n not in position]
    if missing:
        raise UsageError(
            f"{where}: has no output {missing[0]!r} (its outputs: {', '.join(declared)}); "
            "re-run onnxpipe split"
        )
    return [results[position[n]] for n in names]
