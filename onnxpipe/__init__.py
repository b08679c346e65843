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

from onnxpipe.core.lazy import lazy_exports, typed_exports
from onnxpipe.core.version import __version__ as __version__

# written out: a type checker reads only a literal __all__ (for `from onnxpipe import *`); the module of
# each name is its import under TYPE_CHECKING below, which resolves it at run time too (typed_exports;
# tests/unit/test_api.py holds the two to the same names)
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

_EXPORTS = typed_exports(__name__)
"""Each public name's module, as the imports below say: the door's functions, options and results
(:mod:`onnxpipe.api`), the errors (:mod:`onnxpipe.core.errors`), and the steps below the door."""

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)

if TYPE_CHECKING:
    from onnxpipe.api import CalibrationOptions as CalibrationOptions
    from onnxpipe.api import DecoderOptions as DecoderOptions
    from onnxpipe.api import ExportOptions as ExportOptions
    from onnxpipe.api import FolderInspection as FolderInspection
    from onnxpipe.api import GenerateOptions as GenerateOptions
    from onnxpipe.api import GenerateResult as GenerateResult
    from onnxpipe.api import InspectOptions as InspectOptions
    from onnxpipe.api import LinkOptions as LinkOptions
    from onnxpipe.api import LinkReport as LinkReport
    from onnxpipe.api import ModelInspection as ModelInspection
    from onnxpipe.api import PlanOptions as PlanOptions
    from onnxpipe.api import PlanRequest as PlanRequest
    from onnxpipe.api import PlanResult as PlanResult
    from onnxpipe.api import ProfileOptions as ProfileOptions
    from onnxpipe.api import RunOptions as RunOptions
    from onnxpipe.api import RunReport as RunReport
    from onnxpipe.api import Sampling as Sampling
    from onnxpipe.api import ScheduleRequest as ScheduleRequest
    from onnxpipe.api import SplitOptions as SplitOptions
    from onnxpipe.api import SplitResult as SplitResult
    from onnxpipe.api import TritonOptions as TritonOptions
    from onnxpipe.api import TritonRepository as TritonRepository
    from onnxpipe.api import VerifyOptions as VerifyOptions
    from onnxpipe.api import VerifyReport as VerifyReport
    from onnxpipe.api import export_triton as export_triton
    from onnxpipe.api import generate as generate
    from onnxpipe.api import inspect as inspect
    from onnxpipe.api import links as links
    from onnxpipe.api import plan as plan
    from onnxpipe.api import profile as profile
    from onnxpipe.api import run as run
    from onnxpipe.api import split as split
    from onnxpipe.api import verify as verify
    from onnxpipe.cluster.devicesfile import load_cluster as load_cluster
    from onnxpipe.cluster.model import Cluster as Cluster
    from onnxpipe.core.errors import ExportError as ExportError
    from onnxpipe.core.errors import ManifestError as ManifestError
    from onnxpipe.core.errors import MemoryFitError as MemoryFitError
    from onnxpipe.core.errors import ModelLoadError as ModelLoadError
    from onnxpipe.core.errors import OnnxpipeError as OnnxpipeError
    from onnxpipe.core.errors import PartitionError as PartitionError
    from onnxpipe.core.errors import ProfileError as ProfileError
    from onnxpipe.core.errors import RuntimeStageError as RuntimeStageError
    from onnxpipe.core.errors import UsageError as UsageError
    from onnxpipe.core.errors import VerificationError as VerificationError
    from onnxpipe.cost.measure import profile_model as profile_model
    from onnxpipe.cost.profile import Profile as Profile
    from onnxpipe.cost.source import get_profile as get_profile
    from onnxpipe.cost.static import static_profile as static_profile
    from onnxpipe.export.stages import export_stages as export_stages
    from onnxpipe.ir.load import load_model as load_model
    from onnxpipe.ir.model import ModelView as ModelView
    from onnxpipe.manifest import Manifest as Manifest
    from onnxpipe.manifest import load_manifest as load_manifest
    from onnxpipe.partition import Partition as Partition
    from onnxpipe.partition import solve as solve
    from onnxpipe.planning.cluster import plan_pipeline as plan_pipeline
    from onnxpipe.planning.types import Plan as Plan
    from onnxpipe.planning.types import StageSpec as StageSpec
    from onnxpipe.planning.workers import make_plan as make_plan
    from onnxpipe.runtime import Generator as Generator
    from onnxpipe.runtime import Pipeline as Pipeline
