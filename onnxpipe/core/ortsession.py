"""One place that configures and opens onnxruntime sessions.

Why the settings are what they are:

* Optimization level: deployment runs at ``ORT_ENABLE_ALL`` (onnxruntime's own default), so measuring
  and verifying at that level measures what will run. Load-only checks (does this stage or probe load,
  what types does onnxruntime infer) pass ``ORT_DISABLE_ALL``: optimizing a large graph costs several
  times as long as loading it and tells them nothing.
* Sequential execution with one inter-op thread, and ``threads`` intra-op threads: each session then
  uses exactly the cores it was given and nodes run one after another, so stage timings are comparable
  between stages, runs and machines. (In sequential mode onnxruntime creates no inter-op pool; the
  explicit 1 just says so.)
* Log severity 4 (fatal only): a failure reaches the user as one line of an onnxpipe error, made from
  the exception onnxruntime raises with the same text, not also as onnxruntime's coloured log line on
  stderr (a failed run logs one at severity 3 before it raises).
* ``external_dir``: where onnxruntime looks for external-initializer files of a model given as bytes,
  which has no folder of its own.
* ``profile_prefix`` and ``optimized_path``: only the profiler (:mod:`onnxpipe.cost.trace`) sets them, to
  read onnxruntime's per-node trace and the graph it actually ran; they go through here so that the
  session it measures is configured exactly like the ones that later run the stages.

:func:`open_session` turns a load failure into the caller's one-line error (``fail``); callers that
inspect the failure themselves, or expect it, call it without ``fail`` inside their own ``try``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Literal

import onnxruntime as ort

OptimizationLevel = Literal["ORT_DISABLE_ALL", "ORT_ENABLE_BASIC", "ORT_ENABLE_EXTENDED", "ORT_ENABLE_ALL"]
Provider = str | tuple[str, dict[str, str]]

CPU_ONLY: tuple[Provider, ...] = ("CPUExecutionProvider",)
EXTERNAL_FOLDER_KEY = "session.model_external_initializers_file_folder_path"


def session_options(
    *,
    level: OptimizationLevel = "ORT_ENABLE_ALL",
    threads: int | None = None,
    log_severity: int = 4,
    external_dir: Path | None = None,
    config: Mapping[str, str] | None = None,
    profile_prefix: Path | None = None,
    optimized_path: Path | None = None,
) -> ort.SessionOptions:
    """Session options at onnxpipe's settings (see the module docstring for why).

    ``threads``: intra-op threads, or None for onnxruntime's default; ``config``: extra session config
    entries (e.g. ``{"session.disable_prepacking": "1"}``); ``profile_prefix``: turn on onnxruntime's
    profiler, its JSON trace named from this prefix; ``optimized_path``: where onnxruntime saves the
    graph it optimized (how its weights are saved is up to ``config``).
    """
    options = ort.SessionOptions()
    options.log_severity_level = log_severity
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.inter_op_num_threads = 1
    if threads is not None:
        options.intra_op_num_threads = threads
    if external_dir is not None:
        options.add_session_config_entry(EXTERNAL_FOLDER_KEY, str(external_dir))
    for key, value in (config or {}).items():
        options.add_session_config_entry(key, value)
    if profile_prefix is not None:
        options.enable_profiling = True
        options.profile_file_prefix = str(profile_prefix)
    if optimized_path is not None:
        options.optimized_model_filepath = str(optimized_path)
    return options


def open_session(
    model: bytes | str | Path,
    options: ort.SessionOptions,
    providers: Sequence[Provider] = CPU_ONLY,
    *,
    fail: Callable[[Exception], Exception] | None = None,
) -> ort.InferenceSession:
    """An onnxruntime session for ``model`` (serialized bytes or a path).

    If it does not load and ``fail`` is given, raises ``fail(error)`` from the error: the caller's
    one-line message, in the caller's error type. Without ``fail`` the error propagates as is.
    """
    source = model if isinstance(model, bytes) else str(model)
    try:
        return ort.InferenceSession(source, options, providers=list(providers))
    except Exception as e:
        if fail is None:
            raise
        raise fail(e) from e
