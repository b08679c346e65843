"""The runtime registry (:mod:`onnxpipe.core.runtime_kinds`): every room asks it what a runtime is and
accepts, and nothing outside it branches on which runtime a stage has, so that an engine is added as one
entry and its module.  Read from the source with ``ast`` for the branches, imported for the entries."""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from paths import REPO_ROOT

from onnxpipe.core.choices import Runtime, VerifyRuntime
from onnxpipe.core.runtime_kinds import RUNTIMES, EngineConfig, kind_of

PACKAGE = REPO_ROOT / "onnxpipe"

REGISTRY = {PACKAGE / "core" / "runtime_kinds.py"}
"""The modules allowed to tell the runtimes apart by name."""


def _names_runtime(node: ast.AST) -> bool:
    """Whether ``node`` is ``Runtime.X`` (or ``api.Runtime.X``), or a tuple, list or set holding one."""
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_names_runtime(e) for e in node.elts)
    if not isinstance(node, ast.Attribute):
        return False
    owner = node.value
    return (isinstance(owner, ast.Name) and owner.id == "Runtime") or (
        isinstance(owner, ast.Attribute) and owner.attr == "Runtime"
    )


def runtime_branches(tree: ast.AST) -> Iterator[int]:
    """Lines of ``tree`` that compare a value with a runtime (``==``, ``!=``, ``is``, ``in``), match it
    against one, or key a table by runtime."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            named = [node.left, *node.comparators]
        elif isinstance(node, ast.MatchValue):
            named = [node.value]
        elif isinstance(node, ast.Dict):
            named = [k for k in node.keys if k is not None]
        else:
            continue
        if any(_names_runtime(n) for n in named):
            yield node.lineno


def test_the_scan_finds_each_kind_of_branch() -> None:
    source = """
a = x == Runtime.TRACT
b = x.runtime != api.Runtime.OPENVINO
c = y in (Runtime.OPENVINO, Runtime.TRACT)
d = y is Runtime.ONNXRUNTIME
e = {Runtime.TRACT: 1}
match z:
    case Runtime.TRACT:
        pass
f = Runtime.TRACT
g = x == VerifyRuntime.DEVICES
"""
    assert sorted(set(runtime_branches(ast.parse(source)))) == [2, 3, 4, 5, 6, 8]


def test_no_runtime_is_compared_outside_the_registry() -> None:
    found = [
        f"{path.relative_to(REPO_ROOT)}:{line}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path not in REGISTRY
        for line in runtime_branches(ast.parse(path.read_text(), str(path)))
    ]
    assert not found, (
        "branches on a runtime outside onnxpipe/core/runtime_kinds.py (ask kind_of(runtime) for what "
        "the branch needs, adding the fact to RuntimeKind): " + ", ".join(found)
    )


@pytest.mark.parametrize("runtime", list(Runtime))
def test_every_runtime_has_an_entry_and_an_engine_module(runtime: Runtime) -> None:
    kind = kind_of(runtime)
    assert kind.runtime is runtime and kind.name == runtime.value
    path = PACKAGE.parent / Path(*kind.engine_module.split(".")).with_suffix(".py")
    assert path.is_file(), f"{runtime}: no engine module {path}"
    tree = ast.parse(path.read_text())
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert {"load", "runs_here"} <= functions


def test_verify_offers_every_runtime_and_the_devices() -> None:
    """``VerifyRuntime`` spells the runtimes again (plus ``devices``): a new runtime is added there too."""
    assert {v.value for v in VerifyRuntime} == {r.value for r in Runtime} | {"devices"}


def test_exactly_one_reference_runtime_which_needs_no_extra() -> None:
    reference = [k for k in RUNTIMES.values() if k.reference]
    assert [k.runtime for k in reference] == [Runtime.ONNXRUNTIME]
    assert reference[0].extra is None
    assert all(k.extra == k.name for k in RUNTIMES.values() if not k.reference)


def test_what_each_runtime_accepts() -> None:
    """The facts the rooms ask: who takes a provider or an OpenVINO device, which runtime cannot send a
    value computed from shapes (the planner's note names it), what GenAI and Triton serve."""
    taking = {k.name: (k.takes_provider, k.takes_openvino_device) for k in RUNTIMES.values()}
    assert taking == {"onnxruntime": (True, False), "openvino": (False, True), "tract": (False, False)}
    assert [k.name for k in RUNTIMES.values() if not k.sends_shape_values] == ["tract"]
    assert [k.name for k in RUNTIMES.values() if not k.genai] == ["tract"]
    assert {k.name: k.triton_backend for k in RUNTIMES.values()} == {
        "onnxruntime": "onnxruntime",
        "openvino": "openvino",
        "tract": None,
    }


def test_labels_and_what_reports_name_as_the_provider() -> None:
    ort = EngineConfig(provider="CUDAExecutionProvider")
    ov = EngineConfig(runtime=Runtime.OPENVINO, openvino_device="GPU.1")
    tract = EngineConfig(runtime=Runtime.TRACT)
    assert [c.label for c in (ort, ov, tract)] == [
        "onnxruntime (CUDAExecutionProvider)",
        "openvino (GPU.1)",
        "tract",
    ]
    assert [c.runs_on for c in (ort, ov, tract)] == ["CUDAExecutionProvider", "openvino (GPU.1)", "tract"]


def test_what_uses_a_gpu() -> None:
    def gpu(config: EngineConfig) -> bool:
        return config.uses_gpu

    assert gpu(EngineConfig(provider="CUDAExecutionProvider"))
    assert not gpu(EngineConfig())
    assert gpu(EngineConfig(runtime=Runtime.OPENVINO, openvino_device="GPU"))
    assert not gpu(EngineConfig(runtime=Runtime.OPENVINO, openvino_device="cpu"))
    assert not gpu(EngineConfig(runtime=Runtime.TRACT))


def test_runs_here_asks_the_engine_module() -> None:
    from onnxpipe.core.runtimes import available, runs_here

    assert runs_here(EngineConfig())
    assert not runs_here(EngineConfig(provider="NoSuchExecutionProvider"))
    if available(Runtime.TRACT):
        assert runs_here(EngineConfig(runtime=Runtime.TRACT))
        assert importlib.import_module(kind_of(Runtime.TRACT).engine_module).runs_here(
            EngineConfig(runtime=Runtime.TRACT)
        )


def test_a_profile_says_whether_the_reference_measured_it(sample_models_dir: Path) -> None:
    import dataclasses

    from onnxpipe.cost.static import static_profile
    from onnxpipe.ir.load import load_model

    prof = static_profile(load_model(sample_models_dir / "mlp.onnx"))
    assert prof.on_reference
    assert not dataclasses.replace(prof, runtime=EngineConfig(runtime=Runtime.TRACT).label).on_reference
