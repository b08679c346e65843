"""onnxpipe: split one ONNX model into a balanced pipeline of stage models.

The public API is this module's ``__all__``; everything else is private and may change.  Names are
imported on first use (PEP 562), so ``import onnxpipe`` is cheap: every pipeline worker process imports
the package, and most of them need only the runtime.  A public name never equals a submodule's name:
importing a submodule sets the package attribute of its name, which would hide a function so named.

>>> import onnxpipe
>>> "split" in onnxpipe.__all__
True
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    "SplitResult": "onnxpipe.api",
    "get_profile": "onnxpipe.api",
    "split": "onnxpipe.api",
    "static_profile": "onnxpipe.cost.static",
    "ExportError": "onnxpipe.core.errors",
    "ManifestError": "onnxpipe.core.errors",
    "MemoryFitError": "onnxpipe.core.errors",
    "ModelLoadError": "onnxpipe.core.errors",
    "OnnxpipeError": "onnxpipe.core.errors",
    "PartitionError": "onnxpipe.core.errors",
    "ProfileError": "onnxpipe.core.errors",
    "RuntimeStageError": "onnxpipe.core.errors",
    "UsageError": "onnxpipe.core.errors",
    "VerificationError": "onnxpipe.core.errors",
    "export_stages": "onnxpipe.export.stages",
    "Manifest": "onnxpipe.manifest",
    "load_manifest": "onnxpipe.manifest",
    "ModelView": "onnxpipe.ir.model",
    "load_model": "onnxpipe.ir.load",
    "Partition": "onnxpipe.partition",
    "solve": "onnxpipe.partition",
    "Plan": "onnxpipe.planning.types",
    "StageSpec": "onnxpipe.planning.types",
    "make_plan": "onnxpipe.planning.workers",
    "ScheduleRequest": "onnxpipe.planning.request",
    "plan_pipeline": "onnxpipe.planning.cluster",
    "Profile": "onnxpipe.cost.profile",
    "profile_model": "onnxpipe.cost.measure",
    "Pipeline": "onnxpipe.runtime",
    "VerifyReport": "onnxpipe.verification.verify",
    "verify": "onnxpipe.verification.verify",
    "Cluster": "onnxpipe.cluster.model",
    "load_cluster": "onnxpipe.cluster.devicesfile",
}

__all__ = [
    "Cluster",
    "ExportError",
    "Manifest",
    "ManifestError",
    "MemoryFitError",
    "ModelLoadError",
    "ModelView",
    "OnnxpipeError",
    "Partition",
    "PartitionError",
    "Pipeline",
    "Plan",
    "Profile",
    "ProfileError",
    "RuntimeStageError",
    "ScheduleRequest",
    "SplitResult",
    "StageSpec",
    "UsageError",
    "VerificationError",
    "VerifyReport",
    "__version__",
    "export_stages",
    "get_profile",
    "load_cluster",
    "load_manifest",
    "load_model",
    "make_plan",
    "plan_pipeline",
    "profile_model",
    "solve",
    "split",
    "static_profile",
    "verify",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'onnxpipe' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:
    from onnxpipe.api import SplitResult, get_profile, split
    from onnxpipe.cluster.devicesfile import load_cluster
    from onnxpipe.cluster.model import Cluster
    from onnxpipe.core.errors import (
        ExportError,
        ManifestError,
        MemoryFitError,
        ModelLoadError,
        OnnxpipeError,
        PartitionError,
        ProfileError,
        RuntimeStageError,
        UsageError,
        VerificationError,
    )
    from onnxpipe.cost.measure import profile_model
    from onnxpipe.cost.profile import Profile
    from onnxpipe.cost.static import static_profile
    from onnxpipe.export.stages import export_stages
    from onnxpipe.ir.load import load_model
    from onnxpipe.ir.model import ModelView
    from onnxpipe.manifest import Manifest, load_manifest
    from onnxpipe.partition import Partition, solve
    from onnxpipe.planning.cluster import plan_pipeline
    from onnxpipe.planning.request import ScheduleRequest
    from onnxpipe.planning.types import Plan, StageSpec
    from onnxpipe.planning.workers import make_plan
    from onnxpipe.runtime import Pipeline
    from onnxpipe.verification.verify import VerifyReport, verify
