"""The public facade: every name in ``__all__`` resolves, lazily."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_import_is_lazy() -> None:
    code = "import sys, onnxpipe; print('onnx' in sys.modules, 'onnxruntime' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_the_manifest_imports_without_onnx_or_onnxruntime() -> None:
    """What ``tests/test_layers.py`` reads from the source, seen in a fresh interpreter."""
    code = (
        "import sys, onnxpipe.manifest; "
        "print('onnx' in sys.modules, 'onnxruntime' in sys.modules, 'onnxpipe.ir.model' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "False"]


def test_planning_imports_without_networkx() -> None:
    """networkx (about 20 MB) is imported where it is used only: a failing graph's cycle
    (:func:`onnxpipe.ir.graph.cycle_error`) and a measured profile's regions
    (:mod:`onnxpipe.cost.attribution`), so that a plan from a saved or static profile does not carry it."""
    code = "import sys, onnxpipe.api.plans, onnxpipe.cost.measure; print('networkx' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False"]


@pytest.mark.parametrize(
    ("name", "not_loaded"),
    [
        ("links", ("onnx", "onnxpipe.runtime.pipeline")),
        ("inspect", ("onnxpipe.runtime.pipeline", "onnxpipe.runtime.backends.ray_links")),
        ("run", ("onnxpipe.api.results", "onnxpipe.runtime.backends.ray_links")),
    ],
)
def test_each_door_function_loads_its_own_work_only(name: str, not_loaded: tuple[str, ...]) -> None:
    """``links`` measures a devices file's links on Ray: it needs neither onnx nor the model code;
    ``inspect`` reads a manifest or a model and ``run`` runs a pipeline, neither the other's code nor the
    Ray link probe.  Each door function's module imports what its own work uses."""
    code = f"import sys, onnxpipe; onnxpipe.{name}; print(*[m in sys.modules for m in {not_loaded!r}])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False"] * len(not_loaded)
