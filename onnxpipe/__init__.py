"""onnxpipe: split one ONNX model into a balanced pipeline of stage models.

The public API is this module's ``__all__``: the door's functions (one per subcommand, each with its
options object and result, :mod:`onnxpipe.api`), the errors, and the steps below the door for those who
compose them (``load_model``, ``profile_model``, ``make_plan``, ``export_stages``...).  Everything else is
private and may change.  Names are imported on first use (:mod:`onnxpipe.core.lazy`), so ``import
onnxpipe`` is cheap: every pipeline worker process imports the package, and most of them need only the
runtime.

>>> import onnxpipe
>>> "split" in onnxpipe.__all__
True
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from onnxpipe.core.lazy import lazy_exports
from onnxpipe.core.version import __version__

_API = "onnxpipe.api"
_ERRORS = "onnxpipe.core.errors"

_EXPORTS: dict[str, str] = {
    # the door: a function per subcommand, its options, its result
    "profile": _API,
    "plan": _API,
    "split": _API,
    "verify": _API,
    "inspect": _API,
    "run": _API,
    "generate": _API,
    "links": _API,
    "export_triton": _API,
    "ProfileOptions": _API,
    "PlanOptions": _API,
    "PlanRequest": _API,
    "ScheduleRequest": _API,
    "DecoderOptions": _API,
    "SplitOptions": _API,
    "CalibrationOptions": _API,
    "ExportOptions": _API,
    "VerifyOptions": _API,
    "InspectOptions": _API,
    "RunOptions": _API,
    "GenerateOptions": _API,
    "LinkOptions": _API,
    "Sampling": _API,
    "TritonOptions": _API,
    "PlanResult": _API,
    "SplitResult": _API,
    "FolderInspection": _API,
    "ModelInspection": _API,
    "GenerateResult": _API,
    "LinkReport": _API,
    "RunReport": _API,
    "TritonRepository": _API,
    "VerifyReport": _API,
    # the errors
    "ExportError": _ERRORS,
    "ManifestError": _ERRORS,
    "MemoryFitError": _ERRORS,
    "ModelLoadError": _ERRORS,
    "OnnxpipeError": _ERRORS,
    "PartitionError": _ERRORS,
    "ProfileError": _ERRORS,
    "RuntimeStageError": _ERRORS,
    "UsageError": _ERRORS,
    "VerificationError": _ERRORS,
    # the steps below the door
    "get_profile": "onnxpipe.cost.source",
    "static_profile": "onnxpipe.cost.static",
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
    "plan_pipeline": "onnxpipe.planning.cluster",
    "Profile": "onnxpipe.cost.profile",
    "profile_model": "onnxpipe.cost.measure",
    "Pipeline": "onnxpipe.runtime",
    "Generator": "onnxpipe.runtime",
    "Cluster": "onnxpipe.cluster.model",
    "load_cluster": "onnxpipe.cluster.devicesfile",
}

__all__ = [
    "CalibrationOptions",
    "Cluster",
    "DecoderOptions",
    "ExportError",
    "ExportOptions",
    "FolderInspection",
    "GenerateOptions",
    "GenerateResult",
    "Generator",
    "InspectOptions",
    "LinkOptions",
    "LinkReport",
    "Manifest",
    "ManifestError",
    "MemoryFitError",
    "ModelInspection",
    "ModelLoadError",
    "ModelView",
    "OnnxpipeError",
    "Partition",
    "PartitionError",
    "Pipeline",
    "Plan",
    "PlanOptions",
    "PlanRequest",
    "PlanResult",
    "Profile",
    "ProfileError",
    "ProfileOptions",
    "RunOptions",
    "RunReport",
    "RuntimeStageError",
    "Sampling",
    "ScheduleRequest",
    "SplitOptions",
    "SplitResult",
    "StageSpec",
    "TritonOptions",
    "TritonRepository",
    "UsageError",
    "VerificationError",
    "VerifyOptions",
    "VerifyReport",
    "__version__",
    "export_stages",
    "export_triton",
    "generate",
    "get_profile",
    "inspect",
    "links",
    "load_cluster",
    "load_manifest",
    "load_model",
    "make_plan",
    "plan",
    "plan_pipeline",
    "profile",
    "profile_model",
    "run",
    "solve",
    "split",
    "static_profile",
    "verify",
]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)

if TYPE_CHECKING:
    from onnxpipe.api import (
        CalibrationOptions,
        DecoderOptions,
        ExportOptions,
        FolderInspection,
        GenerateOptions,
        GenerateResult,
        InspectOptions,
        LinkOptions,
        LinkReport,
        ModelInspection,
        PlanOptions,
        PlanRequest,
        PlanResult,
        ProfileOptions,
        RunOptions,
        RunReport,
        Sampling,
        ScheduleRequest,
        SplitOptions,
        SplitResult,
        TritonOptions,
        TritonRepository,
        VerifyOptions,
        VerifyReport,
        export_triton,
        generate,
        inspect,
        links,
        plan,
        profile,
        run,
        split,
        verify,
    )
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
    from onnxpipe.cost.source import get_profile
    from onnxpipe.cost.static import static_profile
    from onnxpipe.export.stages import export_stages
    from onnxpipe.ir.load import load_model
    from onnxpipe.ir.model import ModelView
    from onnxpipe.manifest import Manifest, load_manifest
    from onnxpipe.partition import Partition, solve
    from onnxpipe.planning.cluster import plan_pipeline
    from onnxpipe.planning.types import Plan, StageSpec
    from onnxpipe.planning.workers import make_plan
    from onnxpipe.runtime import Generator, Pipeline
