"""The public facade: every name in ``__all__`` resolves, lazily."""

from __future__ import annotations

import subprocess
import sys


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
